//! The Vulkan context: instance, chosen device, memory arenas, pipelines and the queue, shared
//! (`Arc`) by every buffer and frame made from it, so nothing outlives the device. Buffers
//! (`DeviceBuffer`, viewed as `View`s of f32/u32 elements) are sub-allocations that free
//! themselves on drop; `write`/`read` go through a mapping where the memory is mapped and
//! through staging copies where it is not. Submission counts submits (fault injection) and
//! turns a lost device into a sticky `VkError::DeviceLost`; under the validation layer
//! (`Validation::On`) a submission after the layer reported errors fails with
//! `VkError::Validation`. The context keeps frames' spare
//! recording resources (`trim` releases them), the host time spent recording and waiting, and,
//! when profiling, the device time of every kernel.
//!
//! Must not: know about ops or tensors beyond bytes (ops.rs and layout.rs do).

use super::arena::{Allocation, Allocator, MemoryStats};
use super::command::Commands;
use super::device::{self, Device, DeviceCaps};
use super::error::{Result, VkError, VkResultExt};
use super::frame::{Frame, FrameRes};
use super::instance::Instance;
use super::kv_type::KvType;
use super::memory::{place, MemoryProps, MemoryUse, Placement};
use super::options::{
    CoopMatUse, DeviceRole, FaultInjection, IntDotUse, VkOptions, DEFAULT_GEMV_ROWS, DEFAULT_MOE_GEMV_ROWS,
    DEFAULT_MOE_PAIR_ROWS,
};
use super::pipeline::{Pipe, PipelineCache};
use super::shaders::{FormatVariant, Kernel};
use super::validation::ValidationCounts;
use crate::bytes::as_bytes;
use ash::vk;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// How long a submission may take before we call the device lost.
const WAIT_NS: u64 = 120_000_000_000;

/// Serializes creating and destroying contexts in one process. Workaround: NVIDIA's driver
/// (580, H200) hung in about one run in three when six threads each created and destroyed
/// their own instance and device at once (the parallel `vk_memory` tests); never on Lavapipe.
static LIFECYCLE: Mutex<()> = Mutex::new(());

pub(crate) struct Shared {
    pub dev: Device,
    pub caps: DeviceCaps,
    pub pd: vk::PhysicalDevice,
    /// The physical device's place in the enumeration (two contexts with the same index share
    /// one physical device).
    pub index: usize,
    pub mem: Mutex<Allocator>,
    pub pipes: Mutex<PipelineCache>,
    queue: Mutex<()>,
    faults: FaultInjection,
    /// Dense products of at most this many rows take the GEMV (`VkOptions::gemv_rows`).
    gemv_rows: usize,
    /// Routed-expert products of at most this many rows take per-pair GEMVs.
    moe_gemv_rows: usize,
    /// Of those, products of at most this many rows take a GEMV per pair, more one per expert.
    moe_pair_rows: usize,
    /// The most bytes a buffer of a resident expert stack takes (`VkOptions::expert_page_bytes`
    /// within the device's limits).
    expert_page_bytes: u64,
    /// The attention layers' K/V mirror type (`VkOptions::kv_mirror`, where the device can).
    kv_mirror: KvType,
    submits: AtomicU64,
    pub dispatches: AtomicU64,
    /// Host nanoseconds spent recording frames (from the frame's start to its end).
    pub record_ns: AtomicU64,
    /// Host nanoseconds from submitting a frame to its fence.
    pub wait_ns: AtomicU64,
    lost: AtomicBool,
    /// Recording resources of ended frames, for the next ones.
    spares: Mutex<Vec<FrameRes>>,
    /// Per label (kernel and variant, or `copy`): commands timed and device nanoseconds.
    profile: Option<Mutex<HashMap<String, (u64, f64)>>>,
    /// With the profile: per host phase of a frame's run (`Context::note_host`): times and
    /// host nanoseconds.
    host_profile: Option<Mutex<HashMap<&'static str, (u64, f64)>>>,
    // Destroyed last (in `drop`, under the lifecycle lock): everything above is made from it.
    pub inst: std::mem::ManuallyDrop<Instance>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn mem(&self) -> MutexGuard<'_, Allocator> {
        lock(&self.mem)
    }

    pub fn check_alive(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            return Err(VkError::DeviceLost { injected: false });
        }
        Ok(())
    }

    pub fn pipe(&self, kernel: Kernel, variant: Option<FormatVariant>) -> Result<Pipe> {
        // SAFETY: the cache belongs to this device.
        unsafe { lock(&self.pipes).get(&self.dev, &self.caps, kernel, variant) }
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    pub fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    pub fn take_spare(&self) -> Option<FrameRes> {
        lock(&self.spares).pop()
    }

    /// Keeps `res` for a later frame (at most `max` are kept; the rest are destroyed).
    ///
    /// # Safety
    /// Nothing recorded with `res` may be pending.
    pub unsafe fn put_spare(&self, res: FrameRes, max: usize) {
        let mut s = lock(&self.spares);
        if s.len() < max {
            s.push(res);
        } else {
            drop(s);
            res.destroy(self);
        }
    }

    /// Destroys the spare recording resources (their scratch memory goes back to the arenas).
    pub fn drop_spares(&self) {
        let spares = std::mem::take(&mut *lock(&self.spares));
        for r in spares {
            // SAFETY: spares are idle by construction (`put_spare`).
            unsafe { r.destroy(self) };
        }
    }

    /// Adds the device time between consecutive timestamps of a finished submission of `cmds`
    /// to the profile, timestamp `i + 1` closing `labels[i]`.
    pub fn note_stamps(&self, cmds: &Commands, labels: &[String]) {
        let Some(profile) = &self.profile else { return };
        let n = (labels.len() + 1).min(cmds.query_cap as usize);
        if n < 2 {
            return;
        }
        let mut t = vec![0u64; n];
        // SAFETY: the queries were written by a submission that has finished (the caller waited).
        let r = unsafe { self.dev.raw.get_query_pool_results(cmds.queries, 0, &mut t, vk::QueryResultFlags::TYPE_64) };
        if r.is_err() {
            return;
        }
        let period = self.caps.timestamp_period_ns as f64;
        let mut p = lock(profile);
        for i in 1..n {
            let e = p.entry(labels[i - 1].clone()).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += t[i].saturating_sub(t[i - 1]) as f64 * period;
        }
    }

    /// Ends the recording of `cmds` with a barrier toward host reads.
    ///
    /// # Safety
    /// `cmds` must be recording on this device.
    pub unsafe fn end_commands(&self, cmds: &Commands) -> Result<()> {
        let dev = &self.dev.raw;
        cmds.barrier_to_host(dev);
        dev.end_command_buffer(cmds.cmd).ctx("vkEndCommandBuffer")
    }

    /// Submits `cmds` and waits for its fence. A failure marks the device lost when the
    /// driver says so (or the fault injection does).
    ///
    /// # Safety
    /// `cmds` must be executable (ended), not pending, on this device, and reference only
    /// live objects.
    pub unsafe fn submit_and_wait(&self, cmds: &Commands) -> Result<()> {
        self.check_alive()?;
        let dev = &self.dev.raw;
        let t = Instant::now();
        dev.reset_fences(&[cmds.fence]).ctx("vkResetFences")?;
        let n = self.submits.fetch_add(1, Ordering::AcqRel) + 1;
        if self.faults.fail_submit == Some(n) {
            self.lost.store(true, Ordering::Release);
            return Err(VkError::DeviceLost { injected: true });
        }
        let bufs = [cmds.cmd];
        let si = [vk::SubmitInfo::default().command_buffers(&bufs)];
        let r = {
            let _q = lock(&self.queue);
            dev.queue_submit(self.dev.queue, &si, cmds.fence)
        };
        r.map_err(|e| self.note("vkQueueSubmit", e))?;
        let r = match dev.wait_for_fences(&[cmds.fence], true, WAIT_NS) {
            Ok(()) => Ok(()),
            Err(vk::Result::TIMEOUT) => Err(self.note("vkWaitForFences", vk::Result::ERROR_DEVICE_LOST)),
            Err(e) => Err(self.note("vkWaitForFences", e)),
        };
        self.wait_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r?;
        self.check_validation()
    }

    /// `VkError::Validation` when the validation layer reported errors since the last check.
    fn check_validation(&self) -> Result<()> {
        match self.inst.log.as_ref().and_then(|l| l.new_errors()) {
            Some((errors, first)) => Err(VkError::Validation { errors, first }),
            None => Ok(()),
        }
    }

    fn note(&self, call: &'static str, r: vk::Result) -> VkError {
        if r == vk::Result::ERROR_DEVICE_LOST {
            self.lost.store(true, Ordering::Release);
        }
        VkError::from_vk(call, r)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _serial = lock(&LIFECYCLE);
        // SAFETY: every buffer and frame holds an Arc to us, so none is alive; the device is
        // idled before its children are destroyed.
        unsafe {
            let _ = self.dev.raw.device_wait_idle();
            self.drop_spares();
            lock(&self.pipes).destroy(&self.dev.raw);
            lock(&self.mem).destroy_all(&self.dev.raw);
            self.dev.destroy();
            std::mem::ManuallyDrop::drop(&mut self.inst);
        }
    }
}

/// A Vulkan device ready to run coli's kernels. Cheap to clone (shared).
#[derive(Clone)]
pub struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Context {
    /// Opens the loader, chooses a device (`VkOptions::device_name`, else the best kind; or a
    /// second one beside it, `VkOptions::role`),
    /// and sets up memory placement. Fails with `NoLoader` / `NoDevice` on a machine without
    /// Vulkan, which the caller reports in one line.
    pub fn new(opts: &VkOptions) -> Result<Context> {
        let _serial = lock(&LIFECYCLE);
        let inst = Instance::new(&opts.validation)?;
        // SAFETY: the instance is live for these calls; the device made here is stored in
        // `Shared`, which destroys it before the instance.
        unsafe {
            let devices = device::enumerate(&inst)?;
            let cands: Vec<_> = devices.iter().map(|d| d.1.clone()).collect();
            let idx = match &opts.role {
                DeviceRole::Primary => device::choose_device(&cands, opts.device_name.as_deref())?,
                DeviceRole::Second { primary_name } => {
                    let primary = device::choose_device(&cands, primary_name.as_deref())?;
                    device::choose_second(&cands, primary, opts.device_name.as_deref())?
                }
            };
            let (pd, cand) = &devices[idx];
            let mut caps = device::query_caps(&inst, *pd, cand)?;
            if opts.coopmat == CoopMatUse::Off {
                caps.coopmat_i8 = None;
                caps.coopmat_f16 = false;
            }
            if opts.int_dot == IntDotUse::Off {
                caps.integer_dot_product = false;
            }
            if !opts.pipeline_stats {
                caps.pipeline_executable_info = false;
            } else if !caps.pipeline_executable_info {
                eprintln!(
                    "pipeline statistics: {} has no VK_KHR_pipeline_executable_properties; none printed",
                    caps.name
                );
            }
            let props = MemoryProps::from_vk(&inst.raw.get_physical_device_memory_properties(*pd));
            let placement = place(&props, opts.upload)?;
            let dev = Device::new(&inst, *pd, &caps)?;
            let align = caps.min_storage_offset_alignment.max(caps.non_coherent_atom_size);
            let max_range = caps.max_storage_buffer_range.min(caps.max_allocation_size.max(1 << 20));
            let fault = opts.fault.unwrap_or_default();
            let import = caps.external_memory_host.map(|align| super::arena::HostImport {
                ext: ash::ext::external_memory_host::Device::new(&inst.raw, &dev.raw),
                align,
            });
            let mem = Allocator::new(placement, props, opts.memory_cap, align, max_range, fault.fail_alloc, import)
                .with_addresses(caps.buffer_device_address);
            let kv_mirror = if caps.storage_16bit { opts.kv_mirror } else { KvType::F32 };
            Ok(Context {
                shared: Arc::new(Shared {
                    dev,
                    caps,
                    pd: *pd,
                    index: idx,
                    mem: Mutex::new(mem),
                    pipes: Mutex::new(PipelineCache::default()),
                    queue: Mutex::new(()),
                    faults: fault,
                    gemv_rows: opts.gemv_rows.unwrap_or(DEFAULT_GEMV_ROWS).max(1),
                    moe_gemv_rows: opts.moe_gemv_rows.unwrap_or(DEFAULT_MOE_GEMV_ROWS).max(1),
                    moe_pair_rows: opts.moe_pair_rows.unwrap_or(DEFAULT_MOE_PAIR_ROWS).max(1),
                    expert_page_bytes: opts.expert_page_bytes.map_or(max_range, |b| b.clamp(1, max_range)),
                    kv_mirror,
                    submits: AtomicU64::new(0),
                    dispatches: AtomicU64::new(0),
                    record_ns: AtomicU64::new(0),
                    wait_ns: AtomicU64::new(0),
                    lost: AtomicBool::new(false),
                    spares: Mutex::new(Vec::new()),
                    profile: opts.profile.then(|| Mutex::new(HashMap::new())),
                    host_profile: opts.profile.then(|| Mutex::new(HashMap::new())),
                    inst: std::mem::ManuallyDrop::new(inst),
                }),
            })
        }
    }

    pub fn caps(&self) -> &DeviceCaps {
        &self.shared.caps
    }

    /// Dense products of at most this many rows take the GEMV, more the tiled GEMMs.
    pub fn gemv_rows(&self) -> usize {
        self.shared.gemv_rows
    }

    /// Routed-expert products of at most this many rows take per-pair GEMVs, more the grouped
    /// GEMMs.
    pub fn moe_gemv_rows(&self) -> usize {
        self.shared.moe_gemv_rows
    }

    /// Routed-expert GEMVs of at most this many rows run per pair, more per expert.
    pub fn moe_pair_rows(&self) -> usize {
        self.shared.moe_pair_rows
    }

    /// The element type of the attention layers' K/V mirrors: `VkOptions::kv_mirror`, or f32
    /// on a device without 16-bit storage buffers.
    pub fn kv_mirror(&self) -> KvType {
        self.shared.kv_mirror
    }

    /// The most bytes one buffer of a layer's resident expert stack takes (`upload_expert_pages`).
    pub fn expert_page_bytes(&self) -> u64 {
        self.shared.expert_page_bytes
    }

    /// The physical device's place in the loader's enumeration: two contexts with the same
    /// index are two logical devices of one physical device (sharing its memory).
    pub fn physical_index(&self) -> usize {
        self.shared.index
    }

    pub fn placement(&self) -> Placement {
        self.shared.mem().placement()
    }

    /// One line for logs: device, kind, subgroup size, upload path, memory limit.
    pub fn describe(&self) -> String {
        let c = &self.shared.caps;
        let m = self.shared.mem();
        format!(
            "{} ({:?}, Vulkan {}.{}, subgroup {}, {} uploads, {} MiB usable{}{})",
            c.name,
            c.kind,
            vk::api_version_major(c.api_version),
            vk::api_version_minor(c.api_version),
            c.subgroup_size,
            if m.placement().staged { "staged" } else { "mapped" },
            m.limit() >> 20,
            match (c.coopmat_i8, c.cooperative_matrix) {
                (Some(s), _) => format!(
                    ", int8 cooperative matrix {}x{}x{}{}",
                    s.m,
                    s.n,
                    s.k,
                    if c.coopmat_f16 { " and f16 16x16x16" } else { "" }
                ),
                (None, true) => ", cooperative matrix".to_string(),
                _ => String::new(),
            },
            if c.integer_dot_product { ", integer dot product" } else { "" },
        )
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.shared.mem().stats()
    }

    /// Budget and usage per heap (`VK_EXT_memory_budget`), where the device reports them.
    pub fn memory_budget(&self) -> Option<Vec<(u64, u64)>> {
        if !self.shared.caps.memory_budget {
            return None;
        }
        let mut b = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut p = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut b);
        // SAFETY: the physical device belongs to the live instance.
        unsafe { self.shared.inst.raw.get_physical_device_memory_properties2(self.shared.pd, &mut p) };
        let n = p.memory_properties.memory_heap_count as usize;
        Some((0..n).map(|i| (b.heap_budget[i], b.heap_usage[i])).collect())
    }

    /// Free bytes of the heap device buffers come from (its budget less its usage), where the
    /// device reports them: not the largest heap's, which on a discrete GPU is the host's RAM.
    pub fn device_heap_free(&self) -> Option<u64> {
        let heap = self.shared.mem().device_heap();
        self.memory_budget()?.get(heap).map(|(budget, used)| budget.saturating_sub(*used))
    }

    /// Releases the spare recording resources frames keep for reuse, then the empty blocks
    /// the arenas keep.
    pub fn trim(&self) {
        self.shared.drop_spares();
        // SAFETY: empty blocks hold no allocation, so no pending work uses them.
        unsafe { self.shared.mem().trim(&self.shared.dev.raw) }
    }

    /// Host seconds spent recording frames and waiting for submissions, since the start.
    pub fn host_times(&self) -> (f64, f64) {
        let s = &self.shared;
        (s.record_ns.load(Ordering::Relaxed) as f64 * 1e-9, s.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9)
    }

    /// With `VkOptions::profile`: per kernel (and variant; `copy` for copies), commands timed
    /// and device seconds, largest first; and the profile starts over. Empty otherwise, or
    /// where the queue has no timestamps.
    pub fn take_profile(&self) -> Vec<(String, u64, f64)> {
        let Some(p) = &self.shared.profile else { return Vec::new() };
        let mut v: Vec<_> = std::mem::take(&mut *lock(p)).into_iter().map(|(k, (n, ns))| (k, n, ns * 1e-9)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// With `VkOptions::profile`: adds the host time since `since` to `phase` (the executor's
    /// phases of a frame's run: uploads, recording, the wait, read-backs); nothing otherwise.
    pub fn note_host(&self, phase: &'static str, since: Instant) {
        let Some(p) = &self.shared.host_profile else { return };
        let mut map = lock(p);
        let e = map.entry(phase).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += since.elapsed().as_nanos() as f64;
    }

    /// The host phases noted since the last call (`note_host`), as `take_profile`: phase,
    /// times, seconds, largest first; and they start over.
    pub fn take_host_profile(&self) -> Vec<(String, u64, f64)> {
        let Some(p) = &self.shared.host_profile else { return Vec::new() };
        let mut v: Vec<_> =
            std::mem::take(&mut *lock(p)).into_iter().map(|(k, (n, ns))| (k.to_string(), n, ns * 1e-9)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// With `Validation::On`: the validation layer's messages about this context so far.
    pub fn validation_counts(&self) -> Option<ValidationCounts> {
        self.shared.inst.log.as_ref().map(|l| l.counts())
    }

    /// With `Validation::On`: the texts of the validation errors not taken yet, which then
    /// neither fail a submission nor the process (a test that provokes errors on purpose takes
    /// them). Empty otherwise.
    pub fn take_validation_errors(&self) -> Vec<String> {
        self.shared.inst.log.as_ref().map(|l| l.take()).unwrap_or_default()
    }

    /// The raw device, for tests that drive it with Vulkan calls of their own (the validation
    /// test provokes an error through it). What is made through it is the caller's to destroy
    /// before the context drops.
    pub fn ash_device(&self) -> &ash::Device {
        &self.shared.dev.raw
    }

    /// With `VkOptions::pipeline_stats` on a device that reports them: the statistics line of
    /// every pipeline created so far, as printed (`pipeline KERNEL VARIANT: NAME=VALUE, ...`).
    /// Empty otherwise.
    pub fn pipeline_stats(&self) -> Vec<String> {
        lock(&self.shared.pipes).stats.clone()
    }

    /// Dispatches recorded so far (a test that work ran on the device reads this).
    pub fn dispatches(&self) -> u64 {
        self.shared.dispatches.load(Ordering::Relaxed)
    }

    pub fn submits(&self) -> u64 {
        self.shared.submits.load(Ordering::Relaxed)
    }

    pub fn is_lost(&self) -> bool {
        self.shared.is_lost()
    }

    /// Whether the host pool's memory can be the process's own pages (`MemoryUse::PoolImport`).
    pub fn imports_host_memory(&self) -> bool {
        self.shared.mem().imports()
    }

    /// A buffer of `bytes` for `usage` (contents undefined).
    pub fn buffer(&self, usage: MemoryUse, bytes: usize) -> Result<DeviceBuffer> {
        self.shared.check_alive()?;
        // SAFETY: the allocator belongs to this device.
        let mut mem = self.shared.mem();
        let alloc = unsafe { mem.alloc(&self.shared.dev.raw, usage, bytes as u64)? };
        let handle = mem.buffer(&alloc);
        drop(mem);
        Ok(DeviceBuffer { inner: Arc::new(BufInner { shared: self.shared.clone(), alloc, handle, len: bytes }) })
    }

    /// A device buffer of `len` f32 (or u32) elements.
    pub fn f32_buffer(&self, len: usize) -> Result<DeviceBuffer> {
        self.buffer(MemoryUse::Device, len * 4)
    }

    pub fn upload_f32(&self, data: &[f32]) -> Result<DeviceBuffer> {
        let b = self.f32_buffer(data.len())?;
        self.write(&b, 0, as_bytes(data))?;
        Ok(b)
    }

    pub fn upload_u32(&self, data: &[u32]) -> Result<DeviceBuffer> {
        let b = self.f32_buffer(data.len())?;
        self.write(&b, 0, as_bytes(data))?;
        Ok(b)
    }

    pub fn download_f32(&self, view: View) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; view.len * 4];
        self.read(view.buf, view.offset * 4, &mut bytes)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }

    fn check_range(buf: &DeviceBuffer, offset: usize, len: usize) -> Result<()> {
        if offset + len > buf.len_bytes() {
            return Err(VkError::BadArgument {
                op: "buffer access",
                msg: format!("bytes {offset}..{} of a {}-byte buffer", offset + len, buf.len_bytes()),
            });
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` of `buf`: straight through the mapping where there is
    /// one, else through a staging buffer and a copy.
    pub fn write(&self, buf: &DeviceBuffer, offset: usize, data: &[u8]) -> Result<()> {
        Self::check_range(buf, offset, data.len())?;
        self.shared.check_alive()?;
        if data.is_empty() {
            return Ok(());
        }
        if let Some((ptr, coherent, _)) = self.shared.mem().mapping(&buf.inner.alloc).filter(|m| m.1) {
            debug_assert!(coherent);
            // SAFETY: the range is inside this buffer's mapped allocation, which we own.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.add(offset), data.len()) };
            return Ok(());
        }
        let staging = self.buffer(MemoryUse::Upload, data.len())?;
        let (ptr, _, _) =
            self.shared.mem().mapping(&staging.inner.alloc).ok_or(VkError::NoMemoryType("mapped staging"))?;
        // SAFETY: the staging allocation is ours, mapped and coherent (upload types are).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        let mut f = self.frame()?;
        f.copy_bytes(&staging, 0, buf, offset, data.len())?;
        f.run()
    }

    /// Reads `out.len()` bytes at byte `offset` of `buf`: from the mapping where there is one,
    /// else through a read-back buffer.
    pub fn read(&self, buf: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        // SAFETY: `out` is `out.len()` writable bytes.
        unsafe { self.read_raw(buf, offset, out.as_mut_ptr(), out.len()) }
    }

    /// Appends `count` floats read at byte `offset` of `buf` to `out`, written once (no zeroed
    /// room first, as `read` into a grown vector needs); on an error `out` is as it was.
    pub fn read_append_f32(&self, buf: &DeviceBuffer, offset: usize, count: usize, out: &mut Vec<f32>) -> Result<()> {
        out.reserve(count);
        let spare = &mut out.spare_capacity_mut()[..count];
        // SAFETY: `spare` is `count` floats of `out`'s capacity; `read_raw` writes every byte of
        // them before it returns Ok, and only then does the length cover them.
        unsafe {
            self.read_raw(buf, offset, spare.as_mut_ptr().cast(), count * 4)?;
            out.set_len(out.len() + count);
        }
        Ok(())
    }

    /// # Safety
    /// `out` must be valid for writes of `len` bytes.
    pub(super) unsafe fn read_raw(&self, buf: &DeviceBuffer, offset: usize, out: *mut u8, len: usize) -> Result<()> {
        // SAFETY: the caller's `len` writable bytes at `out`; `src` is `len` bytes.
        self.read_with(buf, offset, len, |src| unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out, len) })
    }

    /// Calls `f` with bytes `offset..offset + len` of `buf` as the host sees them: the buffer's
    /// own mapping (no copy; invalidated first where not coherent), else a read-back copy.
    pub fn read_with<R>(&self, buf: &DeviceBuffer, offset: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        Self::check_range(buf, offset, len)?;
        self.shared.check_alive()?;
        if len == 0 {
            return Ok(f(&[]));
        }
        let direct = self.shared.mem().mapping(&buf.inner.alloc);
        let (src, holder) = match direct {
            Some(m) => (m, None),
            None => {
                let rb = self.buffer(MemoryUse::Readback, len)?;
                let mut f = self.frame()?;
                f.copy_bytes(buf, offset, &rb, 0, len)?;
                f.run()?;
                let m = self.shared.mem().mapping(&rb.inner.alloc).ok_or(VkError::NoMemoryType("mapped read-back"))?;
                (m, Some(rb))
            }
        };
        let (ptr, coherent, memory) = src;
        let at = if holder.is_some() { 0 } else { offset };
        // SAFETY: the range lies in a mapped allocation we hold (the copy's, when made, lives
        // to the end of this call); non-coherent memory is invalidated (whole mapping: always a
        // valid range) before it is read.
        unsafe {
            if !coherent {
                let r = [vk::MappedMemoryRange::default().memory(memory).offset(0).size(vk::WHOLE_SIZE)];
                self.shared.dev.raw.invalidate_mapped_memory_ranges(&r).ctx("vkInvalidateMappedMemoryRanges")?;
            }
            Ok(f(std::slice::from_raw_parts(ptr.add(at), len)))
        }
    }

    /// A frame: commands recorded into one command buffer, submitted by `Frame::run`.
    pub fn frame(&self) -> Result<Frame<'_>> {
        Frame::new(self, true)
    }

    /// A frame to record once and submit many times: `Frame::finish` gives the `Recorded`.
    pub fn recording(&self) -> Result<Frame<'_>> {
        Frame::new(self, false)
    }
}

/// A sub-allocated device buffer; returns its range to the arena when it and every
/// recording that binds it are gone.
pub struct DeviceBuffer {
    pub(crate) inner: Arc<BufInner>,
}

/// The allocation behind a `DeviceBuffer` (shared with the recordings that bind it).
pub(crate) struct BufInner {
    shared: Arc<Shared>,
    pub(crate) alloc: Allocation,
    handle: vk::Buffer,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:?}, {} bytes)", self.inner.alloc.usage, self.inner.len)
    }
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.inner.len
    }

    /// Size in 4-byte elements.
    pub fn len(&self) -> usize {
        self.inner.len / 4
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Elements `offset..offset + len` (4-byte elements); checked when an op uses it.
    pub fn view(&self, offset: usize, len: usize) -> View<'_> {
        View { buf: self, offset, len }
    }

    /// The whole buffer as a view.
    pub fn all(&self) -> View<'_> {
        View { buf: self, offset: 0, len: self.len() }
    }

    /// (buffer, byte offset, byte range) for a descriptor covering the whole allocation.
    pub(crate) fn binding(&self) -> (vk::Buffer, u64, u64) {
        (self.inner.handle, self.inner.alloc.offset, self.inner.alloc.size)
    }

    /// The device address of the buffer's first byte, where shaders can reach it so (the
    /// device's `bufferDeviceAddress`; not imported host memory).
    pub(crate) fn address(&self) -> Option<u64> {
        let (shared, alloc) = (&self.inner.shared, &self.inner.alloc);
        let info = vk::BufferDeviceAddressInfo::default().buffer(self.inner.handle);
        // SAFETY: a live buffer (this handle owns its allocation), made with
        // SHADER_DEVICE_ADDRESS (every block but an imported one is, where the feature is on).
        (shared.caps.buffer_device_address && alloc.usage != MemoryUse::PoolImport)
            .then(|| unsafe { shared.dev.raw.get_buffer_device_address(&info) } + alloc.offset)
    }
}

impl Drop for BufInner {
    fn drop(&mut self) {
        // SAFETY: frames borrow the buffers they use and wait for their work before they end,
        // and recordings hold this allocation until they are dropped (after their last run
        // finished), so no pending work references it.
        unsafe { self.shared.mem().free(&self.shared.dev.raw, self.alloc) };
    }
}

/// A range of 4-byte elements of a buffer, as ops take their operands.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub buf: &'a DeviceBuffer,
    pub offset: usize,
    pub len: usize,
}

impl View<'_> {
    /// Checks that the view lies inside its buffer and holds at least `needed` elements.
    pub(crate) fn check(&self, op: &'static str, what: &'static str, needed: usize) -> Result<()> {
        if self.offset + self.len > self.buf.len() {
            return Err(VkError::BadArgument {
                op,
                msg: format!(
                    "{what}: view {}..{} past a buffer of {}",
                    self.offset,
                    self.offset + self.len,
                    self.buf.len()
                ),
            });
        }
        if self.len < needed {
            return Err(VkError::ViewTooSmall { op, what, needed, have: self.len });
        }
        Ok(())
    }
}
