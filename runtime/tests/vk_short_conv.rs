//! Inkling's short convolution on the device (`Frame::row_conv`: Gated DeltaNet's convolution
//! kernel in its row mode, the input added, the input scale) against the CPU's
//! (`cpu::short_conv::short_conv`, its input scaled first as `cpu::run_short_conv` scales it) on
//! Lavapipe: random taps and inputs, a prompt chunk of several rows then single rows and another
//! chunk, each from the ring the previous step left (the ring's continuity), with and without an
//! input scale, out of place and in place, for kernels of 4, 2 and 1 and a width that is not a
//! multiple of the workgroup.
//!
//! Tolerance: each step's output within 1e-5 of its largest |value| (the same sums in the same
//! order; only a fused multiply-add may round differently), and the ring the CPU's last
//! `kernel - 1` scaled inputs within 1e-6 of their largest |value| (a product each).

mod vk_common;

use coli_runtime::cpu::short_conv::short_conv;
use coli_runtime::vk::RowConv;
use vk_common::*;

fn run_case(width: usize, kernel: usize, scale: f32, in_place: bool, seed: u64) -> (f32, f32) {
    let Some(ctx) = ctx() else { return (0.0, 0.0) };
    let mut rng = Rng(seed);
    let taps = rng.vec(width * kernel, 0.5);
    let tb = ctx.upload_f32(&taps).unwrap();
    // A sequence starts from zeros (a new buffer may hold an earlier one's bytes).
    let ring = ctx.upload_f32(&vec![0.0; (width * (kernel - 1)).max(1)]).unwrap();
    let mut hist: Vec<f32> = Vec::new();
    let (mut out_err, mut ring_err) = (0f32, 0f32);
    for (step, n) in [5usize, 3, 1, 1, 1, 4].into_iter().enumerate() {
        let x = rng.vec(n * width, 2.0);
        let scaled: Vec<f32> = x.iter().map(|v| v * scale).collect();
        let mut want = vec![0f32; n * width];
        short_conv(&taps, kernel, &scaled, width, &mut hist, &mut want);
        let xb = ctx.upload_f32(&x).unwrap();
        let ob = ctx.f32_buffer(n * width).unwrap();
        let out = if in_place { &xb } else { &ob };
        let mut f = ctx.frame().unwrap();
        let args = RowConv {
            x: xb.all(),
            taps: tb.all(),
            ring: ring.view(0, width * (kernel - 1)),
            out: out.view(0, n * width),
            n,
            width,
            kernel,
            input_scale: scale,
        };
        f.row_conv(args).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(out.all()).unwrap();
        let what =
            format!("width {width}, kernel {kernel}, scale {scale}, in place {in_place}, step {step} ({n} rows)");
        out_err = out_err.max(rel_err(&got[..n * width], &want));
        assert_close(&what, &got[..n * width], &want, 1e-5);
        // The ring: the last kernel - 1 scaled inputs (zeros before position 0).
        let h = kernel - 1;
        let len = hist.len() / width;
        let mut want_ring = vec![0f32; h * width];
        for i in 0..h.min(len) {
            let src = len - h.min(len) + i;
            let dst = h - h.min(len) + i;
            want_ring[dst * width..(dst + 1) * width].copy_from_slice(&hist[src * width..(src + 1) * width]);
        }
        if h > 0 {
            let got_ring = ctx.download_f32(ring.view(0, h * width)).unwrap();
            ring_err = ring_err.max(rel_err(&got_ring, &want_ring));
            assert_close(&format!("{what}: ring"), &got_ring, &want_ring, 1e-6);
        }
    }
    (out_err, ring_err)
}

#[test]
fn short_conv_matches_cpu_over_chunks_then_single_rows() {
    let (mut out, mut ring) = (0f32, 0f32);
    for (i, &(width, kernel, scale, in_place)) in [
        (200, 4, 1.0, false),
        (200, 4, 0.37, false),
        (200, 4, 1.0, true),
        (130, 4, -1.7, true),
        (64, 2, 1.0, false),
        (70, 1, 0.5, true),
    ]
    .iter()
    .enumerate()
    {
        let (o, r) = run_case(width, kernel, scale, in_place, 0x5c0_0001 + i as u64);
        (out, ring) = (out.max(o), ring.max(r));
    }
    eprintln!("short_conv: worst output {out:.2e} (bound 1e-5), worst ring {ring:.2e} (bound 1e-6) of the largest");
}
