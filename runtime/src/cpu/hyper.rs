//! DeepSeek V4's manifold-constrained hyper-connections over a residual of `S` streams of
//! `hidden` per row: the mix into a sublayer (`hyper_pre`: the collapsed row and the mixing
//! coefficients, with the Sinkhorn projection of the stream mixer), the mix out of it
//! (`hyper_post`), and the block-diagonal `grouped_linear` of V4's output projection.
//!
//! Plain f32 over rows, in the reference's order of operations; the mixing weights multiply
//! in f32 whatever the precision asked for (they are small, and sigmoid, softmax and Sinkhorn
//! amplify their errors). Must not keep state between calls.

use super::linear::{linear, Precision};
use crate::format::Matrix;
use coli_compiler::ir::HyperSpec;

/// The weights of one hyper-connection site: `fn` (`[rows, S * hidden]`), `base` (`[rows]`),
/// `scale` (`[3]`, or `[1]` at the head).
pub struct HyperWeights<'a> {
    pub fn_weight: Matrix<'a>,
    pub base: &'a [f32],
    pub scale: &'a [f32],
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Projects `comb` (`s x s`, row-major, the logits) towards a doubly stochastic matrix as the
/// reference does: a softmax over each row plus `eps`, the columns normalised, then
/// `iters - 1` rounds of rows then columns, every sum plus `eps`.
pub fn sinkhorn(comb: &mut [f32], s: usize, iters: usize, eps: f32) {
    for row in comb.chunks_exact_mut(s) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter_mut().for_each(|v| *v = (*v - m).exp());
        let sum: f32 = row.iter().sum();
        row.iter_mut().for_each(|v| *v = *v / sum + eps);
    }
    let columns = |c: &mut [f32]| {
        for k in 0..s {
            let sum: f32 = (0..s).map(|j| c[j * s + k]).sum::<f32>() + eps;
            (0..s).for_each(|j| c[j * s + k] /= sum);
        }
    };
    columns(comb);
    for _ in 1..iters {
        for row in comb.chunks_exact_mut(s) {
            let sum: f32 = row.iter().sum::<f32>() + eps;
            row.iter_mut().for_each(|v| *v /= sum);
        }
        columns(comb);
    }
}

/// The mix into a sublayer over `n` rows of `x` (`S * hidden` each): `out` (`hidden` per row)
/// the streams weighed by `pre`; with `mix`, `[post (S), comb (S x S)]` per row as well (a
/// layer's site; without, the head's).
pub fn hyper_pre(spec: &HyperSpec, w: &HyperWeights, x: &[f32], n: usize, out: &mut [f32], mix: Option<&mut [f32]>) {
    let s = spec.streams;
    let width = x.len() / n.max(1);
    let hidden = width / s;
    // 1. The unweighted RMSNorm of the flattened streams, then their mixing logits.
    let ones = vec![1f32; width];
    let mut flat = vec![0f32; x.len()];
    super::norm::rms_norm(x, &mut flat, &ones, spec.norm_eps, 0.0);
    let rows = w.fn_weight.rows;
    let mut logits = vec![0f32; n * rows];
    linear(&w.fn_weight, &flat, n, &mut logits, Precision::Exact);
    // 2. Per row: `pre` collapses the streams; `post` and the projected `comb` are kept.
    let mut pre = vec![0f32; s];
    let mut mix = mix;
    for r in 0..n {
        let m = &logits[r * rows..(r + 1) * rows];
        for (i, p) in pre.iter_mut().enumerate() {
            *p = sigmoid(m[i] * w.scale[0] + w.base[i]) + spec.eps;
        }
        let (xs, o) = (&x[r * width..(r + 1) * width], &mut out[r * hidden..(r + 1) * hidden]);
        for (d, v) in o.iter_mut().enumerate() {
            *v = (0..s).map(|i| pre[i] * xs[i * hidden + d]).sum();
        }
        if let Some(mix) = mix.as_deref_mut() {
            let mw = s * (s + 1);
            let (post, comb) = mix[r * mw..(r + 1) * mw].split_at_mut(s);
            for (i, p) in post.iter_mut().enumerate() {
                *p = 2.0 * sigmoid(m[s + i] * w.scale[1] + w.base[s + i]);
            }
            for (i, c) in comb.iter_mut().enumerate() {
                *c = m[2 * s + i] * w.scale[2] + w.base[2 * s + i];
            }
            sinkhorn(comb, s, spec.sinkhorn_iters, spec.eps);
        }
    }
}

/// The mix out of a sublayer: `out[k] = post[k] * x + sum_j comb[j][k] * residual[j]` per row
/// (`x`: `hidden`, `residual` and `out`: `S * hidden`, `mix`: `[post, comb]`); `out` may hold
/// the residual itself (pass it as `out` and `None`). Without `mix`, `x` into every stream.
/// `n` rows.
pub fn hyper_post(x: &[f32], residual: Option<&[f32]>, mix: Option<&[f32]>, s: usize, n: usize, out: &mut [f32]) {
    let hidden = x.len() / n.max(1);
    let mut row = vec![0f32; s * hidden];
    for r in 0..n {
        let xs = &x[r * hidden..(r + 1) * hidden];
        let o = &mut out[r * s * hidden..(r + 1) * s * hidden];
        let Some(mix) = mix else {
            o.chunks_exact_mut(hidden).for_each(|c| c.copy_from_slice(xs));
            continue;
        };
        let m = &mix[r * s * (s + 1)..(r + 1) * s * (s + 1)];
        let (post, comb) = m.split_at(s);
        let res = residual.map_or(&*o, |res| &res[r * s * hidden..(r + 1) * s * hidden]);
        for k in 0..s {
            for d in 0..hidden {
                let mixed: f32 = (0..s).map(|j| comb[j * s + k] * res[j * hidden + d]).sum();
                row[k * hidden + d] = post[k] * xs[d] + mixed;
            }
        }
        o.copy_from_slice(&row);
    }
}

/// `out = x W^T` with `x`'s columns in `groups` equal groups, group `g` times rows
/// `g * r .. (g + 1) * r` of `w` (`[groups * r, cols / groups]`).
pub fn grouped_linear(w: &Matrix, groups: usize, x: &[f32], n: usize, out: &mut [f32], precision: Precision) {
    let (r, c) = (w.rows / groups, w.cols);
    let mut xg = vec![0f32; n * c];
    let mut yg = vec![0f32; n * r];
    for g in 0..groups {
        for i in 0..n {
            xg[i * c..(i + 1) * c].copy_from_slice(&x[i * groups * c + g * c..][..c]);
        }
        linear(&w.rows_range(g * r, (g + 1) * r), &xg, n, &mut yg, precision);
        for i in 0..n {
            out[i * groups * r + g * r..][..r].copy_from_slice(&yg[i * r..(i + 1) * r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::WeightFormat;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn sinkhorn_makes_rows_and_columns_sum_to_one() {
        let s = 4;
        let mut comb: Vec<f32> = (0..s * s).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.6).collect();
        sinkhorn(&mut comb, s, 20, 1e-6);
        for j in 0..s {
            let row: f32 = comb[j * s..(j + 1) * s].iter().sum();
            let col: f32 = (0..s).map(|i| comb[i * s + j]).sum();
            assert!((row - 1.0).abs() < 1e-3, "row {j} sums to {row}");
            assert!((col - 1.0).abs() < 1e-5, "column {j} sums to {col}");
            assert!(comb[j * s..(j + 1) * s].iter().all(|&v| v > 0.0));
        }
    }

    /// The reference normalises the columns once before its `iters - 1` rounds: 0 acts as 1.
    #[test]
    fn zero_sinkhorn_iterations_act_as_one() {
        let logits: Vec<f32> = (0..9).map(|i| (i as f32 * 0.7).sin()).collect();
        let (mut a, mut b) = (logits.clone(), logits);
        sinkhorn(&mut a, 3, 0, 1e-6);
        sinkhorn(&mut b, 3, 1, 1e-6);
        assert_eq!(a, b);
    }

    #[test]
    fn one_sinkhorn_iteration_is_a_row_softmax_with_columns_normalised() {
        let mut comb = vec![0.0, 1.0, 2.0, 0.0];
        sinkhorn(&mut comb, 2, 1, 0.0);
        let (a, b) = (1.0 / (1.0 + 1f32.exp()), 1f32.exp() / (1.0 + 1f32.exp()));
        let (c, d) = (2f32.exp() / (1.0 + 2f32.exp()), 1.0 / (1.0 + 2f32.exp()));
        let want = [a / (a + c), b / (b + d), c / (a + c), d / (b + d)];
        for (g, w) in comb.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{comb:?} vs {want:?}");
        }
    }

    /// Two streams of width 2, one row, against the formulas written out by hand.
    #[test]
    fn pre_and_post_mix_match_a_hand_computation() {
        let (s, hidden) = (2, 2);
        let x = [1.0f32, -2.0, 0.5, 3.0];
        let rows = (2 + s) * s;
        let fw: Vec<f32> = (0..rows * s * hidden).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.1).collect();
        let bytes = f32_bytes(&fw);
        let base: Vec<f32> = (0..rows).map(|i| i as f32 * 0.05 - 0.2).collect();
        let scale = [0.9f32, 1.1, 0.7];
        let w = HyperWeights {
            fn_weight: Matrix::new(WeightFormat::F32, rows, s * hidden, &bytes).unwrap(),
            base: &base,
            scale: &scale,
        };
        let spec = HyperSpec {
            streams: s,
            fn_weight: coli_compiler::ir::WeightRef::whole("fn", vec![rows, s * hidden]),
            base: coli_compiler::ir::WeightRef::whole("base", vec![rows]),
            scale: coli_compiler::ir::WeightRef::whole("scale", vec![3]),
            sinkhorn_iters: 3,
            eps: 1e-6,
            norm_eps: 1e-6,
        };
        let (mut out, mut mix) = (vec![0f32; hidden], vec![0f32; s * (s + 1)]);
        hyper_pre(&spec, &w, &x, 1, &mut out, Some(&mut mix));

        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        let flat: Vec<f32> = x.iter().map(|v| v / (ms + 1e-6).sqrt()).collect();
        let m: Vec<f32> = (0..rows).map(|r| (0..4).map(|c| fw[r * 4 + c] * flat[c]).sum()).collect();
        let pre: Vec<f32> = (0..s).map(|i| sigmoid(m[i] * 0.9 + base[i]) + 1e-6).collect();
        let want_out = [pre[0] * x[0] + pre[1] * x[2], pre[0] * x[1] + pre[1] * x[3]];
        let post: Vec<f32> = (0..s).map(|i| 2.0 * sigmoid(m[2 + i] * 1.1 + base[2 + i])).collect();
        let mut comb: Vec<f32> = (0..4).map(|i| m[4 + i] * 0.7 + base[4 + i]).collect();
        sinkhorn(&mut comb, s, 3, 1e-6);
        for (g, w) in out.iter().zip(want_out) {
            assert!((g - w).abs() < 1e-5, "collapsed {out:?} vs {want_out:?}");
        }
        for (g, w) in mix.iter().zip(post.iter().chain(&comb)) {
            assert!((g - w).abs() < 1e-6, "mix {mix:?}");
        }

        // Out of the sublayer: comb is read transposed (sum over its first index).
        let y = [0.25f32, -1.0];
        let mut res = x.to_vec();
        hyper_post(&y, None, Some(&mix), s, 1, &mut res);
        for k in 0..s {
            for d in 0..hidden {
                let want = post[k] * y[d] + comb[k] * x[d] + comb[2 + k] * x[2 + d];
                assert!((res[k * hidden + d] - want).abs() < 1e-6, "stream {k} column {d}: {res:?}");
            }
        }
        let mut apart = vec![0f32; 4];
        hyper_post(&y, Some(&x), Some(&mix), s, 1, &mut apart);
        assert_eq!(apart, res);
        let mut expanded = vec![0f32; 4];
        hyper_post(&y, None, None, s, 1, &mut expanded);
        assert_eq!(expanded, [0.25, -1.0, 0.25, -1.0]);
    }

    #[test]
    fn grouped_linear_is_block_diagonal() {
        let (groups, r, c, n) = (2, 3, 2, 2);
        let wv: Vec<f32> = (0..groups * r * c).map(|i| i as f32 * 0.5 - 2.0).collect();
        let bytes = f32_bytes(&wv);
        let w = Matrix::new(WeightFormat::F32, groups * r, c, &bytes).unwrap();
        let x: Vec<f32> = (0..n * groups * c).map(|i| i as f32 - 3.0).collect();
        let mut out = vec![0f32; n * groups * r];
        grouped_linear(&w, groups, &x, n, &mut out, Precision::Exact);
        for i in 0..n {
            for g in 0..groups {
                for k in 0..r {
                    let want: f32 = (0..c).map(|j| wv[(g * r + k) * c + j] * x[i * groups * c + g * c + j]).sum();
                    assert_eq!(out[i * groups * r + g * r + k], want);
                }
            }
        }
    }
}
