//! Multi-head latent attention on the device (`Frame::mla`: the query path, kv_a with the
//! latent norm, RoPE on the rope parts, the cache append, the absorbed attention, kv_b's value
//! rows, o) against the CPU op (`cpu::mla::mla`, with f32 weights in the form the CPU picks:
//! expanded for prompt blocks, absorbed for one row) on Lavapipe: random weights, norms and
//! inputs (never zeros), blocks appended one after another (1, 3 and 9 rows; and a first block
//! of 70 rows, past one tile of the attention kernel), on several geometries (the DeepSeek-V3
//! fixture's with YaRN, DeepSeek-V3's heads with a direct query and rotate-half pairs, a latent
//! of 1024, biases on every projection); and over a random selection of positions per row
//! (DeepSeek Sparse Attention, `mla_attn_sparse.comp`) against the CPU op with that selection;
//! heads in groups and decode rows' positions split across workgroups (11 and 9 heads, latents
//! of 64 and 1024, after a block of 150 rows); two layers' split decode attention in one frame
//! against a direct reference in this file, sharing the frame's partials.
//!
//! Tolerance: f32 weights with f32 activations (`Precision::Exact`): each block's output and
//! its new cache rows (read back and in the mirror) within 1e-5 of their largest |value|.
//! Q8_0, BF16 and FP8_E4M3 weights with the CPU's activations (`Precision::Fast`: 8-bit
//! blocks for Q8_0): 1e-4 against the CPU's absorbed form for every block (the form the device runs: with 8-bit
//! activations the CPU's two forms differ by about 1.5e-2 of the output, the expanded one
//! putting the cached latents through kv_b's key rows in 8 bits where the absorbed one decodes
//! those rows in f32).

mod vk_common;

use coli_compiler::ir::RopeStyle;
use coli_compiler::ir::{MlaSpec, RopeScaling};
use coli_runtime::cpu::mla::{mla, MlaCall as CpuCall, MlaForm, MlaWeights, QueryWeights};
use coli_runtime::cpu::rope::inv_freq;
use coli_runtime::cpu::Precision;
use coli_runtime::exec::kv::LayerKv;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::{MlaAttnArgs, MlaCache, MlaCall, MlaMats, MlaQuery, MlaScratch, MlaShape, RopeArgs};
use vk_common::*;

struct Case {
    hidden: usize,
    heads: usize,
    q_lora: Option<usize>,
    latent: usize,
    nope: usize,
    rope: usize,
    v: usize,
    interleave: bool,
    scaling: RopeScaling,
    biases: bool,
    format: WeightFormat,
    blocks: &'static [usize],
    /// A random selection of this many positions per row (DeepSeek Sparse Attention).
    select: Option<usize>,
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn run_case(c: &Case, seed: u64) {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(seed);
    let spec = MlaSpec {
        heads: c.heads,
        q_lora_rank: c.q_lora,
        kv_lora_rank: c.latent,
        qk_nope_head_dim: c.nope,
        qk_rope_head_dim: c.rope,
        v_head_dim: c.v,
        scale: 1.0 / ((c.nope + c.rope) as f32).sqrt(),
        weights: vec![],
        rope_theta: 10000.0,
        rope_scaling: c.scaling,
        norm_eps: 1e-6,
        rope_interleave: c.interleave,
        select: None,
    };
    let s = MlaShape::of(&spec);
    let exact = c.format == WeightFormat::F32;
    let precision = if exact { Precision::Exact } else { Precision::Fast };
    let tol = if exact { 1e-5 } else { 1e-4 };
    let (h, dq) = (c.heads, c.nope + c.rope);
    // Stored rows of every matrix, (rows, cols).
    let dims: Vec<(usize, usize)> = vec![
        (c.q_lora.unwrap_or(h * dq), c.hidden),
        (h * dq, c.q_lora.unwrap_or(1)),
        (c.latent + c.rope, c.hidden),
        (h * (c.nope + c.v), c.latent),
        (c.hidden, h * c.v),
    ];
    let stored: Vec<Vec<u8>> = dims.iter().map(|&(r, k)| random_rows(c.format, r, k, &mut rng)).collect();
    let m = |i: usize| Matrix::new(c.format, dims[i].0, dims[i].1, &stored[i]).unwrap();
    let qn: Vec<f32> = rng.vec(c.q_lora.unwrap_or(1), 0.5).iter().map(|v| 1.0 + v).collect();
    let kn: Vec<f32> = rng.vec(c.latent, 0.5).iter().map(|v| 1.0 + v).collect();
    let bias = |rng: &mut Rng, n: usize| c.biases.then(|| rng.vec(n, 0.3));
    let (qab, kvab, ob) =
        (bias(&mut rng, c.q_lora.unwrap_or(1)), bias(&mut rng, c.latent + c.rope), bias(&mut rng, c.hidden));
    let q = match c.q_lora {
        Some(_) => QueryWeights::Lora { q_a: m(0), q_a_norm: &qn, q_b: m(1) },
        None => QueryWeights::Direct(m(0)),
    };
    let cw = MlaWeights {
        q,
        q_a_bias: qab.as_deref().filter(|_| c.q_lora.is_some()),
        kv_a: m(2),
        kv_a_bias: kvab.as_deref(),
        kv_a_norm: &kn,
        kv_b: m(3),
        o: m(4),
        o_bias: ob.as_deref(),
    };
    // The device's copies.
    let dm: Vec<_> =
        dims.iter().zip(&stored).map(|(&(r, k), b)| ctx.upload_matrix(c.format, r, k, b).unwrap()).collect();
    let (dqn, dkn) = (ctx.upload_f32(&qn).unwrap(), ctx.upload_f32(&kn).unwrap());
    let up = |b: &Option<Vec<f32>>| b.as_ref().map(|b| ctx.upload_f32(b).unwrap());
    let (dqab, dkvab, dob) = (up(&qab), up(&kvab), up(&ob));
    let dq_ = match c.q_lora {
        Some(_) => MlaQuery::Lora { q_a: &dm[0], q_a_norm: dqn.all(), q_b: &dm[1] },
        None => MlaQuery::Direct(&dm[0]),
    };
    let mats = MlaMats {
        q: dq_,
        q_a_bias: dqab.as_ref().filter(|_| c.q_lora.is_some()).map(|b| b.all()),
        kv_a: &dm[2],
        kv_a_bias: dkvab.as_ref().map(|b| b.all()),
        kv_a_norm: dkn.all(),
        kv_b: &dm[3],
        o: &dm[4],
        o_bias: dob.as_ref().map(|b| b.all()),
    };
    let (freq, mscale) = inv_freq(c.rope, spec.rope_theta, spec.rope_scaling);
    let dfreq = ctx.upload_f32(&freq).unwrap();
    let style = if c.interleave { RopeStyle::Interleaved } else { RopeStyle::RotateHalf };
    let rope = RopeArgs { freq: dfreq.all(), style, mscale };
    let total: usize = c.blocks.iter().sum();
    let most = *c.blocks.iter().max().unwrap();
    let (ml, mr) = (ctx.f32_buffer(total * c.latent).unwrap(), ctx.f32_buffer(total * c.rope).unwrap());
    let (sl, sr) = (ctx.f32_buffer(most * c.latent).unwrap(), ctx.f32_buffer(most * c.rope).unwrap());
    let cache = MlaCache { latent: ml.all(), rope: mr.all(), latent_back: sl.all(), rope_back: sr.all() };
    let scratch = MlaScratch::new(ctx, most, s).unwrap();
    // The input in the middle of a larger buffer: the op honours its views' offsets.
    let lead = 3;
    let (dx, dy) = (ctx.f32_buffer(lead + most * c.hidden).unwrap(), ctx.f32_buffer(lead + most * c.hidden).unwrap());
    let mut kv = LayerKv { k_width: c.latent, v_width: c.rope, ..Default::default() };
    let mut pos0 = 0;
    for &n in c.blocks {
        let what = format!(
            "{} heads, q_lora {:?}, latent {}, nope {} rope {} v {}, {:?}, {n} rows at {pos0}",
            h, c.q_lora, c.latent, c.nope, c.rope, c.v, c.format
        );
        let x = rng.vec(n * c.hidden, 1.0);
        let mut want = vec![0f32; n * c.hidden];
        let form = if exact { MlaForm::for_rows(n) } else { MlaForm::Absorbed };
        let sel = c.select.map(|k| random_selection(&mut rng, n, pos0, k));
        let cpu = CpuCall { spec: &spec, weights: &cw, precision, form, select: sel.as_deref() };
        mla(&cpu, &x, n, pos0, &mut kv, &mut want);
        ctx.write(&dx, lead * 4, &bytes(&x)).unwrap();
        let dsel = sel.as_ref().map(|v| ctx.upload_f32(v).unwrap());
        let select = dsel.as_ref().zip(c.select).map(|(b, k)| (b.all(), k));
        let mut f = ctx.frame().unwrap();
        let call = MlaCall { shape: s, weights: mats, rope, cache, scratch: &scratch, precision, select };
        f.mla(call, dx.view(lead, n * c.hidden), n, pos0, dy.view(lead, n * c.hidden)).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(dy.view(lead, n * c.hidden)).unwrap();
        let eo = worst(&got, &want);
        let (gl, gr) =
            (ctx.download_f32(sl.view(0, n * c.latent)).unwrap(), ctx.download_f32(sr.view(0, n * c.rope)).unwrap());
        let (wl, wr) = (&kv.k[pos0 * c.latent..], &kv.v[pos0 * c.rope..]);
        let (el, er) = (worst(&gl, wl), worst(&gr, wr));
        let (ml_, mr_) = (
            ctx.download_f32(ml.view(0, (pos0 + n) * c.latent)).unwrap(),
            ctx.download_f32(mr.view(0, (pos0 + n) * c.rope)).unwrap(),
        );
        let (eml, emr) = (worst(&ml_, &kv.k), worst(&mr_, &kv.v));
        eprintln!("{what}: output {eo:.2e}, latents {el:.2e}, rope keys {er:.2e}");
        assert!(eo <= tol, "{what}: output off by {eo} of its largest value");
        assert!(el <= tol && er <= tol, "{what}: read-back rows off by {el} / {er}");
        assert!(eml <= tol && emr <= tol, "{what}: mirrors off by {eml} / {emr}");
        pos0 += n;
    }
}

/// `n` rows at positions `pos0..` of a selection of `topk` (ascending positions at or before
/// each row, `-1` after them where a row sees fewer), at random.
fn random_selection(rng: &mut Rng, n: usize, pos0: usize, topk: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * topk);
    for i in 0..n {
        let seen = pos0 + i + 1;
        let mut all: Vec<usize> = (0..seen).collect();
        // A partial shuffle picks min(seen, topk) of them.
        for j in 0..topk.min(seen) {
            let k = j + rng.below(seen - j);
            all.swap(j, k);
        }
        let mut pick = all[..topk.min(seen)].to_vec();
        pick.sort_unstable();
        out.extend(pick.iter().map(|&p| p as f32));
        out.extend(std::iter::repeat_n(-1.0, topk - pick.len()));
    }
    out
}

const YARN: RopeScaling = RopeScaling::Yarn {
    factor: 4.0,
    original_max_position: 64,
    beta_fast: 32.0,
    beta_slow: 1.0,
    attention_factor: 1.17,
    truncate: true,
};

/// DeepSeek Sparse Attention: each row over a random selection of 5 positions (`mla_attn_sparse.comp`),
/// in both CPU forms; a first block of 70 rows crosses a tile of the attention kernel.
#[test]
fn over_a_selection_the_fixture_geometry_matches_the_cpu() {
    let case = |blocks: &'static [usize]| Case {
        hidden: 64,
        heads: 4,
        q_lora: Some(40),
        latent: 32,
        nope: 16,
        rope: 8,
        v: 12,
        interleave: true,
        scaling: YARN,
        biases: false,
        format: WeightFormat::F32,
        blocks,
        select: Some(5),
    };
    run_case(&case(&[1, 3, 9]), 0x5e1);
    run_case(&case(&[70, 1, 3]), 0x5e2);
}

/// Heads in groups that share each latent read (11 heads: a group of 8 and one of 3; a latent
/// of 1024: groups of 4 and a last of 1) and one row's positions split across workgroups and
/// joined (decode rows after a block of 150, over every position and over a selection of 100;
/// after a block of 20, over a selection of 100 that names only the 21-22 positions seen).
#[test]
fn head_groups_and_split_positions_match_the_cpu() {
    let case = |heads, latent, select, blocks: &'static [usize]| Case {
        hidden: 48,
        heads,
        q_lora: Some(24),
        latent,
        nope: 8,
        rope: 8,
        v: 6,
        interleave: false,
        scaling: RopeScaling::None,
        biases: false,
        format: WeightFormat::F32,
        blocks,
        select,
    };
    run_case(&case(11, 64, None, &[150, 1, 3, 1]), 0x6a1);
    run_case(&case(11, 64, Some(100), &[150, 1, 3, 1]), 0x6a2);
    run_case(&case(9, 1024, Some(40), &[150, 1, 3, 1]), 0x6a3);
    // Decode rows that see fewer positions than the selection holds (21 and 22 of 100, -1 after
    // them) split four ways: the splits share out the selected positions only.
    run_case(&case(11, 64, Some(100), &[20, 1, 1]), 0x6a4);
}

#[test]
fn the_fixture_geometry_matches_the_cpu() {
    let c = Case {
        hidden: 64,
        heads: 4,
        q_lora: Some(48),
        latent: 32,
        nope: 16,
        rope: 8,
        v: 12,
        interleave: true,
        scaling: YARN,
        biases: false,
        format: WeightFormat::F32,
        blocks: &[1, 3, 9],
        select: None,
    };
    run_case(&c, 0x31a1);
}

#[test]
fn deepseek_v3_heads_with_a_direct_query_match_the_cpu() {
    let c = Case {
        hidden: 96,
        heads: 2,
        q_lora: None,
        latent: 512,
        nope: 128,
        rope: 64,
        v: 128,
        interleave: false,
        scaling: RopeScaling::None,
        biases: false,
        format: WeightFormat::F32,
        blocks: &[1, 3, 9],
        select: None,
    };
    run_case(&c, 0x31a2);
}

#[test]
fn long_blocks_a_wide_latent_and_biases_match_the_cpu() {
    let c = Case {
        hidden: 40,
        heads: 3,
        q_lora: Some(20),
        latent: 1024,
        nope: 8,
        rope: 6,
        v: 5,
        interleave: true,
        scaling: YARN,
        biases: true,
        format: WeightFormat::F32,
        blocks: &[70, 1, 3],
        select: None,
    };
    run_case(&c, 0x31a3);
    let c = Case {
        hidden: 48,
        heads: 5,
        q_lora: Some(16),
        latent: 100,
        nope: 12,
        rope: 4,
        v: 7,
        interleave: false,
        scaling: RopeScaling::None,
        biases: true,
        format: WeightFormat::F32,
        blocks: &[9, 1, 3],
        select: None,
    };
    run_case(&c, 0x31a4);
}

#[test]
fn quantized_and_bf16_weights_match_the_cpu() {
    for (format, seed) in [(WeightFormat::Q8_0, 0x31a5), (WeightFormat::BF16, 0x31a6)] {
        let c = Case {
            hidden: 64,
            heads: 4,
            q_lora: Some(64),
            latent: 64,
            nope: 16,
            rope: 8,
            v: 16,
            interleave: true,
            scaling: YARN,
            biases: false,
            format,
            blocks: &[1, 3, 9],
            select: None,
        };
        run_case(&c, seed);
    }
}

#[test]
fn fp8_weights_match_the_cpu() {
    // Every projection's columns whole 128-blocks (as DeepSeek-V3's FP8 checkpoint has them);
    // kv_a's 144 rows end in a short tile. FP8 rows take f32 activations on both sides.
    let c = Case {
        hidden: 128,
        heads: 2,
        q_lora: Some(128),
        latent: 128,
        nope: 32,
        rope: 16,
        v: 64,
        interleave: true,
        scaling: YARN,
        biases: false,
        format: WeightFormat::FP8_E4M3,
        blocks: &[1, 3, 9],
        select: None,
    };
    run_case(&c, 0x31a7);
}

#[test]
fn out_of_range_geometries_are_typed_errors() {
    let Some(ctx) = ctx() else { return };
    let b = ctx.f32_buffer(1 << 16).unwrap();
    for (latent, rope) in [(2048, 8), (32, 7), (32, 256), (0, 8)] {
        let s = MlaShape { heads: 1, q_lora: None, latent, nope: 4, rope, v_head_dim: 4, scale: 1.0, eps: 1e-6 };
        let mut f = ctx.frame().unwrap();
        let a =
            MlaAttnArgs { q: b.view(0, 64), lat: b.view(0, 4096), latent_mirror: b.all(), rope_mirror: b.all(), n: 1 };
        let e = f.mla_attn(s, a, 0);
        assert!(e.is_err(), "a latent of {latent}, a rope part of {rope}: refused");
    }
}

/// The absorbed attention of one row at `pos` over mirrors `ml` / `mr` (every position up to
/// it), as cpu::mla's second loop: per head the softmax of (q_lat . ml[j] + q_rope . mr[j]) *
/// scale, then the weighted latents.
fn attend_rows(s: &MlaShape, q: &[f32], lat: &[f32], ml: &[f32], mr: &[f32], pos: usize) -> Vec<f32> {
    let (c, dr, dq) = (s.latent, s.rope, s.nope + s.rope);
    let mut out = vec![0f32; s.heads * c];
    for h in 0..s.heads {
        let (ql, qr) = (&lat[h * c..(h + 1) * c], &q[h * dq + s.nope..(h + 1) * dq]);
        let sc: Vec<f32> = (0..=pos)
            .map(|j| {
                let a: f32 = ql.iter().zip(&ml[j * c..(j + 1) * c]).map(|(x, y)| x * y).sum();
                let b: f32 = qr.iter().zip(&mr[j * dr..(j + 1) * dr]).map(|(x, y)| x * y).sum();
                (a + b) * s.scale
            })
            .collect();
        let m = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let p: Vec<f32> = sc.iter().map(|x| (x - m).exp()).collect();
        let l: f32 = p.iter().sum();
        for (j, pj) in p.iter().enumerate() {
            for k in 0..c {
                out[h * c + k] += pj / l * ml[j * c + k];
            }
        }
    }
    out
}

/// Two layers' decode attention in one frame, each row's positions split across workgroups:
/// both match the CPU, and the second call takes no scratch of its own (the split partials
/// and counters are the frame's, shared, so a recording of many layers holds one layer's).
#[test]
fn layers_in_one_frame_share_the_split_partials() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x6b1);
    let s = MlaShape { heads: 12, q_lora: None, latent: 64, nope: 8, rope: 8, v_head_dim: 8, scale: 0.3, eps: 1e-6 };
    let pos = 199;
    let layer = |rng: &mut Rng| {
        let q = rng.vec(s.heads * (s.nope + s.rope), 1.0);
        let lat = rng.vec(s.heads * s.latent, 1.0);
        let ml = rng.vec((pos + 1) * s.latent, 1.0);
        let mr = rng.vec((pos + 1) * s.rope, 1.0);
        (q, lat, ml, mr)
    };
    let layers = [layer(&mut rng), layer(&mut rng)];
    let up: Vec<_> = layers
        .iter()
        .map(|(q, lat, ml, mr)| {
            let u = |v: &Vec<f32>| ctx.upload_f32(v).unwrap();
            (u(q), u(lat), u(ml), u(mr))
        })
        .collect();
    let args = |i: usize| {
        let (q, lat, ml, mr) = &up[i];
        MlaAttnArgs { q: q.all(), lat: lat.all(), latent_mirror: ml.all(), rope_mirror: mr.all(), n: 1 }
    };
    let mut f = ctx.frame().unwrap();
    f.mla_attn(s, args(0), pos).unwrap();
    let one = f.scratch_bytes();
    f.mla_attn(s, args(1), pos).unwrap();
    assert!(one > 0, "a split call takes scratch for its partials");
    assert_eq!(f.scratch_bytes(), one, "the second layer's call shares the first's partials and counters");
    f.run().unwrap();
    for (i, (q, lat, ml, mr)) in layers.iter().enumerate() {
        let want = attend_rows(&s, q, lat, ml, mr, pos);
        let got = ctx.download_f32(up[i].1.all()).unwrap();
        let e = worst(&got, &want);
        eprintln!("layer {i}: {e:.2e} of the largest output");
        assert!(e <= 1e-5, "layer {i}: off by {e} of the largest output");
    }
}
