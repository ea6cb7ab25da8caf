//! Attention over a part of the positions, and the merge of two parts: what a KV split runs
//! (the device attends over a row's newest positions, the host over the older ones, and the
//! two results are joined by their softmax statistics). A part of row `i`, head `h` is
//! `(acc, m, l)`: `m` the largest scaled score of the part (with the head's sink where the
//! part holds it), `l = sum_j e^(s_j - m)` (plus `e^(sink - m)`), `acc = sum_j e^(s_j - m) v_j`
//! (unnormalized). An empty part is `(0, -inf, 0)`. `merge` of two parts equals attention over
//! their union: `M = max(m_a, m_b)`, `out = (e^(m_a-M) acc_a + e^(m_b-M) acc_b) / (e^(m_a-M)
//! l_a + e^(m_b-M) l_b)`.
//!
//! The arithmetic of one row depends on its range only (positions in order within fixed tiles
//! of `TILE` positions, the tiles joined in order), never on the other rows of the call, so a
//! row's part has the same bits however a forward is cut.
//! Reference for `vk::ops::attn_part`. Must not: write the KV cache, or normalize a part.

#[cfg(target_arch = "x86_64")]
use super::attention::avx2::Avx2;
use super::attention::{group_scores, group_weighted, scale_max, AttnShape, Chunk, Plain};
use super::elementwise::exp_shifted_sum;
use crate::format::pool::{self, SendPtr};

/// `(acc, m, l)` of `n` rows: `acc` is `n x heads * v_head_dim`, `ml` is `n x heads x 2`
/// (`m`, then `l`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    pub acc: Vec<f32>,
    pub ml: Vec<f32>,
}

impl Parts {
    /// `n` rows of empty parts.
    pub fn empty(s: &AttnShape, n: usize) -> Parts {
        let mut ml = vec![0.0; n * s.heads * 2];
        ml.chunks_exact_mut(2).for_each(|c| c[0] = f32::NEG_INFINITY);
        Parts { acc: vec![0.0; n * s.heads * s.v_head_dim], ml }
    }
}

/// The part of each of `n` query rows over the positions `range(i) = (from, to)` (`from..to`,
/// absolute positions, `to` at most the rows `k` and `v` hold). `q`: `n x heads * head_dim`;
/// `k`, `v`: position-major rows from position 0 (`kv_heads * head_dim`, `kv_heads *
/// v_head_dim` wide); `sinks`: one logit per head, folded into this part (only one of two
/// merged parts may hold them). The window of `s` is the caller's: `range` already honours it.
pub fn attend_part(
    s: &AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    range: &(dyn Fn(usize) -> (usize, usize) + Sync),
    sinks: Option<&[f32]>,
) -> Parts {
    let mut out = Parts::empty(s, n);
    if n == 0 {
        return out;
    }
    let vhd = s.v_head_dim;
    let group = (s.heads / s.kv_heads.max(1)).max(1);
    // A task is a block of rows, one KV head with its group of query heads, and one tile of
    // positions: the tile's key and value rows come from memory once for the whole block (each
    // row of the block then reads them from the cache: a tile of one KV head is 256 KiB at
    // SmolLM2's width), and the tiles of one row are tasks of their own (a decode row's
    // thousands of positions spread over threads). Each row's share of a tile runs through
    // `cpu::attention`'s SIMD kernels (scores, the weights' exponentials and their sum, the
    // weighted values). Tiles sit at fixed positions (multiples of TILE), so a row's arithmetic
    // depends on its range only, never on the other rows of its block.
    let ranges: Vec<(usize, usize)> = (0..n).map(range).collect();
    let blocks = n.div_ceil(ROWS);
    let span_of = |b: usize| {
        let rs = &ranges[b * ROWS..((b + 1) * ROWS).min(n)];
        let lo = rs.iter().filter(|r| r.1 > r.0).map(|r| r.0).min().unwrap_or(0);
        let hi = rs.iter().filter(|r| r.1 > r.0).map(|r| r.1).max().unwrap_or(0);
        (lo / TILE, hi.div_ceil(TILE))
    };
    let spans: Vec<(usize, usize)> = (0..blocks).map(span_of).collect();
    // Task t -> (block, kv head, tile): blocks' tiles laid out one after another.
    let mut first = Vec::with_capacity(blocks + 1);
    let mut total = 0;
    for &(t0, t1) in &spans {
        first.push(total);
        total += t1.saturating_sub(t0) * s.kv_heads;
    }
    first.push(total);
    // Per task and (row of the block, head of the group): m, l, then acc.
    let stride = 2 + vhd;
    let per_task = ROWS * group * stride;
    let mut partial = vec![0.0f32; total * per_task];
    let pp = SendPtr(partial.as_mut_ptr());
    let wide = crate::format::wide_simd();
    pool::run(total, &|t| {
        let b = first.partition_point(|&f| f <= t) - 1;
        let local = t - first[b];
        let (kvh, tile) = (local % s.kv_heads, spans[b].0 + local / s.kv_heads);
        let (r0, r1) = (b * ROWS, ((b + 1) * ROWS).min(n));
        // SAFETY: each task writes its own `per_task` floats.
        let out = unsafe { std::slice::from_raw_parts_mut(pp.get().add(t * per_task), per_task) };
        let task = Task { s, q, k, v, ranges: &ranges, rows: (r0, r1), kvh, tile: (tile * TILE, (tile + 1) * TILE) };
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: `wide_simd` reported AVX2+FMA.
            unsafe { tile_part_avx2(&task, out) };
            return;
        }
        let _ = wide;
        tile_part::<Plain>(&task, out);
    });
    // 3. Each row's tiles joined in tile order, then the sink.
    let (acc, ml) = (SendPtr(out.acc.as_mut_ptr()), SendPtr(out.ml.as_mut_ptr()));
    pool::run(n * s.kv_heads, &|t| {
        let (i, kvh) = (t / s.kv_heads, t % s.kv_heads);
        let b = i / ROWS;
        let (t0, t1) = spans[b];
        for g in 0..group {
            let h = kvh * group + g;
            let at = |tile: usize| first[b] + (tile - t0) * s.kv_heads + kvh;
            let part = |tile: usize| &partial[at(tile) * per_task + ((i - b * ROWS) * group + g) * stride..][..stride];
            let mut m = (t0..t1).map(|tl| part(tl)[0]).fold(f32::NEG_INFINITY, f32::max);
            if let Some(sk) = sinks {
                m = m.max(sk[h]);
            }
            if m == f32::NEG_INFINITY {
                continue;
            }
            // SAFETY: each task writes its own row and heads.
            let a = unsafe { std::slice::from_raw_parts_mut(acc.get().add((i * s.heads + h) * vhd), vhd) };
            let st = unsafe { std::slice::from_raw_parts_mut(ml.get().add((i * s.heads + h) * 2), 2) };
            let mut l = 0.0f32;
            for tl in t0..t1 {
                let pt = part(tl);
                if pt[0] == f32::NEG_INFINITY {
                    continue;
                }
                let c = (pt[0] - m).exp();
                l += c * pt[1];
                a.iter_mut().zip(&pt[2..]).for_each(|(x, y)| *x += c * y);
            }
            if let Some(sk) = sinks {
                l += (sk[h] - m).exp();
            }
            st[0] = m;
            st[1] = l;
        }
    });
    out
}

/// One task of `attend_part`: the rows `rows` of a block, KV head `kvh`, the positions
/// `tile` (each row's part of it is its range's share).
struct Task<'a> {
    s: &'a AttnShape,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    ranges: &'a [(usize, usize)],
    rows: (usize, usize),
    kvh: usize,
    tile: (usize, usize),
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_part_avx2(task: &Task, out: &mut [f32]) {
    tile_part::<Avx2>(task, out)
}

/// A task's `(m, l, acc)` for each of its rows and the KV head's group of query heads, written
/// to `out` (`(row, head) x (2 + v_head_dim)`): the scores of the row's positions in the tile
/// (`cpu::attention`'s kernels), their maximum, the weights `e^(s - m)` and their sum, and the
/// weighted values. A row that sees none of the tile gets `m = -inf`.
#[inline(always)]
fn tile_part<K: Chunk>(task: &Task, out: &mut [f32]) {
    let Task { s, q, k, v, ranges, rows: (r0, r1), kvh, tile: (p0, p1) } = *task;
    let (hd, vhd) = (s.head_dim, s.v_head_dim);
    let (kw, vw) = (s.kv_heads * hd, s.kv_heads * vhd);
    let group = (s.heads / s.kv_heads.max(1)).max(1);
    let stride = 2 + vhd;
    let seen = |i: usize| (ranges[i].0.max(p0), ranges[i].1.min(p1));
    let mut scores = Vec::new();
    let mut acc = vec![0.0f32; group * vhd];
    for i in r0..r1 {
        let (a, e) = seen(i);
        let o = &mut out[(i - r0) * group * stride..][..group * stride];
        if e <= a {
            o.chunks_exact_mut(stride).for_each(|c| c[0] = f32::NEG_INFINITY);
            continue;
        }
        let len = e - a;
        scores.clear();
        scores.resize(group * len, 0.0);
        let heads = kvh * group..(kvh + 1) * group;
        group_scores::<K>(&q[i * s.heads * hd..], heads, (&k[a * kw + kvh * hd..], kw, hd), len, &mut scores);
        for (g, c) in o.chunks_exact_mut(stride).enumerate() {
            let sc = &mut scores[g * len..(g + 1) * len];
            let m = scale_max(sc, s.scale);
            c[0] = m;
            c[1] = exp_shifted_sum(sc, m);
        }
        acc.iter_mut().for_each(|x| *x = 0.0);
        group_weighted::<K>(&scores, (&v[a * vw + kvh * vhd..], vw, vhd), len, group, &mut acc);
        for (c, a) in o.chunks_exact_mut(stride).zip(acc.chunks_exact(vhd)) {
            c[2..].copy_from_slice(a);
        }
    }
}

/// Rows of a task's block.
const ROWS: usize = 16;
/// Positions of a task's tile.
const TILE: usize = 1024;

/// Joins two parts of the same rows (`a` and `b` cover disjoint positions) into attention
/// outputs over their union: `out` is `n x heads * v_head_dim`. A row both parts left empty
/// (no position, no sink) gets zeros.
pub fn merge(s: &AttnShape, a: &Parts, b: &Parts, out: &mut [f32]) {
    let vhd = s.v_head_dim;
    for (t, o) in out.chunks_exact_mut(vhd).enumerate() {
        let (ma, la, mb, lb) = (a.ml[2 * t], a.ml[2 * t + 1], b.ml[2 * t], b.ml[2 * t + 1]);
        let mx = ma.max(mb);
        if mx == f32::NEG_INFINITY {
            o.iter_mut().for_each(|x| *x = 0.0);
            continue;
        }
        let ea = if ma == f32::NEG_INFINITY { 0.0 } else { (ma - mx).exp() };
        let eb = if mb == f32::NEG_INFINITY { 0.0 } else { (mb - mx).exp() };
        let inv = 1.0 / (ea * la + eb * lb);
        let (xa, xb) = (&a.acc[t * vhd..][..vhd], &b.acc[t * vhd..][..vhd]);
        for ((x, pa), pb) in o.iter_mut().zip(xa).zip(xb) {
            *x = (ea * pa + eb * pb) * inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::attend;
    use super::*;

    fn rnd(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Split at every point, every row: the merge of the two parts equals the full attention
    /// within 1e-6 relative to the largest |value| (values in [-1, 1]).
    #[test]
    fn a_merge_of_two_parts_is_the_full_attention() {
        let mut seed = 99u64;
        // (heads, kv_heads, head_dim, v_head_dim, window, sinks, pos0, n)
        let cases = [
            (4, 2, 16, 16, None, false, 0, 24),
            (3, 1, 8, 12, Some(9), true, 5, 17),
            (2, 2, 32, 32, None, true, 30, 3),
            // SmolLM2's heads: the kernels' widest chunk (64 lanes), three heads a KV head.
            (9, 3, 64, 64, None, false, 40, 2),
        ];
        for (heads, kv_heads, head_dim, v_head_dim, window, with_sinks, pos0, n) in cases {
            let s = AttnShape { heads, kv_heads, head_dim, v_head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window };
            let len = pos0 + n;
            let q: Vec<f32> = (0..n * heads * head_dim).map(|_| 2.0 * rnd(&mut seed)).collect();
            let k: Vec<f32> = (0..len * kv_heads * head_dim).map(|_| 2.0 * rnd(&mut seed)).collect();
            let v: Vec<f32> = (0..len * kv_heads * v_head_dim).map(|_| rnd(&mut seed)).collect();
            let sinks: Vec<f32> = (0..heads).map(|_| rnd(&mut seed)).collect();
            let sinks = with_sinks.then_some(sinks.as_slice());
            let mut want = vec![0.0; n * heads * v_head_dim];
            attend(s, &q, &k, &v, pos0, sinks, &mut want);
            let lo = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
            for cut in 0..=len {
                // The host's part holds the sinks and the positions below the cut.
                let low =
                    attend_part(&s, &q, &k, &v, n, &|i| (lo(pos0 + i), cut.clamp(lo(pos0 + i), pos0 + i + 1)), sinks);
                let high =
                    attend_part(&s, &q, &k, &v, n, &|i| (cut.clamp(lo(pos0 + i), pos0 + i + 1), pos0 + i + 1), None);
                let mut got = vec![f32::NAN; want.len()];
                merge(&s, &high, &low, &mut got);
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-6, "{heads}/{kv_heads}/{head_dim} cut {cut} [{j}]: {a} vs {b}");
                }
            }
        }
    }

    /// Rows in several blocks over ranges of several tiles (a prefill chunk at a long context),
    /// and one row alone (a decode step): the merge is the full attention, and a row's part
    /// does not depend on the rows beside it.
    #[test]
    fn long_ranges_in_tiles_and_blocks_match_the_full_attention() {
        let mut seed = 7u64;
        let (heads, kv_heads, head_dim) = (4, 2, 8);
        let s = AttnShape { heads, kv_heads, head_dim, v_head_dim: head_dim, scale: 0.35, window: None };
        let (pos0, n) = (2 * TILE + 100, 37);
        let len = pos0 + n;
        let q: Vec<f32> = (0..n * heads * head_dim).map(|_| 2.0 * rnd(&mut seed)).collect();
        let k: Vec<f32> = (0..len * kv_heads * head_dim).map(|_| 2.0 * rnd(&mut seed)).collect();
        let v: Vec<f32> = (0..len * kv_heads * head_dim).map(|_| rnd(&mut seed)).collect();
        let mut want = vec![0.0; n * heads * head_dim];
        attend(s, &q, &k, &v, pos0, None, &mut want);
        // The device part: the newest 300 positions of each row.
        let cut = |i: usize| (pos0 + i + 1).saturating_sub(300);
        let low = attend_part(&s, &q, &k, &v, n, &|i| (0, cut(i)), None);
        let high = attend_part(&s, &q, &k, &v, n, &|i| (cut(i), pos0 + i + 1), None);
        let mut got = vec![f32::NAN; want.len()];
        merge(&s, &high, &low, &mut got);
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5, "[{j}]: {a} vs {b}");
        }
        // Row 20 alone has the bits it has among the others.
        let w = heads * head_dim;
        let one = attend_part(&s, &q[20 * w..21 * w], &k, &v, 1, &|_| (0, cut(20)), None);
        assert_eq!(one.acc[..], low.acc[20 * w..21 * w]);
        assert_eq!(one.ml[..], low.ml[20 * heads * 2..21 * heads * 2]);
    }

    #[test]
    fn an_empty_part_is_neutral() {
        let s = AttnShape { heads: 1, kv_heads: 1, head_dim: 1, v_head_dim: 1, scale: 1.0, window: None };
        let e = Parts::empty(&s, 1);
        let p = attend_part(&s, &[1.0], &[0.5, 2.0], &[3.0, 4.0], 1, &|_| (0, 2), None);
        let mut out = [0.0];
        merge(&s, &p, &e, &mut out);
        let want = (3.0 * 0.5f32.exp() + 4.0 * 2.0f32.exp()) / (0.5f32.exp() + 2.0f32.exp());
        assert!((out[0] - want).abs() < 1e-6);
        merge(&s, &e, &e, &mut out);
        assert_eq!(out, [0.0]);
    }
}
