//! DeepSeek V4's device kernels against the CPU reference, on whatever device the machine has
//! (Lavapipe in CI): the unweighted RMSNorm, RoPE on the heads' last columns and inverted, the
//! limited SwiGLU (and its product; in the experts: `vk_moe.rs`), the sqrt-softplus and hash
//! routers, ...
//! Random inputs from a seeded generator, odd sizes; each test states its tolerance, relative to
//! the largest |reference| of the output, and prints the error it measured.
//!
//! Must not: compare a device path with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{GluKind, GroupScore, RopeScaling, RopeStyle, RouterScoring};
use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::route::RouteSpec;
use coli_runtime::cpu::Precision;
use coli_runtime::cpu::{elementwise as cpu_elementwise, norm as cpu_norm, rope as cpu_rope, route as cpu_route};
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::{MatIn, MatmulPath, RopePart, RopeShape, RouteHash, RouteParams};
use vk_common::{assert_close, assert_close_terms, ctx, random_rows, rel_err, Rng};

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

/// DeepSeek V4's limited SwiGLU (`glu_limited`: gate clamped above, up to [-limit, limit],
/// silu(gate) * up) over an odd count with values well past the limit both ways, out of place
/// and over its gate: against `cpu::elementwise::glu`. Tolerance 1e-5 (the device's exp).
#[test]
fn glu_limited_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4003);
    let count = 1001;
    let (g, u) = (rng.vec(count, 8.0), rng.vec(count, 8.0));
    for limit in [2.0, 7.0] {
        let kind = GluKind::LimitedSwiGlu { limit };
        let mut want = vec![0f32; count];
        cpu_elementwise::glu(kind, &g, &u, &mut want);
        let (gb, ub, ob) = (ctx.upload_f32(&g).unwrap(), ctx.upload_f32(&u).unwrap(), ctx.f32_buffer(count).unwrap());
        let mut f = ctx.frame().unwrap();
        f.glu(kind, gb.all(), ub.all(), ob.all(), count).unwrap();
        f.glu(kind, gb.all(), ub.all(), gb.all(), count).unwrap();
        f.run().unwrap();
        check(&format!("glu_limited {limit}"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        check(&format!("glu_limited {limit} over its gate"), &ctx.download_f32(gb.all()).unwrap(), &want, 1e-5);
    }
}

/// The limited SwiGLU fused into the product that reads it (`MatIn::Glu`, the shared expert's
/// down projection): f32 and Q8_0 weights, one row (GEMV) and several (GEMM), f32 activations
/// (`Precision::Exact`), against the CPU's `glu` then `linear`. Tolerance 1e-5 of each output's
/// sum of |w x| (f32 accumulation in another order, as `vk_fused.rs`).
#[test]
fn a_product_of_the_limited_swiglu_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4004);
    let (rows, cols) = (37, 96);
    let kind = GluKind::LimitedSwiGlu { limit: 2.0 };
    for format in [WeightFormat::F32, WeightFormat::Q8_0] {
        let bytes = random_rows(format, rows, cols, &mut rng);
        let (m, w) =
            (Matrix::new(format, rows, cols, &bytes).unwrap(), ctx.upload_matrix(format, rows, cols, &bytes).unwrap());
        for (n, path) in [(1, MatmulPath::Gemv), (5, MatmulPath::Gemm)] {
            let (g, u) = (rng.vec(n * cols, 4.0), rng.vec(n * cols, 4.0));
            let mut h = vec![0f32; n * cols];
            cpu_elementwise::glu(kind, &g, &u, &mut h);
            let mut want = vec![0f32; n * rows];
            linear(&m, &h, n, &mut want, Precision::Exact);
            let mut wrow = vec![0f32; cols];
            let mut mag = vec![0f32; n * rows];
            for r in 0..rows {
                dequant_row(format, m.row(r), &mut wrow);
                for i in 0..n {
                    mag[i * rows + r] = wrow.iter().zip(&h[i * cols..]).map(|(a, b)| (a * b).abs()).sum();
                }
            }
            let (gb, ub, ob) =
                (ctx.upload_f32(&g).unwrap(), ctx.upload_f32(&u).unwrap(), ctx.f32_buffer(n * rows).unwrap());
            let input = MatIn::Glu { gate: gb.all(), up: ub.all(), kind };
            let mut f = ctx.frame().unwrap();
            f.matmul_fused(&w, input, n, ob.all(), None, path, Precision::Exact).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(ob.all()).unwrap();
            let what = format!("{format} limited swiglu product n {n} {path:?}");
            eprintln!("{what}: {:.2e} of the largest", rel_err(&got, &want));
            assert_close_terms(&what, &got, &want, &mag, 1e-5);
        }
    }
}

/// DeepSeek V4's routers (`route_sqrt_softplus`, `route_hash`): sqrt(softplus) scores with a
/// correction bias and top-k, and hash routing (each row's experts its token's row of a table)
/// under every scoring, renormalised or not, an odd count of experts and rows, logits past
/// softplus' cut at 20 and far below 0: against `cpu::route::route_row` / `route_row_hash`.
/// Expert ids exact; weights within 1e-5 of the largest (the device's exp/log/sqrt).
#[test]
fn sqrt_softplus_and_hash_routing_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4005);
    let (n, experts, top_k, vocab) = (7, 13, 3, 11);
    let mut logits = rng.vec(n * experts, 6.0);
    logits[2] = 23.0;
    logits[5] = -30.0;
    let bias = rng.vec(experts, 0.3);
    let table: Vec<f32> = (0..vocab * top_k).map(|_| rng.below(experts) as f32).collect();
    let tokens: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
    let (lb, bb, tb) =
        (ctx.upload_f32(&logits).unwrap(), ctx.upload_f32(&bias).unwrap(), ctx.upload_f32(&table).unwrap());
    let kb = ctx.upload_f32(&tokens.iter().map(|&t| f32::from_bits(t)).collect::<Vec<_>>()).unwrap();
    let scorings = [RouterScoring::SqrtSoftplus, RouterScoring::Sigmoid, RouterScoring::Softmax];
    for (scoring, hashed, renormalize) in
        scorings.iter().flat_map(|&s| [(s, true, true), (s, true, false), (s, false, true)])
    {
        if !hashed && scoring != RouterScoring::SqrtSoftplus {
            continue;
        }
        let spec = RouteSpec {
            scoring,
            top_k,
            renormalize,
            correction_bias: (!hashed).then_some(&bias[..]),
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.5,
        };
        let mut want = vec![0f32; n * 2 * top_k];
        for r in 0..n {
            let (l, o) = (&logits[r * experts..(r + 1) * experts], &mut want[r * 2 * top_k..(r + 1) * 2 * top_k]);
            if hashed {
                let t = tokens[r] as usize;
                cpu_route::route_row_hash(&spec, &table[t * top_k..(t + 1) * top_k], l, o);
            } else {
                cpu_route::route_row(&spec, l, o);
            }
        }
        let p =
            RouteParams { scoring, top_k, renormalize, groups: None, group_score: GroupScore::TopTwoSum, scale: 1.5 };
        let ob = ctx.f32_buffer(n * 2 * top_k).unwrap();
        let mut f = ctx.frame().unwrap();
        if hashed {
            let h = RouteHash { tokens: kb.all(), table: tb.all(), vocab };
            f.route_hash(lb.all(), h, ob.all(), (n, experts), p).unwrap();
        } else {
            f.route(lb.all(), Some(bb.all()), ob.all(), n, experts, p).unwrap();
        }
        f.run().unwrap();
        let got = ctx.download_f32(ob.all()).unwrap();
        let what = format!("route {scoring:?} hash {hashed} renormalize {renormalize}");
        let ids = |v: &[f32]| v.iter().step_by(2).copied().collect::<Vec<_>>();
        let weights = |v: &[f32]| v.iter().skip(1).step_by(2).copied().collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "{what}: experts");
        check(&format!("{what} weights"), &weights(&got), &weights(&want), 1e-5);
    }
}

/// Attention over the cached rows and a compressor's compressed entries
/// (`attention_compressed.comp`) against `cpu::compress::attend`: odd head widths and head
/// counts, rows whose windows cross a window boundary and whose entries close mid-block, every
/// visible entry or a selection with `-1` padding and entries a row does not see yet (both
/// skipped), sinks on and off, more keys than a tile of 64, and a decode row at a position read
/// on the device. Tolerance 1e-5 of the largest |output| (f32 sums in another order; measured
/// about 2e-7).
#[test]
fn compressed_attention_matches_cpu() {
    use coli_runtime::cpu::attention::AttnShape as CpuShape;
    use coli_runtime::cpu::compress::{attend, Entries};
    use coli_runtime::vk::{CompressedArgs, CompressedShape, Pos};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4007);
    // (heads, head_dim, window, rate, pos0, n, topk, sinks, dynamic)
    let cases = [
        (3, 24, Some(4), 5, 0, 22, 0, true, false),
        (3, 24, Some(4), 3, 5, 9, 3, true, false),
        (2, 37, None, 4, 0, 13, 0, false, false),
        (5, 19, Some(70), 2, 60, 30, 0, true, false),
        (4, 64, Some(128), 4, 300, 7, 16, true, false),
        (3, 24, Some(4), 3, 40, 1, 3, true, true),
        (2, 130, Some(8), 5, 99, 1, 0, false, true),
    ];
    for (heads, d, window, rate, pos0, n, topk, with_sinks, dynamic) in cases {
        let len = pos0 + n;
        let count = len / rate;
        let q = rng.vec(n * heads * d, 1.0);
        let (k, v) = (rng.vec(len * d, 1.0), rng.vec(len * d, 1.0));
        let entries = rng.vec(count.max(1) * d, 1.0);
        let sinks = rng.vec(heads, 1.0);
        // A row's selection: entries it sees and does not, in some order of ascending picks,
        // padded with -1 (the padding in the middle too, which the CPU skips).
        let select: Vec<f32> = (0..n * topk)
            .map(|_| match rng.below(6) {
                0 => -1.0,
                _ => rng.below(count + 2) as f32,
            })
            .collect();
        let cs = CpuShape { heads, kv_heads: 1, head_dim: d, v_head_dim: d, scale: (d as f32).powf(-0.5), window };
        let sel = (topk > 0).then_some((select.as_slice(), topk));
        let e = Entries { rows: &entries, rate, select: sel };
        let mut want = vec![0f32; n * heads * d];
        attend(cs, &q, (&k, &v), &e, pos0, with_sinks.then_some(sinks.as_slice()), &mut want);
        let shape = CompressedShape { heads, head_dim: d, scale: cs.scale, window, rate, ring: None };
        let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
        let (dq, dk, dv, de, ds, dsel) = (up(&q), up(&k), up(&v), up(&entries), up(&sinks), up(&select));
        let (out, dpos) = (ctx.f32_buffer(n * heads * d).unwrap(), ctx.f32_buffer(1).unwrap());
        ctx.write(&dpos, 0, &(pos0 as u32).to_le_bytes()).unwrap();
        let pos = if dynamic { Pos::Dynamic(dpos.view(0, 1)) } else { Pos::Fixed(pos0) };
        let args = CompressedArgs {
            q: dq.all(),
            k: dk.all(),
            v: dv.all(),
            entries: de.all(),
            sinks: with_sinks.then(|| ds.all()),
            select: (topk > 0).then(|| (dsel.all(), topk)),
            out: out.all(),
            n,
        };
        let mut f = ctx.frame().unwrap();
        f.attention_compressed(shape, args, pos).unwrap();
        f.run().unwrap();
        let what = format!("attention_compressed {heads}x{d} window {window:?} rate {rate} at {pos0}+{n} topk {topk}");
        check(&what, &ctx.download_f32(out.all()).unwrap(), &want, 1e-5);
    }
}

/// The KV compressor on the device (its two products into the projection mirrors at the
/// block's positions, then `compress_pool.comp` closing the windows the block completes)
/// against `cpu::compress::kv_compress` over the same blocks: overlap off and on, rope parts of
/// 0, 6 (YaRN) and 8, odd widths, blocks of odd sizes crossing windows, the first window's
/// overlap (its own rows only). Tolerance 1e-5 of the largest |entry| (f32 sums in another
/// order, the device's sin/cos; measured about 3e-7); the read-back rows equal the mirror's.
#[test]
fn kv_compressor_matches_cpu() {
    use coli_compiler::ir::CompressSpec;
    use coli_runtime::cpu::compress::{kv_compress, CompressWeights, Compressor};
    use coli_runtime::vk::{PoolArgs, PoolShape};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4008);
    let yarn = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position: 16,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    // (head_dim, rate, overlap, rope_dim, scaling, hidden, blocks)
    let cases = [
        (24, 5, false, 6, yarn, 48, vec![22, 1, 1, 3]),
        (24, 3, true, 6, yarn, 48, vec![7, 1, 5, 2]),
        (19, 4, true, 0, RopeScaling::None, 33, vec![1, 1, 1, 1, 9]),
        (40, 2, false, 8, RopeScaling::None, 21, vec![3, 4]),
    ];
    for (d, rate, overlap, rope_dim, scaling, hidden, blocks) in cases {
        let spec = CompressSpec {
            rate,
            head_dim: d,
            rope_dim,
            rope_theta: 160000.0,
            rope_scaling: scaling,
            overlap,
            eps: 1e-6,
            index: None,
            weights: vec![],
        };
        let shape = PoolShape::parts_of(&spec).expect("a shape the kernel takes")[0];
        let half = shape.half();
        let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (wk, wg) = (f32s(&rng.vec(half * hidden, 0.3)), f32s(&rng.vec(half * hidden, 0.5)));
        let (ape, norm) = (rng.vec(rate * half, 0.5), rng.vec(d, 1.0));
        let (mk, mg) = (
            Matrix::new(WeightFormat::F32, half, hidden, &wk).unwrap(),
            Matrix::new(WeightFormat::F32, half, hidden, &wg).unwrap(),
        );
        let w = CompressWeights { main: Compressor { kv: mk, gate: mg, ape: &ape, norm: &norm }, index: None };
        let total: usize = blocks.iter().sum();
        let (dk, dg) = (
            ctx.upload_matrix(WeightFormat::F32, half, hidden, &wk).unwrap(),
            ctx.upload_matrix(WeightFormat::F32, half, hidden, &wg).unwrap(),
        );
        let (freq, mscale) = cpu_rope::inv_freq(rope_dim, spec.rope_theta, scaling);
        let up = |x: &[f32]| ctx.upload_f32(if x.is_empty() { &[0.0] } else { x }).unwrap();
        let (dape, dnorm, dfreq) = (up(&ape), up(&norm), up(&freq));
        let (kvm, gm) = (ctx.f32_buffer(total * half).unwrap(), ctx.f32_buffer(total * half).unwrap());
        let ents = ctx.f32_buffer((total / rate).max(1) * d).unwrap();
        let back = ctx.f32_buffer((total / rate).max(1) * d).unwrap();
        let mut state = Vec::new();
        let mut pos0 = 0;
        for &n in &blocks {
            let x = rng.vec(n * hidden, 1.0);
            kv_compress(&spec, &w, (&x, None, n, pos0), Precision::Exact, &mut state, None).unwrap();
            let dx = ctx.upload_f32(&x).unwrap();
            let (e0, e1) = (pos0 / rate, (pos0 + n) / rate);
            let mut f = ctx.frame().unwrap();
            let (kr, gr) = (kvm.view(pos0 * half, n * half), gm.view(pos0 * half, n * half));
            f.matmul_with(&dk, dx.all(), n, kr, MatmulPath::Auto, Precision::Exact).unwrap();
            f.matmul_with(&dg, dx.all(), n, gr, MatmulPath::Auto, Precision::Exact).unwrap();
            let args = PoolArgs {
                kv: kvm.all(),
                gate: gm.all(),
                ape: dape.all(),
                norm: dnorm.all(),
                freq: dfreq.view(0, rope_dim / 2),
                mscale,
                entries: ents.all(),
                back: back.view(0, (e1 - e0) * d),
            };
            f.compress_pool(shape, args, e0, e1 - e0).unwrap();
            f.run().unwrap();
            pos0 += n;
            let want = &state[0].entries[..e1 * d];
            let what = format!("kv_compress {d} rate {rate} overlap {overlap} rope {rope_dim} to {pos0}");
            let got = ctx.download_f32(ents.all()).unwrap();
            check(&what, &got[..e1 * d], want, 1e-5);
            let got_back = ctx.download_f32(back.view(0, (e1 - e0) * d)).unwrap();
            assert_eq!(got_back, got[e0 * d..e1 * d], "{what}: the read-back rows are the mirror's");
        }
    }
}

/// The compressor's lightning indexer selection on the device (`dsa_select_rate`: the DSA
/// kernels over a compressor's entries, a row at `p` seeing `e < (p + 1) / rate`) against the
/// definition `cpu::compress` chooses by: scores `sum_h w_h relu(q_h . k_e / sqrt(d))`, the
/// `topk` best ascending, earlier of equal scores first, every entry and `-1` padding where a row
/// sees no more than `topk`. Rows whose k-th and (k+1)-th scores differ by at most 1e-5 (not
/// exact ties) are skipped (f32 sums in another order); at least 90% of the rows are checked,
/// exactly.
#[test]
fn compressed_index_selection_matches_cpu() {
    use coli_runtime::vk::{DsaSelectArgs, DsaShape, Pos};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_4009);
    // (heads, head_dim, topk, rate, pos0, n)
    for (h, d, topk, rate, pos0, n) in [(8, 8, 3, 3, 0, 22), (4, 16, 5, 4, 37, 9), (3, 12, 64, 2, 200, 6)] {
        let count = (pos0 + n) / rate;
        let (q, keys, w) = (rng.vec(n * h * d, 1.0), rng.vec(count.max(1) * d, 1.0), rng.vec(n * h, 1.0));
        let w_scale = (h as f32).powf(-0.5);
        let score = |r: usize, e: usize| -> f32 {
            let qr = &q[r * h * d..(r + 1) * h * d];
            let k = &keys[e * d..(e + 1) * d];
            let s: f32 = qr
                .chunks_exact(d)
                .zip(&w[r * h..(r + 1) * h])
                .map(|(qh, &wh)| {
                    let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
                    wh * w_scale * (dot * (d as f32).powf(-0.5)).max(0.0)
                })
                .sum();
            s + 0.0
        };
        let (dq, dk, dw) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&keys).unwrap(), ctx.upload_f32(&w).unwrap());
        let stride = count.max(1);
        let (scores, out) = (ctx.f32_buffer(n * stride).unwrap(), ctx.f32_buffer(n * topk).unwrap());
        let args = DsaSelectArgs {
            q: dq.all(),
            keys: dk.all(),
            w: dw.all(),
            w_scale,
            scores: scores.all(),
            stride,
            out: out.all(),
            n,
        };
        let mut f = ctx.frame().unwrap();
        f.dsa_select_rate(DsaShape { heads: h, head_dim: d, topk }, args, Pos::Fixed(pos0), rate).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(out.all()).unwrap();
        let mut checked = 0;
        for r in 0..n {
            let seen = (pos0 + r + 1) / rate;
            let mut order: Vec<usize> = (0..seen).collect();
            order.sort_by(|&a, &b| score(r, b).total_cmp(&score(r, a)).then(a.cmp(&b)));
            // A cut within rounding is skipped; an exact tie (zeros, every head's relu 0) is not.
            let gap = if seen > topk { score(r, order[topk - 1]) - score(r, order[topk]) } else { 1.0 };
            if gap != 0.0 && gap.abs() <= 1e-5 {
                continue;
            }
            let mut want: Vec<f32> = order.iter().take(topk).map(|&e| e as f32).collect();
            want.sort_by(f32::total_cmp);
            want.resize(topk, -1.0);
            assert_eq!(got[r * topk..(r + 1) * topk], want[..], "h {h} d {d} topk {topk} rate {rate}: row {r}");
            checked += 1;
        }
        eprintln!("compressed index selection {h}x{d} topk {topk} rate {rate}: {checked} of {n} rows checked");
        assert!(10 * checked >= 9 * n, "{checked} of {n} rows clear of rounding");
    }
}
