//! Kimi Delta Attention (Kimi Linear) on the CPU: the channel-wise gated delta rule with a
//! recurrent state, for a block of rows that continues the sequence the state has absorbed.
//!
//! `heads` heads of one width `d` (`hd = heads * d`). Per row: `q`, `k`, `v` projections
//! (`hd` each), each channel through its own causal depthwise convolution (kernel
//! `conv_kernel`, the last `conv_kernel - 1` inputs kept in a ring) and SiLU; the forget gate
//! `g = -exp(A_log[head]) * softplus(f_b(f_a(x)) + dt_bias)`, one log-decay per channel;
//! `beta = sigmoid(b_proj(x))` per head; per head, q and k L2-normed (q also scaled by
//! `1/sqrt(d)`) and the delta rule on the head's `d x d` state `S` with the decay applied per
//! key channel: `S[i, :] *= exp(g[i])`, `S += k (beta (v - S^T k))^T`, `o = S^T q`; then the
//! RMSNorm per head times `sigmoid(g_b(g_a(x)))`, and `out_proj`. A block's rows run in order
//! (the recurrence is sequential; transformers' chunked prefill is the same sum reordered);
//! heads run in parallel.
//!
//! The state is the caller's, in the layout of `LinearAttentionSpec::state_floats`: every
//! head's `S` (key channel major), then the convolution ring (`conv_kernel - 1` rows of the
//! `[q | k | v]` channels, oldest first). Must not: keep state of its own, or decide when the
//! state may be reset (the executor does).

use super::deltanet::{l2norm, short_conv, sigmoid, softplus, MissingRole};
use super::linear::{linear, Precision};
use crate::format::Matrix;
use crate::store::weights::WeightStore;
use coli_compiler::ir::LinearAttentionSpec;
use rayon::prelude::*;

/// The weights of one KDA op, by role (the compiler checked the roles and their shapes).
pub struct KdaWeights<'a> {
    pub q: Matrix<'a>,
    pub k: Matrix<'a>,
    pub v: Matrix<'a>,
    /// The three convolutions, `[hd, 1, kernel]` each, flattened.
    pub conv: [&'a [f32]; 3],
    pub f_a: Matrix<'a>,
    pub f_b: Matrix<'a>,
    /// `[hd]`.
    pub dt_bias: &'a [f32],
    /// `[heads]` (stored `[1, 1, heads, 1]`).
    pub a_log: &'a [f32],
    pub b: Matrix<'a>,
    pub g_a: Matrix<'a>,
    pub g_b: Matrix<'a>,
    /// `[d]`.
    pub norm: &'a [f32],
    pub out: Matrix<'a>,
}

impl<'a> KdaWeights<'a> {
    /// The op's weights from the store, by role.
    pub fn resolve(spec: &LinearAttentionSpec, ws: &'a WeightStore) -> Result<KdaWeights<'a>, MissingRole> {
        let find = |r: &str| {
            spec.weights
                .iter()
                .find(|(role, _)| role == r)
                .map(|(_, w)| w.name.as_str())
                .ok_or_else(|| MissingRole(r.to_string()))
        };
        Ok(KdaWeights {
            q: ws.matrix(find("q_proj")?),
            k: ws.matrix(find("k_proj")?),
            v: ws.matrix(find("v_proj")?),
            conv: [ws.vector(find("q_conv")?), ws.vector(find("k_conv")?), ws.vector(find("v_conv")?)],
            f_a: ws.matrix(find("f_a")?),
            f_b: ws.matrix(find("f_b")?),
            dt_bias: ws.vector(find("dt_bias")?),
            a_log: ws.vector(find("a_log")?),
            b: ws.matrix(find("b_proj")?),
            g_a: ws.matrix(find("g_a")?),
            g_b: ws.matrix(find("g_b")?),
            norm: ws.vector(find("norm")?),
            out: ws.matrix(find("out_proj")?),
        })
    }
}

/// One layer's op as a call runs it: the spec, the weights, the output norm's epsilon and the
/// precision of the products.
#[derive(Clone, Copy)]
pub struct KdaCall<'a> {
    pub spec: &'a LinearAttentionSpec,
    pub weights: &'a KdaWeights<'a>,
    pub eps: f32,
    pub precision: Precision,
}

/// `y = b(a(x))` for `n` rows: a low-rank pair of projections.
fn low_rank(a: &Matrix, b: &Matrix, x: &[f32], n: usize, mid: usize, out: &mut [f32], precision: Precision) {
    let mut t = vec![0f32; n * mid];
    linear(a, x, n, &mut t, precision);
    linear(b, &t, n, out, precision);
}

/// Runs the mixer over `x` (`n x hidden`), advancing `state` by `n` positions, and writes `out`
/// (`n x hidden`).
pub fn kda(call: &KdaCall, x: &[f32], n: usize, state: &mut [f32], out: &mut [f32]) {
    let KdaCall { spec: s, weights: w, eps, precision } = *call;
    let (heads, d, kk) = (s.value_heads, s.value_head_dim, s.conv_kernel);
    let hd = heads * d;
    let channels = 3 * hd;
    // 1. Projections: mixed = [q | k | v] per row, the convolution's channel order.
    let mut mixed = vec![0f32; n * channels];
    let mut part = vec![0f32; n * hd];
    for (j, m) in [&w.q, &w.k, &w.v].into_iter().enumerate() {
        linear(m, x, n, &mut part, precision);
        for t in 0..n {
            mixed[t * channels + j * hd..][..hd].copy_from_slice(&part[t * hd..(t + 1) * hd]);
        }
    }
    // The decay per channel, beta per head, the output gate per channel.
    let mut decay = vec![0f32; n * hd];
    low_rank(&w.f_a, &w.f_b, x, n, d, &mut decay, precision);
    for (i, g) in decay.iter_mut().enumerate() {
        let c = i % hd;
        *g = (-w.a_log[c / d].exp() * softplus(*g + w.dt_bias[c])).exp();
    }
    let mut beta = vec![0f32; n * heads];
    linear(&w.b, x, n, &mut beta, precision);
    beta.iter_mut().for_each(|b| *b = sigmoid(*b));
    let mut gate = vec![0f32; n * hd];
    low_rank(&w.g_a, &w.g_b, x, n, d, &mut gate, precision);
    // 2. The three short convolutions (one weight per channel: q's, k's, v's in turn), SiLU.
    let (heads_state, ring) = state.split_at_mut(heads * d * d);
    let conv_w: Vec<f32> = w.conv.iter().flat_map(|c| c.iter().copied()).collect();
    let conv = short_conv(&conv_w, kk, channels, &mixed, n, ring);
    // 3. The delta rule per head, rows in order, the decay per key channel.
    let mut per_head: Vec<Vec<f32>> = vec![Vec::new(); heads];
    heads_state.par_chunks_mut(d * d).zip(per_head.par_iter_mut()).enumerate().for_each(|(h, (st, oh))| {
        let (mut q, mut k) = (vec![0f32; d], vec![0f32; d]);
        let mut delta = vec![0f32; d];
        oh.resize(n * d, 0.0);
        let qscale = 1.0 / (d as f32).sqrt();
        for t in 0..n {
            let row = &conv[t * channels..(t + 1) * channels];
            q.copy_from_slice(&row[h * d..(h + 1) * d]);
            k.copy_from_slice(&row[hd + h * d..hd + (h + 1) * d]);
            let v = &row[2 * hd + h * d..2 * hd + (h + 1) * d];
            l2norm(&mut q);
            l2norm(&mut k);
            q.iter_mut().for_each(|x| *x *= qscale);
            let g = &decay[t * hd + h * d..][..d];
            for (sr, &gi) in st.chunks_exact_mut(d).zip(g) {
                sr.iter_mut().for_each(|x| *x *= gi);
            }
            // delta = beta (v - S^T k)
            delta.copy_from_slice(v);
            for (sr, &ki) in st.chunks_exact(d).zip(&k) {
                delta.iter_mut().zip(sr).for_each(|(a, &sv)| *a -= ki * sv);
            }
            let bt = beta[t * heads + h];
            delta.iter_mut().for_each(|a| *a *= bt);
            // S += k delta^T; o = S^T q
            let ot = &mut oh[t * d..(t + 1) * d];
            ot.iter_mut().for_each(|a| *a = 0.0);
            for (sr, (&ki, &qi)) in st.chunks_exact_mut(d).zip(k.iter().zip(&q)) {
                sr.iter_mut().zip(&delta).for_each(|(sv, &de)| *sv += ki * de);
                ot.iter_mut().zip(sr.iter()).for_each(|(a, &sv)| *a += qi * sv);
            }
        }
    });
    // 4. The RMSNorm per head times the sigmoid gate, then the output projection.
    let mut o = vec![0f32; n * hd];
    for (h, oh) in per_head.iter().enumerate() {
        for t in 0..n {
            let src = &oh[t * d..(t + 1) * d];
            let ms = src.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            let (gt, dst) = (&gate[t * hd + h * d..][..d], &mut o[t * hd + h * d..][..d]);
            for e in 0..d {
                dst[e] = src[e] * inv * w.norm[e] * sigmoid(gt[e]);
            }
        }
    }
    linear(&w.out, &o, n, out, precision);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::WeightFormat;
    use coli_compiler::ir::LinearAttentionKind;

    fn rnd(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn m(rows: usize, cols: usize, data: &[u8]) -> Matrix<'_> {
        Matrix::new(WeightFormat::F32, rows, cols, data).unwrap()
    }

    fn spec(heads: usize, d: usize, kernel: usize) -> LinearAttentionSpec {
        LinearAttentionSpec {
            kind: LinearAttentionKind::Kda,
            key_heads: heads,
            value_heads: heads,
            key_head_dim: d,
            value_head_dim: d,
            conv_kernel: kernel,
            weights: vec![],
            norm_eps: 1e-5,
        }
    }

    /// The raw weights of a random op, as bytes (matrices) and floats (vectors).
    struct Raw {
        mats: Vec<Vec<u8>>,
        conv: [Vec<f32>; 3],
        dt: Vec<f32>,
        a_log: Vec<f32>,
        norm: Vec<f32>,
    }

    fn raw(heads: usize, d: usize, hidden: usize, kernel: usize) -> Raw {
        let hd = heads * d;
        let sizes = [hd * hidden, hd * hidden, hd * hidden, d * hidden, hd * d, heads * hidden, d * hidden, hd * d];
        let mut mats: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| bytes(&rnd(n, 10 + i as u32))).collect();
        mats.push(bytes(&rnd(hidden * hd, 30)));
        Raw {
            mats,
            conv: [rnd(hd * kernel, 31), rnd(hd * kernel, 32), rnd(hd * kernel, 33)],
            dt: rnd(hd, 34),
            a_log: rnd(heads, 35),
            norm: rnd(d, 36),
        }
    }

    fn weights(r: &Raw, heads: usize, d: usize, hidden: usize) -> KdaWeights<'_> {
        let hd = heads * d;
        let mm = &r.mats;
        KdaWeights {
            q: m(hd, hidden, &mm[0]),
            k: m(hd, hidden, &mm[1]),
            v: m(hd, hidden, &mm[2]),
            conv: [&r.conv[0], &r.conv[1], &r.conv[2]],
            f_a: m(d, hidden, &mm[3]),
            f_b: m(hd, d, &mm[4]),
            dt_bias: &r.dt,
            a_log: &r.a_log,
            b: m(heads, hidden, &mm[5]),
            g_a: m(d, hidden, &mm[6]),
            g_b: m(hd, d, &mm[7]),
            norm: &r.norm,
            out: m(hidden, hd, &mm[8]),
        }
    }

    /// A block of rows gives what the same rows give in smaller blocks (the state carries
    /// exactly what the rows pass along), in any chunking.
    #[test]
    fn chunked_blocks_equal_one_block() {
        let (heads, d, hidden, kernel) = (3, 5, 11, 4);
        let s = spec(heads, d, kernel);
        let r = raw(heads, d, hidden, kernel);
        let w = weights(&r, heads, d, hidden);
        let n = 10;
        let x = rnd(n * hidden, 40);
        let run = |chunk: usize| {
            let mut state = vec![0f32; s.state_floats()];
            let mut all = Vec::new();
            for start in (0..n).step_by(chunk) {
                let rows = chunk.min(n - start);
                let mut o = vec![0f32; rows * hidden];
                let call = KdaCall { spec: &s, weights: &w, eps: 1e-5, precision: Precision::Exact };
                kda(&call, &x[start * hidden..(start + rows) * hidden], rows, &mut state, &mut o);
                all.extend(o);
            }
            (all, state)
        };
        let (want, want_state) = run(n);
        assert!(want.iter().any(|v| v.abs() > 1e-3), "the output is not all zero");
        for chunk in [1, 3, 4] {
            let (got, st) = run(chunk);
            let err = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            let serr = st.iter().zip(&want_state).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(err < 1e-5 && serr < 1e-5, "chunk {chunk}: out {err}, state {serr}");
        }
    }

    /// The first row from a zero state, written out by hand: the convolution sees only its
    /// last tap, `S = k (beta v)^T` after the decay of a zero state, so `o = (q . k) beta v`.
    #[test]
    fn first_row_is_the_closed_form() {
        let (heads, d, hidden, kernel) = (2, 3, 4, 3);
        let s = spec(heads, d, kernel);
        let r = raw(heads, d, hidden, kernel);
        let w = weights(&r, heads, d, hidden);
        let x = rnd(hidden, 50);
        let mut state = vec![0f32; s.state_floats()];
        let mut got = vec![0f32; hidden];
        kda(&KdaCall { spec: &s, weights: &w, eps: 1e-5, precision: Precision::Exact }, &x, 1, &mut state, &mut got);
        let hd = heads * d;
        let mv = |m: &Matrix, x: &[f32], rows: usize| {
            let mut o = vec![0f32; rows];
            linear(m, x, 1, &mut o, Precision::Exact);
            o
        };
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let last_tap = |p: Vec<f32>, c: &[f32]| -> Vec<f32> {
            p.iter().enumerate().map(|(i, v)| silu(v * c[i * kernel + kernel - 1])).collect()
        };
        let (q, k, v) = (
            last_tap(mv(&w.q, &x, hd), w.conv[0]),
            last_tap(mv(&w.k, &x, hd), w.conv[1]),
            last_tap(mv(&w.v, &x, hd), w.conv[2]),
        );
        let beta: Vec<f32> = mv(&w.b, &x, heads).iter().map(|b| 1.0 / (1.0 + (-b).exp())).collect();
        let gate = mv(&w.g_b, &mv(&w.g_a, &x, d), hd);
        let l2 = |s: &[f32]| (s.iter().map(|a| a * a).sum::<f32>() + 1e-6).sqrt();
        let mut o = vec![0f32; hd];
        for h in 0..heads {
            let (nq, nk) = (l2(&q[h * d..(h + 1) * d]), l2(&k[h * d..(h + 1) * d]));
            let qk: f32 = (0..d).map(|i| q[h * d + i] / nq * k[h * d + i] / nk).sum::<f32>() / (d as f32).sqrt();
            let oh: Vec<f32> = (0..d).map(|e| qk * beta[h] * v[h * d + e]).collect();
            let rms = (oh.iter().map(|a| a * a).sum::<f32>() / d as f32 + 1e-5).sqrt();
            for e in 0..d {
                o[h * d + e] = oh[e] / rms * w.norm[e] / (1.0 + (-gate[h * d + e]).exp());
            }
        }
        let want = mv(&w.out, &o, hidden);
        let err = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(err < 1e-5, "first row vs closed form: {err}");
    }
}
