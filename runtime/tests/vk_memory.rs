//! Device memory and faults on the real device (Lavapipe in CI): staged uploads give the same
//! results as mapped ones, the memory cap makes a device small, running out and injected
//! allocation and submit failures are typed errors, and nothing leaks after any of them.
//!
//! Must not: depend on the device's real size (every limit here is a cap or an injection).

mod vk_common;

use coli_runtime::format::{matmul, Matrix, WeightFormat};
use coli_runtime::vk::{Broadcast, FaultInjection, MemoryUse, UploadPath, VkError, VkOptions};
use vk_common::{assert_close, open, random_rows, Rng};

/// Staged uploads (the path of a discrete card without Resizable BAR) and read-backs through
/// a copy give the CPU's results, like the mapped path. Tolerance 1e-5 as in vk_ops.
#[test]
fn staged_uploads_match_the_cpu() {
    let Some(ctx) = open(&VkOptions { upload: UploadPath::Staged, ..Default::default() }) else { return };
    let p = ctx.placement();
    assert!(p.staged && !p.device_mapped, "{p:?}");
    let mut rng = Rng(0x5eed_0101);
    let (rows, cols, n) = (33, 96, 2);
    let bytes = random_rows(WeightFormat::Q8_0, rows, cols, &mut rng);
    let w = ctx.upload_matrix(WeightFormat::Q8_0, rows, cols, &bytes).unwrap();
    let x = rng.vec(n * cols, 1.0);
    let mut want = vec![0f32; n * rows];
    matmul(&Matrix::new(WeightFormat::Q8_0, rows, cols, &bytes).unwrap(), &x, n, &mut want);
    let xb = ctx.upload_f32(&x).unwrap();
    assert_eq!(ctx.download_f32(xb.all()).unwrap(), x, "a staged round trip is exact");
    let ob = ctx.f32_buffer(n * rows).unwrap();
    let mut f = ctx.frame().unwrap();
    f.matmul(&w, xb.all(), n, ob.all()).unwrap();
    f.run().unwrap();
    assert_close("staged Q8_0 matmul", &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
    assert!(ctx.describe().contains("staged uploads"), "{}", ctx.describe());
}

/// A capped device refuses what does not fit with a typed error, and keeps working.
#[test]
fn memory_cap_makes_the_device_small() {
    let cap = 1 << 20;
    let Some(ctx) = open(&VkOptions { memory_cap: Some(cap), ..Default::default() }) else { return };
    let small = ctx.f32_buffer(1000).unwrap();
    let err = ctx.buffer(MemoryUse::Device, 2 << 20).unwrap_err();
    match &err {
        VkError::OutOfMemory { requested, limit, injected: false, .. } => {
            assert!(*requested >= 2 << 20 && *limit == cap, "{err}");
        }
        e => panic!("expected out of memory, got {e}"),
    }
    assert!(err.is_device_failure());
    // Still usable after the refusal.
    let mut f = ctx.frame().unwrap();
    f.add(small.all(), small.all(), small.all(), 1, 1000, Broadcast::None).unwrap();
    f.run().unwrap();
    drop(small);
    ctx.trim();
    assert_eq!(ctx.memory_stats().device_bytes, 0, "{:?}", ctx.memory_stats());
}

/// A cap holds what it says: device buffers fill it up to the last request that fits (the
/// allocator's last blocks shrink to what is left), and staging and read-back buffers do not
/// count against it.
#[test]
fn a_cap_is_usable_to_its_last_bytes() {
    let cap = 10 << 20;
    let Some(ctx) = open(&VkOptions { memory_cap: Some(cap), ..Default::default() }) else { return };
    // A buffer of its own (1.5 MiB), then pieces of 256 KiB into shared blocks (an eighth of
    // the cap, five pieces each): six whole blocks, then a last one of the 1 MiB left.
    let big = ctx.buffer(MemoryUse::Device, 3 << 19).unwrap();
    let piece = 256 << 10;
    let mut held = vec![big];
    while let Ok(b) = ctx.buffer(MemoryUse::Device, piece) {
        held.push(b);
    }
    assert_eq!(
        held.len() - 1,
        (cap as usize - (3 << 19)) / piece,
        "pieces of {piece} B beside 1.5 MiB under a cap of {cap} B"
    );
    let back = ctx.buffer(MemoryUse::Readback, 1 << 20).expect("read-backs are not counted against the cap");
    let up = ctx.buffer(MemoryUse::Upload, 1 << 20).expect("uploads are not counted against the cap");
    assert!(ctx.memory_stats().device_bytes <= cap, "{:?}", ctx.memory_stats());
    drop((back, up, held));
    ctx.trim();
    assert_eq!(ctx.memory_stats().device_bytes, 0, "{:?}", ctx.memory_stats());
}

/// Sub-allocations share blocks, and freeing them all leaves nothing behind.
#[test]
fn buffers_share_blocks_and_free_everything() {
    let Some(ctx) = open(&VkOptions::default()) else { return };
    let bufs: Vec<_> = (0..50).map(|i| ctx.f32_buffer(100 + i).unwrap()).collect();
    let s = ctx.memory_stats();
    assert_eq!(s.blocks, 1, "50 small buffers fit one block: {s:?}");
    assert!(s.used_bytes >= 50 * 400);
    drop(bufs);
    assert_eq!(ctx.memory_stats().used_bytes, 0);
    ctx.trim();
    assert_eq!(ctx.memory_stats().device_bytes, 0);
}

/// The n-th device allocation fails as injected; nothing leaks, and later ones succeed.
#[test]
fn injected_allocation_failure_is_an_error_and_leaks_nothing() {
    let fault = FaultInjection { fail_alloc: Some(3), ..Default::default() };
    let Some(ctx) = open(&VkOptions { fault: Some(fault), ..Default::default() }) else { return };
    // Each 48 MiB request takes a block of its own (above half the 64 MiB block size).
    let a = ctx.buffer(MemoryUse::Device, 48 << 20).unwrap();
    let b = ctx.buffer(MemoryUse::Device, 48 << 20).unwrap();
    let before = ctx.memory_stats();
    let err = ctx.buffer(MemoryUse::Device, 48 << 20).unwrap_err();
    assert!(matches!(err, VkError::OutOfMemory { injected: true, .. }), "{err}");
    assert_eq!(ctx.memory_stats().device_bytes, before.device_bytes, "the failed allocation holds nothing");
    let c = ctx.buffer(MemoryUse::Device, 48 << 20).unwrap();
    drop((a, b, c));
    ctx.trim();
    assert_eq!(ctx.memory_stats().device_bytes, 0);
}

/// The n-th submit fails as a lost device: the error is typed, the context stays lost (the
/// executor re-runs on the CPU), and every buffer still frees.
#[test]
fn injected_submit_failure_loses_the_device_and_leaks_nothing() {
    let fault = FaultInjection { fail_submit: Some(2), ..Default::default() };
    let Some(ctx) = open(&VkOptions { fault: Some(fault), upload: UploadPath::Mapped, ..Default::default() }) else {
        return;
    };
    let x = ctx.upload_f32(&[1.0, 2.0]).unwrap();
    let mut f = ctx.frame().unwrap();
    f.add(x.all(), x.all(), x.all(), 1, 2, Broadcast::None).unwrap();
    f.run().unwrap();
    let mut f = ctx.frame().unwrap();
    f.add(x.all(), x.all(), x.all(), 1, 2, Broadcast::None).unwrap();
    let err = f.run().unwrap_err();
    assert!(matches!(err, VkError::DeviceLost { injected: true }), "{err}");
    assert!(err.is_device_failure() && ctx.is_lost());
    assert!(matches!(ctx.frame().map(|_| ()), Err(VkError::DeviceLost { .. })));
    assert!(ctx.f32_buffer(4).is_err());
    drop(x);
    assert_eq!(ctx.memory_stats().used_bytes, 0);
    ctx.trim();
    assert_eq!(ctx.memory_stats().device_bytes, 0);
}

/// The device line names the device; the budget query answers where the extension exists, and
/// the device heap's free bytes are one heap's.
#[test]
fn context_describes_itself() {
    let Some(ctx) = open(&VkOptions::default()) else { return };
    let line = ctx.describe();
    assert!(line.starts_with(&ctx.caps().name), "{line}");
    assert!(ctx.caps().subgroup_size >= 1);
    if ctx.caps().memory_budget {
        let heaps = ctx.memory_budget().unwrap();
        assert!(!heaps.is_empty());
        // The plan's budget is the free memory of the heap device buffers come from: one of
        // the heaps, at most its budget (not the largest heap's, the host's RAM on a discrete
        // GPU).
        let free = ctx.device_heap_free().expect("the device heap's budget");
        assert!(heaps.iter().any(|&(b, u)| b.saturating_sub(u) == free), "{free} of {heaps:?}");
    } else {
        assert_eq!(ctx.device_heap_free(), None);
    }
    // A device named like nothing is a clear error.
    let err =
        coli_runtime::vk::Context::new(&VkOptions { device_name: Some("no such gpu".into()), ..Default::default() })
            .unwrap_err();
    assert!(matches!(err, VkError::NoDevice { .. }), "{err}");
}

/// `read_append_f32` appends exactly the floats asked for after what the vector held, from a
/// mapped buffer and through a staged read-back alike; a range past the buffer is an error that
/// leaves the vector as it was.
#[test]
fn reads_append_to_a_vector() {
    for upload in [UploadPath::Auto, UploadPath::Staged] {
        let Some(ctx) = open(&VkOptions { upload, ..Default::default() }) else { return };
        let x: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
        let b = ctx.upload_f32(&x).unwrap();
        let mut out = vec![1.0f32, 2.0];
        ctx.read_append_f32(&b, 10 * 4, 30, &mut out).unwrap();
        assert_eq!(out[..2], [1.0, 2.0]);
        assert_eq!(out[2..], x[10..40], "{upload:?}");
        ctx.read_append_f32(&b, 0, 0, &mut out).unwrap();
        assert_eq!(out.len(), 32);
        assert!(ctx.read_append_f32(&b, 90 * 4, 20, &mut out).is_err(), "past the end");
        assert_eq!(out.len(), 32, "an error appends nothing");
    }
}
