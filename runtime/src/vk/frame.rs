//! A frame: a run of kernels recorded into one command buffer and submitted once. Ops
//! (ops/*.rs) record dispatches here; each dispatch takes a descriptor set of whole-buffer
//! bindings and 64 bytes of push constants. A memory barrier goes in only before a command
//! that touches a range an earlier command since the last barrier wrote (read after write,
//! write after write) or that it writes a range read since then (write after read), so
//! independent kernels (q, k and v projections; a quantization beside an unrelated GEMV) run
//! without one between them. Scratch buffers an
//! op needs (quantized activations, attention partials) live until the frame ends. A frame
//! borrows every buffer it records (`'a`), so none can be freed while its work is pending.
//!
//! Must not: validate op arguments (the op layer does before it records).

use super::command::Commands;
use super::context::{Context, DeviceBuffer, View};
use super::error::{Result, VkError};
use super::memory::MemoryUse;
use super::shaders::{FormatVariant, Kernel};
use ash::vk;
use std::sync::atomic::Ordering;

/// Push constants: 16 words; floats go in as their bits.
pub(crate) type Push = [u32; 16];

/// What a binding slot of a dispatch reads: a whole buffer's range (ops pass element
/// offsets in push constants), or nothing (a dummy the shader never reads). Resolved when the
/// op builds it, so scratch buffers of the frame can be bound while the frame records.
#[derive(Clone, Copy)]
pub(crate) struct Bind(Option<(vk::Buffer, u64, u64)>);

impl Bind {
    pub const UNUSED: Bind = Bind(None);

    pub fn buf(b: &DeviceBuffer) -> Bind {
        Bind(Some(b.binding()))
    }
}

/// Byte ranges touched since the last barrier: (buffer, start, end).
#[derive(Default)]
struct Hazards {
    written: Vec<(vk::Buffer, u64, u64)>,
    read: Vec<(vk::Buffer, u64, u64)>,
}

fn overlaps(set: &[(vk::Buffer, u64, u64)], r: (vk::Buffer, u64, u64)) -> bool {
    set.iter().any(|&(b, s, e)| b == r.0 && s < r.2 && r.1 < e)
}

impl Hazards {
    /// Whether a command reading `reads` and writing `writes` must wait for earlier ones.
    fn conflicts(&self, reads: &[(vk::Buffer, u64, u64)], writes: &[(vk::Buffer, u64, u64)]) -> bool {
        reads.iter().any(|&r| overlaps(&self.written, r)) || writes.iter().any(|&w| overlaps(&self.written, w) || overlaps(&self.read, w))
    }

    fn note(&mut self, reads: &[(vk::Buffer, u64, u64)], writes: &[(vk::Buffer, u64, u64)]) {
        self.read.extend_from_slice(reads);
        self.written.extend_from_slice(writes);
    }
}

pub struct Frame<'a> {
    pub(crate) ctx: &'a Context,
    cmds: Commands,
    hazards: Hazards,
    barriers: u64,
    scratch: Vec<DeviceBuffer>,
    dummy: Option<DeviceBuffer>,
    dispatches: u64,
}

impl<'a> Frame<'a> {
    pub(crate) fn new(ctx: &'a Context) -> Result<Frame<'a>> {
        ctx.shared.check_alive()?;
        // SAFETY: the device is live (the context holds it).
        let cmds = unsafe { Commands::new(&ctx.shared.dev.raw, ctx.shared.caps.compute_family)? };
        Ok(Frame { ctx, cmds, hazards: Hazards::default(), barriers: 0, scratch: Vec::new(), dummy: None, dispatches: 0 })
    }

    /// Dispatches recorded in this frame.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches
    }

    /// Barriers recorded in this frame (fewer than dispatches when kernels are independent).
    pub fn barrier_count(&self) -> u64 {
        self.barriers
    }

    /// Puts a barrier before a command that reads `reads` and writes `writes` when it
    /// depends on an earlier one, then notes its ranges.
    fn order(&mut self, reads: &[(vk::Buffer, u64, u64)], writes: &[(vk::Buffer, u64, u64)]) {
        if self.hazards.conflicts(reads, writes) {
            // SAFETY: the command buffer is recording.
            unsafe { self.cmds.barrier(&self.ctx.shared.dev.raw, false) };
            self.hazards = Hazards::default();
            self.barriers += 1;
        }
        self.hazards.note(reads, writes);
    }

    /// A device buffer of `len` elements that lives until the frame ends; returns its index
    /// in the frame's scratch list.
    pub(crate) fn scratch(&mut self, len: usize) -> Result<usize> {
        let b = self.ctx.buffer(MemoryUse::Device, len.max(1) * 4)?;
        self.scratch.push(b);
        Ok(self.scratch.len() - 1)
    }

    /// The binding of scratch buffer `i`.
    pub(crate) fn scratch_bind(&self, i: usize) -> Bind {
        Bind::buf(&self.scratch[i])
    }

    /// Records `kernel` over `groups` workgroups with `binds` in binding order.
    pub(crate) fn dispatch(&mut self, kernel: Kernel, variant: Option<FormatVariant>, binds: &[Bind], push: &Push, groups: [u32; 3]) -> Result<()> {
        if groups.iter().any(|&g| g == 0) {
            return Ok(());
        }
        let pipe = self.ctx.shared.pipe(kernel, variant)?;
        if self.dummy.is_none() {
            self.dummy = Some(self.ctx.buffer(MemoryUse::Device, 16)?);
        }
        let dummy = self.dummy.as_ref().unwrap().binding();
        let written = kernel.written_bindings();
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for (i, b) in binds.iter().enumerate() {
            if let Some((buf, off, len)) = b.0 {
                let range = (buf, off, off + len);
                if written.contains(&(i as u32)) { writes.push(range) } else { reads.push(range) }
            }
        }
        self.order(&reads, &writes);
        let infos: Vec<vk::DescriptorBufferInfo> = (0..pipe.bindings as usize)
            .map(|i| {
                let (buffer, offset, range) = binds.get(i).and_then(|b| b.0).unwrap_or(dummy);
                vk::DescriptorBufferInfo::default().buffer(buffer).offset(offset).range(range)
            })
            .collect();
        let dev = &self.ctx.shared.dev.raw;
        // SAFETY: the set layout, pipeline and buffers are live (the buffers are borrowed for
        // 'a or owned by the frame); the command buffer is recording.
        unsafe {
            let set = self.cmds.descriptor_set(dev, pipe.set_layout)?;
            let writes: Vec<vk::WriteDescriptorSet> = infos
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(i as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(std::slice::from_ref(info))
                })
                .collect();
            dev.update_descriptor_sets(&writes, &[]);
            dev.cmd_bind_pipeline(self.cmds.cmd, vk::PipelineBindPoint::COMPUTE, pipe.pipeline);
            dev.cmd_bind_descriptor_sets(self.cmds.cmd, vk::PipelineBindPoint::COMPUTE, pipe.layout, 0, &[set], &[]);
            let bytes: Vec<u8> = push.iter().flat_map(|w| w.to_ne_bytes()).collect();
            dev.cmd_push_constants(self.cmds.cmd, pipe.layout, vk::ShaderStageFlags::COMPUTE, 0, &bytes);
            dev.cmd_dispatch(self.cmds.cmd, groups[0], groups[1], groups[2]);
        }
        self.dispatches += 1;
        Ok(())
    }

    /// The workgroup size the device-sized kernels run with.
    pub(crate) fn device_workgroup(&self, kernel: Kernel, variant: Option<FormatVariant>) -> Result<u32> {
        Ok(self.ctx.shared.pipe(kernel, variant)?.workgroup)
    }

    /// Copies `len` bytes between buffers.
    pub fn copy_bytes(&mut self, src: &DeviceBuffer, src_off: usize, dst: &DeviceBuffer, dst_off: usize, len: usize) -> Result<()> {
        if src_off + len > src.len_bytes() || dst_off + len > dst.len_bytes() {
            return Err(VkError::BadArgument { op: "copy", msg: format!("{len} bytes from {src_off} of {} to {dst_off} of {}", src.len_bytes(), dst.len_bytes()) });
        }
        let (sb, so, _) = src.binding();
        let (db, doff, _) = dst.binding();
        let (s0, d0) = (so + src_off as u64, doff + dst_off as u64);
        self.order(&[(sb, s0, s0 + len as u64)], &[(db, d0, d0 + len as u64)]);
        let region = [vk::BufferCopy::default().src_offset(s0).dst_offset(d0).size(len as u64)];
        // SAFETY: both buffers are live for the frame; the ranges were checked.
        unsafe { self.ctx.shared.dev.raw.cmd_copy_buffer(self.cmds.cmd, sb, db, &region) };
        Ok(())
    }

    /// Copies f32 elements between views (`src.len` of them).
    pub fn copy(&mut self, src: View<'a>, dst: View<'a>) -> Result<()> {
        src.check("copy", "source", 0)?;
        dst.check("copy", "destination", src.len)?;
        self.copy_bytes(src.buf, src.offset * 4, dst.buf, dst.offset * 4, src.len * 4)
    }

    /// Submits the frame and waits for it; scratch buffers are released after.
    pub fn run(self) -> Result<()> {
        // SAFETY: the command buffer is recording and references live objects only.
        let r = unsafe { self.ctx.shared.submit_and_wait(&self.cmds) };
        if r.is_ok() {
            self.ctx.shared.dispatches.fetch_add(self.dispatches, Ordering::Relaxed);
        }
        r
    }
}

impl Drop for Frame<'_> {
    fn drop(&mut self) {
        // SAFETY: `run` waited for the fence (or the submission never happened, or the device
        // is lost, where destroying is allowed); idle the device when the wait failed.
        unsafe {
            let dev = &self.ctx.shared.dev.raw;
            if dev.get_fence_status(self.cmds.fence) == Ok(false) && !self.ctx.is_lost() {
                let _ = dev.device_wait_idle();
            }
            self.cmds.destroy(dev);
        }
        self.scratch.clear();
    }
}
