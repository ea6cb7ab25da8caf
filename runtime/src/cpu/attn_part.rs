//! Attention over a part of the positions, and the merge of two parts: what a KV split runs
//! (the device attends over a row's newest positions, the host over the older ones, and the
//! two results are joined by their softmax statistics). A part of row `i`, head `h` is
//! `(acc, m, l)`: `m` the largest scaled score of the part (with the head's sink where the
//! part holds it), `l = sum_j e^(s_j - m)` (plus `e^(sink - m)`), `acc = sum_j e^(s_j - m) v_j`
//! (unnormalized). An empty part is `(0, -inf, 0)`. `merge` of two parts equals attention over
//! their union: `M = max(m_a, m_b)`, `out = (e^(m_a-M) acc_a + e^(m_b-M) acc_b) / (e^(m_a-M)
//! l_a + e^(m_b-M) l_b)`.
//!
//! The arithmetic of one row depends on its range only (positions in order, one pass), never
//! on the other rows of the call, so a row's part has the same bits however a forward is cut.
//! Reference for `vk::ops::attn_part`. Must not: write the KV cache, or normalize a part.

use super::attention::AttnShape;
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
pub fn attend_part(s: &AttnShape, q: &[f32], k: &[f32], v: &[f32], n: usize, range: &(dyn Fn(usize) -> (usize, usize) + Sync), sinks: Option<&[f32]>) -> Parts {
    let mut out = Parts::empty(s, n);
    let (acc, ml) = (SendPtr(out.acc.as_mut_ptr()), SendPtr(out.ml.as_mut_ptr()));
    let (hd, vhd) = (s.head_dim, s.v_head_dim);
    let (kw, vw) = (s.kv_heads * hd, s.kv_heads * vhd);
    let group = (s.heads / s.kv_heads.max(1)).max(1);
    // A task is one row and one KV head with its group of query heads: each key and value row
    // is read once for the whole group.
    pool::run(n * s.kv_heads, &|t| {
        let (i, kvh) = (t / s.kv_heads, t % s.kv_heads);
        let (from, to) = range(i);
        let len = to.saturating_sub(from);
        let mut scores = vec![0.0f32; group * len];
        for (jj, j) in (from..to).enumerate() {
            let kr = &k[j * kw + kvh * hd..][..hd];
            for g in 0..group {
                let h = kvh * group + g;
                scores[g * len + jj] = dot(&q[(i * s.heads + h) * hd..][..hd], kr) * s.scale;
            }
        }
        // Per head of the group its largest score (with its sink), then one pass over the
        // positions, each value row read once for the group, adding in position order.
        let ms: Vec<f32> = (0..group).map(|g| scores[g * len..(g + 1) * len].iter().copied().chain(sinks.map(|sk| sk[kvh * group + g])).fold(f32::NEG_INFINITY, f32::max)).collect();
        let mut ls = vec![0.0f32; group];
        // SAFETY: task `t` writes only row `i`, the heads of KV head `kvh` (contiguous): disjoint.
        let a = unsafe { std::slice::from_raw_parts_mut(acc.get().add((i * s.heads + kvh * group) * vhd), group * vhd) };
        for (jj, j) in (from..to).enumerate() {
            let vr = &v[j * vw + kvh * vhd..][..vhd];
            for g in 0..group {
                if ms[g] == f32::NEG_INFINITY {
                    continue;
                }
                let e = (scores[g * len + jj] - ms[g]).exp();
                ls[g] += e;
                a[g * vhd..(g + 1) * vhd].iter_mut().zip(vr).for_each(|(x, y)| *x += e * y);
            }
        }
        for g in 0..group {
            if ms[g] == f32::NEG_INFINITY {
                continue;
            }
            let h = kvh * group + g;
            // SAFETY: as above, row `i`, head `h` of KV head `kvh`.
            let st = unsafe { std::slice::from_raw_parts_mut(ml.get().add((i * s.heads + h) * 2), 2) };
            if let Some(sk) = sinks {
                ls[g] += (sk[h] - ms[g]).exp();
            }
            st[0] = ms[g];
            st[1] = ls[g];
        }
    });
    out
}

/// `a . b` in eight lanes (vectorized), the lanes and the tail then summed in a fixed order:
/// the same bits for the same inputs whatever the call.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut t = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (x, y) in ra.iter().zip(rb) {
        t += x * y;
    }
    t
}

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
        let cases = [(4, 2, 16, 16, None, false, 0, 24), (3, 1, 8, 12, Some(9), true, 5, 17), (2, 2, 32, 32, None, true, 30, 3)];
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
                let low = attend_part(&s, &q, &k, &v, n, &|i| (lo(pos0 + i), cut.clamp(lo(pos0 + i), pos0 + i + 1)), sinks);
                let high = attend_part(&s, &q, &k, &v, n, &|i| (cut.clamp(lo(pos0 + i), pos0 + i + 1), pos0 + i + 1), None);
                let mut got = vec![f32::NAN; want.len()];
                merge(&s, &high, &low, &mut got);
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 1e-6, "{heads}/{kv_heads}/{head_dim} cut {cut} [{j}]: {a} vs {b}");
                }
            }
        }
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
