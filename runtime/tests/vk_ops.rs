//! Every Vulkan op against the CPU reference, on whatever device the machine has (Lavapipe in
//! CI): random inputs from a seeded generator (never zeros), odd and tail sizes, one test body
//! per op, the tolerance stated beside each. Tolerances are relative to the largest |reference|
//! of the output.
//!
//! Must not: compare a device path with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

// The CPU op library is the reference.
use coli_compiler::ir::{Activation, GluKind, GroupScore, RopeScaling, RopeStyle, RouterScoring};
use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::Precision;
use coli_runtime::cpu::{elementwise as cpu_elementwise, norm as cpu_norm, rope as cpu_rope, route as cpu_route};
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::{
    AttnArgs, AttnPath, Broadcast, IntDotUse, MatmulPath, NormArgs, RopePart, RopeShape, RouteParams, RouteSink,
    VkOptions,
};
use vk_common::{
    assert_close, assert_close_terms, attention_case, attention_case_kv, ctx, kv_types, random_rows, term_magnitudes,
    upload_kv, AttnCase, Rng,
};

/// Columns per format: tails for the formats that take any length, two or more blocks else.
fn cols_for(format: WeightFormat) -> &'static [usize] {
    match format {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => &[45, 160],
        WeightFormat::I8Row => &[45, 160],
        // 8448 columns: long rows, 264 blocks (many units per GEMV lane, 264 GEMM steps).
        f if f.block_size() == 256 => &[512, 8448],
        WeightFormat::I4G64 => &[192],
        // Blocks of 128: one, and 66 (long rows, many units per GEMV lane).
        WeightFormat::FP8_E4M3 => &[128, 8448],
        _ => &[96, 160],
    }
}

/// Matrix products, GEMV and tiled GEMM, every format, both precisions, against
/// `cpu::linear` (Fast: integer formats with q8 activations, which the device quantizes the
/// same way; Exact: f32 activations). Tolerance: 1e-5 of each output's sum of |w x| (f32
/// accumulation in another order; k-quant mins cancel, so the output itself can be small);
/// 5e-5 with q8 activations, where among 37 rows of 8448 activations one can quantize one step
/// away from the CPU's (a last-bit difference before the rounding, any format: measured 1.2e-5
/// for IQ2_S at 70 x 8448, n = 37; the GEMV and the GEMM agree within 4e-8 of each other).
#[test]
fn matmul_matches_cpu_for_every_format() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0001);
    for format in vk_common::device_formats() {
        for &cols in cols_for(format) {
            // 70 rows: decode GEMVs split each row over subgroups (`ksplit`);
            // `matvec_of_many_rows_matches_cpu` has one subgroup a row.
            let rows = 70;
            let bytes = random_rows(format, rows, cols, &mut rng);
            let m = Matrix::new(format, rows, cols, &bytes).unwrap();
            let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
            let cases = [
                (1, MatmulPath::Auto, Precision::Fast),
                (3, MatmulPath::Gemv, Precision::Fast),
                (2, MatmulPath::Auto, Precision::Fast),
                (37, MatmulPath::Gemm, Precision::Fast),
                (1, MatmulPath::Auto, Precision::Exact),
                (5, MatmulPath::Gemm, Precision::Exact),
            ];
            for (n, path, precision) in cases {
                let x = rng.vec(n * cols, 1.0);
                let mut want = vec![0f32; n * rows];
                linear(&m, &x, n, &mut want, precision);
                // Offsets inside larger buffers, to exercise the views.
                let xb = ctx.upload_f32(&[vec![9.0; 3], x.clone()].concat()).unwrap();
                let ob = ctx.f32_buffer(n * rows + 5).unwrap();
                let mut f = ctx.frame().unwrap();
                f.matmul_with(&w, xb.view(3, n * cols), n, ob.view(5, n * rows), path, precision).unwrap();
                f.run().unwrap();
                let got = ctx.download_f32(ob.view(5, n * rows)).unwrap();
                let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
                assert_close_terms(
                    &format!("{format} {rows}x{cols} n={n} {path:?} {precision:?}"),
                    &got,
                    &want,
                    &mag,
                    if precision == Precision::Fast { 5e-5 } else { 1e-5 },
                );
            }
        }
    }
}

/// `MatmulPath::Auto` past the GEMV's rows: a router's matrix (64 rows of 2048, f32) over 64
/// activation rows takes the GEMV (its output bit for bit the forced GEMV's: two f32 tiles would
/// leave the device idle), a wider one the tiled GEMM (bit for bit the forced GEMM's); each
/// within 1e-5 of the sum of |w x| of the CPU's.
#[test]
fn a_routers_product_of_many_rows_takes_the_gemv() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0042);
    for (rows, want_path) in [(64, MatmulPath::Gemv), (384, MatmulPath::Gemm)] {
        let (cols, n, format) = (2048, 64, WeightFormat::F32);
        let bytes = random_rows(format, rows, cols, &mut rng);
        let m = Matrix::new(format, rows, cols, &bytes).unwrap();
        let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
        let x = rng.vec(n * cols, 1.0);
        let mut want = vec![0f32; n * rows];
        linear(&m, &x, n, &mut want, Precision::Fast);
        let xb = ctx.upload_f32(&x).unwrap();
        let run = |path: MatmulPath| {
            let ob = ctx.f32_buffer(n * rows).unwrap();
            let mut f = ctx.frame().unwrap();
            f.matmul_with(&w, xb.all(), n, ob.all(), path, Precision::Fast).unwrap();
            f.run().unwrap();
            ctx.download_f32(ob.all()).unwrap()
        };
        let (auto, forced, other) = (run(MatmulPath::Auto), run(want_path), run(MatmulPath::Gemm));
        let what = format!("{rows}x{cols}, n={n}");
        assert!(auto.iter().zip(&forced).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: Auto is not {want_path:?}");
        if want_path == MatmulPath::Gemv {
            assert!(
                auto.iter().zip(&other).any(|(a, b)| a.to_bits() != b.to_bits()),
                "{what}: the two kernels agree bit for bit, the test tells nothing"
            );
        }
        let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
        assert_close_terms(&what, &auto, &want, &mag, 1e-5);
    }
}

/// The packed integer dot product (`IntDotUse::Auto`, where the device has it: Lavapipe does)
/// and the byte arithmetic (`IntDotUse::Off`) give the same bits: every integer format with
/// 8-bit activations, GEMV and GEMM, both against the CPU (1e-5 of the terms) and against
/// each other exactly (the integer sums are exact, the float steps the same).
#[test]
fn packed_dot_product_and_byte_arithmetic_agree_bit_for_bit() {
    let Some(auto) = ctx() else { return };
    let Some(off) = vk_common::open(&VkOptions { int_dot: IntDotUse::Off, ..Default::default() }) else { return };
    assert!(!off.caps().integer_dot_product, "IntDotUse::Off leaves the feature off");
    let mut rng = Rng(0x5eed_00d0);
    for format in vk_common::device_formats().into_iter().filter(|f| f.uses_q8_acts(256)) {
        let (rows, cols) = (70, if format.block_size() == 256 { 512 } else { 192 });
        let bytes = random_rows(format, rows, cols, &mut rng);
        let m = Matrix::new(format, rows, cols, &bytes).unwrap();
        for (n, path) in [(1, MatmulPath::Gemv), (5, MatmulPath::Gemm)] {
            let x = rng.vec(n * cols, 1.0);
            let mut want = vec![0f32; n * rows];
            linear(&m, &x, n, &mut want, Precision::Fast);
            let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
            let run = |ctx: &coli_runtime::vk::Context| {
                let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
                let (xb, ob) = (ctx.upload_f32(&x).unwrap(), ctx.f32_buffer(n * rows).unwrap());
                let mut f = ctx.frame().unwrap();
                f.matmul_with(&w, xb.all(), n, ob.all(), path, Precision::Fast).unwrap();
                f.run().unwrap();
                ctx.download_f32(ob.all()).unwrap()
            };
            let (a, b) = (run(auto), run(&off));
            let what = format!("{format} {rows}x{cols} n={n} {path:?}");
            assert_close_terms(&format!("{what} packed dot"), &a, &want, &mag, 1e-5);
            assert_close_terms(&format!("{what} byte arithmetic"), &b, &want, &mag, 1e-5);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: the two paths differ");
        }
    }
}

/// Decode GEMVs past `ksplit`'s row count (one subgroup a row), a float and an integer format
/// against the CPU; tolerance 1e-5 of the terms' magnitudes.
#[test]
fn matvec_of_many_rows_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0002);
    for format in [WeightFormat::F32, WeightFormat::BF16, WeightFormat::I8Row, WeightFormat::Q8_0] {
        let (rows, cols) = (515, 96);
        let bytes = random_rows(format, rows, cols, &mut rng);
        let m = Matrix::new(format, rows, cols, &bytes).unwrap();
        let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
        for n in [1, 2] {
            let x = rng.vec(n * cols, 1.0);
            let mut want = vec![0f32; n * rows];
            linear(&m, &x, n, &mut want, Precision::Fast);
            let xb = ctx.upload_f32(&x).unwrap();
            let ob = ctx.f32_buffer(n * rows).unwrap();
            let mut f = ctx.frame().unwrap();
            f.matmul_with(&w, xb.all(), n, ob.all(), MatmulPath::Gemv, Precision::Fast).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(ob.all()).unwrap();
            let mag = term_magnitudes(format, &bytes, rows, cols, &x, n);
            assert_close_terms(&format!("{format} {rows}x{cols} n={n}"), &got, &want, &mag, 1e-5);
        }
    }
}

/// Activations quantized once and shared by three matrices (q, k, v of one input), every
/// integer format, against `format::matmul_q` over one `QuantizedActs`; a float format
/// against `format::matmul` (it reads the f32 input, as `matmul` does). Tolerance 1e-5.
#[test]
fn shared_quantized_activations_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0009);
    let (cols, n) = (256, 3);
    let x = rng.vec(n * cols, 1.0);
    let acts = coli_runtime::format::QuantizedActs::new(&x, n, cols).unwrap();
    let xb = ctx.upload_f32(&x).unwrap();
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_K, WeightFormat::I4G64, WeightFormat::F16] {
        let mats: Vec<(usize, Vec<u8>)> =
            [40usize, 24, 24].iter().map(|&r| (r, random_rows(format, r, cols, &mut rng))).collect();
        let dev: Vec<_> = mats.iter().map(|(r, b)| ctx.upload_matrix(format, *r, cols, b).unwrap()).collect();
        let outs: Vec<_> = mats.iter().map(|(r, _)| ctx.f32_buffer(n * r).unwrap()).collect();
        let mut f = ctx.frame().unwrap();
        let q = f.quantize_acts(xb.all(), n, cols).unwrap();
        for (w, o) in dev.iter().zip(&outs) {
            f.matmul_q(w, xb.all(), &q, o.all(), MatmulPath::Auto).unwrap();
        }
        f.run().unwrap();
        for ((r, b), o) in mats.iter().zip(&outs) {
            let mut want = vec![0f32; n * r];
            let m = Matrix::new(format, *r, cols, b).unwrap();
            if format.uses_q8_acts(cols) {
                coli_runtime::format::matmul_q(&m, &acts, &mut want);
            } else {
                coli_runtime::format::matmul(&m, &x, n, &mut want);
            }
            assert_close(&format!("{format} shared activations"), &ctx.download_f32(o.all()).unwrap(), &want, 1e-5);
        }
    }
}

/// The device's q8 activations are the CPU's `QuantizedActs` bit for bit: every block's scale
/// `d = amax / 127`, its reciprocal and each `round_half_even(x * (1 / d))`. Read back through
/// a `Q8_0` identity matrix (scale 1, one code 1 a row), whose product is each `d * q` as the
/// CPU's `dequantize` computes it, by the GEMV and the GEMM. Rows of magnitudes 1e-3 to 3e2.
/// Exact (no tolerance): a device whose `fma` is a rounded product and a rounded sum
/// (Lavapipe) once took `d` an ulp off in 64 of 512 such blocks (`div_rn` took its residuals
/// through `fma`), which moved every value of the block and, at a rounding tie, a code.
#[test]
fn quantized_activations_are_the_cpus_bit_for_bit() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_00a8);
    let (cols, n) = (256, 64);
    let mut eye = Vec::with_capacity(cols * cols / 32 * 34);
    for r in 0..cols {
        for b in 0..cols / 32 {
            eye.extend_from_slice(&coli_runtime::format::fp16::f32_to_f16(1.0).to_le_bytes());
            eye.extend((0..32).map(|e| u8::from(b * 32 + e == r)));
        }
    }
    let w = ctx.upload_matrix(WeightFormat::Q8_0, cols, cols, &eye).unwrap();
    let x: Vec<f32> = (0..n).flat_map(|i| rng.vec(cols, [1e-3, 1.0, 2.0, 3e2][i % 4])).collect();
    let want = coli_runtime::format::QuantizedActs::new(&x, n, cols).unwrap().dequantize();
    let xb = ctx.upload_f32(&x).unwrap();
    for path in [MatmulPath::Gemv, MatmulPath::Gemm] {
        let ob = ctx.f32_buffer(n * cols).unwrap();
        let mut f = ctx.frame().unwrap();
        f.matmul_with(&w, xb.all(), n, ob.all(), path, Precision::Fast).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let bad: Vec<usize> = (0..n * cols / 32)
            .filter(|b| (0..32).any(|e| got[b * 32 + e].to_bits() != want[b * 32 + e].to_bits()))
            .collect();
        let first = bad.first().map(|&b| (&got[b * 32..b * 32 + 4], &want[b * 32..b * 32 + 4]));
        assert!(bad.is_empty(), "{path:?}: {} of {} blocks differ, first {first:?}", bad.len(), n * cols / 32);
    }
}

/// Every weight format has a shader (the grid formats `IQ1_*`, `IQ2_*`, `IQ3_*` too, since
/// `shaders/iq_grid.glsl`): none is refused at upload, so no model silently stays on the CPU
/// for its formats.
#[test]
fn every_format_uploads() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0003);
    assert_eq!(vk_common::device_formats(), WeightFormat::ALL.to_vec());
    for format in WeightFormat::ALL.into_iter().filter(|f| f.block_size() == 256) {
        let bytes = random_rows(format, 3, 256, &mut rng);
        if let Err(e) = ctx.upload_matrix(format, 3, 256, &bytes) {
            panic!("{format}: {e}");
        }
    }
}

/// Embedding gather, every format, against `dequant_row` times the scale. Exact but for the
/// scale's rounding: tolerance 1e-6.
#[test]
fn embed_matches_cpu_for_every_format() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0002);
    for format in vk_common::device_formats() {
        let cols = *cols_for(format).last().unwrap();
        let vocab = 23;
        let bytes = random_rows(format, vocab, cols, &mut rng);
        let m = Matrix::new(format, vocab, cols, &bytes).unwrap();
        let table = ctx.upload_matrix(format, vocab, cols, &bytes).unwrap();
        let tokens: Vec<u32> = (0..7).map(|_| rng.below(vocab) as u32).collect();
        for scale in [1.0f32, 0.37] {
            let mut want = vec![0f32; tokens.len() * cols];
            for (i, &t) in tokens.iter().enumerate() {
                let row = &mut want[i * cols..(i + 1) * cols];
                dequant_row(format, m.row(t as usize), row);
                if scale != 1.0 {
                    row.iter_mut().for_each(|v| *v *= scale);
                }
            }
            let tb = ctx.upload_tokens(&tokens, vocab).unwrap();
            let out = ctx.f32_buffer(want.len()).unwrap();
            let mut f = ctx.frame().unwrap();
            f.embed(&table, tb.all(), tokens.len(), scale, out.all()).unwrap();
            f.run().unwrap();
            assert_close(&format!("embed {format}"), &ctx.download_f32(out.all()).unwrap(), &want, 1e-6);
        }
        assert!(ctx.upload_tokens(&[vocab as u32], vocab).is_err(), "out-of-vocabulary ids are refused");
    }
}

/// RMSNorm over whole rows and per group (per head), with and without a weight offset.
/// Tolerance 1e-5 (a sum of squares in another order; sqrt).
#[test]
fn rms_norm_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0003);
    let (n, width) = (3, 200);
    for (group, offset) in [(200, 0.0), (40, 0.0), (200, 1.0), (8, 1.0)] {
        let x = rng.vec(n * width, 2.0);
        let w = rng.vec(group, 1.0);
        let mut want = vec![0f32; n * width];
        cpu_norm::rms_norm(&x, &mut want, &w, 1e-6, offset);
        let (xb, wb, ob) =
            (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&w).unwrap(), ctx.f32_buffer(n * width).unwrap());
        let mut f = ctx.frame().unwrap();
        f.rms_norm(NormArgs { x: xb.all(), weight: wb.all(), out: ob.all(), width }, n, 1e-6, offset).unwrap();
        // In place as well.
        f.rms_norm(NormArgs { x: xb.all(), weight: wb.all(), out: xb.all(), width }, n, 1e-6, offset).unwrap();
        f.run().unwrap();
        assert_close(&format!("rms_norm group {group}"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        assert_close(&format!("rms_norm in place {group}"), &ctx.download_f32(xb.all()).unwrap(), &want, 1e-5);
    }
}

/// A scaled RMSNorm (`rms_norm_scaled`: Inkling's final norm over its width multiplier), whole
/// rows and per group, out of place and in place, against `cpu::norm::rms_norm` scaled after
/// (as `cpu::run_op`). Tolerance 1e-5 (as `rms_norm_matches_cpu`).
#[test]
fn rms_norm_scaled_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0023);
    let (n, width) = (4, 96);
    for (group, offset, scale) in [(96, 0.0, 1.0 / 24.0), (32, 1.0, 3.5)] {
        let x = rng.vec(n * width, 2.0);
        let w = rng.vec(group, 1.0);
        let mut want = vec![0f32; n * width];
        cpu_norm::rms_norm(&x, &mut want, &w, 1e-6, offset);
        want.iter_mut().for_each(|v| *v *= scale);
        let (xb, wb, ob) =
            (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&w).unwrap(), ctx.f32_buffer(n * width).unwrap());
        let mut f = ctx.frame().unwrap();
        let args = |out| NormArgs { x: xb.all(), weight: wb.all(), out, width };
        f.rms_norm_scaled(args(ob.all()), n, 1e-6, offset, scale).unwrap();
        f.rms_norm_scaled(args(xb.all()), n, 1e-6, offset, scale).unwrap();
        f.run().unwrap();
        for (what, b) in [("out of place", &ob), ("in place", &xb)] {
            let got = ctx.download_f32(b.all()).unwrap();
            eprintln!("rms_norm_scaled {what} group {group}: {:.2e} of the largest", vk_common::rel_err(&got, &want));
            assert_close(&format!("rms_norm_scaled {what} group {group}"), &got, &want, 1e-5);
        }
    }
}

/// Two norms in one dispatch (a layer's q and k norms): different widths and groups (whole
/// rows and per head, the second in place), each as the CPU. Tolerance 1e-5.
#[test]
fn rms_norm_pair_matches_two_cpu_norms() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0013);
    let n = 3;
    for ((wa, ga), (wb, gb)) in [((256, 256), (64, 64)), ((96, 32), (160, 32)), ((64, 64), (64, 8))] {
        let (xa, xb) = (rng.vec(n * wa, 2.0), rng.vec(n * wb, 2.0));
        let (wa_, wb_) = (rng.vec(ga, 1.0), rng.vec(gb, 1.0));
        let (mut want_a, mut want_b) = (vec![0f32; n * wa], vec![0f32; n * wb]);
        cpu_norm::rms_norm(&xa, &mut want_a, &wa_, 1e-6, 0.0);
        cpu_norm::rms_norm(&xb, &mut want_b, &wb_, 1e-6, 0.0);
        let (xab, wab, oab) =
            (ctx.upload_f32(&xa).unwrap(), ctx.upload_f32(&wa_).unwrap(), ctx.f32_buffer(n * wa).unwrap());
        let (xbb, wbb) = (ctx.upload_f32(&xb).unwrap(), ctx.upload_f32(&wb_).unwrap());
        let mut f = ctx.frame().unwrap();
        let a = coli_runtime::vk::NormArgs { x: xab.all(), weight: wab.all(), out: oab.all(), width: wa };
        let b = coli_runtime::vk::NormArgs { x: xbb.all(), weight: wbb.all(), out: xbb.all(), width: wb };
        f.rms_norm_pair(a, b, n, 1e-6, 0.0).unwrap();
        f.run().unwrap();
        assert_close(&format!("pair a {wa}/{ga}"), &ctx.download_f32(oab.all()).unwrap(), &want_a, 1e-5);
        assert_close(&format!("pair b {wb}/{gb}"), &ctx.download_f32(xbb.all()).unwrap(), &want_b, 1e-5);
    }
}

/// RoPE, both pair layouts, full and partial rotary dims, with scaling, at positions into the
/// thousands. Tolerance 1e-5 (the device's sin/cos after an explicit range reduction).
#[test]
fn rope_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0004);
    let (n, heads, head_dim) = (5, 3, 32);
    let width = heads * head_dim + 8; // a row wider than its heads: the tail is left alone
    let scalings = [
        RopeScaling::None,
        RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 },
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.2,
            truncate: true,
        },
    ];
    for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        for (rotary, scaling) in [(32, scalings[0]), (16, scalings[1]), (32, scalings[2])] {
            let (freq, mscale) = cpu_rope::inv_freq(rotary, 10000.0, scaling);
            let pos0 = 3000;
            let x = rng.vec(n * width, 1.0);
            let mut want = x.clone();
            for (i, row) in want.chunks_exact_mut(width).enumerate() {
                cpu_rope::apply_row(&mut row[..heads * head_dim], head_dim, style, &freq, mscale, pos0 + i);
            }
            let (xb, fb) = (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&freq).unwrap());
            let mut f = ctx.frame().unwrap();
            f.rope(
                xb.all(),
                fb.all(),
                RopeShape { n, width, heads, head_dim, style, pos0, mscale, part: RopePart::default() },
            )
            .unwrap();
            f.run().unwrap();
            assert_close(&format!("rope {style:?} rotary {rotary}"), &ctx.download_f32(xb.all()).unwrap(), &want, 1e-5);
        }
    }
}

/// Gated units and activations. Tolerance 1e-5 (the device's exp/tanh).
#[test]
fn glu_and_activations_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0005);
    let count = 333;
    let (g, u) = (rng.vec(count, 6.0), rng.vec(count, 6.0));
    let (gb, ub, ob) = (ctx.upload_f32(&g).unwrap(), ctx.upload_f32(&u).unwrap(), ctx.f32_buffer(count).unwrap());
    for kind in [GluKind::SwiGlu, GluKind::GeGlu, GluKind::ClampedSwiGlu { limit: 3.0, alpha: 1.702 }] {
        let mut want = vec![0f32; count];
        cpu_elementwise::glu(kind, &g, &u, &mut want);
        let mut f = ctx.frame().unwrap();
        f.glu(kind, gb.all(), ub.all(), ob.all(), count).unwrap();
        f.run().unwrap();
        assert_close(&format!("{kind:?}"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
    }
    for act in [Activation::Silu, Activation::Sigmoid, Activation::Relu, Activation::Gelu, Activation::GeluTanh] {
        let want: Vec<f32> = g.iter().map(|&v| cpu_elementwise::activate(act, v)).collect();
        let mut f = ctx.frame().unwrap();
        f.act(act, gb.all(), ob.all(), count).unwrap();
        f.run().unwrap();
        assert_close(&format!("{act:?}"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
    }
}

/// Residual add and products, with each broadcast. Exact (one rounding, as on the CPU).
#[test]
fn add_and_mul_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0006);
    let (n, width) = (4, 77);
    let a = rng.vec(n * width, 3.0);
    let ab = ctx.upload_f32(&a).unwrap();
    let ob = ctx.f32_buffer(n * width).unwrap();
    for bmode in [Broadcast::None, Broadcast::PerRow, Broadcast::Row] {
        let blen = match bmode {
            Broadcast::None => n * width,
            Broadcast::PerRow => n,
            Broadcast::Row => width,
        };
        let b = rng.vec(blen, 3.0);
        let bb = ctx.upload_f32(&b).unwrap();
        let bat = |i: usize| match bmode {
            Broadcast::None => b[i],
            Broadcast::PerRow => b[i / width],
            Broadcast::Row => b[i % width],
        };
        for mul in [false, true] {
            let want: Vec<f32> = (0..n * width).map(|i| if mul { a[i] * bat(i) } else { a[i] + bat(i) }).collect();
            let mut f = ctx.frame().unwrap();
            if mul {
                f.mul(ab.all(), bb.all(), ob.all(), n, width, bmode).unwrap();
            } else {
                f.add(ab.all(), bb.all(), ob.all(), n, width, bmode).unwrap();
            }
            f.run().unwrap();
            assert_close(
                &format!("{} {bmode:?}", if mul { "mul" } else { "add" }),
                &ctx.download_f32(ob.all()).unwrap(),
                &want,
                0.0,
            );
        }
    }
}

/// Routing: softmax and sigmoid scores, correction bias, group limit, renormalization, scale.
/// The experts chosen must be the CPU's, in rank order; weights within 1e-5.
#[test]
fn route_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0007);
    let (n, experts) = (6, 64);
    let cases = [
        (RouterScoring::Softmax, 8, false, None, false, 1.0),
        (RouterScoring::Softmax, 2, true, None, false, 1.0),
        (RouterScoring::Sigmoid, 8, true, Some((8, 3)), true, 2.5),
        (RouterScoring::Sigmoid, 6, false, None, true, 1.0),
        // DeepSeek-V2's group-limited greedy: softmax, a group scores its best.
        (RouterScoring::Softmax, 6, false, Some((8, 3)), false, 16.0),
    ];
    for (case, (scoring, top_k, renormalize, groups, with_bias, scale)) in cases.into_iter().enumerate() {
        let group_score = if case == 4 { GroupScore::Max } else { GroupScore::TopTwoSum };
        let mut logits = rng.vec(n * experts, 4.0);
        if case == 0 {
            // Ties: row 0 all equal (the lowest indices win), row 1 in pairs of equal values.
            logits[..experts].iter_mut().for_each(|v| *v = 0.5);
            for e in 0..experts {
                logits[experts + e] = (e / 2) as f32 * 0.01;
            }
        }
        let bias = rng.vec(experts, 0.1);
        let spec = cpu_route::RouteSpec {
            scoring,
            top_k,
            renormalize,
            correction_bias: with_bias.then_some(&bias[..]),
            groups,
            group_score,
            scale,
        };
        let mut want = vec![0f32; n * 2 * top_k];
        for r in 0..n {
            cpu_route::route_row(
                &spec,
                &logits[r * experts..(r + 1) * experts],
                &mut want[r * 2 * top_k..(r + 1) * 2 * top_k],
            );
        }
        let (lb, bb, ob) =
            (ctx.upload_f32(&logits).unwrap(), ctx.upload_f32(&bias).unwrap(), ctx.f32_buffer(want.len()).unwrap());
        let p = RouteParams { scoring, top_k, renormalize, groups, group_score, scale };
        let mut f = ctx.frame().unwrap();
        f.route(lb.all(), with_bias.then(|| bb.all()), ob.all(), n, experts, p).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let ids = |v: &[f32]| v.iter().step_by(2).copied().collect::<Vec<f32>>();
        let wts = |v: &[f32]| v.iter().skip(1).step_by(2).copied().collect::<Vec<f32>>();
        assert_eq!(ids(&got), ids(&want), "{scoring:?} top {top_k} groups {groups:?}: experts");
        assert_close(&format!("{scoring:?} top {top_k} weights"), &wts(&got), &wts(&want), 1e-5);
    }
}

/// Routing with shared experts (Inkling's sink, `cpu::route::route_row_shared`): the top-k
/// among the routed logits with a correction bias, the shared experts' pairs after them, all
/// renormalized together (or not), times the scale and a one-entry `scale_by`. Experts the
/// CPU's in rank order; weights within 1e-5.
#[test]
fn route_with_shared_experts_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0017);
    let n = 5;
    for (routed, shared, top_k, renormalize, scale_by) in
        [(6, 2, 2, true, Some(0.7)), (17, 1, 4, false, None), (40, 3, 8, true, None)]
    {
        let width = routed + shared;
        let logits = rng.vec(n * width, 3.0);
        let bias = rng.vec(routed, 0.2);
        let spec = cpu_route::RouteSpec {
            scoring: RouterScoring::Sigmoid,
            top_k,
            renormalize,
            correction_bias: Some(&bias[..]),
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.3,
        };
        let out_w = 2 * (top_k + shared);
        let mut want = vec![0f32; n * out_w];
        for r in 0..n {
            let row = &logits[r * width..(r + 1) * width];
            cpu_route::route_row_shared(
                &spec,
                shared,
                scale_by.unwrap_or(1.0),
                row,
                &mut want[r * out_w..(r + 1) * out_w],
            );
        }
        let (lb, bb, ob) =
            (ctx.upload_f32(&logits).unwrap(), ctx.upload_f32(&bias).unwrap(), ctx.f32_buffer(want.len()).unwrap());
        let sb = ctx.upload_f32(&[scale_by.unwrap_or(1.0)]).unwrap();
        let p = RouteParams {
            scoring: RouterScoring::Sigmoid,
            top_k,
            renormalize,
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.3,
        };
        let sink = RouteSink { shared, scale_by: scale_by.map(|_| sb.all()) };
        let mut f = ctx.frame().unwrap();
        f.route_shared(lb.all(), Some(bb.all()), sink, ob.all(), (n, routed), p).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let ids = |v: &[f32]| v.iter().step_by(2).copied().collect::<Vec<f32>>();
        let wts = |v: &[f32]| v.iter().skip(1).step_by(2).copied().collect::<Vec<f32>>();
        let what = format!("{routed} routed + {shared} shared, top {top_k}");
        assert_eq!(ids(&got), ids(&want), "{what}: experts");
        assert_close(&format!("{what}: weights"), &wts(&got), &wts(&want), 1e-5);
    }
}

/// GQA attention, decode (positions split across workgroups, up to the most splits, then joined)
/// and prompt chunks (blocked, online softmax), each path on both shapes, with a sliding window
/// and sinks, and MiMo-V2-Flash's geometry (value heads half the key heads' width, window and
/// sinks, values scaled: the CPU executor scales the output of `attend`); over f32 mirrors and
/// f16 ones (the CPU's keys and values the f16 values the mirrors hold). Tolerance 1e-5
/// (softmax sums in another order).
#[test]
fn attention_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0008);
    let shapes = [
        (4, 2, 64, 64, None, false, 1.0),
        (4, 1, 32, 48, Some(37), true, 1.0),
        (2, 2, 80, 80, Some(5), false, 1.0),
        (8, 2, 192, 128, Some(4), true, 0.707),
    ];
    for (heads, kv_heads, head_dim, v_head_dim, window, with_sinks, value_scale) in shapes {
        let dims = (heads, kv_heads, head_dim, v_head_dim);
        // 1,500 positions: the most splits (32), joined eight at a time.
        let kvs = kv_types(ctx);
        for ((n, pos0), kv) in
            [(1, 150), (19, 5), (1, 0), (3, 70), (1, 1500)].into_iter().flat_map(|c| kvs.iter().map(move |&t| (c, t)))
        {
            let AttnCase { q, k, v, sinks, shape: vs, want } =
                attention_case_kv(&mut rng, dims, window, with_sinks, value_scale, (n, pos0), kv);
            let (qb, kb, vb, sb) = (
                ctx.upload_f32(&q).unwrap(),
                upload_kv(ctx, &k, kv),
                upload_kv(ctx, &v, kv),
                ctx.upload_f32(&sinks).unwrap(),
            );
            for path in [AttnPath::Split, AttnPath::Block] {
                let ob = ctx.f32_buffer(want.len()).unwrap();
                let mut f = ctx.frame().unwrap();
                let sinks = with_sinks.then(|| sb.all());
                let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks, out: ob.all(), n };
                f.attention(vs, args, pos0, path).unwrap();
                f.run().unwrap();
                let what = format!("attention {heads}/{kv_heads}x{head_dim}/{v_head_dim} window {window:?} sinks {with_sinks} x{value_scale} n {n} pos0 {pos0} {path:?} {kv:?}");
                assert_close(&what, &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
            }
        }
    }
}

/// Two layers' decode attention in one frame, positions split across workgroups: both match
/// the CPU (1e-5), and the second call takes no scratch of its own (the split partials and
/// counters are the frame's, shared, so a replayed decode recording holds one layer's).
#[test]
fn split_attention_of_two_layers_shares_the_frames_partials() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0009);
    let cases: Vec<AttnCase> =
        (0..2).map(|_| attention_case(&mut rng, (8, 2, 64, 64), None, true, 1.0, 1, 300)).collect();
    let bufs: Vec<_> = cases
        .iter()
        .map(|c| {
            let u = |v: &[f32]| ctx.upload_f32(v).unwrap();
            (u(&c.q), u(&c.k), u(&c.v), u(&c.sinks), ctx.f32_buffer(c.want.len()).unwrap())
        })
        .collect();
    let mut f = ctx.frame().unwrap();
    let mut asked = Vec::new();
    for (c, (q, k, v, sk, o)) in cases.iter().zip(&bufs) {
        let args = AttnArgs { q: q.all(), k: k.all(), v: v.all(), sinks: Some(sk.all()), out: o.all(), n: 1 };
        f.attention(c.shape, args, 300, AttnPath::Split).unwrap();
        asked.push(f.scratch_bytes());
    }
    assert!(asked[0] > 0, "a split call takes scratch for its partials");
    assert_eq!(asked[1], asked[0], "the second layer's call shares the first's partials and counters");
    f.run().unwrap();
    for (i, (c, b)) in cases.iter().zip(&bufs).enumerate() {
        assert_close(&format!("layer {i}"), &ctx.download_f32(b.4.all()).unwrap(), &c.want, 1e-5);
    }
}

/// A device without the f16 cooperative shape (Lavapipe) refuses `AttnPath::Coop` with an
/// error that says why, and `AttnPath::Auto` takes the f32 kernel there (within its 1e-5).
/// (The cooperative kernel itself is checked against the CPU by `vk_coopmat` on a GPU.)
#[test]
fn the_cooperative_attention_is_refused_where_the_device_lacks_it() {
    let Some(ctx) = ctx() else { return };
    if ctx.caps().coopmat_f16 {
        eprintln!("note: {} has the f16 shape; vk_coopmat checks that kernel", ctx.caps().name);
        return;
    }
    let mut rng = Rng(0x5eed_c00f);
    let (n, pos0) = (70, 10);
    let AttnCase { q, k, v, shape, want, .. } = attention_case(&mut rng, (4, 2, 64, 64), None, false, 1.0, n, pos0);
    let (qb, kb, vb) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&k).unwrap(), ctx.upload_f32(&v).unwrap());
    let ob = ctx.f32_buffer(want.len()).unwrap();
    let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: None, out: ob.all(), n };
    let err = ctx.frame().unwrap().attention(shape, args, pos0, AttnPath::Coop).unwrap_err().to_string();
    assert!(err.contains("no f16 cooperative attention"), "{err}");
    let mut f = ctx.frame().unwrap();
    f.attention(shape, args, pos0, AttnPath::Auto).unwrap();
    f.run().unwrap();
    assert_close("attention, Auto without the f16 shape", &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
}

/// Work ran on the device: the dispatch counter moves (a silent CPU fallback cannot pass).
#[test]
fn dispatches_are_counted() {
    let Some(ctx) = ctx() else { return };
    let x = ctx.upload_f32(&[1.0, 2.0, 3.0]).unwrap();
    let before = ctx.dispatches();
    let mut f = ctx.frame().unwrap();
    f.add(x.all(), x.all(), x.all(), 1, 3, Broadcast::None).unwrap();
    assert_eq!(f.dispatch_count(), 1);
    f.run().unwrap();
    assert!(ctx.dispatches() > before);
    assert_eq!(ctx.download_f32(x.all()).unwrap(), vec![2.0, 4.0, 6.0]);
}

/// Barriers go only between dependent commands: independent ones share a stage, and a read
/// after a write, a write after a write and a write after a read each wait. The results
/// show the order held.
#[test]
fn barriers_follow_dependencies() {
    let Some(ctx) = ctx() else { return };
    let a = ctx.upload_f32(&[1.0; 8]).unwrap();
    let b = ctx.upload_f32(&[2.0; 8]).unwrap();
    let c = ctx.upload_f32(&[3.0; 8]).unwrap();
    let mut f = ctx.frame().unwrap();
    // a = a + a and c = c + c are independent: no barrier.
    f.add(a.all(), a.all(), a.all(), 1, 8, Broadcast::None).unwrap();
    f.add(c.all(), c.all(), c.all(), 1, 8, Broadcast::None).unwrap();
    assert_eq!(f.barrier_count(), 0);
    // b = a * b reads a (written): one barrier.
    f.mul(a.all(), b.all(), b.all(), 1, 8, Broadcast::None).unwrap();
    assert_eq!(f.barrier_count(), 1);
    // a = c + c writes a, which the mul read: another.
    f.add(c.all(), c.all(), a.all(), 1, 8, Broadcast::None).unwrap();
    assert_eq!(f.barrier_count(), 2);
    // Two halves of one buffer written side by side need none.
    f.add(b.view(0, 4), b.view(0, 4), c.view(0, 4), 1, 4, Broadcast::None).unwrap();
    assert_eq!(f.barrier_count(), 3, "c was read by the last add");
    f.run().unwrap();
    assert_eq!(ctx.download_f32(a.all()).unwrap(), vec![12.0; 8]);
    assert_eq!(ctx.download_f32(b.all()).unwrap(), vec![4.0; 8]);
    assert_eq!(ctx.download_f32(c.all()).unwrap(), [vec![8.0; 4], vec![6.0; 4]].concat());
}

/// Bad operands are typed errors, never panics.
#[test]
fn bad_operands_are_errors() {
    let Some(ctx) = ctx() else { return };
    let w = ctx.upload_matrix(WeightFormat::F32, 4, 8, &[0u8; 4 * 8 * 4]).unwrap();
    let x = ctx.f32_buffer(7).unwrap();
    let y = ctx.f32_buffer(4).unwrap();
    let mut f = ctx.frame().unwrap();
    let e = f.matmul(&w, x.all(), 1, y.all()).unwrap_err();
    assert!(e.to_string().contains("needs 8 elements"), "{e}");
    assert!(!e.is_device_failure());
    assert!(ctx.upload_matrix(WeightFormat::Q8_0, 1, 40, &[0u8; 40]).is_err());
}

/// Two row buffers side by side (a draft model's embedding beside its target's hidden state):
/// copies, so exact; odd widths, one and several rows, views at offsets.
#[test]
fn concat_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0031);
    for (n, wa, wb) in [(1, 48, 48), (5, 7, 13), (3, 0, 9)] {
        let a = rng.vec(n * wa + 3, 2.0);
        let b = rng.vec(n * wb + 1, 2.0);
        let (ab, bb) = (ctx.upload_f32(&a).unwrap(), ctx.upload_f32(&b).unwrap());
        let ob = ctx.f32_buffer(n * (wa + wb) + 2).unwrap();
        let mut f = ctx.frame().unwrap();
        // `a` from its 4th element, `b` from its 2nd, `out` from its 3rd.
        f.concat(ab.view(3, n * wa), bb.view(1, n * wb), ob.view(2, n * (wa + wb)), n, (wa, wb)).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let mut want = Vec::new();
        for r in 0..n {
            want.extend_from_slice(&a[3 + r * wa..3 + (r + 1) * wa]);
            want.extend_from_slice(&b[1 + r * wb..1 + (r + 1) * wb]);
        }
        assert_eq!(&got[2..], &want[..], "{n} rows of {wa} + {wb}");
    }
}
