//! Gated DeltaNet (Qwen3-Next, Qwen3.5) on the CPU: a linear-attention mixer with a recurrent
//! state, for a block of rows that continues the sequence the state has absorbed.
//!
//! Per row: the input projections, either Qwen3-Next's `in_proj_qkvz` and `in_proj_ba`
//! (grouped per key head: q, k, then the group's values and output gates z; b then a) or
//! Qwen3.5's four apart (`in_proj_qkv`: every q, every k, every v; `in_proj_z`; `in_proj_b`;
//! `in_proj_a`, each per value head in order); a causal depthwise convolution over q, k and v
//! (kernel `conv_kernel`, its last `conv_kernel - 1` inputs kept in a ring) followed by SiLU;
//! per value head `h` (sharing key head `h / (value_heads / key_heads)`): q and k L2-normed
//! (q also scaled by `1/sqrt(key_head_dim)`), `beta = sigmoid(b)`, the decay
//! `g = -exp(A_log) * softplus(a + dt_bias)`, and the gated delta rule on the head's
//! `key_head_dim x value_head_dim` state `S`: `S *= exp(g)`, `S += k (beta (v - S^T k))^T`,
//! `o = S^T q`; then the gated RMSNorm `rms_norm(o) * w * silu(z)` and `out_proj`.
//! A block's rows run in order (the recurrence is sequential); heads run in parallel.
//!
//! The state (`LinearAttentionSpec::state_floats`) is the caller's: every head's `S`, then
//! the convolution ring (`conv_kernel - 1` rows of the q/k/v channels, oldest first). Must
//! not: keep state of its own, or decide when the state may be reset (the executor does).

use super::linear::{linear, Precision};
use crate::format::Matrix;
use crate::store::weights::WeightStore;
use coli_compiler::ir::LinearAttentionSpec;
use rayon::prelude::*;

/// The input projections of one Gated DeltaNet op, in one of the two layouts checkpoints use
/// (the compiler admits exactly one of the two role sets).
pub enum DeltaNetProjections<'a> {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Grouped { qkvz: Matrix<'a>, ba: Matrix<'a> },
    /// Qwen3.5: `in_proj_qkv` (`[q | k | v]`, the convolution's channel order), `in_proj_z`,
    /// `in_proj_b` and `in_proj_a` (per value head).
    Split { qkv: Matrix<'a>, z: Matrix<'a>, b: Matrix<'a>, a: Matrix<'a> },
}

/// The weights of one Gated DeltaNet op, by role.
pub struct DeltaNetWeights<'a> {
    pub proj: DeltaNetProjections<'a>,
    /// `[channels, 1, kernel]`, flattened.
    pub conv: &'a [f32],
    pub dt_bias: &'a [f32],
    pub a_log: &'a [f32],
    pub norm: &'a [f32],
    pub out: Matrix<'a>,
}

/// A role the op lacks (the compiler checks them; reported as the op library's error).
#[derive(Debug)]
pub struct MissingRole(pub String);

impl<'a> DeltaNetWeights<'a> {
    /// The op's weights from the store, by role.
    pub fn resolve(spec: &LinearAttentionSpec, ws: &'a WeightStore) -> Result<DeltaNetWeights<'a>, MissingRole> {
        let find = |r: &str| {
            spec.weights
                .iter()
                .find(|(role, _)| role == r)
                .map(|(_, w)| w.name.as_str())
                .ok_or_else(|| MissingRole(r.to_string()))
        };
        let proj = if spec.projections_apart() {
            DeltaNetProjections::Split {
                qkv: ws.matrix(find("in_proj_qkv")?),
                z: ws.matrix(find("in_proj_z")?),
                b: ws.matrix(find("in_proj_b")?),
                a: ws.matrix(find("in_proj_a")?),
            }
        } else {
            DeltaNetProjections::Grouped { qkvz: ws.matrix(find("in_proj_qkvz")?), ba: ws.matrix(find("in_proj_ba")?) }
        };
        Ok(DeltaNetWeights {
            proj,
            conv: ws.vector(find("conv1d")?),
            dt_bias: ws.vector(find("dt_bias")?),
            a_log: ws.vector(find("a_log")?),
            norm: ws.vector(find("norm")?),
            out: ws.matrix(find("out_proj")?),
        })
    }
}

pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub(super) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// torch's softplus (linear above 20).
pub(super) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x / sqrt(sum x^2 + 1e-6)` in place.
pub(super) fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// The causal depthwise convolution of `n` rows of `mixed` (`channels` wide; `weight` is
/// `[channels, kernel]`) continuing the ring of the previous `kernel - 1` inputs (oldest
/// first), each output through SiLU; the ring then keeps the last `kernel - 1` inputs.
pub(super) fn short_conv(
    weight: &[f32],
    kernel: usize,
    channels: usize,
    mixed: &[f32],
    n: usize,
    ring: &mut [f32],
) -> Vec<f32> {
    let hist = kernel.saturating_sub(1);
    let mut conv = vec![0f32; n * channels];
    for c in 0..channels {
        let wc = &weight[c * kernel..(c + 1) * kernel];
        // The input at time index `i` of the sequence ring ++ block.
        let at = |i: usize| if i < hist { ring[i * channels + c] } else { mixed[(i - hist) * channels + c] };
        for t in 0..n {
            let acc: f32 = (0..kernel).map(|k| wc[k] * at(t + k)).sum();
            conv[t * channels + c] = silu(acc);
        }
    }
    let total = hist + n;
    let mut new_ring = vec![0f32; hist * channels];
    for i in 0..hist {
        let src = total - hist + i;
        let row = if src < hist {
            &ring[src * channels..(src + 1) * channels]
        } else {
            &mixed[(src - hist) * channels..(src - hist + 1) * channels]
        };
        new_ring[i * channels..(i + 1) * channels].copy_from_slice(row);
    }
    ring.copy_from_slice(&new_ring);
    conv
}

/// One layer's op as a call runs it: the spec, the weights, the gated norm's epsilon and the
/// precision of the products.
#[derive(Clone, Copy)]
pub struct DeltaNetCall<'a> {
    pub spec: &'a LinearAttentionSpec,
    pub weights: &'a DeltaNetWeights<'a>,
    pub eps: f32,
    pub precision: Precision,
}

/// Runs the mixer over `x` (`n x hidden`), advancing `state` by `n` positions, and writes `out`
/// (`n x hidden`).
pub fn gated_deltanet(call: &DeltaNetCall, x: &[f32], n: usize, state: &mut [f32], out: &mut [f32]) {
    let DeltaNetCall { spec: s, weights: w, eps, precision } = *call;
    let (nk, nv, dk, dv, kk) = (s.key_heads, s.value_heads, s.key_head_dim, s.value_head_dim, s.conv_kernel);
    let r = nv / nk;
    let key_dim = nk * dk;
    let channels = 2 * key_dim + nv * dv;
    // 1. Projections, in the convolution's order: mixed = [q (nk*dk) | k (nk*dk) | v (nv*dv)],
    // z (nv*dv), beta and the decay per value head.
    let mut mixed = vec![0f32; n * channels];
    let mut z = vec![0f32; n * nv * dv];
    let (mut beta, mut decay) = (vec![0f32; n * nv], vec![0f32; n * nv]);
    let gate = |b: f32, a: f32, h: usize| (sigmoid(b), (-w.a_log[h].exp() * softplus(a + w.dt_bias[h])).exp());
    match &w.proj {
        DeltaNetProjections::Grouped { qkvz, ba: ba_w } => {
            let pw = 2 * key_dim + 2 * nv * dv;
            let mut p = vec![0f32; n * pw];
            linear(qkvz, x, n, &mut p, precision);
            let mut ba = vec![0f32; n * 2 * nv];
            linear(ba_w, x, n, &mut ba, precision);
            let group = 2 * dk + 2 * r * dv;
            for t in 0..n {
                let (pr, mr) = (&p[t * pw..(t + 1) * pw], &mut mixed[t * channels..(t + 1) * channels]);
                for g in 0..nk {
                    let src = &pr[g * group..(g + 1) * group];
                    mr[g * dk..(g + 1) * dk].copy_from_slice(&src[..dk]);
                    mr[key_dim + g * dk..key_dim + (g + 1) * dk].copy_from_slice(&src[dk..2 * dk]);
                    mr[2 * key_dim + g * r * dv..2 * key_dim + (g + 1) * r * dv]
                        .copy_from_slice(&src[2 * dk..2 * dk + r * dv]);
                    z[t * nv * dv + g * r * dv..][..r * dv].copy_from_slice(&src[2 * dk + r * dv..]);
                    for j in 0..r {
                        let h = g * r + j;
                        let (b, a) = (ba[t * 2 * nv + g * 2 * r + j], ba[t * 2 * nv + g * 2 * r + r + j]);
                        (beta[t * nv + h], decay[t * nv + h]) = gate(b, a, h);
                    }
                }
            }
        }
        DeltaNetProjections::Split { qkv, z: z_w, b: b_w, a: a_w } => {
            linear(qkv, x, n, &mut mixed, precision);
            linear(z_w, x, n, &mut z, precision);
            let (mut b, mut a) = (vec![0f32; n * nv], vec![0f32; n * nv]);
            linear(b_w, x, n, &mut b, precision);
            linear(a_w, x, n, &mut a, precision);
            for i in 0..n * nv {
                (beta[i], decay[i]) = gate(b[i], a[i], i % nv);
            }
        }
    }
    // 2. Causal depthwise convolution with the ring of the previous `kk - 1` inputs, then SiLU.
    let (heads_state, ring) = state.split_at_mut(nv * dk * dv);
    let conv = short_conv(w.conv, kk, channels, &mixed, n, ring);
    // 3. The gated delta rule, per value head, rows in order; then the gated RMSNorm.
    let mut o = vec![0f32; n * nv * dv];
    let mut per_head: Vec<Vec<f32>> = vec![Vec::new(); nv];
    heads_state.par_chunks_mut(dk * dv).zip(per_head.par_iter_mut()).enumerate().for_each(|(h, (st, oh))| {
        let kh = h / r;
        let (mut q, mut k) = (vec![0f32; dk], vec![0f32; dk]);
        let mut delta = vec![0f32; dv];
        oh.resize(n * dv, 0.0);
        let qscale = 1.0 / (dk as f32).sqrt();
        for t in 0..n {
            let row = &conv[t * channels..(t + 1) * channels];
            q.copy_from_slice(&row[kh * dk..(kh + 1) * dk]);
            k.copy_from_slice(&row[key_dim + kh * dk..key_dim + (kh + 1) * dk]);
            let v = &row[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv];
            l2norm(&mut q);
            l2norm(&mut k);
            q.iter_mut().for_each(|x| *x *= qscale);
            let (gd, bt) = (decay[t * nv + h], beta[t * nv + h]);
            st.iter_mut().for_each(|x| *x *= gd);
            // delta = beta (v - S^T k)
            delta.copy_from_slice(v);
            for (d, &kd) in k.iter().enumerate() {
                delta.iter_mut().zip(&st[d * dv..(d + 1) * dv]).for_each(|(a, &sv)| *a -= kd * sv);
            }
            delta.iter_mut().for_each(|a| *a *= bt);
            // S += k delta^T; o = S^T q
            let ot = &mut oh[t * dv..(t + 1) * dv];
            ot.iter_mut().for_each(|a| *a = 0.0);
            for (d, (&kd, &qd)) in k.iter().zip(&q).enumerate() {
                let sr = &mut st[d * dv..(d + 1) * dv];
                sr.iter_mut().zip(&delta).for_each(|(sv, &de)| *sv += kd * de);
                ot.iter_mut().zip(sr.iter()).for_each(|(a, &sv)| *a += qd * sv);
            }
        }
    });
    for (h, oh) in per_head.iter().enumerate() {
        for t in 0..n {
            let src = &oh[t * dv..(t + 1) * dv];
            let zt = &z[t * nv * dv + h * dv..][..dv];
            let ms = src.iter().map(|v| v * v).sum::<f32>() / dv as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            let dst = &mut o[t * nv * dv + h * dv..][..dv];
            for e in 0..dv {
                dst[e] = src[e] * inv * w.norm[e] * silu(zt[e]);
            }
        }
    }
    // 4. Output projection.
    linear(&w.out, &o, n, out, precision);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rows: usize, cols: usize, data: &[u8]) -> Matrix<'_> {
        Matrix::new(WeightFormat::F32, rows, cols, data).unwrap()
    }
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

    /// A block of rows gives what the same rows give one at a time (the state carries exactly
    /// what the block's rows pass along), in any chunking.
    #[test]
    fn chunked_blocks_equal_one_block() {
        let spec = LinearAttentionSpec {
            kind: LinearAttentionKind::GatedDeltaNet,
            key_heads: 2,
            value_heads: 4,
            key_head_dim: 6,
            value_head_dim: 5,
            conv_kernel: 4,
            weights: vec![],
            norm_eps: 1e-6,
        };
        let hidden = 16;
        let (nk, nv, dk, dv) = (2, 4, 6, 5);
        let channels = 2 * nk * dk + nv * dv;
        let qkvz = bytes(&rnd((2 * nk * dk + 2 * nv * dv) * hidden, 1));
        let ba = bytes(&rnd(2 * nv * hidden, 2));
        let out = bytes(&rnd(hidden * nv * dv, 3));
        let conv = rnd(channels * 4, 4);
        let (dt, al, nw) = (rnd(nv, 5), rnd(nv, 6), rnd(dv, 7));
        let w = DeltaNetWeights {
            proj: DeltaNetProjections::Grouped {
                qkvz: Matrix::new(WeightFormat::F32, 2 * nk * dk + 2 * nv * dv, hidden, &qkvz).unwrap(),
                ba: Matrix::new(WeightFormat::F32, 2 * nv, hidden, &ba).unwrap(),
            },
            conv: &conv,
            dt_bias: &dt,
            a_log: &al,
            norm: &nw,
            out: Matrix::new(WeightFormat::F32, hidden, nv * dv, &out).unwrap(),
        };
        let n = 9;
        let x = rnd(n * hidden, 8);
        let run = |chunk: usize| {
            let mut state = vec![0f32; spec.state_floats()];
            let mut all = Vec::new();
            for start in (0..n).step_by(chunk) {
                let m = chunk.min(n - start);
                let mut o = vec![0f32; m * hidden];
                let call = DeltaNetCall { spec: &spec, weights: &w, eps: 1e-6, precision: Precision::Exact };
                gated_deltanet(&call, &x[start * hidden..(start + m) * hidden], m, &mut state, &mut o);
                all.extend(o);
            }
            (all, state)
        };
        let (want, want_state) = run(n);
        for chunk in [1, 2, 4] {
            let (got, st) = run(chunk);
            let err = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            let serr = st.iter().zip(&want_state).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(err < 1e-5 && serr < 1e-5, "chunk {chunk}: out {err}, state {serr}");
        }
    }

    /// Qwen3.5's four projections apart give what Qwen3-Next's grouped pair gives when they
    /// hold the same rows: the split rows are the grouped rows regathered (q, k, v, z of every
    /// key head in turn; b then a of each group).
    #[test]
    fn split_projections_equal_grouped_ones() {
        let (nk, nv, dk, dv, hidden) = (2, 6, 4, 3, 10);
        let r = nv / nk;
        let spec = LinearAttentionSpec {
            kind: LinearAttentionKind::GatedDeltaNet,
            key_heads: nk,
            value_heads: nv,
            key_head_dim: dk,
            value_head_dim: dv,
            conv_kernel: 3,
            weights: vec![],
            norm_eps: 1e-6,
        };
        let channels = 2 * nk * dk + nv * dv;
        let qkvz = rnd((2 * nk * dk + 2 * nv * dv) * hidden, 11);
        let ba = rnd(2 * nv * hidden, 12);
        let row = |m: &[f32], i: usize| m[i * hidden..(i + 1) * hidden].to_vec();
        let group = 2 * dk + 2 * r * dv;
        let (mut q, mut k, mut v, mut z, mut b, mut a) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        for g in 0..nk {
            let base = g * group;
            (0..dk).for_each(|i| q.extend(row(&qkvz, base + i)));
            (0..dk).for_each(|i| k.extend(row(&qkvz, base + dk + i)));
            (0..r * dv).for_each(|i| v.extend(row(&qkvz, base + 2 * dk + i)));
            (0..r * dv).for_each(|i| z.extend(row(&qkvz, base + 2 * dk + r * dv + i)));
            (0..r).for_each(|j| b.extend(row(&ba, g * 2 * r + j)));
            (0..r).for_each(|j| a.extend(row(&ba, g * 2 * r + r + j)));
        }
        let qkv: Vec<f32> = q.into_iter().chain(k).chain(v).collect();
        let (out, conv) = (bytes(&rnd(hidden * nv * dv, 13)), rnd(channels * 3, 14));
        let (dt, al, nw) = (rnd(nv, 15), rnd(nv, 16), rnd(dv, 17));
        let (qkvz, ba, qkv, z, b, a) = (bytes(&qkvz), bytes(&ba), bytes(&qkv), bytes(&z), bytes(&b), bytes(&a));
        let weights = |proj| DeltaNetWeights {
            proj,
            conv: &conv,
            dt_bias: &dt,
            a_log: &al,
            norm: &nw,
            out: m(hidden, nv * dv, &out),
        };
        let grouped = weights(DeltaNetProjections::Grouped {
            qkvz: m(2 * nk * dk + 2 * nv * dv, hidden, &qkvz),
            ba: m(2 * nv, hidden, &ba),
        });
        let split = weights(DeltaNetProjections::Split {
            qkv: m(channels, hidden, &qkv),
            z: m(nv * dv, hidden, &z),
            b: m(nv, hidden, &b),
            a: m(nv, hidden, &a),
        });
        let n = 7;
        let x = rnd(n * hidden, 18);
        let run = |w: &DeltaNetWeights| {
            let mut state = vec![0f32; spec.state_floats()];
            let mut o = vec![0f32; n * hidden];
            let call = DeltaNetCall { spec: &spec, weights: w, eps: 1e-6, precision: Precision::Exact };
            gated_deltanet(&call, &x, n, &mut state, &mut o);
            (o, state)
        };
        let ((go, gs), (so, ss)) = (run(&grouped), run(&split));
        let err = go.iter().zip(&so).chain(gs.iter().zip(&ss)).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err < 1e-6, "split vs grouped: {err}");
        assert!(go.iter().any(|v| v.abs() > 1e-3), "the output is not all zero");
    }
}
