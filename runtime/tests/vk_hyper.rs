//! DeepSeek V4's hyper-connections and grouped output projection on the device against the CPU
//! reference (`cpu::hyper`), on whatever device the machine has (Lavapipe in CI): `hyper_pre`
//! (a layer's site and the head's; four streams and three, Sinkhorn iterations 20, 1 and 0),
//! `hyper_post` (apart, in place over the residual, and the embedding's copy into every
//! stream) and `grouped_linear` (float and int8 weights, one row and several, both precisions).
//! Random inputs from a seeded generator, widths that are not multiples of 64; each test states
//! its tolerance and prints the error it measured.
//!
//! Must not: compare a device path with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{HyperSpec, WeightRef};
use coli_runtime::cpu::hyper::{grouped_linear, hyper_post, hyper_pre, HyperWeights};
use coli_runtime::cpu::Precision;
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::{HyperMix, HyperShape};
use vk_common::{assert_close, random_rows, rel_err, Rng};

/// Checks `got` against `want` within `tol` of the largest |want| and prints the error.
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) {
    eprintln!("{what}: {:.2e} of the largest (bound {tol:.0e})", rel_err(got, want));
    assert_close(what, got, want, tol);
}

/// `hyper_pre` at a layer's site (mix: `[post, comb]`) and at the head (no mix), over 5 rows of
/// 4 streams of 100 and 3 streams of 77, f32 and bf16 mixing weights (the device's f32 copy of
/// them, as the frames upload them), Sinkhorn iterations 20, 1 and 0. Tolerance 1e-5 of the
/// largest value for the collapsed rows and for `[post, comb]` (sums of squares and the mixing
/// products in another order, the device's exp; measured below 1e-6).
#[test]
fn hyper_pre_matches_cpu() {
    let Some(ctx) = vk_common::ctx() else { return };
    let mut rng = Rng(0x5eed_4101);
    let n = 5;
    for (s, hidden, iters, site, format) in [
        (4, 100, 20, true, WeightFormat::F32),
        (3, 77, 1, true, WeightFormat::BF16),
        (3, 77, 0, true, WeightFormat::F32),
        (4, 100, 20, false, WeightFormat::BF16),
        (3, 77, 20, false, WeightFormat::F32),
    ] {
        let width = s * hidden;
        let rows = if site { (2 + s) * s } else { s };
        let fn_bytes = {
            let v = rng.vec(rows * width, 0.1);
            match format {
                WeightFormat::BF16 => v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            }
        };
        let m = Matrix::new(format, rows, width, &fn_bytes).unwrap();
        let mut fn_f32 = vec![0f32; rows * width];
        for (r, out) in fn_f32.chunks_exact_mut(width).enumerate() {
            dequant_row(format, m.row(r), out);
        }
        let base = rng.vec(rows, 0.5);
        let scale: Vec<f32> = (0..if site { 3 } else { 1 }).map(|_| 0.8 + 0.4 * rng.unit().abs()).collect();
        let spec = HyperSpec {
            streams: s,
            fn_weight: WeightRef::whole("fn", vec![rows, width]),
            base: WeightRef::whole("base", vec![rows]),
            scale: WeightRef::whole("scale", vec![scale.len()]),
            sinkhorn_iters: iters,
            eps: 1e-6,
            norm_eps: 1e-6,
        };
        let x = rng.vec(n * width, 2.0);
        let (mut want, mut want_mix) = (vec![0f32; n * hidden], vec![0f32; n * s * (s + 1)]);
        let w = HyperWeights { fn_weight: m, base: &base, scale: &scale };
        hyper_pre(&spec, &w, &x, n, &mut want, site.then_some(&mut want_mix[..]));

        let up = |v: &[f32]| ctx.upload_f32(v).unwrap();
        let (xb, fb, bb, sb) = (up(&x), up(&fn_f32), up(&base), up(&scale));
        let (ob, mb) = (ctx.f32_buffer(n * hidden).unwrap(), ctx.f32_buffer(n * s * (s + 1)).unwrap());
        let mix = HyperMix { fn_weight: fb.all(), base: bb.all(), scale: sb.all() };
        let shape = HyperShape { n, streams: s, hidden, sinkhorn_iters: iters, eps: 1e-6, norm_eps: 1e-6 };
        let mut f = ctx.frame().unwrap();
        f.hyper_pre(xb.all(), mix, ob.all(), site.then(|| mb.all()), shape).unwrap();
        f.run().unwrap();
        let what = format!("hyper_pre {s} streams of {hidden}, {format} fn, iters {iters}, site {site}");
        check(&what, &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        if site {
            check(&format!("{what}: post and comb"), &ctx.download_f32(mb.all()).unwrap(), &want_mix, 1e-5);
        }
    }
}

/// `hyper_post` over 5 rows of 4 streams of 100 and 3 of 77: the residual apart, the residual
/// as the output itself (in place), and without a mix (the input into every stream). Tolerance
/// 1e-6 of the largest value (S + 1 products summed in the CPU's order; measured 0 or a few ulp).
#[test]
fn hyper_post_matches_cpu_apart_and_in_place() {
    let Some(ctx) = vk_common::ctx() else { return };
    let mut rng = Rng(0x5eed_4102);
    let n = 5;
    for (s, hidden) in [(4, 100), (3, 77)] {
        let width = s * hidden;
        let x = rng.vec(n * hidden, 2.0);
        let res = rng.vec(n * width, 3.0);
        let mix: Vec<f32> = (0..n * s * (s + 1)).map(|_| rng.unit().abs()).collect();
        let mut want = vec![0f32; n * width];
        hyper_post(&x, Some(&res), Some(&mix), s, n, &mut want);
        let mut expand = vec![0f32; n * width];
        hyper_post(&x, None, None, s, n, &mut expand);

        let (xb, rb, mb) = (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&res).unwrap(), ctx.upload_f32(&mix).unwrap());
        let (ob, eb) = (ctx.f32_buffer(n * width).unwrap(), ctx.f32_buffer(n * width).unwrap());
        let mut f = ctx.frame().unwrap();
        f.hyper_post(xb.all(), Some((rb.all(), mb.all())), ob.all(), (n, s, hidden)).unwrap();
        f.hyper_post(xb.all(), None, eb.all(), (n, s, hidden)).unwrap();
        f.run().unwrap();
        let what = format!("hyper_post {s} streams of {hidden}");
        check(&what, &ctx.download_f32(ob.all()).unwrap(), &want, 1e-6);
        check(&format!("{what} without a mix"), &ctx.download_f32(eb.all()).unwrap(), &expand, 1e-6);

        // In place: the residual is the output.
        let mut f = ctx.frame().unwrap();
        f.hyper_post(xb.all(), Some((rb.all(), mb.all())), rb.all(), (n, s, hidden)).unwrap();
        f.run().unwrap();
        check(&format!("{what} in place"), &ctx.download_f32(rb.all()).unwrap(), &want, 1e-6);
        // A residual that overlaps the output without being it is refused.
        let mut f = ctx.frame().unwrap();
        let shifted = rb.view(hidden, (n - 1) * width);
        assert!(f.hyper_post(xb.all(), Some((rb.all(), mb.all())), shifted, (n - 1, s, hidden)).is_err());
    }
}

/// `grouped_linear` with f32, bf16, f16 and I8Row weights (I8Row's rows of 64 take q8
/// activations under `Precision::Fast`, its rows of 40 f32 ones), 4 groups of 24 x 64 and 3 of
/// 10 x 40, 1 row, 5 and 40 (a GEMM that takes the cooperative-matrix kernel for I8Row where
/// the device has one), both precisions, against `cpu::hyper::grouped_linear`. Tolerance 1e-5
/// of the largest output (f32 sums in another order; q8 activations quantized as the CPU does;
/// measured at most 3.2e-7).
#[test]
fn grouped_linear_matches_cpu() {
    let Some(ctx) = vk_common::ctx() else { return };
    let mut rng = Rng(0x5eed_4103);
    for format in [WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16, WeightFormat::I8Row] {
        for (groups, r, c) in [(4, 24, 64), (3, 10, 40)] {
            let bytes = random_rows(format, groups * r, c, &mut rng);
            let m = Matrix::new(format, groups * r, c, &bytes).unwrap();
            let mats: Vec<_> = (0..groups)
                .map(|g| {
                    let part = m.rows_range(g * r, (g + 1) * r);
                    ctx.upload_matrix(format, r, c, part.bytes()).unwrap()
                })
                .collect();
            for n in [1, 5, 40] {
                for precision in [Precision::Fast, Precision::Exact] {
                    let x = rng.vec(n * groups * c, 2.0);
                    let mut want = vec![0f32; n * groups * r];
                    grouped_linear(&m, groups, &x, n, &mut want, precision);
                    let xb = ctx.upload_f32(&x).unwrap();
                    let (sb, ob) = (ctx.f32_buffer(n * groups * c).unwrap(), ctx.f32_buffer(n * groups * r).unwrap());
                    let mut f = ctx.frame().unwrap();
                    f.grouped_linear(&mats, xb.all(), sb.all(), ob.all(), n, precision).unwrap();
                    f.run().unwrap();
                    let what = format!("grouped_linear {format} {groups} x {r} x {c}, {n} rows, {precision:?}");
                    check(&what, &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
                }
            }
        }
    }
}
