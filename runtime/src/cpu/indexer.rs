//! DeepSeek Sparse Attention's lightning indexer on the CPU (`Op::Indexer`), for a block of rows
//! at positions `pos0..pos0+n`: the index queries `q_b(q)` in `heads` heads of `head_dim`, one
//! index key `LayerNorm(k(x))` per row, RoPE on the first `rope_dim` columns of both (halves or
//! adjacent pairs, YaRN from the configuration), the per-head weights `w(x) / sqrt(heads)`; per
//! row `s` and position `t <= s`, `score = sum_h w[h] * relu(q[h] . k[t] / sqrt(head_dim))`;
//! the `topk` best positions are the row's selection.
//!
//! The selection is written as positions in f32 (exact below 2^24), ascending, `-1` after them
//! where the row sees fewer than `topk` positions (it keeps every one). Of equal scores the
//! earlier position wins. The index keys of every position so far are the layer's
//! `LayerKv::index` rows (`head_dim` wide), cut to the block's first position before this
//! block's are appended, so they go back with the KV cache.
//!
//! Must not: keep state of its own, or know checkpoint names; the roles and their shapes were
//! checked by the compiler (`IndexerSpec`).

use super::linear::{linear, Precision};
use super::norm::layer_norm;
use super::rope;
use crate::format::Matrix;
use crate::store::weights::WeightStore;
use coli_compiler::ir::IndexerSpec;
use rayon::prelude::*;

/// The weights of one indexer, by role.
pub struct IndexerWeights<'a> {
    pub q_b: Matrix<'a>,
    pub k: Matrix<'a>,
    pub k_norm: &'a [f32],
    pub k_norm_bias: &'a [f32],
    pub w: Matrix<'a>,
}

impl<'a> IndexerWeights<'a> {
    /// The op's weights from the store, by role; `Err(role)` names a missing one.
    pub fn resolve(spec: &IndexerSpec, ws: &'a WeightStore) -> Result<IndexerWeights<'a>, String> {
        let find = |r: &str| spec.weights.iter().find(|(role, _)| role == r).map(|(_, w)| w.name.as_str());
        let mat = |r: &str| find(r).map(|n| ws.matrix(n)).ok_or_else(|| r.to_string());
        let vec = |r: &str| find(r).map(|n| ws.vector(n)).ok_or_else(|| r.to_string());
        Ok(IndexerWeights {
            q_b: mat("q_b")?,
            k: mat("k")?,
            k_norm: vec("k_norm")?,
            k_norm_bias: vec("k_norm_bias")?,
            w: mat("w")?,
        })
    }
}

/// The block's inputs: the layer's input rows `x` and the MLA's normed query latent `q`.
pub struct IndexerRows<'a> {
    pub x: &'a [f32],
    pub q: &'a [f32],
    pub n: usize,
    pub pos0: usize,
}

/// Runs the indexer over a block, appending its keys to `keys` (which must hold at least the
/// positions before `pos0`; later ones are dropped), and writes `out` (`n x topk`).
pub fn indexer(
    s: &IndexerSpec,
    w: &IndexerWeights,
    rows: &IndexerRows,
    precision: Precision,
    keys: &mut Vec<f32>,
    out: &mut [f32],
) {
    let IndexerRows { x, q, n, pos0 } = *rows;
    let (h, d, dr) = (s.heads, s.head_dim, s.rope_dim);
    // 1. Index queries, keys and head weights.
    let mut qs = vec![0f32; n * h * d];
    linear(&w.q_b, q, n, &mut qs, precision);
    let mut kraw = vec![0f32; n * d];
    linear(&w.k, x, n, &mut kraw, precision);
    let mut k = vec![0f32; n * d];
    layer_norm(&kraw, &mut k, w.k_norm, Some(w.k_norm_bias), s.eps);
    let mut hw = vec![0f32; n * h];
    linear(&w.w, x, n, &mut hw, precision);
    let wscale = (h as f32).powf(-0.5);
    hw.iter_mut().for_each(|v| *v *= wscale);
    // 2. RoPE on the rope part of every query head and of the key.
    let (freq, mscale) = rope::inv_freq(dr, s.rope_theta, s.rope_scaling);
    for i in 0..n {
        let p = pos0 + i;
        rope::apply_row(&mut k[i * d..i * d + dr], dr, s.rope_style, &freq, mscale, p);
        for head in qs[i * h * d..(i + 1) * h * d].chunks_exact_mut(d) {
            rope::apply_row(&mut head[..dr], dr, s.rope_style, &freq, mscale, p);
        }
    }
    // 3. The key cache: the positions before this block, then this block's.
    keys.truncate(pos0 * d);
    keys.extend_from_slice(&k);
    // 4. Scores and the top-k, per row.
    select_rows(s, &qs, &hw, keys, pos0, out);
}

/// The selection of `n` rows at positions `pos0..` (`out`, `n x topk`) from their rotated
/// index queries `qs` (`n x heads x head_dim`), head weights `hw` (`n x heads`, already times
/// `heads^-0.5`) and the index keys of positions `0..pos0 + n`.
pub fn select_rows(s: &IndexerSpec, qs: &[f32], hw: &[f32], keys: &[f32], pos0: usize, out: &mut [f32]) {
    let (h, d, topk) = (s.heads, s.head_dim, s.topk);
    let n = hw.len() / h.max(1);
    let scale = (d as f32).powf(-0.5);
    out.par_chunks_mut(topk).enumerate().take(n).for_each(|(i, o)| {
        let p = pos0 + i;
        let seen = p + 1;
        if seen <= topk {
            for (j, v) in o.iter_mut().enumerate() {
                *v = if j < seen { j as f32 } else { -1.0 };
            }
            return;
        }
        let qi = &qs[i * h * d..(i + 1) * h * d];
        let wi = &hw[i * h..(i + 1) * h];
        let scores: Vec<f32> = (0..seen)
            .map(|t| {
                let kt = &keys[t * d..(t + 1) * d];
                qi.chunks_exact(d)
                    .zip(wi)
                    .map(|(qh, &wh)| {
                        let dot: f32 = qh.iter().zip(kt).map(|(a, b)| a * b).sum();
                        wh * (dot * scale).max(0.0)
                    })
                    .sum::<f32>()
                    // No score is -0 (which `total_cmp` puts below +0): the device's order too.
                    + 0.0
            })
            .collect();
        let mut order: Vec<usize> = (0..seen).collect();
        // Best first; of equal scores the earlier position.
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let mut chosen: Vec<usize> = order[..topk].to_vec();
        chosen.sort_unstable();
        for (v, &t) in o.iter_mut().zip(&chosen) {
            *v = t as f32;
        }
    });
}

/// The positions a row of a selection names (ascending, the `-1` padding dropped).
pub fn selected(row: &[f32]) -> impl Iterator<Item = usize> + '_ {
    row.iter().take_while(|&&v| v >= 0.0).map(|&v| v as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coli_compiler::ir::{RopeScaling, RopeStyle};

    fn spec(topk: usize) -> IndexerSpec {
        IndexerSpec {
            heads: 1,
            head_dim: 1,
            rope_dim: 0,
            topk,
            rope_style: RopeStyle::RotateHalf,
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            eps: 1e-6,
            weights: vec![],
        }
    }

    /// One head of width 1: the scores are the ReLU of the keys.
    #[test]
    fn the_best_positions_ascending_ties_to_the_earlier_and_short_rows_padded() {
        let keys = [0.5, 2.0, -1.0, 2.0, 1.0];
        let mut out = vec![0f32; 2];
        select_rows(&spec(2), &[1.0], &[1.0], &keys, 4, &mut out);
        assert_eq!(out, [1.0, 3.0]);
        let mut out = vec![0f32; 1];
        select_rows(&spec(1), &[1.0], &[1.0], &keys, 4, &mut out);
        assert_eq!(out, [1.0], "of equal scores the earlier position");
        // A negative head weight prefers the ReLU's zeros; rows 0 and 1 see no more than topk.
        let mut out = vec![0f32; 6];
        select_rows(&spec(2), &[1.0, 1.0, 1.0], &[1.0, 1.0, -1.0], &keys, 0, &mut out);
        assert_eq!(out, [0.0, -1.0, 0.0, 1.0, 0.0, 2.0]);
    }
}
