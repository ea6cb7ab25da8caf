//! Causal grouped-query attention of a block of query rows over one layer's KV rows, with a
//! sliding window, per-head sink logits and relative-position logits (Inkling's, added to the
//! scaled scores by backward distance) where the spec has them. Parallel over (head, block
//! of rows) on the format module's thread team; each row's scores live in a per-thread scratch
//! buffer, and the head dimension is walked in register-sized chunks (compiled with AVX2+FMA
//! where the CPU has them). The KV rows are the caller's (the executor's cache); this module
//! only reads them.

use crate::format::pool::{self, SendPtr};
use coli_compiler::ir::AttentionSpec;
use std::cell::RefCell;

/// Geometry and options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

impl AttnShape {
    /// The geometry and options of an attention op.
    pub fn of(spec: &AttentionSpec) -> AttnShape {
        AttnShape {
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
            v_head_dim: spec.v_head_dim,
            scale: spec.scale,
            window: spec.window,
        }
    }
}

/// Relative-position logits of a block of query rows: `logits` is `n x heads x extent`, the
/// logit of each row, head and backward distance `0 .. extent` (zero from `extent` on).
#[derive(Clone, Copy, Debug)]
pub struct RelBias<'a> {
    pub logits: &'a [f32],
    pub extent: usize,
}

/// The relative logits of `n` rows: `r` (`n x heads x d_rel`) times `proj` (`[d_rel, extent]`).
pub fn rel_logits(r: &[f32], proj: &[f32], heads: usize, d_rel: usize, extent: usize) -> Vec<f32> {
    let n = r.len() / (heads * d_rel).max(1);
    let mut out = vec![0f32; n * heads * extent];
    for (rs, o) in r.chunks_exact(d_rel).zip(out.chunks_exact_mut(extent)).take(n * heads) {
        for (d, &rv) in rs.iter().enumerate() {
            o.iter_mut().zip(&proj[d * extent..(d + 1) * extent]).for_each(|(x, &p)| *x += rv * p);
        }
    }
    out
}

/// Query rows per task (prefill): enough to amortize a task, few enough to balance.
const ROWS_PER_TASK: usize = 8;

/// `q`: `n x heads*head_dim`, row `i` at position `pos0 + i`. `k`, `v`: all cached rows of the
/// layer (`len x kv_heads*head_dim`, `len x kv_heads*v_head_dim`), including this block's.
/// `out`: `n x heads*v_head_dim`. `sinks`: one logit per head, or none.
pub fn attend(s: AttnShape, q: &[f32], k: &[f32], v: &[f32], pos0: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    attend_rel(s, q, k, v, pos0, sinks, None, out)
}

/// `attend` with relative-position logits added to the scaled scores.
#[allow(clippy::too_many_arguments)]
pub fn attend_rel(
    s: AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    sinks: Option<&[f32]>,
    rel: Option<RelBias>,
    out: &mut [f32],
) {
    let ow = s.heads * s.v_head_dim;
    if ow == 0 {
        return;
    }
    let n = out.len() / ow;
    let blocks = n.div_ceil(ROWS_PER_TASK);
    let group = s.heads / s.kv_heads;
    // Prefill: a task is a KV head's whole group of query heads (they share every K and V load)
    // over a block of rows. Decode (one row): one head per task, to spread the few heads.
    let per = if n > 1 { group } else { 1 };
    let sets = s.heads / per;
    let o = SendPtr(out.as_mut_ptr());
    let wide = crate::format::wide_simd();
    let call = Rows { s: &s, q, k, v, pos0, sinks, rel };
    pool::run(sets * blocks, &|t| {
        // Later rows see more keys: hand out the heaviest blocks first, for balance.
        let (set, b) = (t % sets, blocks - 1 - t / sets);
        let hs = set * per..(set + 1) * per;
        let rows = b * ROWS_PER_TASK..((b + 1) * ROWS_PER_TASK).min(n);
        SCORES.with(|sc| {
            let sc = &mut sc.borrow_mut();
            for i in rows.clone() {
                // SAFETY: task `(set, b)` writes only heads `hs` of rows in block `b`: disjoint.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(o.get().add(i * ow + hs.start * s.v_head_dim), per * s.v_head_dim)
                };
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: `wide_simd` reported AVX2+FMA.
                    unsafe { heads_row_avx2(&call, i, hs.clone(), sc, o) };
                    continue;
                }
                let _ = wide;
                heads_row::<Plain>(&call, i, hs.clone(), sc, o);
            }
        });
    });
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// What every row of one `attend` call reads: its geometry, the query rows, the cached keys
/// and values, the block's first position and the sinks (as `attend` takes them).
struct Rows<'a> {
    s: &'a AttnShape,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    pos0: usize,
    sinks: Option<&'a [f32]>,
    rel: Option<RelBias<'a>>,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads_row_avx2(call: &Rows, i: usize, hs: std::ops::Range<usize>, scores: &mut Vec<f32>, o: &mut [f32]) {
    heads_row::<avx2::Avx2>(call, i, hs, scores, o)
}

/// The two inner loops of a head row over one chunk of `8 * NV` lanes of the head dimension
/// (`NV` in 1, 2, 4, 8): `scores[j] += q . k_j` and `out += sum_j w_j v_j` (rows `j` at
/// `stride` floats apart).
pub(crate) trait Chunk {
    /// # Safety
    /// `q` holds `8 * NV` floats; `k` holds `scores.len()` rows of at least `8 * NV` floats,
    /// `stride` apart; callers of an implementation with CPU features have checked them.
    unsafe fn scores<const NV: usize>(q: &[f32], k: *const f32, stride: usize, scores: &mut [f32]);
    /// # Safety
    /// As `scores`, for `v` and `w.len()` rows; `out` holds `8 * NV` floats.
    unsafe fn weighted<const NV: usize>(w: &[f32], v: *const f32, stride: usize, out: &mut [f32]);
}

pub(crate) struct Plain;

impl Chunk for Plain {
    unsafe fn scores<const NV: usize>(q: &[f32], k: *const f32, stride: usize, scores: &mut [f32]) {
        for (j, sc) in scores.iter_mut().enumerate() {
            let kr = std::slice::from_raw_parts(k.add(j * stride), 8 * NV);
            let mut acc = [0f32; 8];
            for (qq, kk) in q[..8 * NV].chunks_exact(8).zip(kr.chunks_exact(8)) {
                for l in 0..8 {
                    acc[l] += qq[l] * kk[l];
                }
            }
            *sc += acc.iter().sum::<f32>();
        }
    }

    unsafe fn weighted<const NV: usize>(w: &[f32], v: *const f32, stride: usize, out: &mut [f32]) {
        for (j, &wj) in w.iter().enumerate() {
            let vr = std::slice::from_raw_parts(v.add(j * stride), 8 * NV);
            for (o, &x) in out[..8 * NV].iter_mut().zip(vr) {
                *o += wj * x;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::Chunk;
    use std::arch::x86_64::*;

    pub struct Avx2;

    /// `q . k` over `NV` vectors, in two accumulators (one when `NV == 1`).
    #[inline(always)]
    unsafe fn dot<const NV: usize>(q: &[__m256; NV], k: *const f32) -> __m256 {
        let mut a = _mm256_mul_ps(q[0], _mm256_loadu_ps(k));
        if NV == 1 {
            return a;
        }
        let mut b = _mm256_mul_ps(q[1], _mm256_loadu_ps(k.add(8)));
        for c in (2..NV).step_by(2) {
            a = _mm256_fmadd_ps(q[c], _mm256_loadu_ps(k.add(8 * c)), a);
            b = _mm256_fmadd_ps(q[c + 1], _mm256_loadu_ps(k.add(8 * c + 8)), b);
        }
        _mm256_add_ps(a, b)
    }

    // The features on the methods themselves, so their intrinsics inline however deep the
    // generic code that calls them sits (through two levels of `inline(always)` helpers they
    // did not, and every intrinsic became a call: 10x slower).
    impl Chunk for Avx2 {
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn scores<const NV: usize>(q: &[f32], k: *const f32, stride: usize, scores: &mut [f32]) {
            let qv: [__m256; NV] = std::array::from_fn(|c| _mm256_loadu_ps(q.as_ptr().add(8 * c)));
            let len = scores.len();
            let mut j = 0;
            // Four keys at a time: their eight-lane sums reduce together through `hadd`.
            while j + 4 <= len {
                let s: [__m256; 4] = std::array::from_fn(|t| dot::<NV>(&qv, k.add((j + t) * stride)));
                let h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
                let r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
                let at = scores.as_mut_ptr().add(j);
                _mm_storeu_ps(at, _mm_add_ps(_mm_loadu_ps(at), r));
                j += 4;
            }
            while j < len {
                let v = dot::<NV>(&qv, k.add(j * stride));
                let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
                scores[j] += _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps(r, r, 1)));
                j += 1;
            }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn weighted<const NV: usize>(w: &[f32], v: *const f32, stride: usize, out: &mut [f32]) {
            let mut acc: [__m256; NV] = std::array::from_fn(|c| _mm256_loadu_ps(out.as_ptr().add(8 * c)));
            for (j, &wj) in w.iter().enumerate() {
                let wv = _mm256_set1_ps(wj);
                let vr = v.add(j * stride);
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(vr.add(8 * c)), *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *a);
            }
        }
    }
}

/// The widest chunk (64, 32, 16 or 8 lanes) that fits in `rest` lanes; 0 below 8.
fn chunk_width(rest: usize) -> usize {
    [64, 32, 16, 8].into_iter().find(|&c| c <= rest).unwrap_or(0)
}

/// Keys per block when several heads share a KV head: one block of K (or V) rows stays in L1
/// while every head of the group takes its turn over it.
const KEY_BLOCK: usize = 32;

/// One query row `i` of heads `hs` (all reading the same KV head): scores against the row's
/// keys, softmax (with each head's sink), and the weighted sums of values into `o` (the
/// heads' outputs, `v_head_dim` each). `scores` is scratch.
#[inline(always)]
fn heads_row<K: Chunk>(call: &Rows, i: usize, hs: std::ops::Range<usize>, scores: &mut Vec<f32>, o: &mut [f32]) {
    let Rows { s, q, k, v, pos0, sinks, rel } = *call;
    let (hd, vhd) = (s.head_dim, s.v_head_dim);
    let g = hs.len();
    let kvh = hs.start / (s.heads / s.kv_heads);
    let (kw, vw) = (s.kv_heads * hd, s.kv_heads * vhd);
    let p = pos0 + i;
    let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
    let len = p + 1 - lo;
    scores.clear();
    scores.resize(g * len, 0.0);
    // Scores, one register-held chunk of the query at a time, key blocks shared by the heads.
    let krows = &k[lo * kw + kvh * hd..];
    group_scores::<K>(&q[i * s.heads * hd..], hs.clone(), (krows, kw, hd), len, scores);
    // Softmax of each head's scores.
    let mut inv = [0f32; 64];
    let mut invs = Vec::new();
    let inv: &mut [f32] = if g <= 64 {
        &mut inv[..g]
    } else {
        invs.resize(g, 0.0);
        &mut invs
    };
    for (t, h) in hs.clone().enumerate() {
        let sc = &mut scores[t * len..(t + 1) * len];
        let sink = sinks.map(|sk| sk[h]);
        let mut m = scale_max(sc, s.scale);
        if let Some(rb) = rel {
            // Key `j` is at position `lo + j`, `p - lo - j` back from the query.
            let bias = &rb.logits[(i * s.heads + h) * rb.extent..][..rb.extent];
            for (j, x) in sc.iter_mut().enumerate() {
                if let Some(b) = bias.get(p - lo - j) {
                    *x += b;
                }
            }
            m = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        }
        if let Some(sv) = sink {
            m = m.max(sv);
        }
        let mut l = super::elementwise::exp_shifted_sum(sc, m);
        if let Some(sv) = sink {
            l += (sv - m).exp();
        }
        inv[t] = 1.0 / l;
    }
    // Weighted values, one register-held chunk of the output at a time, value blocks shared.
    o.iter_mut().for_each(|x| *x = 0.0);
    group_weighted::<K>(scores, (&v[lo * vw + kvh * vhd..], vw, vhd), len, g, o);
    for t in 0..g {
        o[t * vhd..(t + 1) * vhd].iter_mut().for_each(|x| *x *= inv[t]);
    }
}

/// Scales `sc` by `scale` in place and returns the largest (in eight lanes, so it vectorizes);
/// negative infinity when empty.
#[inline(always)]
pub(crate) fn scale_max(sc: &mut [f32], scale: f32) -> f32 {
    let mut mx = [f32::NEG_INFINITY; 8];
    let mut c8 = sc.chunks_exact_mut(8);
    for c in &mut c8 {
        for l in 0..8 {
            c[l] *= scale;
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
        }
    }
    for x in c8.into_remainder() {
        *x *= scale;
        mx[0] = mx[0].max(*x);
    }
    mx.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `scores[t * len + j] += q_h . k_j` for the heads `h` of `hs` (`t` their index) and `len`
/// key rows of `hd` floats, `kw` apart from the start of `krows` (`q_h`: `qrow[h * hd..][..hd]`,
/// a query row's heads): one register-held chunk of the query at a time, blocks of `KEY_BLOCK` keys shared by
/// the heads. `K`'s CPU features must have been checked by the caller that chose it.
#[inline(always)]
pub(crate) fn group_scores<K: Chunk>(
    qrow: &[f32],
    hs: std::ops::Range<usize>,
    (krows, kw, hd): (&[f32], usize, usize),
    len: usize,
    scores: &mut [f32],
) {
    assert!(len == 0 || krows.len() >= (len - 1) * kw + hd, "key rows past the cache");
    let mut c0 = 0;
    while c0 < hd {
        let c = chunk_width(hd - c0);
        let width = if c == 0 { hd - c0 } else { c };
        for j0 in (0..len).step_by(KEY_BLOCK) {
            let j1 = (j0 + KEY_BLOCK).min(len);
            for (t, h) in hs.clone().enumerate() {
                let qc = &qrow[h * hd + c0..h * hd + c0 + width];
                let sc = &mut scores[t * len + j0..t * len + j1];
                let rows = &krows[j0 * kw + c0..];
                // SAFETY: the assert above bounds every row read (`c0 + c <= hd`); `K`'s CPU
                // features were checked by the caller that chose it.
                unsafe {
                    match c {
                        64 => K::scores::<8>(qc, rows.as_ptr(), kw, sc),
                        32 => K::scores::<4>(qc, rows.as_ptr(), kw, sc),
                        16 => K::scores::<2>(qc, rows.as_ptr(), kw, sc),
                        8 => K::scores::<1>(qc, rows.as_ptr(), kw, sc),
                        _ => {
                            // Fewer than eight lanes left: plain code.
                            for (j, x) in sc.iter_mut().enumerate() {
                                *x += qc.iter().zip(&rows[j * kw..j * kw + width]).map(|(a, b)| a * b).sum::<f32>();
                            }
                        }
                    }
                }
            }
        }
        c0 += width;
    }
}

/// `o[t * vhd..][..vhd] += sum_j w[t * len + j] v_j` for `g` heads over `len` value rows of
/// `vhd` floats, `vw` apart from the start of `vrows`: one register-held chunk of the output at
/// a time, value blocks shared by the heads.
#[inline(always)]
pub(crate) fn group_weighted<K: Chunk>(
    w: &[f32],
    (vrows, vw, vhd): (&[f32], usize, usize),
    len: usize,
    g: usize,
    o: &mut [f32],
) {
    assert!(len == 0 || vrows.len() >= (len - 1) * vw + vhd, "value rows past the cache");
    let mut c0 = 0;
    while c0 < vhd {
        let c = chunk_width(vhd - c0);
        let width = if c == 0 { vhd - c0 } else { c };
        for j0 in (0..len).step_by(KEY_BLOCK) {
            let j1 = (j0 + KEY_BLOCK).min(len);
            for t in 0..g {
                let wt = &w[t * len + j0..t * len + j1];
                let oc = &mut o[t * vhd + c0..t * vhd + c0 + width];
                let rows = &vrows[j0 * vw + c0..];
                // SAFETY: as for the scores.
                unsafe {
                    match c {
                        64 => K::weighted::<8>(wt, rows.as_ptr(), vw, oc),
                        32 => K::weighted::<4>(wt, rows.as_ptr(), vw, oc),
                        16 => K::weighted::<2>(wt, rows.as_ptr(), vw, oc),
                        8 => K::weighted::<1>(wt, rows.as_ptr(), vw, oc),
                        _ => {
                            for (j, &wj) in wt.iter().enumerate() {
                                oc.iter_mut().zip(&rows[j * vw..j * vw + width]).for_each(|(x, &vv)| *x += wj * vv);
                            }
                        }
                    }
                }
            }
        }
        c0 += width;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(window: Option<usize>) -> AttnShape {
        AttnShape { heads: 2, kv_heads: 1, head_dim: 2, v_head_dim: 2, scale: 1.0, window }
    }

    #[test]
    fn single_position_returns_its_value() {
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [0.5, 0.5];
        let v = [3.0, 4.0];
        let mut out = [0.0; 4];
        attend(shape(None), &q, &k, &v, 0, None, &mut out);
        assert_eq!(out, [3.0, 4.0, 3.0, 4.0]);
    }

    #[test]
    fn equal_scores_average_values() {
        let q = [0.0; 4];
        let k = [1.0, 2.0, 3.0, 4.0];
        let v = [2.0, 0.0, 4.0, 2.0];
        let mut out = [0.0; 4];
        attend(shape(None), &q, &k, &v, 1, None, &mut out);
        assert_eq!(out, [3.0, 1.0, 3.0, 1.0]);
    }

    #[test]
    fn relative_logits_weigh_keys_by_distance() {
        // Row at position 2 over keys 0..=2, equal q.k; head 0: distance 0 gets ln 2, distance
        // 1 gets 0, distance 2 is past the extent (2); head 1: distance 1 gets ln 3.
        let q = [0.0; 4];
        let k = [0.0; 6];
        let v = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let r = [2f32.ln(), 0.0, 0.0, 3f32.ln()];
        // proj rows: d 0 = [1, 0] (distance 0), d 1 = [0, 1] (distance 1).
        let proj = [1.0, 0.0, 0.0, 1.0];
        let logits = rel_logits(&r, &proj, 2, 2, 2);
        assert_eq!(logits.len(), 4);
        let mut out = [0.0; 4];
        attend_rel(shape(None), &q, &k, &v, 2, None, Some(RelBias { logits: &logits, extent: 2 }), &mut out);
        // Head 0: weights (1, 1, 2) / 4 over keys 0, 1, 2; head 1: (1, 3, 1) / 5.
        let want = [0.25, 0.25, 0.2, 0.6];
        for (g, w) in out.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn window_hides_old_positions() {
        let q = [0.0; 4];
        let k = [0.0; 4];
        let v = [2.0, 0.0, 4.0, 2.0];
        let mut out = [0.0; 4];
        attend(shape(Some(1)), &q, &k, &v, 1, None, &mut out);
        assert_eq!(out, [4.0, 2.0, 4.0, 2.0]);
    }

    #[test]
    fn sink_takes_its_share_of_the_denominator() {
        let q = [0.0; 4];
        let k = [0.0; 2];
        let v = [1.0, 1.0];
        let mut out = [0.0; 4];
        // score 0 and sink 0: the value gets half the weight.
        attend(shape(None), &q, &k, &v, 0, Some(&[0.0, f32::NEG_INFINITY]), &mut out);
        assert!((out[0] - 0.5).abs() < 1e-6 && (out[2] - 1.0).abs() < 1e-6);
    }

    /// The plain definition, in f64.
    fn reference(
        s: AttnShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pos0: usize,
        sinks: Option<&[f32]>,
        n: usize,
    ) -> Vec<f32> {
        let (hd, vhd) = (s.head_dim, s.v_head_dim);
        let mut out = vec![0f32; n * s.heads * vhd];
        for i in 0..n {
            for h in 0..s.heads {
                let kvh = h / (s.heads / s.kv_heads);
                let p = pos0 + i;
                let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
                let qh = &q[(i * s.heads + h) * hd..][..hd];
                let sc: Vec<f64> = (lo..=p)
                    .map(|j| {
                        qh.iter()
                            .zip(&k[(j * s.kv_heads + kvh) * hd..][..hd])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * s.scale as f64
                    })
                    .collect();
                let sink = sinks.map(|sk| sk[h] as f64);
                let m = sc.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = sc.iter().chain(sink.as_ref()).map(|x| (x - m).exp()).sum();
                for d in 0..vhd {
                    let acc: f64 = (lo..=p)
                        .zip(&sc)
                        .map(|(j, x)| (x - m).exp() * v[(j * s.kv_heads + kvh) * vhd + d] as f64)
                        .sum();
                    out[(i * s.heads + h) * vhd + d] = (acc / l) as f32;
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_plain_definition_across_shapes() {
        let mut seed = 12345u64;
        let mut rnd = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        // (heads, kv_heads, head_dim, v_head_dim, window, sinks, pos0, n): head dims on and off
        // the 64-lane chunk, GQA groups, a window, sinks, prefill blocks and decode rows.
        let cases = [
            (9, 3, 64, 64, None, false, 0, 37),
            (9, 3, 64, 64, None, false, 40, 1),
            (4, 2, 80, 48, Some(7), true, 5, 20),
            (2, 2, 128, 128, None, true, 3, 2),
            (3, 1, 16, 24, Some(50), false, 0, 70),
            (8, 8, 32, 32, None, false, 0, 20),
            (2, 1, 20, 12, None, true, 2, 5),
        ];
        for (heads, kv_heads, head_dim, v_head_dim, window, with_sinks, pos0, n) in cases {
            let s = AttnShape { heads, kv_heads, head_dim, v_head_dim, scale: 1.0 / (head_dim as f32).sqrt(), window };
            let len = pos0 + n;
            let q: Vec<f32> = (0..n * heads * head_dim).map(|_| 2.0 * rnd()).collect();
            let k: Vec<f32> = (0..len * kv_heads * head_dim).map(|_| 2.0 * rnd()).collect();
            let v: Vec<f32> = (0..len * kv_heads * v_head_dim).map(|_| rnd()).collect();
            let sinks: Vec<f32> = (0..heads).map(|_| rnd()).collect();
            let sinks = with_sinks.then_some(sinks.as_slice());
            let mut out = vec![f32::NAN; n * heads * v_head_dim];
            attend(s, &q, &k, &v, pos0, sinks, &mut out);
            let want = reference(s, &q, &k, &v, pos0, sinks, n);
            for (j, (a, b)) in out.iter().zip(&want).enumerate() {
                // Values are within [-1, 1]: f32 sums of a few hundred terms stay within 1e-5.
                assert!(
                    (a - b).abs() <= 1e-5,
                    "case {heads}/{kv_heads}/{head_dim}/{v_head_dim} n={n} [{j}]: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn causal_block_rows_see_only_the_past() {
        // two rows at positions 0 and 1; row 0 must not see position 1's value.
        let s = AttnShape { heads: 1, kv_heads: 1, head_dim: 1, v_head_dim: 1, scale: 1.0, window: None };
        let q = [0.0, 0.0];
        let k = [0.0, 0.0];
        let v = [1.0, 3.0];
        let mut out = [0.0; 2];
        attend(s, &q, &k, &v, 0, None, &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }
}
