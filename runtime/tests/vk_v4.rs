//! DeepSeek V4's device kernels against the CPU reference, on whatever device the machine has
//! (Lavapipe in CI): the unweighted RMSNorm, RoPE on the heads' last columns and inverted, ...
//! Random inputs from a seeded generator, odd sizes; each test states its tolerance, relative to
//! the largest |reference| of the output, and prints the error it measured.
//!
//! Must not: compare a device path with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{RopeScaling, RopeStyle};
use coli_runtime::cpu::{norm as cpu_norm, rope as cpu_rope};
use coli_runtime::vk::{RopePart, RopeShape};
use vk_common::{assert_close, ctx, rel_err, Rng};

/// Checks `got` against `want` within `tol` of the largest |want| and prints the error.
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) {
    eprintln!("{what}: {:.2e} of the largest (bound {tol:.0e})", rel_err(got, want));
    assert_close(what, got, want, tol);
}

/// The unweighted RMSNorm (`rms_norm_unweighted`: a weight of ones), per group of odd widths
/// and over whole rows, out of place and in place, plain and with an offset and a scale,
/// against `cpu::norm::rms_norm` with a weight of ones (as `cpu::run_op`). Tolerance 1e-5
/// (f32 sums of squares in another order; measured about 2e-7).
#[test]
fn rms_norm_unweighted_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4001);
    let (n, width) = (5, 111);
    for (group, offset, scale) in [(37, 0.0, 1.0), (111, 0.0, 1.0), (37, 0.5, 1.7)] {
        let x = rng.vec(n * width, 3.0);
        let mut want = vec![0f32; n * width];
        cpu_norm::rms_norm(&x, &mut want, &vec![1.0; group], 1e-6, offset);
        want.iter_mut().for_each(|v| *v *= scale);
        let (xb, ob) = (ctx.upload_f32(&x).unwrap(), ctx.f32_buffer(n * width).unwrap());
        let mut f = ctx.frame().unwrap();
        f.rms_norm_unweighted(xb.all(), ob.all(), (n, width, group), (1e-6, offset, scale)).unwrap();
        f.rms_norm_unweighted(xb.all(), xb.all(), (n, width, group), (1e-6, offset, scale)).unwrap();
        f.run().unwrap();
        let what = format!("rms_norm_unweighted group {group} offset {offset} scale {scale}");
        check(&what, &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        check(&format!("{what} in place"), &ctx.download_f32(xb.all()).unwrap(), &want, 1e-5);
    }
}

/// RoPE on the last `rotary_dim` columns of each head (`tail`), by the opposite angles
/// (`inverse`) and both, in both pair layouts, plain and YaRN-scaled, at positions into the
/// thousands, rows wider than their heads: against `cpu::rope::rotate_part`. Tolerance 1e-5
/// (the device's sin/cos after an explicit range reduction, as `rope_matches_cpu`).
#[test]
fn rope_tail_and_inverse_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4002);
    let (n, heads, head_dim) = (7, 3, 30);
    let width = heads * head_dim + 5;
    let yarn = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position: 16,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    for style in [RopeStyle::Interleaved, RopeStyle::RotateHalf] {
        for (rotary, scaling) in [(10, RopeScaling::None), (6, yarn)] {
            for (tail, inverse) in [(true, false), (false, true), (true, true)] {
                let (freq, mscale) = cpu_rope::inv_freq(rotary, 160000.0, scaling);
                let pos0 = 2047;
                let x = rng.vec(n * width, 1.0);
                let mut want = x.clone();
                let part = cpu_rope::Part { heads, head_dim, rotary_dim: rotary, tail, inverse };
                let mut cs = vec![0f32; 2 * freq.len()];
                for (i, row) in want.chunks_exact_mut(width).enumerate() {
                    cpu_rope::angles(&freq, mscale, pos0 + i, &mut cs);
                    cpu_rope::rotate_part(row, &part, style, &cs);
                }
                let (xb, fb) = (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&freq).unwrap());
                let skip = if tail { head_dim - rotary } else { 0 };
                let shape =
                    RopeShape { n, width, heads, head_dim, style, pos0, mscale, part: RopePart { skip, inverse } };
                let mut f = ctx.frame().unwrap();
                f.rope(xb.all(), fb.all(), shape).unwrap();
                f.run().unwrap();
                let what = format!("rope {style:?} rotary {rotary} tail {tail} inverse {inverse}");
                check(&what, &ctx.download_f32(xb.all()).unwrap(), &want, 1e-5);
            }
        }
    }
}
