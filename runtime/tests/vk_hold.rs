//! The clock hold (`vk::hold`) on whatever device the machine has: its kernel runs and writes
//! nothing; the hold runs where the device has a second compute queue (NVIDIA's), and a device
//! of one queue (Lavapipe) has none.
//!
//! Must not: run long on Lavapipe.

mod vk_common;

use vk_common::ctx;

/// The clock hold's kernel runs and writes nothing (its result is never non-finite); the hold
/// runs on a device with a second compute queue while held, and a device of one queue (Lavapipe)
/// has none.
#[test]
fn the_clock_hold_kernel_writes_nothing_and_the_hold_runs_where_a_second_queue_exists() {
    let Some(ctx) = ctx() else { return };
    let out = ctx.upload_f32(&[7.0; 32]).unwrap();
    let mut f = ctx.frame().unwrap();
    coli_runtime::vk::hold::record_into(&mut f, &out, 4096).unwrap();
    f.run().unwrap();
    assert_eq!(ctx.download_f32(out.all()).unwrap(), vec![7.0; 32]);
    match ctx.clock_hold() {
        None => assert!(!ctx.caps().second_compute_queue),
        Some(h) => {
            assert!(ctx.caps().second_compute_queue);
            let t = std::time::Instant::now();
            {
                let _g = h.hold();
                while h.runs() < 2 && h.failed().is_none() && t.elapsed().as_secs() < 10 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            assert_eq!(h.failed(), None);
            assert!(h.runs() >= 2, "{} hold runs", h.runs());
        }
    }
}
