//! The fused Vulkan kernels and recordings against the CPU reference, on whatever device the
//! machine has (Lavapipe in CI): matrix products with a fused RMSNorm or gated-unit input and
//! a fused residual add (every format, GEMV and GEMM, both precisions), RoPE with the KV
//! append in one kernel, positions read on the device, and one recording replayed at many
//! positions. Tolerances are stated beside each test.
//!
//! Must not: compare a device path with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{GluKind, RopeScaling, RopeStyle};
use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::{
    attention as cpu_attention, elementwise as cpu_elementwise, norm as cpu_norm, rope as cpu_rope, Precision,
};
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::{
    AttnArgs, AttnPath, AttnShape, DecodeArgs, KvMirror, KvShape, KvType, MatIn, MatmulPath, Pos, QkNorm, RopeArgs,
    RopeKvArgs, VkOptions,
};
use vk_common::{as_kv, assert_close, ctx, download_kv, kv_types, open, random_rows, upload_kv, Rng};

/// The CPU's input of a fused product: the rows as the unfused ops would leave them.
enum Input {
    Plain,
    Norm { eps: f32, offset: f32 },
    Glu(GluKind),
}

/// `|got - want| <= 1e-5 * sum |w x| + slack + 1e-6` per output, `slack` covering q8
/// activations: the device's row norm (its sum of squares in another order) and gated unit
/// (the driver's `exp`) may differ from the CPU's in the last bit, so a value within an ulp of
/// a rounding tie (seen: 58.500004) can move one 8-bit value of a block by one step (the
/// quantization itself is the CPU's bit for bit: vk_ops.rs); two such steps per output are
/// allowed (`2 * max_b(amax_b / 127) * max |w|`). Float activations need no slack.
fn check(what: &str, got: &[f32], want: &[f32], mag: &[f32], slack: &[f32]) {
    for (i, (((g, w), m), s)) in got.iter().zip(want).zip(mag).zip(slack).enumerate() {
        let d = (g - w).abs();
        assert!(d <= 1e-5 * m + s + 1e-6, "{what}: |{g} - {w}| at {i} = {d:e} > 1e-5 * {m} + {s}");
    }
}

/// Fused products: out = residual + f(x) W^T for f an RMSNorm (offset 0 and 1) or a gated
/// unit, every format, one row (GEMV) and several (GEMM), both precisions; against the CPU's
/// ops in sequence (`rms_norm` / `glu`, `linear`, the add). Tolerance: `check`.
#[test]
fn fused_products_match_the_cpu_ops() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f001);
    let formats = vk_common::device_formats();
    let inputs = [
        Input::Norm { eps: 1e-5, offset: 0.0 },
        Input::Norm { eps: 1e-6, offset: 1.0 },
        Input::Glu(GluKind::SwiGlu),
        Input::Glu(GluKind::GeGlu),
        Input::Glu(GluKind::ClampedSwiGlu { limit: 2.0, alpha: 1.702 }),
        Input::Plain,
    ];
    for (fi, format) in formats.into_iter().enumerate() {
        let cols = if format.block_size() == 256 { 512 } else { 256 };
        let rows = 37;
        let bytes = random_rows(format, rows, cols, &mut rng);
        let w = ctx.upload_matrix(format, rows, cols, &bytes).unwrap();
        let m = Matrix::new(format, rows, cols, &bytes).unwrap();
        let mut wrow = vec![0f32; cols];
        let wmax: Vec<f32> = (0..rows)
            .map(|r| {
                dequant_row(format, m.row(r), &mut wrow);
                wrow.iter().fold(0f32, |a, v| a.max(v.abs()))
            })
            .collect();
        for (ii, input) in inputs.iter().enumerate() {
            // Each format takes two of the inputs, so every input meets several formats.
            if ii % 3 != fi % 3 && ii != 5 - fi % 2 {
                continue;
            }
            for (n, path) in [(1, MatmulPath::Auto), (3, MatmulPath::Gemv), (5, MatmulPath::Auto)] {
                let x = rng.vec(n * cols, 2.0);
                let aux = match input {
                    Input::Norm { .. } => rng.vec(cols, 1.0),
                    _ => rng.vec(n * cols, 2.0),
                };
                let res = rng.vec(n * rows, 1.0);
                let mut xin = vec![0f32; n * cols];
                match *input {
                    Input::Plain => xin.copy_from_slice(&x),
                    Input::Norm { eps, offset } => cpu_norm::rms_norm(&x, &mut xin, &aux, eps, offset),
                    Input::Glu(kind) => cpu_elementwise::glu(kind, &x, &aux, &mut xin),
                }
                let (xb, ab, rb) =
                    (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&aux).unwrap(), ctx.upload_f32(&res).unwrap());
                for precision in [Precision::Fast, Precision::Exact] {
                    let mut want = vec![0f32; n * rows];
                    linear(&m, &xin, n, &mut want, precision);
                    for (wv, r) in want.iter_mut().zip(&res) {
                        *wv += r;
                    }
                    let mut mag = vec![0f32; n * rows];
                    let mut slack = vec![0f32; n * rows];
                    let q8 = precision == Precision::Fast
                        && !matches!(format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16);
                    for i in 0..n {
                        let xr = &xin[i * cols..(i + 1) * cols];
                        let step = xr
                            .chunks(32)
                            .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0)
                            .fold(0f32, f32::max);
                        for r in 0..rows {
                            dequant_row(format, m.row(r), &mut wrow);
                            mag[i * rows + r] =
                                wrow.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum::<f32>() + res[i * rows + r].abs();
                            if q8 {
                                slack[i * rows + r] = 2.0 * step * wmax[r];
                            }
                        }
                    }
                    let fused = match *input {
                        Input::Plain => MatIn::Plain(xb.all()),
                        Input::Norm { eps, offset } => MatIn::Norm { x: xb.all(), weight: ab.all(), eps, offset },
                        Input::Glu(kind) => MatIn::Glu { gate: xb.all(), up: ab.all(), kind },
                    };
                    // The residual in place: out is the residual stream.
                    let ob = ctx.upload_f32(&res).unwrap();
                    let mut f = ctx.frame().unwrap();
                    f.matmul_fused(&w, fused, n, ob.all(), Some(ob.all()), path, precision).unwrap();
                    f.run().unwrap();
                    let what = format!(
                        "{format} {} n {n} {path:?} {precision:?}",
                        ["norm", "norm+1", "swiglu", "geglu", "clamped", "plain"][ii]
                    );
                    check(&format!("{what} (in place)"), &ctx.download_f32(ob.all()).unwrap(), &want, &mag, &slack);
                    // Into another buffer, and through shared quantized activations.
                    if precision == Precision::Fast {
                        let ob = ctx.f32_buffer(n * rows).unwrap();
                        let mut f = ctx.frame().unwrap();
                        let q = f.quantize_input(fused, n, cols).unwrap();
                        f.matmul_q_fused(&w, fused, &q, ob.all(), Some(rb.all()), path).unwrap();
                        f.run().unwrap();
                        check(
                            &format!("{what} (shared q8)"),
                            &ctx.download_f32(ob.all()).unwrap(),
                            &want,
                            &mag,
                            &slack,
                        );
                    }
                }
            }
        }
    }
}

/// A fused product whose output overlaps its input, or a norm over part of a row, is refused.
#[test]
fn fused_products_refuse_bad_operands() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f002);
    let w = ctx.upload_matrix(WeightFormat::F32, 64, 64, &random_rows(WeightFormat::F32, 64, 64, &mut rng)).unwrap();
    let x = ctx.upload_f32(&rng.vec(128, 1.0)).unwrap();
    let nw = ctx.upload_f32(&rng.vec(32, 1.0)).unwrap();
    let mut f = ctx.frame().unwrap();
    let norm = MatIn::Norm { x: x.view(0, 64), weight: nw.all(), eps: 1e-5, offset: 0.0 };
    assert!(
        f.matmul_fused(&w, norm, 1, x.view(64, 64), None, MatmulPath::Auto, Precision::Fast).is_err(),
        "a norm over half a row"
    );
    let glu = MatIn::Glu { gate: x.view(0, 64), up: x.view(64, 64), kind: GluKind::SwiGlu };
    assert!(
        f.matmul_fused(&w, glu, 1, x.view(64, 64), None, MatmulPath::Auto, Precision::Fast).is_err(),
        "output over the up rows"
    );
}

/// RoPE of q and k with the KV append in one kernel: q and k rotated in place as
/// `cpu::rope::apply_row`, k and v rows at positions pos0.. of the mirrors and at rows 0.. of
/// the read-back rows; both pairings, a rotary dim below the head dim, none at all; fixed and
/// device-read positions; blocks below and above `BACK_BY_COPY_ROWS`. Tolerance 1e-5
/// (rotations, as rope); copies exact.
#[test]
fn rope_kv_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f003);
    let (heads, kv_heads, head_dim, v_head_dim) = (6, 2, 32, 24);
    let (kw, vw) = (kv_heads * head_dim, kv_heads * v_head_dim);
    let cap = 64;
    let scaling =
        RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 };
    for (style, rotary, dynamic) in [
        (RopeStyle::RotateHalf, 32, false),
        (RopeStyle::Interleaved, 16, true),
        (RopeStyle::RotateHalf, 0, false),
        (RopeStyle::RotateHalf, 24, true),
    ] {
        // 12 rows at a fixed position: the read-back rows by copy commands from the mirror.
        let kvs = kv_types(ctx);
        for ((n, pos0), kv) in [(1, 40), (5, 7), (12, 20)].into_iter().flat_map(|c| kvs.iter().map(move |&t| (c, t))) {
            let (freq, mscale) =
                if rotary > 0 { cpu_rope::inv_freq(rotary, 10000.0, scaling) } else { (Vec::new(), 1.0) };
            let (q, k, v) = (rng.vec(n * heads * head_dim, 1.0), rng.vec(n * kw, 1.0), rng.vec(n * vw, 1.0));
            let (mut wq, mut wk) = (q.clone(), k.clone());
            if rotary > 0 {
                for (i, row) in wq.chunks_exact_mut(heads * head_dim).enumerate() {
                    cpu_rope::apply_row(row, head_dim, style, &freq, mscale, pos0 + i);
                }
                for (i, row) in wk.chunks_exact_mut(kw).enumerate() {
                    cpu_rope::apply_row(row, head_dim, style, &freq, mscale, pos0 + i);
                }
            }
            let old_k = rng.vec(cap * kw, 1.0);
            let old_v = rng.vec(cap * vw, 1.0);
            let (qb, kb, vb) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&k).unwrap(), ctx.upload_f32(&v).unwrap());
            let (mk, mv) = (upload_kv(ctx, &old_k, kv), upload_kv(ctx, &old_v, kv));
            let (sk, sv) = (upload_kv(ctx, &vec![0.0; n * kw], kv), upload_kv(ctx, &vec![0.0; n * vw], kv));
            let fb = ctx.upload_f32(&freq.iter().copied().chain([0.0]).collect::<Vec<_>>()).unwrap();
            let pb = ctx.upload_u32(&[pos0 as u32]).unwrap();
            let rope = (rotary > 0).then(|| RopeArgs { freq: fb.view(0, freq.len()), style, mscale });
            let pos = if dynamic { Pos::Dynamic(pb.all()) } else { Pos::Fixed(pos0) };
            let shape = KvShape { n, heads, kv_heads, head_dim, v_head_dim, kv };
            let mut f = ctx.frame().unwrap();
            let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
            f.rope_kv(RopeKvArgs { rope, q: qb.all(), k: kb.all(), v: vb.all(), shape, mirror, pos }).unwrap();
            f.run().unwrap();
            let what = format!("rope_kv {style:?} rotary {rotary} dynamic {dynamic} n {n} {kv:?}");
            assert_close(&format!("{what}: q"), &ctx.download_f32(qb.all()).unwrap(), &wq, 1e-5);
            assert_close(&format!("{what}: k"), &ctx.download_f32(kb.all()).unwrap(), &wk, 1e-5);
            // f16: the rotated keys rounded, within one f16 step of the CPU's rotation rounded.
            let tol = if kv == KvType::F16 { 1e-3 } else { 1e-5 };
            let back_k = download_kv(ctx, &sk, n * kw, kv);
            assert_close(&format!("{what}: k read-back"), &back_k, &as_kv(&wk, kv), tol);
            assert_eq!(download_kv(ctx, &sv, n * vw, kv), as_kv(&v, kv), "{what}: v read-back");
            let mut want_k = as_kv(&old_k, kv);
            want_k[pos0 * kw..(pos0 + n) * kw].copy_from_slice(&as_kv(&wk, kv));
            let mut want_v = as_kv(&old_v, kv);
            want_v[pos0 * vw..(pos0 + n) * vw].copy_from_slice(&as_kv(&v, kv));
            let got_k = download_kv(ctx, &mk, cap * kw, kv);
            assert_close(&format!("{what}: k mirror"), &got_k, &want_k, tol);
            assert_eq!(&got_k[pos0 * kw..(pos0 + n) * kw], &back_k[..], "{what}: k read-back is the mirror's rows");
            assert_eq!(download_kv(ctx, &mv, cap * vw, kv), want_v, "{what}: v mirror (other rows untouched)");
        }
    }
}

/// One row's RoPE, KV append and attention in one kernel (`attention_decode`) against the
/// CPU: q and the row's k rotated as `cpu::rope::apply_row`, the row appended to mirrors
/// holding earlier rows, then `cpu::attention::attend` over every row; GQA, a rotary dim
/// below the head dim, both pairings, no rotation, a window, sinks, fixed and device-read
/// positions; q and k norms absorbed; the 8-bit output; f32 and f16 mirrors (f16: the row's k
/// and v rounded as the mirror keeps them, within one f16 step of the CPU's rounded, and the
/// output against the CPU over what the mirrors hold after the call). The mirrors' other rows
/// and the q, k, v rows stay as they were. Tolerance 1e-5 of the largest |reference| (as
/// attention and rope).
#[test]
fn attention_decode_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f005);
    let cases = [
        (6, 2, 64, 64, 64, RopeStyle::RotateHalf, None, false, false, 300, 1.0),
        (4, 1, 32, 48, 16, RopeStyle::Interleaved, Some(37), true, true, 80, 1.0),
        (2, 2, 80, 80, 0, RopeStyle::RotateHalf, None, true, false, 5, 1.0),
        (9, 3, 64, 64, 64, RopeStyle::RotateHalf, Some(40), false, true, 0, 1.0),
        // MiMo-V2-Flash: value heads narrower than key heads, partial RoPE, window, sinks, values scaled.
        (4, 2, 32, 16, 10, RopeStyle::RotateHalf, Some(4), true, true, 33, 0.707),
    ];
    let scaling =
        RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 };
    // q and k norms absorbed: none, over the whole projected rows (OLMoE), per head (Qwen3).
    let kvs = kv_types(ctx);
    for (
        (ci, (heads, kv_heads, head_dim, v_head_dim, rotary, style, window, with_sinks, dynamic, p, value_scale)),
        kv,
    ) in cases
        .into_iter()
        .enumerate()
        .flat_map(|(i, c)| (0..3).map(move |m| ((i, m), c)))
        .flat_map(|c| kvs.iter().map(move |&t| (c, t)))
    {
        let norm_mode = ci.1;
        let (kw, vw, qw) = (kv_heads * head_dim, kv_heads * v_head_dim, heads * head_dim);
        let cap = p + 3;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (freq, mscale) = if rotary > 0 { cpu_rope::inv_freq(rotary, 10000.0, scaling) } else { (Vec::new(), 1.0) };
        let (q, k, v) = (rng.vec(qw, 1.0), rng.vec(kw, 1.0), rng.vec(vw, 1.0));
        let (old_k, old_v) = (rng.vec(cap * kw, 1.0), rng.vec(cap * vw, 1.0));
        let sinks = rng.vec(heads, 1.0);
        let (qg, kg) = if norm_mode == 1 { (qw, kw) } else { (head_dim, head_dim) };
        let (qnw, knw, offset) = (rng.vec(qg, 1.0), rng.vec(kg, 1.0), if norm_mode == 2 { 1.0 } else { 0.0 });
        let (mut rq, mut rk) = (q.clone(), k.clone());
        if norm_mode > 0 {
            coli_runtime::cpu::norm::rms_norm(&q, &mut rq, &qnw, 1e-5, offset);
            coli_runtime::cpu::norm::rms_norm(&k, &mut rk, &knw, 1e-5, offset);
        }
        if rotary > 0 {
            cpu_rope::apply_row(&mut rq, head_dim, style, &freq, mscale, p);
            cpu_rope::apply_row(&mut rk, head_dim, style, &freq, mscale, p);
        }
        let mut want_k = as_kv(&old_k, kv);
        want_k[p * kw..(p + 1) * kw].copy_from_slice(&as_kv(&rk, kv));
        let mut want_v = as_kv(&old_v, kv);
        want_v[p * vw..(p + 1) * vw].copy_from_slice(&as_kv(&v, kv));
        let cs = cpu_attention::AttnShape { heads, kv_heads, head_dim, v_head_dim, scale, window };
        // The CPU's attention over `keys` and `values` (f16: what the mirrors hold after the call).
        let attend = |keys: &[f32], values: &[f32]| {
            let mut want = vec![0f32; heads * v_head_dim];
            cpu_attention::attend(
                cs,
                &rq,
                &keys[..(p + 1) * kw],
                &values[..(p + 1) * vw],
                p,
                with_sinks.then_some(&sinks[..]),
                &mut want,
            );
            want.iter_mut().for_each(|x| *x *= value_scale);
            want
        };
        let (qb, kb, vb) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&k).unwrap(), ctx.upload_f32(&v).unwrap());
        let (mk, mv) = (upload_kv(ctx, &old_k, kv), upload_kv(ctx, &old_v, kv));
        let (sk, sv, ob) = (
            upload_kv(ctx, &vec![0.0; kw], kv),
            upload_kv(ctx, &vec![0.0; vw], kv),
            ctx.f32_buffer(heads * v_head_dim).unwrap(),
        );
        let fb = ctx.upload_f32(&freq.iter().copied().chain([0.0]).collect::<Vec<_>>()).unwrap();
        let (sb, pb) = (ctx.upload_f32(&sinks).unwrap(), ctx.upload_u32(&[p as u32]).unwrap());
        let rope = (rotary > 0).then(|| RopeArgs { freq: fb.view(0, freq.len()), style, mscale });
        let pos = if dynamic { Pos::Dynamic(pb.all()) } else { Pos::Fixed(p) };
        let vs = AttnShape { heads, kv_heads, head_dim, v_head_dim, scale, window, value_scale, ring: None, kv };
        let (qnb, knb) = (ctx.upload_f32(&qnw).unwrap(), ctx.upload_f32(&knw).unwrap());
        // With value heads of whole 32-blocks, the kernel's 8-bit output too: a product over it
        // equals the same product over `quantize_acts` of the float output, bit for bit.
        let q8 = v_head_dim % 32 == 0;
        let ow = heads * v_head_dim;
        let w8 =
            ctx.upload_matrix(WeightFormat::I8Row, 5, ow, &random_rows(WeightFormat::I8Row, 5, ow, &mut rng)).unwrap();
        let (y1, y2) = (ctx.f32_buffer(5).unwrap(), ctx.f32_buffer(5).unwrap());
        let mut f = ctx.frame().unwrap();
        let (mkv, mvv) = if dynamic {
            (mk.all(), mv.all())
        } else {
            (mk.view(0, kv.words((p + 1) * kw)), mv.view(0, kv.words((p + 1) * vw)))
        };
        let norm = (norm_mode > 0).then(|| QkNorm {
            q_weight: qnb.all(),
            k_weight: knb.all(),
            q_group: qg,
            k_group: kg,
            eps: 1e-5,
            offset,
        });
        let args = DecodeArgs {
            rope,
            q: qb.all(),
            k: kb.all(),
            v: vb.all(),
            mirror: KvMirror { k: mkv, v: mvv, k_back: sk.all(), v_back: sv.all() },
            sinks: with_sinks.then(|| sb.all()),
            out: ob.all(),
            pos,
            norm,
            q8,
        };
        let acts = f.attention_decode(vs, args).unwrap();
        assert_eq!(f.dispatch_count(), 1);
        assert_eq!(acts.is_some(), q8);
        if let Some(a) = acts {
            f.matmul_q(&w8, ob.all(), &a, y1.all(), MatmulPath::Gemv).unwrap();
            let b = f.quantize_acts(ob.all(), 1, ow).unwrap();
            f.matmul_q(&w8, ob.all(), &b, y2.all(), MatmulPath::Gemv).unwrap();
        }
        f.run().unwrap();
        if q8 {
            assert_eq!(
                ctx.download_f32(y1.all()).unwrap(),
                ctx.download_f32(y2.all()).unwrap(),
                "8-bit output of the attention kernel"
            );
        }
        let what = format!("attention_decode norm {norm_mode} {heads}/{kv_heads}x{head_dim}/{v_head_dim} rotary {rotary} {style:?} window {window:?} sinks {with_sinks} x{value_scale} dynamic {dynamic} p {p} {kv:?}");
        let (got_k, got_v) = (download_kv(ctx, &mk, cap * kw, kv), download_kv(ctx, &mv, cap * vw, kv));
        assert_close(&what, &ctx.download_f32(ob.all()).unwrap(), &attend(&got_k, &got_v), 1e-5);
        // f16: the rotated key rounded, within one f16 step of the CPU's rotation rounded.
        let tol = if kv == KvType::F16 { 1e-3 } else { 1e-5 };
        assert_close(&format!("{what}: k mirror"), &got_k, &want_k, tol);
        assert_eq!(got_v, want_v, "{what}: v mirror");
        assert_eq!(download_kv(ctx, &sk, kw, kv), &got_k[p * kw..(p + 1) * kw], "{what}: k read-back");
        assert_eq!(download_kv(ctx, &sv, vw, kv), as_kv(&v, kv), "{what}: v read-back");
        if kv == KvType::F32 {
            assert_close(
                &format!("{what}: against the CPU's mirrors"),
                &attend(&want_k, &want_v),
                &attend(&got_k, &got_v),
                1e-5,
            );
        }
        assert_eq!(ctx.download_f32(qb.all()).unwrap(), q, "{what}: q untouched");
        assert_eq!(ctx.download_f32(kb.all()).unwrap(), k, "{what}: k untouched");
    }
}

/// One row of each of several sequences in one call (`attention_decode_rows`, a batched
/// decode step): each row rotated at its own position, appended to its own mirrors and attended
/// over them, against the CPU as `attention_decode_matches_cpu` (tolerance 1e-5 of the largest
/// |reference|); no barrier between the rows (one kernel for all where the device reaches
/// buffers by address, `vk_attn_seqs.rs`; else a kernel each, their constants first and
/// counters of their own).
#[test]
fn attention_decode_rows_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f00d);
    let (heads, kv_heads, head_dim) = (4, 2, 32);
    let (kw, qw, ow) = (kv_heads * head_dim, heads * head_dim, heads * head_dim);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let (freq, mscale) = cpu_rope::inv_freq(head_dim, 10000.0, RopeScaling::None);
    let fb = ctx.upload_f32(&freq).unwrap();
    let positions = [0usize, 7, 300, 31, 64];
    let n = positions.len();
    let cs = cpu_attention::AttnShape { heads, kv_heads, head_dim, v_head_dim: head_dim, scale, window: None };
    for kv in kv_types(ctx) {
        let (q, k, v) = (rng.vec(n * qw, 1.0), rng.vec(n * kw, 1.0), rng.vec(n * kw, 1.0));
        let (qb, kb, vb, ob) = (
            ctx.upload_f32(&q).unwrap(),
            ctx.upload_f32(&k).unwrap(),
            ctx.upload_f32(&v).unwrap(),
            ctx.f32_buffer(n * ow).unwrap(),
        );
        let (mut want, mut rqs, mut mirrors) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &p) in positions.iter().enumerate() {
            let (old_k, old_v) = (rng.vec((p + 1) * kw, 1.0), rng.vec((p + 1) * kw, 1.0));
            let (mut rq, mut rk) = (q[i * qw..(i + 1) * qw].to_vec(), k[i * kw..(i + 1) * kw].to_vec());
            cpu_rope::apply_row(&mut rq, head_dim, RopeStyle::RotateHalf, &freq, mscale, p);
            cpu_rope::apply_row(&mut rk, head_dim, RopeStyle::RotateHalf, &freq, mscale, p);
            let (mut wk, mut wv) = (as_kv(&old_k, kv), as_kv(&old_v, kv));
            wk[p * kw..].copy_from_slice(&as_kv(&rk, kv));
            wv[p * kw..].copy_from_slice(&as_kv(&v[i * kw..(i + 1) * kw], kv));
            want.push((wk, wv));
            rqs.push(rq);
            let m = (upload_kv(ctx, &old_k, kv), upload_kv(ctx, &old_v, kv));
            mirrors.push((m.0, m.1, upload_kv(ctx, &vec![0.0; kw], kv), upload_kv(ctx, &vec![0.0; kw], kv)));
        }
        let vs = AttnShape {
            heads,
            kv_heads,
            head_dim,
            v_head_dim: head_dim,
            scale,
            window: None,
            value_scale: 1.0,
            ring: None,
            kv,
        };
        let rope = Some(RopeArgs { freq: fb.all(), style: RopeStyle::RotateHalf, mscale });
        let rows: Vec<DecodeArgs> = positions
            .iter()
            .zip(&mirrors)
            .enumerate()
            .map(|(i, (&p, (mk, mv, sk, sv)))| DecodeArgs {
                rope,
                q: qb.view(i * qw, qw),
                k: kb.view(i * kw, kw),
                v: vb.view(i * kw, kw),
                mirror: KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() },
                sinks: None,
                out: ob.view(i * ow, ow),
                pos: Pos::Fixed(p),
                norm: None,
                q8: false,
            })
            .collect();
        let mut f = ctx.frame().unwrap();
        f.attention_decode_rows(vs, &rows).unwrap();
        assert!(f.barrier_count() <= 1, "{} barriers between the rows' kernels", f.barrier_count());
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        // The CPU over what each row's mirrors hold after the call (f16: the row's own key as the
        // device rounded it), and those mirrors within one f16 step of the CPU's.
        let tol = if kv == KvType::F16 { 1e-3 } else { 1e-5 };
        for (i, ((wk, wv), (mk, mv, _, _))) in want.iter().zip(&mirrors).enumerate() {
            let p = positions[i];
            let (gk, gv) = (download_kv(ctx, mk, (p + 1) * kw, kv), download_kv(ctx, mv, (p + 1) * kw, kv));
            let what = format!("row {i} at {p} {kv:?}");
            assert_close(&format!("{what}: k mirror"), &gk, wk, tol);
            assert_eq!(&gv, wv, "{what}: v mirror");
            let mut out = vec![0f32; ow];
            cpu_attention::attend(cs, &rqs[i], &gk, &gv, p, None, &mut out);
            assert_close(&what, &got[i * ow..(i + 1) * ow], &out, 1e-5);
        }
    }
}

/// One recording of a decode step (RoPE and KV append, then attention over the mirror, both
/// with the position read on the device) replayed at every position of a sequence, the
/// position written before each run: each step's output equals the CPU's attention over the
/// rows so far (tolerance 1e-5 of the largest |reference|, as attention).
#[test]
fn a_recording_replays_at_every_position() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_f004);
    let (heads, kv_heads, head_dim) = (4, 2, 16);
    let (kw, qw) = (kv_heads * head_dim, heads * head_dim);
    let cap = 150;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let (freq, mscale) = cpu_rope::inv_freq(head_dim, 10000.0, RopeScaling::None);
    let fb = ctx.upload_f32(&freq).unwrap();
    let (qb, kb, vb) = (ctx.f32_buffer(qw).unwrap(), ctx.f32_buffer(kw).unwrap(), ctx.f32_buffer(kw).unwrap());
    let (mk, mv) = (ctx.f32_buffer(cap * kw).unwrap(), ctx.f32_buffer(cap * kw).unwrap());
    let (sk, sv) = (ctx.f32_buffer(kw).unwrap(), ctx.f32_buffer(kw).unwrap());
    let ob = ctx.f32_buffer(qw).unwrap();
    let pb = ctx.upload_u32(&[0]).unwrap();
    for window in [None, Some(70)] {
        let vs = AttnShape {
            heads,
            kv_heads,
            head_dim,
            v_head_dim: head_dim,
            scale,
            window,
            value_scale: 1.0,
            ring: None,
            kv: KvType::F32,
        };
        let cs = cpu_attention::AttnShape { heads, kv_heads, head_dim, v_head_dim: head_dim, scale, window };
        let mut f = ctx.recording().unwrap();
        let shape = KvShape { n: 1, heads, kv_heads, head_dim, v_head_dim: head_dim, kv: KvType::F32 };
        let pos = Pos::Dynamic(pb.all());
        let rope = Some(RopeArgs { freq: fb.all(), style: RopeStyle::RotateHalf, mscale });
        let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
        f.rope_kv(RopeKvArgs { rope, q: qb.all(), k: kb.all(), v: vb.all(), shape, mirror, pos }).unwrap();
        let attn = AttnArgs { q: qb.all(), k: mk.all(), v: mv.all(), sinks: None, out: ob.all(), n: 1 };
        f.attention_at(vs, attn, pos, AttnPath::Auto).unwrap();
        let rec = f.finish().unwrap();
        assert!(rec.dispatch_count() == 2 && rec.barrier_count() >= 1, "{rec:?}");
        let (mut keys, mut vals) = (Vec::new(), Vec::new());
        for p in 0..cap {
            let (mut q, mut k, v) = (rng.vec(qw, 1.0), rng.vec(kw, 1.0), rng.vec(kw, 1.0));
            ctx.write(&qb, 0, bytes(&q)).unwrap();
            ctx.write(&kb, 0, bytes(&k)).unwrap();
            ctx.write(&vb, 0, bytes(&v)).unwrap();
            ctx.write(&pb, 0, &(p as u32).to_le_bytes()).unwrap();
            rec.run().unwrap();
            cpu_rope::apply_row(&mut q, head_dim, RopeStyle::RotateHalf, &freq, mscale, p);
            cpu_rope::apply_row(&mut k, head_dim, RopeStyle::RotateHalf, &freq, mscale, p);
            keys.extend_from_slice(&k);
            vals.extend_from_slice(&v);
            if p % 7 == 0 || p + 1 == cap {
                let mut want = vec![0f32; qw];
                cpu_attention::attend(cs, &q, &keys, &vals, p, None, &mut want);
                assert_close(
                    &format!("window {window:?} position {p}"),
                    &ctx.download_f32(ob.all()).unwrap(),
                    &want,
                    1e-5,
                );
            }
        }
    }
}

/// A recording keeps the buffers it binds alive after their owners drop them, and gives their
/// memory back when it goes.
#[test]
fn a_recording_keeps_its_buffers() {
    // A context of its own: the memory counts must not see other tests' buffers.
    let Some(ctx) = open(&VkOptions::default()) else { return };
    let a = ctx.upload_f32(&[1.0, 2.0]).unwrap();
    let b = ctx.upload_f32(&[10.0, 20.0]).unwrap();
    let o = ctx.f32_buffer(2).unwrap();
    let mut f = ctx.recording().unwrap();
    f.add(a.all(), b.all(), o.all(), 1, 2, coli_runtime::vk::Broadcast::None).unwrap();
    let rec = f.finish().unwrap();
    assert!(rec.kept_buffers() >= 3);
    let used = ctx.memory_stats().used_bytes;
    drop((a, b));
    assert_eq!(ctx.memory_stats().used_bytes, used, "the recording holds a and b");
    rec.run().unwrap();
    rec.run().unwrap();
    assert_eq!(ctx.download_f32(o.all()).unwrap(), vec![11.0, 22.0]);
    drop(rec);
    assert!(ctx.memory_stats().used_bytes < used, "dropping the recording frees a and b");
}

fn bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
