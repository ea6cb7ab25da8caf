//! DeepSeek V4's KV compressor on the CPU (`Op::KvCompress`) and attention over its entries
//! beside the cached rows (`AttentionSpec::compressed`).
//!
//! A compressor projects every position (`kv`, `gate`: one `head_dim` half, or two with
//! overlapping windows) and keeps the projections in the layer's `CompressRows`; window `e`
//! (positions `e * rate ..+ rate`) closes into one entry once its last position is in: per
//! channel, the softmax over the window's slots of `gate + ape[slot]` weighs their `kv`; with
//! overlap the slots are the previous window's first halves, then this window's second halves
//! (the first window has only its own). The entry is RMSNormed and RoPE'd on its last
//! `rope_dim` columns (adjacent pairs) at position `e * rate`. The lightning indexer has a
//! compressor of its own and scores each row's visible entries (`sum_h w_h relu(q_h . k_e) /
//! sqrt(head_dim)`); a row's `topk` best are its selection, ascending, `-1` after them where it
//! sees fewer (then it keeps every one). Of equal scores the earlier entry wins.
//!
//! A query at position `p` sees the entries `e < (p + 1) / rate` (windows closed at or before
//! it), so a block computes the same as one row at a time. Must not: keep state of its own or
//! know checkpoint names (the compiler checked the roles and shapes, `CompressSpec`).

use super::attention::AttnShape;
use super::linear::{linear, Precision};
use super::norm::rms_norm;
use super::rope;
use crate::format::Matrix;
use crate::store::kv::CompressRows;
use crate::store::weights::WeightStore;
use coli_compiler::ir::{CompressSpec, RopeStyle};
use rayon::prelude::*;

/// One compressor's weights: projections, per-slot biases (`ape`) and the entries' norm.
pub struct Compressor<'a> {
    pub kv: Matrix<'a>,
    pub gate: Matrix<'a>,
    pub ape: &'a [f32],
    pub norm: &'a [f32],
}

/// The weights of a `KvCompress`, by role.
pub struct CompressWeights<'a> {
    pub main: Compressor<'a>,
    /// The indexer's compressor, its query projection and its head weights.
    pub index: Option<(Compressor<'a>, Matrix<'a>, Matrix<'a>)>,
}

impl<'a> CompressWeights<'a> {
    /// The op's weights from the store; `Err(role)` names a missing one.
    pub fn resolve(spec: &CompressSpec, ws: &'a WeightStore) -> Result<CompressWeights<'a>, String> {
        let find = |r: &str| spec.weights.iter().find(|(role, _)| role == r).map(|(_, w)| w.name.as_str());
        let mat = |r: &str| find(r).map(|n| ws.matrix(n)).ok_or_else(|| r.to_string());
        let vec = |r: &str| find(r).map(|n| ws.vector(n)).ok_or_else(|| r.to_string());
        let compressor = |p: &str| -> Result<Compressor<'a>, String> {
            Ok(Compressor {
                kv: mat(&format!("{p}kv"))?,
                gate: mat(&format!("{p}gate"))?,
                ape: vec(&format!("{p}ape"))?,
                norm: vec(&format!("{p}norm"))?,
            })
        };
        let index = match spec.index {
            Some(_) => Some((compressor("index_")?, mat("index_q_b")?, mat("index_w")?)),
            None => None,
        };
        Ok(CompressWeights { main: compressor("")?, index })
    }
}

/// The geometry one compressor runs with.
#[derive(Clone, Copy)]
struct Geometry {
    rate: usize,
    head_dim: usize,
    overlap: bool,
    rope_dim: usize,
    eps: f32,
}

impl Geometry {
    /// The width of one projection (`kv` or `gate`) of a position.
    fn half(&self) -> usize {
        if self.overlap {
            2 * self.head_dim
        } else {
            self.head_dim
        }
    }
}

/// Runs a `KvCompress` over the rows of a block at positions `pos0..pos0 + n`: `x` the layer's
/// normed input, `q` the query latent (with an indexer). `state` must hold the positions before
/// `pos0` (later ones are dropped); `select` (`n x topk`) gets the indexer's choices. `Err`
/// says how many positions the state held.
pub fn kv_compress(
    s: &CompressSpec,
    w: &CompressWeights,
    (x, q, n, pos0): (&[f32], Option<&[f32]>, usize, usize),
    precision: Precision,
    state: &mut Vec<CompressRows>,
    select: Option<&mut [f32]>,
) -> Result<(), usize> {
    let (freq, mscale) = rope::inv_freq(s.rope_dim, s.rope_theta, s.rope_scaling);
    let geo = |head_dim| Geometry { rate: s.rate, head_dim, overlap: s.overlap, rope_dim: s.rope_dim, eps: s.eps };
    let mut parts = vec![(geo(s.head_dim), &w.main)];
    if let (Some(i), Some((c, _, _))) = (s.index, &w.index) {
        parts.push((geo(i.head_dim), c));
    }
    state.resize_with(parts.len(), CompressRows::default);
    for ((g, c), rows) in parts.into_iter().zip(state.iter_mut()) {
        advance(rows, c, g, (x, n, pos0), precision, (&freq, mscale))?;
    }
    if let (Some(i), Some((_, q_b, hw)), Some(q), Some(out)) = (s.index, &w.index, q, select) {
        // The index queries at each row's position, and the head weights.
        let (h, d) = (i.heads, i.head_dim);
        let mut qs = vec![0f32; n * h * d];
        linear(q_b, q, n, &mut qs, precision);
        let part = rope::Part { heads: h, head_dim: d, rotary_dim: s.rope_dim, tail: true, inverse: false };
        let mut cs = vec![0f32; 2 * freq.len()];
        for (r, row) in qs.chunks_exact_mut(h * d).enumerate() {
            rope::angles(&freq, mscale, pos0 + r, &mut cs);
            rope::rotate_part(row, &part, RopeStyle::Interleaved, &cs);
        }
        let mut ws = vec![0f32; n * h];
        linear(hw, x, n, &mut ws, precision);
        let wscale = (h as f32).powf(-0.5);
        ws.iter_mut().for_each(|v| *v *= wscale);
        let keys = &state[1].entries;
        let scale = (d as f32).powf(-0.5);
        out.par_chunks_mut(i.topk).enumerate().take(n).for_each(|(r, o)| {
            let seen = (pos0 + r + 1) / s.rate;
            let (qr, wr) = (&qs[r * h * d..(r + 1) * h * d], &ws[r * h..(r + 1) * h]);
            let score = |e: usize| -> f32 {
                let k = &keys[e * d..(e + 1) * d];
                // + 0: no score is -0, which would sort below +0 (the device's order).
                qr.chunks_exact(d).zip(wr).map(|(qh, &wh)| wh * (dot(qh, k) * scale).max(0.0)).sum::<f32>() + 0.0
            };
            choose(seen, i.topk, score, o);
        });
    }
    Ok(())
}

/// Appends a block's projections to one compressor's rows and closes the windows it completes.
fn advance(
    c: &mut CompressRows,
    w: &Compressor,
    g: Geometry,
    (x, n, pos0): (&[f32], usize, usize),
    precision: Precision,
    (freq, mscale): (&[f32], f32),
) -> Result<(), usize> {
    let half = g.half();
    (c.width, c.rate, c.entry_width) = (2 * half, g.rate, g.head_dim);
    if c.len() < pos0 {
        return Err(c.len());
    }
    c.truncate(pos0);
    let (mut kv, mut gate) = (vec![0f32; n * half], vec![0f32; n * half]);
    linear(&w.kv, x, n, &mut kv, precision);
    linear(&w.gate, x, n, &mut gate, precision);
    for (k, gt) in kv.chunks_exact(half).zip(gate.chunks_exact(half)) {
        c.rows.extend_from_slice(k);
        c.rows.extend_from_slice(gt);
    }
    let closed = (pos0 + n) / g.rate;
    let mut cs = vec![0f32; 2 * freq.len()];
    let part = rope::Part { heads: 1, head_dim: g.head_dim, rotary_dim: g.rope_dim, tail: true, inverse: false };
    for e in c.entry_count()..closed {
        let mut entry = pool_window(&c.rows, w.ape, g, e);
        let raw = entry.clone();
        rms_norm(&raw, &mut entry, w.norm, g.eps, 0.0);
        rope::angles(freq, mscale, e * g.rate, &mut cs);
        rope::rotate_part(&mut entry, &part, RopeStyle::Interleaved, &cs);
        c.entries.extend_from_slice(&entry);
    }
    Ok(())
}

/// Window `e`'s entry before its norm: per channel, the softmax-weighted sum of its slots.
fn pool_window(rows: &[f32], ape: &[f32], g: Geometry, e: usize) -> Vec<f32> {
    let (d, half, rate) = (g.head_dim, g.half(), g.rate);
    let width = 2 * half;
    // Slots: (position, column of the projections); this window's second halves (or its only
    // half), and with overlap the previous window's first halves.
    let own = if g.overlap { d } else { 0 };
    let mut slots: Vec<(usize, usize, usize)> = (0..rate).map(|j| (e * rate + j, j, own)).collect();
    if g.overlap && e > 0 {
        slots.extend((0..rate).map(|j| ((e - 1) * rate + j, j, 0)));
    }
    let mut out = vec![0f32; d];
    for (ch, o) in out.iter_mut().enumerate() {
        let logit = |&(t, j, col): &(usize, usize, usize)| rows[t * width + half + col + ch] + ape[j * half + col + ch];
        let m = slots.iter().map(logit).fold(f32::NEG_INFINITY, f32::max);
        let (mut num, mut den) = (0f32, 0f32);
        for s in &slots {
            let p = (logit(s) - m).exp();
            den += p;
            num += p * rows[s.0 * width + s.2 + ch];
        }
        *o = num / den;
    }
    out
}

/// The `topk` best of `seen` candidates by `score`, ascending, `-1` after them (all of them
/// where there are no more than `topk`).
fn choose(seen: usize, topk: usize, score: impl Fn(usize) -> f32, out: &mut [f32]) {
    let chosen: Vec<usize> = if seen <= topk {
        (0..seen).collect()
    } else {
        let scores: Vec<f32> = (0..seen).map(score).collect();
        let mut order: Vec<usize> = (0..seen).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let mut c = order[..topk].to_vec();
        c.sort_unstable();
        c
    };
    for (j, v) in out.iter_mut().enumerate() {
        *v = chosen.get(j).map_or(-1.0, |&e| e as f32);
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The compressed entries an attention reads beside its cached rows.
pub struct Entries<'a> {
    /// `count x head_dim`, each both key and value.
    pub rows: &'a [f32],
    pub rate: usize,
    /// The rows' selections (`n x topk`), or none: every entry a row sees.
    pub select: Option<(&'a [f32], usize)>,
}

/// Attention of `n` query rows at positions `pos0..` over the cached rows (one KV head; `k`,
/// `v` hold every position so far) within the window and the compressed entries each row sees,
/// with per-head sinks in the denominator. `out`: `n x heads * head_dim`.
pub fn attend(
    s: AttnShape,
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    entries: &Entries,
    pos0: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let (h, d) = (s.heads, s.head_dim);
    out.par_chunks_mut(h * d).enumerate().for_each(|(r, o)| {
        let p = pos0 + r;
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let seen = (p + 1) / entries.rate;
        let chosen: Vec<usize> = match entries.select {
            Some((sel, topk)) => sel[r * topk..(r + 1) * topk]
                .iter()
                .filter(|&&e| e >= 0.0 && (e as usize) < seen)
                .map(|&e| e as usize)
                .collect(),
            None => (0..seen).collect(),
        };
        // (key, value) of every cached row in the window, then of every entry seen (its own both).
        let entry = |e: usize| &entries.rows[e * d..(e + 1) * d];
        let kv: Vec<(&[f32], &[f32])> = (lo..=p)
            .map(|t| (&k[t * d..(t + 1) * d], &v[t * d..(t + 1) * d]))
            .chain(chosen.iter().map(|&e| (entry(e), entry(e))))
            .collect();
        for (head, oh) in o.chunks_exact_mut(d).enumerate() {
            let qh = &q[(r * h + head) * d..(r * h + head + 1) * d];
            let scores: Vec<f32> = kv.iter().map(|(kt, _)| dot(qh, kt) * s.scale).collect();
            let sink = sinks.map(|s| s[head]);
            let m = scores.iter().copied().chain(sink).fold(f32::NEG_INFINITY, f32::max);
            let den: f32 = scores.iter().map(|&x| (x - m).exp()).sum::<f32>() + sink.map_or(0.0, |x| (x - m).exp());
            oh.fill(0.0);
            for (&sc, (_, vt)) in scores.iter().zip(&kv) {
                let p = (sc - m).exp() / den;
                oh.iter_mut().zip(vt.iter()).for_each(|(a, &b)| *a += p * b);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(rate: usize, overlap: bool) -> Geometry {
        Geometry { rate, head_dim: 2, overlap, rope_dim: 0, eps: 1e-6 }
    }

    /// Without overlap a window's entry weighs its own rows by softmax(gate + ape).
    #[test]
    fn a_window_pools_its_rows_by_their_gates() {
        // Two positions of width 2 (kv | gate), window 2, no biases: position 0's gate 0 and
        // position 1's gate ln 3 weigh their kv 1 : 3.
        let l3 = 3f32.ln();
        let rows = [1.0, 10.0, 0.0, 0.0, 5.0, 20.0, l3, l3];
        let got = pool_window(&rows, &[0.0; 4], geo(2, false), 0);
        assert!((got[0] - (1.0 + 3.0 * 5.0) / 4.0).abs() < 1e-6 && (got[1] - (10.0 + 3.0 * 20.0) / 4.0).abs() < 1e-6);
    }

    /// With overlap window `e` also weighs the previous window's first halves; the first window
    /// only its own second halves.
    #[test]
    fn overlapping_windows_share_the_previous_first_halves() {
        // Width 2 x 2 per projection, window 1: position t's kv = [t, t, 10 + t, 10 + t], gates 0.
        let row = |t: f32| [t, t, 10.0 + t, 10.0 + t, 0.0, 0.0, 0.0, 0.0];
        let rows: Vec<f32> = (0..2).flat_map(|t| row(t as f32)).collect();
        let g = geo(1, true);
        assert_eq!(pool_window(&rows, &[0.0; 4], g, 0), [10.0, 10.0]);
        // Entry 1: equal weights on position 1's second half (11) and position 0's first (0).
        assert_eq!(pool_window(&rows, &[0.0; 4], g, 1), [5.5, 5.5]);
    }

    /// A block past the positions the state holds is an error naming them, not a panic.
    #[test]
    fn a_block_past_the_held_positions_is_refused() {
        use crate::format::WeightFormat;
        use coli_compiler::ir::RopeScaling;
        let eye: Vec<u8> = [1f32, 0.0, 0.0, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let m = || Matrix::new(WeightFormat::F32, 2, 2, &eye).unwrap();
        let w =
            CompressWeights { main: Compressor { kv: m(), gate: m(), ape: &[0.0; 4], norm: &[1.0; 2] }, index: None };
        let s = CompressSpec {
            rate: 2,
            head_dim: 2,
            rope_dim: 0,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::None,
            overlap: false,
            eps: 1e-6,
            index: None,
            weights: vec![],
        };
        let mut state = Vec::new();
        let x = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(kv_compress(&s, &w, (&x, None, 2, 3), Precision::Exact, &mut state, None), Err(0));
        assert_eq!(kv_compress(&s, &w, (&x, None, 2, 0), Precision::Exact, &mut state, None), Ok(()));
        // Two positions close one window.
        assert_eq!((state[0].len(), state[0].entry_count()), (2, 1));
    }

    #[test]
    fn a_row_chooses_its_best_entries_in_order() {
        let mut out = [0f32; 3];
        choose(5, 3, |e| [0.5, 2.0, 1.0, 2.0, -1.0][e], &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0]);
        choose(2, 3, |_| 0.0, &mut out);
        assert_eq!(out, [0.0, 1.0, -1.0]);
    }
}
