//! The cooperative-matrix GEMMs (`matmul_coop.comp`, `moe_matmul_coop.comp`: the weights of
//! every format with q8 activations, decoded per block into int8 codes and factors, against q8
//! activations on int8 tensor cores) against the CPU op library's q8 path
//! (`cpu::linear::linear(.., Precision::Fast)`, `cpu::experts::routed_experts`), with random
//! non-zero inputs, odd row counts, tail tiles (weight rows, activation rows and columns not
//! multiples of the 64 x 64 x 128 tile), several experts with uneven pair counts (some with
//! none), biases and the gated units; and against the f32 tiles of the same device
//! (`CoopMatUse::Off`). Each case checks, where the device profiles, that the cooperative
//! kernel is the one that ran.
//!
//! The f16 cooperative prompt attention (`attn_coop.comp`) against the CPU's `attend` and the
//! f32 blocked kernel: `prompt_attention_on_f16_matrices_matches_cpu` (bound `ATTN_TOL`).
//!
//! On a device without an int8 cooperative-matrix shape (Lavapipe) every test prints that it
//! skipped and passes. `tools/gpu-coopmat.sh` runs this binary on the GPU machine.
//!
//! Tolerance, relative to the largest |reference| of each output: dense 1e-5 (each block's
//! integer sum is exact; only the f32 sums over blocks may round differently, e.g. a fused
//! multiply-add); dense block formats `FORMAT_TOL` (the block's factors multiply in another
//! order than the CPU's, and an offset term may cancel a larger product); routed experts 1e-3 (`MOE_TOL`): a last-bit difference in a gated hidden
//! value can move its 8-bit quantization by one step before the down matrix (on the H200 the
//! OLMoE-sized chunk measured 1.8e-4 against the CPU). The worst relative error of each case
//! is printed.

mod vk_common;

/// Routed experts' bound (see the module doc).
const MOE_TOL: f32 = 1e-3;
/// The f16 cooperative prompt attention's bound: queries, keys, values and probabilities are
/// rounded to f16 (2^-11 relative), the sums kept in f32.
const ATTN_TOL: f32 = 4e-3;
/// Dense products of the block formats (see the module doc).
const FORMAT_TOL: f32 = 1e-4;

/// The formats the cooperative kernels take besides I8Row (`COOP_FORMATS` in
/// shaders/variants.rs), with the column multiple of each (its super-block).
const FORMATS: [(WeightFormat, usize); 20] = [
    (WeightFormat::Q8_0, 32),
    (WeightFormat::Q4_0, 32),
    (WeightFormat::Q4_1, 32),
    (WeightFormat::Q5_0, 32),
    (WeightFormat::Q5_1, 32),
    (WeightFormat::I4G64, 64),
    (WeightFormat::IQ4_NL, 32),
    (WeightFormat::Q4_K, 256),
    (WeightFormat::Q5_K, 256),
    (WeightFormat::Q6_K, 256),
    (WeightFormat::Q3_K, 256),
    (WeightFormat::IQ4_XS, 256),
    (WeightFormat::MXFP4, 32),
    (WeightFormat::IQ2_XXS, 256),
    (WeightFormat::IQ2_XS, 256),
    (WeightFormat::IQ2_S, 256),
    (WeightFormat::IQ3_XXS, 256),
    (WeightFormat::IQ3_S, 256),
    (WeightFormat::IQ1_S, 256),
    (WeightFormat::IQ1_M, 256),
];

use coli_compiler::ir::GluKind;
use coli_runtime::cpu::experts::{routed_experts, ExpertMats, Routed};
use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::Precision;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::ops::{COOP_ATTN_ROWS, COOP_MIN_ROWS, COOP_MIN_WINDOW};
use coli_runtime::vk::{AttnArgs, AttnPath, Context, CoopMatUse, MatIn, MatmulPath, MoeCall, MoePath, VkOptions};
use std::sync::OnceLock;
use vk_common::{attention_case, open, random_rows, routing, to_ring, AttnCase, Rng};

/// The context with cooperative matrices (profiling on, to see which kernel ran; pipeline
/// statistics on, so a run with `--nocapture` prints each kernel's registers and shared memory
/// as the driver reports them), or `None` (after saying why) where the device has no int8 shape.
fn coop() -> Option<&'static Context> {
    static CTX: OnceLock<Option<Context>> = OnceLock::new();
    CTX.get_or_init(|| {
        let c = open(&VkOptions { profile: true, pipeline_stats: true, ..Default::default() })?;
        let caps = c.caps();
        match caps.coopmat_i8 {
            Some(s) => {
                eprintln!("vk_coopmat: {} (subgroup {}), int8 shape {}x{}x{}", caps.name, caps.subgroup_size, s.m, s.n, s.k);
                for l in &caps.coopmat_shapes {
                    eprintln!("  listed: {l:?}");
                }
                Some(c)
            }
            None => {
                eprintln!(
                    "vk_coopmat: SKIPPED: {} has no int8 cooperative-matrix shape (VK_KHR_cooperative_matrix: {}, {} shapes listed)",
                    caps.name,
                    caps.cooperative_matrix,
                    caps.coopmat_shapes.len()
                );
                None
            }
        }
    })
    .as_ref()
}

/// The same device with the f32 tiles only (profiling on, for the times).
fn plain() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| {
        open(&VkOptions { coopmat: CoopMatUse::Off, profile: true, ..Default::default() })
            .expect("the device opened once already")
    })
}

/// The worst `|got - want|` over the largest |want| (at least 1e-3); panics past `tol`.
fn check_close(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
    let (mut worst, mut at) = (0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d.is_nan() || d > worst {
            worst = d;
            at = i;
        }
    }
    let rel = worst / scale;
    eprintln!("  {what}: worst relative error {rel:.2e}");
    assert!(worst <= tol * scale, "{what}: |{} - {}| at {at} = {worst:e} > {tol:e} * {scale}", got[at], want[at]);
    rel
}

/// Asserts that `kernel` ran since the last call (where the device writes timestamps) and
/// returns the nanoseconds per kernel label.
fn ran(ctx: &Context, kernel: &str, what: &str) -> Vec<(String, u64, f64)> {
    let p = ctx.take_profile();
    if ctx.caps().timestamps {
        assert!(p.iter().any(|(l, _, _)| l.starts_with(kernel)), "{what}: {kernel} did not run; profile: {p:?}");
    }
    p
}

/// One dense product of `format` (views at offsets inside larger buffers, a residual or
/// not) on the cooperative kernel and on the f32 tiles, each against the CPU's q8 path and
/// against each other within `tol`.
fn dense_case(
    ctx: &Context,
    format: WeightFormat,
    (rows, cols, n): (usize, usize, usize),
    residual: bool,
    tol: f32,
    rng: &mut Rng,
) {
    let bytes = random_rows(format, rows, cols, rng);
    let m = Matrix::new(format, rows, cols, &bytes).unwrap();
    let x = rng.vec(n * cols, 1.0);
    let res = rng.vec(n * rows, 0.5);
    let mut want = vec![0f32; n * rows];
    linear(&m, &x, n, &mut want, Precision::Fast);
    if residual {
        want.iter_mut().zip(&res).for_each(|(w, r)| *w += r);
    }
    let what = format!("dense {format:?} {rows}x{cols} n={n} residual={residual}");
    let mut outs = Vec::new();
    for c in [ctx, plain()] {
        let w = c.upload_matrix(format, rows, cols, &bytes).unwrap();
        let xb = c.upload_f32(&[vec![9.0; 3], x.clone()].concat()).unwrap();
        let rb = c.upload_f32(&[vec![4.0; 7], res.clone()].concat()).unwrap();
        let ob = c.f32_buffer(n * rows + 5).unwrap();
        let mut f = c.frame().unwrap();
        let r = residual.then(|| rb.view(7, n * rows));
        let input = MatIn::Plain(xb.view(3, n * cols));
        f.matmul_fused(&w, input, n, ob.view(5, n * rows), r, MatmulPath::Gemm, Precision::Fast).unwrap();
        f.run().unwrap();
        outs.push(c.download_f32(ob.view(5, n * rows)).unwrap());
    }
    ran(ctx, "MatmulCoop", &what);
    check_close(&format!("{what} (f32 tiles vs CPU)"), &outs[1], &want, tol);
    check_close(&format!("{what} (cooperative vs CPU)"), &outs[0], &want, tol);
    check_close(&format!("{what} (cooperative vs f32 tiles)"), &outs[0], &outs[1], tol);
}

/// Dense I8Row products: (weight rows, cols, activation rows), residual or not.
#[test]
fn dense_matches_cpu() {
    let Some(ctx) = coop() else { return };
    const { assert!(COOP_MIN_ROWS <= 37, "the cases below expect the cooperative path from 37 rows") };
    let mut rng = Rng(0xc00b_0001);
    let cases = [(64, 128, 64), (70, 96, 37), (100, 224, 130), (200, 32, 45), (33, 2048, 64), (130, 160, 257)];
    for shape in cases {
        for residual in [false, true] {
            dense_case(ctx, WeightFormat::I8Row, shape, residual, 1e-5, &mut rng);
        }
    }
}

/// Dense products of every other cooperative format: whole super-blocks, tail tiles of
/// weight and activation rows, a stage tail (768 = 6 blocks of 128 columns), a residual.
#[test]
fn dense_formats_match_cpu() {
    let Some(ctx) = coop() else { return };
    let mut rng = Rng(0xc00b_0004);
    for (format, unit) in FORMATS {
        let cases = [((64, 256usize.max(unit), 64), false), ((70, 512, 37), true), ((100, 768, 130), false)];
        for (shape, residual) in cases {
            dense_case(ctx, format, shape, residual, FORMAT_TOL, &mut rng);
        }
    }
}

/// One layer of experts of one format.
struct Layer {
    format: WeightFormat,
    experts: usize,
    hidden: usize,
    ffn: usize,
    gate: Vec<Vec<u8>>,
    up: Vec<Vec<u8>>,
    down: Vec<Vec<u8>>,
    bias: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

impl Layer {
    fn new(experts: usize, hidden: usize, ffn: usize, bias: bool, rng: &mut Rng) -> Layer {
        Layer::of(WeightFormat::I8Row, experts, hidden, ffn, bias, rng)
    }

    fn of(format: WeightFormat, experts: usize, hidden: usize, ffn: usize, bias: bool, rng: &mut Rng) -> Layer {
        let mut mk = |rows, cols| (0..experts).map(|_| random_rows(format, rows, cols, rng)).collect::<Vec<_>>();
        let (gate, up, down) = (mk(ffn, hidden), mk(ffn, hidden), mk(hidden, ffn));
        let bias =
            bias.then(|| (rng.vec(experts * ffn, 0.5), rng.vec(experts * ffn, 0.5), rng.vec(experts * hidden, 0.5)));
        Layer { format, experts, hidden, ffn, gate, up, down, bias }
    }

    fn mats<'a>(&'a self, e: usize) -> ExpertMats<'a> {
        let (f, h, fmt) = (self.ffn, self.hidden, self.format);
        let m = |b: &'a [u8], rows: usize, cols: usize| Matrix::new(fmt, rows, cols, b).unwrap();
        ExpertMats {
            gate: m(&self.gate[e], f, h),
            up: m(&self.up[e], f, h),
            down: m(&self.down[e], h, f),
            gate_bias: self.bias.as_ref().map(|b| &b.0[e * f..(e + 1) * f]),
            up_bias: self.bias.as_ref().map(|b| &b.1[e * f..(e + 1) * f]),
            down_bias: self.bias.as_ref().map(|b| &b.2[e * h..(e + 1) * h]),
        }
    }
}

/// A routing of `n` rows, `top_k` distinct experts each, skewed: expert 0 in about half the
/// rows, the last expert never (uneven pair counts, one expert with none).
fn skewed_routing(n: usize, top_k: usize, experts: usize, rng: &mut Rng) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * 2 * top_k);
    for _ in 0..n {
        let mut chosen: Vec<usize> = Vec::new();
        if rng.below(2) == 0 {
            chosen.push(0);
        }
        while chosen.len() < top_k {
            // Lower ids more often: the smaller of two draws.
            let e = rng.below(experts - 1).min(rng.below(experts - 1));
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            out.extend([e as f32, 0.1 + rng.unit().abs()]);
        }
    }
    out
}

fn moe_case(ctx: &Context, layer: &Layer, n: usize, top_k: usize, glu: GluKind, rng: &mut Rng) {
    let h = layer.hidden;
    let x = rng.vec(n * h, 1.0);
    let rt = skewed_routing(n, top_k, layer.experts, rng);
    let mut want = vec![0f32; n * h];
    routed_experts(
        Routed { x: &x, n, hidden: h, routing: &rt, top_k },
        glu,
        Precision::Fast,
        &|e| layer.mats(e),
        &mut want,
    );
    let what = format!(
        "experts {:?} E={} {}x{} n={n} top {top_k} {glu:?} bias={}",
        layer.format,
        layer.experts,
        h,
        layer.ffn,
        layer.bias.is_some()
    );
    let mut outs = Vec::new();
    for c in [ctx, plain()] {
        let dev = c.upload_experts(layer.experts, &|e| layer.mats(e)).unwrap();
        let scratch = c.moe_scratch(n, top_k, h, layer.ffn, layer.experts).unwrap();
        let xb = c.upload_f32(&[vec![7.0; 5], x.clone()].concat()).unwrap();
        let rb = c.upload_f32(&[vec![3.0; 2], rt.clone()].concat()).unwrap();
        let ob = c.f32_buffer(n * h + 3).unwrap();
        let mut f = c.frame().unwrap();
        let call = MoeCall {
            experts: &dev,
            scratch: &scratch,
            n,
            top_k,
            glu,
            precision: Precision::Fast,
            path: MoePath::Grouped,
        };
        f.moe(call, xb.view(5, n * h), rb.view(2, n * 2 * top_k), ob.view(3, n * h)).unwrap();
        f.run().unwrap();
        outs.push(c.download_f32(ob.view(3, n * h)).unwrap());
    }
    ran(ctx, "MoeMatmulCoop", &what);
    // Both device paths against the CPU first (printed), then the bound.
    check_close(&format!("{what} (f32 tiles vs CPU)"), &outs[1], &want, MOE_TOL);
    check_close(&format!("{what} (cooperative vs CPU)"), &outs[0], &want, MOE_TOL);
    check_close(&format!("{what} (cooperative vs f32 tiles)"), &outs[0], &outs[1], MOE_TOL);
}

/// Routed experts, gate/up with the gated unit (mode 0) and down (mode 1).
#[test]
fn routed_experts_match_cpu() {
    let Some(ctx) = coop() else { return };
    let mut rng = Rng(0xc00b_0002);
    // hidden 160: five blocks (a tail stage of one); ffn 96: three; ffn 100 would not be
    // whole blocks (I8Row then multiplies in f32 and never takes this kernel).
    let layer = Layer::new(9, 160, 96, false, &mut rng);
    for (n, top_k) in [(37, 2), (64, 4), (130, 8), (33, 1)] {
        moe_case(ctx, &layer, n, top_k, GluKind::SwiGlu, &mut rng);
    }
    let layer = Layer::new(5, 256, 192, true, &mut rng);
    for glu in [GluKind::SwiGlu, GluKind::GeGlu, GluKind::ClampedSwiGlu { limit: 0.7, alpha: 1.702 }] {
        moe_case(ctx, &layer, 70, 3, glu, &mut rng);
    }
}

/// Routed experts of every other cooperative format (super-block multiples).
#[test]
fn routed_expert_formats_match_cpu() {
    let Some(ctx) = coop() else { return };
    let mut rng = Rng(0xc00b_0005);
    for (format, unit) in FORMATS {
        let (hidden, ffn) = (512usize.max(2 * unit), 256usize.max(unit));
        let layer = Layer::of(format, 7, hidden, ffn, format == WeightFormat::Q8_0, &mut rng);
        for (n, top_k) in [(70, 3), (33, 1)] {
            moe_case(ctx, &layer, n, top_k, GluKind::SwiGlu, &mut rng);
        }
    }
}

/// One prompt chunk of OLMoE's geometry (hidden 2048, expert FFN 1024, 64 experts, top 8,
/// 512 rows) and its dense projection shape, timed with and without cooperative matrices
/// (printed, not asserted), and checked like the cases above.
#[test]
fn olmoe_sized_chunk() {
    let Some(ctx) = coop() else { return };
    let mut rng = Rng(0xc00b_0003);
    for format in [WeightFormat::I8Row, WeightFormat::Q8_0, WeightFormat::Q4_K, WeightFormat::Q6_K] {
        olmoe_chunk(ctx, format, &mut rng);
    }
}

/// `olmoe_sized_chunk` for the weights of one format.
fn olmoe_chunk(ctx: &Context, format: WeightFormat, rng: &mut Rng) {
    let tol = if format == WeightFormat::I8Row { 1e-5 } else { FORMAT_TOL };
    let (rows, cols, n) = (2048, 2048, 512);
    let bytes = random_rows(format, rows, cols, rng);
    let m = Matrix::new(format, rows, cols, &bytes).unwrap();
    let x = rng.vec(n * cols, 1.0);
    let mut want = vec![0f32; n * rows];
    linear(&m, &x, n, &mut want, Precision::Fast);
    for c in [ctx, plain()] {
        let w = c.upload_matrix(format, rows, cols, &bytes).unwrap();
        let xb = c.upload_f32(&x).unwrap();
        let ob = c.f32_buffer(n * rows).unwrap();
        let mut f = c.frame().unwrap();
        f.matmul_with(&w, xb.view(0, n * cols), n, ob.view(0, n * rows), MatmulPath::Gemm, Precision::Fast).unwrap();
        f.run().unwrap();
        let got = c.download_f32(ob.view(0, n * rows)).unwrap();
        let which = if std::ptr::eq(c, ctx) { "cooperative" } else { "f32 tiles" };
        check_close(&format!("dense {format:?} {rows}x{cols} n={n} ({which})"), &got, &want, tol);
    }
    let layer = Layer::of(format, 64, 2048, 1024, false, rng);
    moe_case(ctx, &layer, 512, 8, GluKind::SwiGlu, rng);
    // Timings: run each path again on data already up (first runs pay pipeline creation).
    let rt = skewed_routing(n, 8, 64, rng);
    for c in [ctx, plain()] {
        let _ = c.take_profile();
        let w = c.upload_matrix(format, rows, cols, &bytes).unwrap();
        let dev = c.upload_experts(64, &|e| layer.mats(e)).unwrap();
        let scratch = c.moe_scratch(n, 8, 2048, 1024, 64).unwrap();
        let xb = c.upload_f32(&x).unwrap();
        let rb = c.upload_f32(&rt).unwrap();
        let ob = c.f32_buffer(n * rows).unwrap();
        for round in 0..2 {
            let mut f = c.frame().unwrap();
            f.matmul_with(&w, xb.view(0, n * cols), n, ob.view(0, n * rows), MatmulPath::Gemm, Precision::Fast)
                .unwrap();
            let call = MoeCall {
                experts: &dev,
                scratch: &scratch,
                n,
                top_k: 8,
                glu: GluKind::SwiGlu,
                precision: Precision::Fast,
                path: MoePath::Grouped,
            };
            f.moe(call, xb.view(0, n * 2048), rb.view(0, n * 16), ob.view(0, n * 2048)).unwrap();
            f.run().unwrap();
            let p = c.take_profile();
            if round == 1 {
                let which = if std::ptr::eq(c, ctx) { "cooperative" } else { "f32 tiles" };
                eprintln!("  times, {format:?}, {which}:");
                for (label, count, secs) in p {
                    eprintln!("    {label}: {count} x, {:.1} us", secs * 1e6);
                }
            }
        }
    }
}

/// Prompt attention on f16 cooperative matrices over a sliding window's mirror as a ring
/// (`AttnShape::ring`: the window and the chunk, the chunk crossing the ring's end) against the
/// CPU's `attend` over every position, within `ATTN_TOL` of the largest |reference|.
#[test]
fn prompt_attention_over_a_ring_on_f16_matrices_matches_cpu() {
    let Some(ctx) = coop() else { return };
    if !ctx.caps().coopmat_f16 {
        eprintln!("vk_coopmat: SKIPPED the ring attention: {} has no f16 16x16x16 shape", ctx.caps().name);
        return;
    }
    let mut rng = Rng(0xc00b_a77f);
    let (dims, window, n, pos0, ring) = ((8, 2, 64, 64), 300, 130, 700, 429);
    let AttnCase { q, k, v, sinks, shape, want } = attention_case(&mut rng, dims, Some(window), true, 1.0, n, pos0);
    let shape = coli_runtime::vk::AttnShape { ring: Some(ring), ..shape };
    let (kw, len) = (dims.1 * dims.2, pos0 + n);
    let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
    let (qb, sb) = (up(&q), up(&sinks));
    let (kb, vb) = (up(&to_ring(&k, kw, len, ring)), up(&to_ring(&v, kw, len, ring)));
    let ob = ctx.f32_buffer(want.len()).unwrap();
    let mut f = ctx.frame().unwrap();
    let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: Some(sb.all()), out: ob.all(), n };
    f.attention(shape, args, pos0, AttnPath::Coop).unwrap();
    f.run().unwrap();
    check_close("attention over a ring (coop)", &ctx.download_f32(ob.all()).unwrap(), &want, ATTN_TOL);
}

/// Prompt attention on f16 cooperative matrices (`attn_coop.comp`) against the CPU's `attend`
/// and against the f32 blocked kernel of the same device: GQA, a chunk after earlier positions,
/// tail tiles (rows not a multiple of 64), a sliding window with sinks, value heads narrower
/// than key heads with a value scale, a head dim below 128; within `ATTN_TOL` of the largest
/// |reference|; `AttnPath::Auto` takes it from `COOP_ATTN_ROWS` rows and windows of
/// `COOP_MIN_WINDOW`, the f32 kernel below. Then the Llama-3.1-8B layer's shape (32 query heads, 8 KV heads of 128, 512
/// rows) on both kernels, timed.
#[test]
fn prompt_attention_on_f16_matrices_matches_cpu() {
    let Some(ctx) = coop() else { return };
    if !ctx.caps().coopmat_f16 {
        eprintln!("vk_coopmat: SKIPPED the attention: {} has no f16 16x16x16 shape", ctx.caps().name);
        return;
    }
    let mut rng = Rng(0xc00b_a77e);
    let cases = [
        (32, 8, 128, 128, None, false, 1.0, 512, 0),
        (16, 16, 128, 128, None, false, 1.0, 70, 100),
        (8, 2, 64, 64, Some(40), true, 1.0, 130, 30),
        (4, 2, 128, 64, None, true, 0.707, 33, 0),
        (4, 4, 96, 96, Some(9), false, 1.0, 16, 7),
    ];
    for (heads, kv_heads, head_dim, v_head_dim, window, with_sinks, value_scale, n, pos0) in cases {
        let dims = (heads, kv_heads, head_dim, v_head_dim);
        let AttnCase { q, k, v, sinks, shape: vs, want } =
            attention_case(&mut rng, dims, window, with_sinks, value_scale, n, pos0);
        let what = format!(
            "attention {heads}/{kv_heads}x{head_dim}/{v_head_dim} window {window:?} sinks {with_sinks} n {n} pos0 {pos0}"
        );
        let (qb, kb, vb, sb) = (
            ctx.upload_f32(&q).unwrap(),
            ctx.upload_f32(&k).unwrap(),
            ctx.upload_f32(&v).unwrap(),
            ctx.upload_f32(&sinks).unwrap(),
        );
        let mut outs = Vec::new();
        for path in [AttnPath::Coop, AttnPath::Block, AttnPath::Auto] {
            let ob = ctx.f32_buffer(want.len()).unwrap();
            let _ = ctx.take_profile();
            for _ in 0..2 {
                let mut f = ctx.frame().unwrap();
                let args = AttnArgs {
                    q: qb.all(),
                    k: kb.all(),
                    v: vb.all(),
                    sinks: with_sinks.then(|| sb.all()),
                    out: ob.all(),
                    n,
                };
                f.attention(vs, args, pos0, path).unwrap();
                f.run().unwrap();
            }
            let auto_coop = n >= COOP_ATTN_ROWS && window.is_none_or(|w| w >= COOP_MIN_WINDOW);
            let kernel = match path {
                AttnPath::Block => "AttnBlock",
                AttnPath::Auto if !auto_coop => "AttnBlock",
                _ => "AttnCoop",
            };
            let p = ran(ctx, kernel, &what);
            let us: f64 = p.iter().filter(|l| l.0.starts_with(kernel)).map(|l| l.2).sum::<f64>() / 2.0 * 1e6;
            let got = ctx.download_f32(ob.all()).unwrap();
            let tol = if kernel == "AttnBlock" { 1e-5 } else { ATTN_TOL };
            check_close(&format!("{what} {path:?} ({us:.1} us)"), &got, &want, tol);
            outs.push(got);
        }
        let auto_coop = n >= COOP_ATTN_ROWS && window.is_none_or(|w| w >= COOP_MIN_WINDOW);
        assert_eq!(outs[2], outs[if auto_coop { 0 } else { 1 }], "{what}: Auto's kernel");
    }
}

/// The cooperative and the blocked prompt attention over f16 K/V mirrors (`KvType::F16`, the
/// kernels' `_kv16` twins) against the CPU's `attend` over the same f16 values: within
/// `ATTN_TOL` (cooperative) and 1e-5 (blocked) of the largest |reference|.
#[test]
fn prompt_attention_over_f16_mirrors_matches_cpu() {
    let Some(ctx) = coop() else { return };
    if !ctx.caps().coopmat_f16 || !ctx.caps().storage_16bit {
        eprintln!("vk_coopmat: SKIPPED f16 mirrors: {} lacks the f16 shape or 16-bit storage", ctx.caps().name);
        return;
    }
    let mut rng = Rng(0xc00b_a716);
    let cases = [(32, 8, 128, 128, None, false, 1.0, 512, 0), (8, 2, 64, 64, Some(300), true, 0.707, 130, 30)];
    for (heads, kv_heads, head_dim, v_head_dim, window, with_sinks, value_scale, n, pos0) in cases {
        let dims = (heads, kv_heads, head_dim, v_head_dim);
        let kv = coli_runtime::vk::KvType::F16;
        let AttnCase { q, k, v, sinks, shape: vs, want } =
            vk_common::attention_case_kv(&mut rng, dims, window, with_sinks, value_scale, (n, pos0), kv);
        let (qb, sb) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&sinks).unwrap());
        // The mirror from its first word (staged four elements a load) and from its second (two
        // f16 elements in: one at a time).
        for pad in [0, 1] {
            let upload = |x: &[f32]| {
                let b = ctx.buffer(coli_runtime::vk::MemoryUse::Device, (x.len() + 2 * pad) * kv.bytes()).unwrap();
                ctx.write_kv(&b, 4 * pad, x, kv).unwrap();
                b
            };
            let (kb, vb) = (upload(&k), upload(&v));
            let (kview, vview) = (kb.view(pad, kb.len() - pad), vb.view(pad, vb.len() - pad));
            for (path, tol) in [(AttnPath::Coop, ATTN_TOL), (AttnPath::Block, 1e-5)] {
                let ob = ctx.f32_buffer(want.len()).unwrap();
                let mut f = ctx.frame().unwrap();
                let sinks = with_sinks.then(|| sb.all());
                let args = AttnArgs { q: qb.all(), k: kview, v: vview, sinks, out: ob.all(), n };
                f.attention(vs, args, pos0, path).unwrap();
                f.run().unwrap();
                let what = format!(
                    "f16 mirrors {heads}/{kv_heads}x{head_dim}/{v_head_dim} n {n} pos0 {pos0} word {pad} {path:?}"
                );
                check_close(&what, &ctx.download_f32(ob.all()).unwrap(), &want, tol);
            }
        }
    }
}

/// Not a check: device time a call of OLMoE's routed experts (512 rows, top 8 of 64, even and
/// skewed routing; top 8 of 8, the experts' weights small enough for the L2 cache), a dense
/// product with gate/up's work (2048 x 2048 over 4,096 rows) and one of the same work with
/// every weight row read once (65,536 x 2048 over 64 rows), Q8_0 and I8Row, after two seconds
/// of work to bring the clocks up. Run on the GPU machine: `vk_coopmat --ignored --nocapture
/// gemm_rates`.
#[test]
#[ignore]
fn gemm_rates() {
    let Some(ctx) = coop() else { return };
    let mut rng = Rng(0xc00b_0007);
    let (n, h, f, top_k) = (512, 2048, 1024, 8);
    for format in [WeightFormat::Q8_0, WeightFormat::I8Row] {
        let mut moe = Vec::new();
        for (experts, name) in [(64, "even"), (64, "skewed"), (8, "8 experts")] {
            let layer = Layer::of(format, experts, h, f, false, &mut rng);
            let dev = ctx.upload_experts(experts, &|e| layer.mats(e)).unwrap();
            let scratch = ctx.moe_scratch(n, top_k, h, f, experts).unwrap();
            let rt = if name == "skewed" {
                skewed_routing(n, top_k, experts, &mut rng)
            } else {
                routing(n, top_k, experts, &mut rng)
            };
            moe.push((name, dev, scratch, ctx.upload_f32(&rt).unwrap()));
        }
        let mut dense = Vec::new();
        for (rows, xn, name) in [(h, n * top_k, "dense"), (65536, 64, "dense, rows read once")] {
            let w = ctx.upload_matrix(format, rows, h, &random_rows(format, rows, h, &mut rng)).unwrap();
            let x = ctx.upload_f32(&rng.vec(xn * h, 1.0)).unwrap();
            dense.push((name, w, rows, xn, x, ctx.f32_buffer(xn * rows).unwrap()));
        }
        let xb = ctx.upload_f32(&rng.vec(n * h, 1.0)).unwrap();
        let ob = ctx.f32_buffer(n * h).unwrap();
        let run = |what: usize, reps: usize| {
            let mut fr = ctx.frame().unwrap();
            for _ in 0..reps {
                if let Some((_, dev, scratch, rb)) = moe.get(what) {
                    let call = MoeCall {
                        experts: dev,
                        scratch,
                        n,
                        top_k,
                        glu: GluKind::SwiGlu,
                        precision: Precision::Fast,
                        path: MoePath::Grouped,
                    };
                    fr.moe(call, xb.view(0, n * h), rb.all(), ob.view(0, n * h)).unwrap();
                } else {
                    let (_, w, _, xn, x, o) = &dense[what - moe.len()];
                    fr.matmul_with(w, x.all(), *xn, o.all(), MatmulPath::Gemm, Precision::Fast).unwrap();
                }
            }
            fr.run().unwrap();
        };
        let t = std::time::Instant::now();
        while t.elapsed().as_secs_f64() < 2.0 {
            run(0, 8);
        }
        let names: Vec<&str> = moe.iter().map(|m| m.0).chain(dense.iter().map(|d| d.0)).collect();
        for (what, name) in names.iter().enumerate() {
            let _ = ctx.take_profile();
            let wall = std::time::Instant::now();
            for _ in 0..5 {
                run(what, 8);
            }
            let wall = wall.elapsed().as_secs_f64() / 40.0;
            eprintln!("gemm_rates {format:?} {name}: {:.1} us a call on the host's clock", wall * 1e6);
            for (label, count, secs) in ctx.take_profile() {
                eprintln!("    {label}: {count} x, {:.1} us a call", secs * 1e6 / count as f64);
            }
        }
    }
}
