//! A frame: a run of kernels recorded into one command buffer and submitted once (`run`), or
//! recorded once and submitted as often as wanted (`Context::recording`, `finish`, then
//! `Recorded::run`). Ops (ops/*.rs) record dispatches here; each dispatch binds whole-buffer
//! ranges (pushed into the command buffer where the device has `VK_KHR_push_descriptor`, else
//! a descriptor set from the frame's pools) and 64 bytes of push constants (the kernel's
//! struct of `push.rs`, zero-extended); a slot the op leaves unused binds a small scratch
//! range (one shared by read-only slots, one per writable slot since the last barrier, so
//! unused slots are never a hazard). A memory barrier
//! goes in only before a command that touches a range an earlier command since the last
//! barrier wrote (read after write, write after write) or that it writes a range read since
//! then (write after read), so independent kernels (q, k and v projections; a quantization
//! beside an unrelated GEMV) run without one between them.
//!
//! Recording resources (command pool, fence, descriptor pools, a scratch arena for the
//! quantized activations and attention partials ops need) come from the context's spares and
//! go back to them when the frame ends, so a warm forward creates no Vulkan objects and
//! allocates no device memory. A frame borrows every buffer it records (`'a`), so none can be
//! freed while its work is pending; a recording also keeps them alive while it exists.
//!
//! Must not: validate op arguments (the op layer does before it records).

use super::arena::Allocation;
use super::command::Commands;
use super::context::{BufInner, Context, DeviceBuffer, Shared, View};
use super::error::{Result, VkError};
use super::hazards::{Hazards, Range};
use super::memory::MemoryUse;
use super::pipeline::PUSH_BYTES;
use super::push::PushConstants;
use super::shaders::{FormatVariant, Kernel};
use ash::vk;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The most storage-buffer bindings a kernel declares.
const MAX_BINDINGS: usize = 24;
/// Scratch ranges are aligned to this many bytes (at least any device's storage-offset rule).
const SCRATCH_ALIGN: u64 = 256;
/// Smallest scratch arena.
const MIN_ARENA: u64 = 64 << 10;
/// Spare recording resources a context keeps.
const MAX_SPARES: usize = 8;

/// What a binding slot of a dispatch reads: a buffer's whole range (ops pass element offsets
/// in push constants), a frame scratch range, or nothing (a dummy the shader never reads).
#[derive(Clone, Copy)]
pub(crate) struct Bind<'b> {
    range: Option<Range>,
    owner: Option<&'b DeviceBuffer>,
    /// The bytes the kernel touches through the binding, when not all of it: (start, end).
    span: Option<(u64, u64)>,
}

impl<'b> Bind<'b> {
    pub const UNUSED: Bind<'static> = Bind { range: None, owner: None, span: None };

    pub fn buf(b: &'b DeviceBuffer) -> Bind<'b> {
        Bind { range: Some(b.binding()), owner: Some(b), span: None }
    }

    /// `v`'s whole buffer bound (the kernel takes the view's offset in its push constants),
    /// and only the view's elements counted as touched: kernels on disjoint views of one
    /// buffer need no barrier between them. Only for a kernel that touches no element
    /// outside the view.
    pub fn view(v: crate::vk::View<'b>) -> Bind<'b> {
        let r = v.buf.binding();
        let start = r.1 + v.offset as u64 * 4;
        Bind { range: Some(r), owner: Some(v.buf), span: Some((start, start + v.len as u64 * 4)) }
    }

    /// A range the frame owns (scratch).
    pub(crate) fn raw(r: Range) -> Bind<'b> {
        Bind { range: Some(r), owner: None, span: None }
    }
}

/// A device allocation a frame owns directly (scratch), outside `DeviceBuffer`.
pub(crate) struct Raw {
    alloc: Allocation,
    handle: vk::Buffer,
}

/// The reusable resources of a frame: commands, and the scratch arena with the overflow
/// allocations made when a recording outgrew it (folded into one arena at the next reuse).
pub(crate) struct FrameRes {
    cmds: Commands,
    arena: Option<Raw>,
    extra: Vec<Raw>,
    /// Scratch bytes the last recording wanted.
    want: u64,
    /// Timestamp queries the last recording wanted.
    want_queries: u32,
}

impl FrameRes {
    /// # Safety
    /// Nothing recorded with these resources may be pending.
    pub(crate) unsafe fn destroy(mut self, shared: &Shared) {
        let dev = &shared.dev.raw;
        self.cmds.destroy(dev);
        let mut mem = shared.mem();
        for r in self.arena.take().into_iter().chain(self.extra.drain(..)) {
            mem.free(dev, r.alloc);
        }
    }
}

/// Where a recording stands, for what its resources may do when it ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// Not submitted, or its last submission waited for: reusable.
    Idle,
    /// Submitted and not known to be finished.
    Maybe,
}

/// Profiling of one recording: what each timestamp after the first closes.
#[derive(Default)]
struct Stamps {
    labels: Vec<String>,
}

pub struct Frame<'a> {
    pub(crate) ctx: &'a Context,
    res: Option<FrameRes>,
    hazards: Hazards,
    barriers: u64,
    dispatches: u64,
    /// Next free byte of the scratch arena.
    bump: u64,
    /// Scratch bytes asked for (arena and overflow).
    asked: u64,
    scratch: Vec<Range>,
    /// The range every unused slot a kernel only reads binds (reads never conflict).
    dummy: Option<Range>,
    /// Ranges unused slots a kernel may write bind, one per slot since the last barrier
    /// (`dummies_used` of them taken): a kernel that writes a slot only in some modes (the
    /// second output of two norms in one dispatch) still declares the write, so two dispatches
    /// that shared one range would be a write-after-write hazard to the validation layer.
    write_dummies: Vec<Range>,
    dummies_used: usize,
    /// Zeroed u32 counters kernels share (each returns them to 0 when done), and how many.
    counters: Option<(Range, usize)>,
    /// Split kernels' partials, one range every call shares, and its length in floats.
    partials: Option<(Range, usize)>,
    /// Constants recorded so far, for reuse by later kernels that want the same words.
    constants: Vec<(Vec<u32>, Range)>,
    /// Keep every recorded buffer alive (a recording that outlives the borrow).
    retain: bool,
    keep: Vec<Arc<BufInner>>,
    stamps: Option<Stamps>,
    /// What the next dispatch's profile label adds to its kernel's name.
    hint: Option<&'static str>,
    pending: Pending,
    started: Instant,
    last_pipeline: vk::Pipeline,
}

impl<'a> Frame<'a> {
    pub(crate) fn new(ctx: &'a Context, once: bool) -> Result<Frame<'a>> {
        let shared = &ctx.shared;
        shared.check_alive()?;
        let started = Instant::now();
        let dev = &shared.dev.raw;
        let mut res = match shared.take_spare() {
            Some(r) => r,
            // SAFETY: the device is live (the context holds it); destroyed through FrameRes.
            None => FrameRes {
                cmds: unsafe { Commands::new(dev, shared.caps.compute_family)? },
                arena: None,
                extra: Vec::new(),
                want: 0,
                want_queries: 0,
            },
        };
        let prepared = (|| {
            // Fold the last recording's overflow into one arena big enough for it.
            let need = res.want.max(MIN_ARENA).next_power_of_two();
            let small = res.arena.as_ref().is_none_or(|a| a.alloc.size < need);
            if !res.extra.is_empty() || small {
                let mut mem = shared.mem();
                for r in res.extra.drain(..) {
                    // SAFETY: the resources were idle when they went back to the spares.
                    unsafe { mem.free(dev, r.alloc) };
                }
                if small {
                    if let Some(a) = res.arena.take() {
                        // SAFETY: as above.
                        unsafe { mem.free(dev, a.alloc) };
                    }
                    // SAFETY: the allocator belongs to this device.
                    let alloc = unsafe { mem.alloc(dev, MemoryUse::Device, need)? };
                    res.arena = Some(Raw { handle: mem.buffer(&alloc), alloc });
                }
            }
            let profile = shared.profiling() && shared.caps.timestamps;
            // SAFETY: the resources are idle; the command buffer is not recording.
            unsafe {
                if profile {
                    res.cmds.ensure_queries(dev, res.want_queries.max(1024))?;
                }
                res.cmds.begin(dev, once)?;
                if profile {
                    dev.cmd_reset_query_pool(res.cmds.cmd, res.cmds.queries, 0, res.cmds.query_cap);
                    dev.cmd_write_timestamp(res.cmds.cmd, vk::PipelineStageFlags::TOP_OF_PIPE, res.cmds.queries, 0);
                }
            }
            Ok::<bool, VkError>(profile)
        })();
        let profile = match prepared {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: nothing was submitted with these resources.
                unsafe { res.destroy(shared) };
                return Err(e);
            }
        };
        Ok(Frame {
            ctx,
            res: Some(res),
            hazards: Hazards::default(),
            barriers: 0,
            dispatches: 0,
            bump: 0,
            asked: 0,
            scratch: Vec::new(),
            dummy: None,
            write_dummies: Vec::new(),
            dummies_used: 0,
            counters: None,
            partials: None,
            constants: Vec::new(),
            retain: !once,
            keep: Vec::new(),
            stamps: profile.then(Stamps::default),
            hint: None,
            pending: Pending::Idle,
            started,
            last_pipeline: vk::Pipeline::null(),
        })
    }

    fn res(&mut self) -> &mut FrameRes {
        self.res.as_mut().expect("a frame holds its resources until it ends")
    }

    /// Dispatches recorded in this frame.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches
    }

    /// Barriers recorded in this frame (fewer than dispatches when kernels are independent).
    pub fn barrier_count(&self) -> u64 {
        self.barriers
    }

    /// Puts a barrier before a command (a kernel, or a copy command with `copy`) that reads
    /// `reads` and writes `writes` when it depends on an earlier one, waiting for the kind of
    /// command it depends on, then notes its ranges.
    fn order(&mut self, reads: &[Range], writes: &[Range], copy: bool) {
        if let Some(waits) = self.hazards.waits(reads, writes) {
            let dev = &self.ctx.shared.dev.raw;
            // SAFETY: the command buffer is recording.
            unsafe { self.res.as_ref().expect("recording").cmds.barrier_after(dev, waits) };
            if waits.kernels {
                self.hazards.kernels.clear();
                // Only kernels bind the write dummies.
                self.dummies_used = 0;
            }
            if waits.copies {
                self.hazards.copies.clear();
            }
            self.barriers += 1;
        }
        let touched = if copy { &mut self.hazards.copies } else { &mut self.hazards.kernels };
        touched.note(reads, writes);
    }

    /// A device range of `bytes` that lives as long as the recording.
    fn scratch_range(&mut self, bytes: u64) -> Result<Range> {
        let bytes = bytes.max(4).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
        self.asked += bytes;
        let bump = self.bump;
        let res = self.res();
        if let Some(a) = res.arena.as_ref().filter(|a| bump + bytes <= a.alloc.size) {
            let r = (a.handle, a.alloc.offset + bump, bytes);
            self.bump += bytes;
            return Ok(r);
        }
        let shared = &self.ctx.shared;
        let mut mem = shared.mem();
        // SAFETY: the allocator belongs to this device.
        let alloc = unsafe { mem.alloc(&shared.dev.raw, MemoryUse::Device, bytes)? };
        let handle = mem.buffer(&alloc);
        drop(mem);
        self.res().extra.push(Raw { alloc, handle });
        Ok((handle, alloc.offset, alloc.size))
    }

    /// A device buffer of `len` elements that lives until the frame ends; returns its index
    /// in the frame's scratch list.
    pub(crate) fn scratch(&mut self, len: usize) -> Result<usize> {
        let r = self.scratch_range(len.max(1) as u64 * 4)?;
        self.scratch.push(r);
        Ok(self.scratch.len() - 1)
    }

    /// At least `len` u32 counters, zero when the frame's first kernel that uses them runs;
    /// each user must leave them at zero when it is done (so all users of a frame share
    /// them, ordered by their other dependencies like any scratch).
    pub(crate) fn counters(&mut self, len: usize) -> Result<Bind<'static>> {
        if let Some((r, n)) = self.counters.filter(|c| c.1 >= len) {
            let _ = n;
            return Ok(Bind::raw(r));
        }
        let r = self.scratch_range(len.max(64) as u64 * 4)?;
        self.order(&[], &[(r.0, r.1, r.1 + r.2)], true);
        let cmd = self.res().cmds.cmd;
        // SAFETY: the range is the frame's scratch, 4-byte aligned and sized; the command
        // buffer is recording.
        unsafe { self.ctx.shared.dev.raw.cmd_fill_buffer(cmd, r.0, r.1, r.2, 0) };
        self.stamp(|| "fill".to_string());
        self.counters = Some((r, len.max(64)));
        Ok(Bind::raw(r))
    }

    /// Scratch bytes the recording has asked for so far.
    pub fn scratch_bytes(&self) -> u64 {
        self.asked
    }

    /// Two ranges of at least `a` and `b` floats for a split kernel's partials (its (m, l)
    /// pairs and its weighted sums), within one range every such call of the frame shares: the
    /// calls are ordered by their writes like any scratch (an MLA layer's attention after the
    /// last), so a recording of many layers holds one layer's partials, not one per layer.
    pub(crate) fn partials(&mut self, a: usize, b: usize) -> Result<(Bind<'static>, Bind<'static>)> {
        let a_bytes = (a.max(1) as u64 * 4).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
        let len = (a_bytes / 4) as usize + b.max(1);
        let (buf, start, _) = match self.partials.filter(|p| p.1 >= len) {
            Some((r, _)) => r,
            None => {
                let r = self.scratch_range(len as u64 * 4)?;
                self.partials = Some((r, len));
                r
            }
        };
        Ok((Bind::raw((buf, start, a.max(1) as u64 * 4)), Bind::raw((buf, start + a_bytes, b.max(1) as u64 * 4))))
    }

    /// `count` disjoint runs of at least `each` counters within the frame's shared counters
    /// (zero, as `counters` says): kernels that run side by side each take their own run, so
    /// none waits on another.
    pub(crate) fn counter_runs(&mut self, each: usize, count: usize) -> Result<Vec<Bind<'static>>> {
        let stride = (each.max(1) as u64 * 4).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
        let all = self.counters((stride / 4) as usize * count.max(1))?;
        let (buf, start, _) = all.range.expect("counters are a range");
        Ok((0..count as u64).map(|i| Bind::raw((buf, start + i * stride, each.max(1) as u64 * 4))).collect())
    }

    /// A scratch range holding `words` as recorded (an update in the command buffer, so it
    /// serves every run of a recording): constants a kernel reads beyond its push constants.
    pub(crate) fn constants(&mut self, words: &[u32]) -> Result<Bind<'static>> {
        if let Some((_, r)) = self.constants.iter().find(|(w, _)| w == words) {
            return Ok(Bind::raw(*r));
        }
        let r = self.scratch_range(words.len().max(1) as u64 * 4)?;
        self.constants.push((words.to_vec(), r));
        self.order(&[], &[(r.0, r.1, r.1 + r.2)], true);
        let cmd = self.res().cmds.cmd;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        // SAFETY: the range is the frame's scratch, 4-byte aligned and at least as long as the
        // data (under the 64 KiB an update may carry); the command buffer is recording.
        unsafe { self.ctx.shared.dev.raw.cmd_update_buffer(cmd, r.0, r.1, &bytes) };
        self.stamp(|| "constants".to_string());
        Ok(Bind::raw(r))
    }

    /// The binding of scratch buffer `i`.
    pub(crate) fn scratch_bind(&self, i: usize) -> Bind<'static> {
        Bind::raw(self.scratch[i])
    }

    fn stamp(&mut self, label: impl FnOnce() -> String) {
        let Some(st) = self.stamps.as_mut() else { return };
        let res = self.res.as_ref().expect("recording");
        let i = st.labels.len() as u32 + 1;
        if i < res.cmds.query_cap {
            // SAFETY: the command buffer is recording and the query was reset at its start.
            unsafe {
                self.ctx.shared.dev.raw.cmd_write_timestamp(
                    res.cmds.cmd,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    res.cmds.queries,
                    i,
                )
            };
        }
        st.labels.push(label());
    }

    /// Records `kernel` over `groups` workgroups with `binds` in binding order and `push` (one
    /// of the structs `push.rs` declares for `kernel`) as its push constants.
    pub(crate) fn dispatch<P: PushConstants>(
        &mut self,
        kernel: Kernel,
        variant: Option<FormatVariant>,
        binds: &[Bind<'a>],
        push: &P,
        groups: [u32; 3],
    ) -> Result<()> {
        self.dispatch_reaching(kernel, variant, binds, &[], push, groups)
    }

    /// `dispatch`, for a kernel that also reaches `reached` through their device addresses
    /// (not bound): each ordered as a read, or as a write where its flag is set, and kept alive
    /// with the recording like a binding.
    pub(crate) fn dispatch_reaching<P: PushConstants>(
        &mut self,
        kernel: Kernel,
        variant: Option<FormatVariant>,
        binds: &[Bind<'a>],
        reached: &[(Bind<'a>, bool)],
        push: &P,
        groups: [u32; 3],
    ) -> Result<()> {
        if !P::LAYOUT.kernels.contains(&kernel.base()) {
            return Err(VkError::BadArgument {
                op: "dispatch",
                msg: format!("{kernel:?} does not take {} push constants", P::LAYOUT.name),
            });
        }
        if groups.contains(&0) {
            return Ok(());
        }
        // The pipeline layout declares `PUSH_BYTES`; a shorter block is zero-extended to it.
        let mut constants = [0u8; PUSH_BYTES as usize];
        constants[..P::LAYOUT.size].copy_from_slice(push.bytes());
        let pipe = self.ctx.shared.pipe(kernel, variant)?;
        let n = pipe.bindings as usize;
        if n > MAX_BINDINGS || binds.len() > n {
            return Err(VkError::BadArgument {
                op: "dispatch",
                msg: format!("{kernel:?}: {} bindings for {n} slots", binds.len()),
            });
        }
        let written = kernel.written_bindings();
        let (mut reads, mut writes) = (Vec::with_capacity(n + reached.len()), Vec::with_capacity(n));
        let mut ranges = [None; MAX_BINDINGS];
        let bound = (0..n).map(|i| (Some(i), binds.get(i).copied().unwrap_or(Bind::UNUSED), false));
        for (slot, b, reached_write) in bound.chain(reached.iter().map(|&(b, w)| (None, b, w))) {
            let Some(r) = b.range else { continue };
            let (start, end) = b.span.unwrap_or((r.1, r.1 + r.2));
            let write = match slot {
                Some(i) => written.contains(&(i as u32)),
                None => reached_write,
            };
            if write {
                writes.push((r.0, start, end));
            } else {
                reads.push((r.0, start, end));
            }
            if self.retain {
                if let Some(o) = b.owner {
                    self.keep.push(o.inner.clone());
                }
            }
            if let Some(i) = slot {
                ranges[i] = Some(r);
            }
        }
        self.order(&reads, &writes, false);
        // Unused slots, after the barrier (if any) that resets the write dummies.
        let mut infos = [vk::DescriptorBufferInfo::default(); MAX_BINDINGS];
        for (i, info) in infos.iter_mut().enumerate().take(n) {
            let r = match ranges[i] {
                Some(r) => r,
                None if written.contains(&(i as u32)) => self.write_dummy()?,
                None => self.read_dummy()?,
            };
            *info = vk::DescriptorBufferInfo::default().buffer(r.0).offset(r.1).range(r.2);
        }
        let shared = &self.ctx.shared;
        let dev = &shared.dev.raw;
        let res = self.res.as_mut().expect("recording");
        let cmd = res.cmds.cmd;
        // SAFETY: the set layout, pipeline and buffers are live (the buffers are borrowed for
        // 'a or owned by the frame); the command buffer is recording.
        unsafe {
            if pipe.pipeline != self.last_pipeline {
                dev.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipe.pipeline);
                self.last_pipeline = pipe.pipeline;
            }
            let set = match &shared.dev.push {
                Some(_) => vk::DescriptorSet::null(),
                None => res.cmds.descriptor_set(dev, pipe.set_layout)?,
            };
            let mut ws = [vk::WriteDescriptorSet::default(); MAX_BINDINGS];
            for (i, w) in ws.iter_mut().enumerate().take(n) {
                *w = vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(std::slice::from_ref(&infos[i]));
            }
            match &shared.dev.push {
                Some(pd) => pd.cmd_push_descriptor_set(cmd, vk::PipelineBindPoint::COMPUTE, pipe.layout, 0, &ws[..n]),
                None => {
                    dev.update_descriptor_sets(&ws[..n], &[]);
                    dev.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, pipe.layout, 0, &[set], &[]);
                }
            }
            dev.cmd_push_constants(cmd, pipe.layout, vk::ShaderStageFlags::COMPUTE, 0, &constants);
            dev.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
        }
        self.dispatches += 1;
        let hint = self.hint.take();
        self.stamp(|| {
            let name = match variant {
                Some(v) => format!("{kernel:?} {v:?}"),
                None => format!("{kernel:?}"),
            };
            match hint {
                Some(h) => format!("{name} {h}"),
                None => name,
            }
        });
        Ok(())
    }

    /// The range unused read-only slots bind.
    fn read_dummy(&mut self) -> Result<Range> {
        if let Some(d) = self.dummy {
            return Ok(d);
        }
        let d = self.scratch_range(16)?;
        self.dummy = Some(d);
        Ok(d)
    }

    /// A range for an unused slot the kernel may write that no other dispatch since the last
    /// barrier binds.
    fn write_dummy(&mut self) -> Result<Range> {
        if self.dummies_used == self.write_dummies.len() {
            let d = self.scratch_range(16)?;
            self.write_dummies.push(d);
        }
        self.dummies_used += 1;
        Ok(self.write_dummies[self.dummies_used - 1])
    }

    /// Names what the next dispatch does beyond its kernel, for the profile.
    pub(crate) fn hint(&mut self, h: &'static str) {
        if self.stamps.is_some() {
            self.hint = Some(h);
        }
    }

    /// The workgroup size the device-sized kernels run with.
    pub(crate) fn device_workgroup(&self, kernel: Kernel, variant: Option<FormatVariant>) -> Result<u32> {
        Ok(self.ctx.shared.pipe(kernel, variant)?.workgroup)
    }

    /// Copies `len` bytes between buffers.
    pub fn copy_bytes(
        &mut self,
        src: &'a DeviceBuffer,
        src_off: usize,
        dst: &'a DeviceBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        if src_off + len > src.len_bytes() || dst_off + len > dst.len_bytes() {
            return Err(VkError::BadArgument {
                op: "copy",
                msg: format!("{len} bytes from {src_off} of {} to {dst_off} of {}", src.len_bytes(), dst.len_bytes()),
            });
        }
        let (sb, so, _) = src.binding();
        let (db, doff, _) = dst.binding();
        let (s0, d0) = (so + src_off as u64, doff + dst_off as u64);
        self.order(&[(sb, s0, s0 + len as u64)], &[(db, d0, d0 + len as u64)], true);
        if self.retain {
            self.keep.push(src.inner.clone());
            self.keep.push(dst.inner.clone());
        }
        let region = [vk::BufferCopy::default().src_offset(s0).dst_offset(d0).size(len as u64)];
        let cmd = self.res().cmds.cmd;
        // SAFETY: both buffers are live for the frame; the ranges were checked.
        unsafe { self.ctx.shared.dev.raw.cmd_copy_buffer(cmd, sb, db, &region) };
        self.stamp(|| "copy".to_string());
        Ok(())
    }

    /// `out = [a | b]` for each of `n` rows (`a` rows of `wa`, `b` rows of `wb` floats): one
    /// copy command of `2 n` regions.
    pub fn concat(
        &mut self,
        a: View<'a>,
        b: View<'a>,
        out: View<'a>,
        n: usize,
        (wa, wb): (usize, usize),
    ) -> Result<()> {
        a.check("concat", "a", n * wa)?;
        b.check("concat", "b", n * wb)?;
        out.check("concat", "out", n * (wa + wb))?;
        if n == 0 || wa + wb == 0 {
            return Ok(());
        }
        let at = |v: &View, i: usize| v.buf.binding().1 + ((v.offset + i) * 4) as u64;
        let (ab, bb, ob) = (a.buf.binding().0, b.buf.binding().0, out.buf.binding().0);
        let span = |v: &View, len: usize| (v.buf.binding().0, at(v, 0), at(v, len));
        self.order(&[span(&a, n * wa), span(&b, n * wb)], &[span(&out, n * (wa + wb))], true);
        if self.retain {
            self.keep.extend([a.buf.inner.clone(), b.buf.inner.clone(), out.buf.inner.clone()]);
        }
        let region = |src: &View, w: usize, r: usize, col: usize| {
            vk::BufferCopy::default()
                .src_offset(at(src, r * w))
                .dst_offset(at(&out, r * (wa + wb) + col))
                .size((w * 4) as u64)
        };
        let a_rows = (0..n).filter(|_| wa > 0).map(|r| region(&a, wa, r, 0));
        let b_rows = (0..n).filter(|_| wb > 0).map(|r| region(&b, wb, r, wa));
        let (from_a, from_b): (Vec<_>, Vec<_>) = (a_rows.collect(), b_rows.collect());
        let cmd = self.res().cmds.cmd;
        // SAFETY: the buffers are live for the frame; every range was checked above.
        unsafe {
            if !from_a.is_empty() {
                self.ctx.shared.dev.raw.cmd_copy_buffer(cmd, ab, ob, &from_a);
            }
            if !from_b.is_empty() {
                self.ctx.shared.dev.raw.cmd_copy_buffer(cmd, bb, ob, &from_b);
            }
        }
        self.stamp(|| "concat".to_string());
        Ok(())
    }

    /// Copies f32 elements between views (`src.len` of them).
    pub fn copy(&mut self, src: View<'a>, dst: View<'a>) -> Result<()> {
        src.check("copy", "source", 0)?;
        dst.check("copy", "destination", src.len)?;
        self.copy_bytes(src.buf, src.offset * 4, dst.buf, dst.offset * 4, src.len * 4)
    }

    /// Ends recording (a barrier toward host reads, then the end of the command buffer).
    fn end(&mut self) -> Result<()> {
        let asked = self.asked;
        let queries = self.stamps.as_ref().map_or(0, |s| s.labels.len() as u32 + 1);
        let shared = &self.ctx.shared;
        let res = self.res.as_mut().expect("recording");
        res.want = asked;
        res.want_queries = queries;
        // SAFETY: the command buffer is recording.
        unsafe { shared.end_commands(&res.cmds) }?;
        shared.record_ns.fetch_add(self.started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Submits the frame and waits for it; scratch goes back to the context after.
    pub fn run(mut self) -> Result<()> {
        self.end()?;
        self.pending = Pending::Maybe;
        let res = self.res.as_ref().expect("recording");
        // SAFETY: the command buffer is executable and references live objects only.
        unsafe { self.ctx.shared.submit_and_wait(&res.cmds) }?;
        self.pending = Pending::Idle;
        self.ctx.shared.dispatches.fetch_add(self.dispatches, Ordering::Relaxed);
        if let Some(st) = &self.stamps {
            self.ctx.shared.note_stamps(&res.cmds, &st.labels);
        }
        Ok(())
    }

    /// Ends a recording made with `Context::recording` for submitting as often as wanted.
    pub fn finish(mut self) -> Result<Recorded> {
        if !self.retain {
            return Err(VkError::BadArgument {
                op: "finish",
                msg: "a frame from Context::frame runs once; record with Context::recording".into(),
            });
        }
        self.end()?;
        Ok(Recorded {
            ctx: self.ctx.clone(),
            res: self.res.take(),
            keep: std::mem::take(&mut self.keep),
            dispatches: self.dispatches,
            barriers: self.barriers,
            labels: self.stamps.take().map(|s| s.labels),
            pending: std::cell::Cell::new(Pending::Idle),
        })
    }
}

/// Returns a frame's resources to the context's spares, or destroys them when the device is
/// lost; waits for the device first when a submission may still be pending.
fn release(shared: &Shared, res: FrameRes, pending: Pending) {
    let dev = &shared.dev.raw;
    // SAFETY: after the wait below nothing recorded with `res` is pending (or the device is
    // lost, where destroying is allowed).
    unsafe {
        if pending == Pending::Maybe && dev.get_fence_status(res.cmds.fence) != Ok(true) && !shared.is_lost() {
            let _ = dev.device_wait_idle();
        }
        if shared.is_lost() {
            res.destroy(shared);
            shared.drop_spares();
        } else {
            shared.put_spare(res, MAX_SPARES);
        }
    }
}

impl Drop for Frame<'_> {
    fn drop(&mut self) {
        if let Some(res) = self.res.take() {
            release(&self.ctx.shared, res, self.pending);
        }
    }
}

/// A recorded frame, submitted with `run` as often as wanted (one submission at a time). It
/// keeps every buffer it binds alive, so what it references cannot be freed under it; what it
/// reads at run time is whatever those buffers hold then (per-run inputs are written into
/// them before `run`).
pub struct Recorded {
    ctx: Context,
    res: Option<FrameRes>,
    keep: Vec<Arc<BufInner>>,
    dispatches: u64,
    barriers: u64,
    labels: Option<Vec<String>>,
    pending: std::cell::Cell<Pending>,
}

impl Recorded {
    /// Submits the recording and waits for it.
    pub fn run(&self) -> Result<()> {
        let res = self.res.as_ref().expect("a recording holds its resources");
        self.pending.set(Pending::Maybe);
        // SAFETY: the command buffer is executable, was not recorded for one submission, is
        // not pending (the last run waited), and every buffer it uses is kept alive by `keep`.
        unsafe { self.ctx.shared.submit_and_wait(&res.cmds) }?;
        self.pending.set(Pending::Idle);
        self.ctx.shared.dispatches.fetch_add(self.dispatches, Ordering::Relaxed);
        if let Some(l) = &self.labels {
            self.ctx.shared.note_stamps(&res.cmds, l);
        }
        Ok(())
    }

    /// Dispatches one run records.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches
    }

    /// Barriers one run records.
    pub fn barrier_count(&self) -> u64 {
        self.barriers
    }

    /// Buffers the recording keeps alive.
    pub fn kept_buffers(&self) -> usize {
        self.keep.len()
    }
}

impl std::fmt::Debug for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recorded({} dispatches, {} barriers)", self.dispatches, self.barriers)
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if let Some(res) = self.res.take() {
            release(&self.ctx.shared, res, self.pending.get());
        }
    }
}
