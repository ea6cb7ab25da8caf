//! Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) on the CPU, for a block of rows at
//! positions `pos0..pos0+n`: the query through `q_a`, its RMSNorm and `q_b` (or one `q`
//! projection); `kv_a` split into the latent (RMSNormed) and the shared rope key; RoPE on the
//! rope part of every query head and on the shared key (adjacent pairs or halves, YaRN from
//! the configuration); causal attention over every cached position; `o`.
//!
//! The layer's cache (`LayerKv`) holds, per position, the normalized latent in its `k` rows
//! (`kv_lora_rank` wide) and the rotated shared rope key in its `v` rows (`qk_rope_head_dim`).
//! Two forms, equal up to the order of float operations:
//! - expanded: every cached latent through `kv_b` into per-head keys and values, then plain
//!   attention (cheaper for prompt blocks, whose rows share the expansion);
//! - absorbed: each query's nope part through `kv_b`'s key rows into latent space, scores
//!   against the cached latents directly, and the softmax-weighted latent through `kv_b`'s
//!   value rows (cheaper for decode: nothing per cached position but two dot products).
//!
//! With a selection (`MlaSpec::select`, an indexer's output: DeepSeek Sparse Attention) each
//! row attends over its selected positions only, in either form.
//!
//! Must not: keep state of its own (the cache is the executor's), or know checkpoint names;
//! the roles and their shapes were checked by the compiler (`MlaSpec`).

use super::attention::{attend, AttnShape};
use super::linear::{linear, Precision};
use super::norm::rms_norm;
use super::rope;
use crate::format::{dequant_row, Matrix};
use crate::store::kv::LayerKv;
use crate::store::weights::WeightStore;
use coli_compiler::ir::{MlaSpec, RopeStyle};
use rayon::prelude::*;

/// The weights of one MLA op, by role.
pub struct MlaWeights<'a> {
    /// `(q_a, q_a_norm, q_b)` with a query LoRA, else `q`.
    pub q: QueryWeights<'a>,
    pub q_a_bias: Option<&'a [f32]>,
    pub kv_a: Matrix<'a>,
    pub kv_a_bias: Option<&'a [f32]>,
    pub kv_a_norm: &'a [f32],
    pub kv_b: Matrix<'a>,
    pub o: Matrix<'a>,
    pub o_bias: Option<&'a [f32]>,
}

pub enum QueryWeights<'a> {
    Lora { q_a: Matrix<'a>, q_a_norm: &'a [f32], q_b: Matrix<'a> },
    Direct(Matrix<'a>),
}

/// Which way to attend (see the module's note).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaForm {
    Expanded,
    Absorbed,
}

impl MlaForm {
    /// The cheaper form for a block of `n` rows: absorbed for a single row (decode),
    /// expanded for prompt blocks.
    pub fn for_rows(n: usize) -> MlaForm {
        if n == 1 {
            MlaForm::Absorbed
        } else {
            MlaForm::Expanded
        }
    }
}

/// A role the compiler's check guarantees is missing: reported as the CPU op library's error.
#[derive(Debug)]
pub struct MissingRole(pub String);

impl<'a> MlaWeights<'a> {
    /// The op's weights from the store, by role.
    pub fn resolve(spec: &MlaSpec, ws: &'a WeightStore) -> Result<MlaWeights<'a>, MissingRole> {
        let find = |r: &str| spec.weights.iter().find(|(role, _)| role == r).map(|(_, w)| w.name.as_str());
        let mat = |r: &str| find(r).map(|n| ws.matrix(n)).ok_or_else(|| MissingRole(r.to_string()));
        let vec = |r: &str| find(r).map(|n| ws.vector(n)).ok_or_else(|| MissingRole(r.to_string()));
        let q = if spec.q_lora_rank.is_some() {
            QueryWeights::Lora { q_a: mat("q_a")?, q_a_norm: vec("q_a_norm")?, q_b: mat("q_b")? }
        } else {
            QueryWeights::Direct(mat("q")?)
        };
        Ok(MlaWeights {
            q,
            q_a_bias: vec("q_a_bias").ok(),
            kv_a: mat("kv_a")?,
            kv_a_bias: vec("kv_a_bias").ok(),
            kv_a_norm: vec("kv_a_norm")?,
            kv_b: mat("kv_b")?,
            o: mat("o")?,
            o_bias: vec("o_bias").ok(),
        })
    }
}

fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in rows.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}

/// One layer's op as a call runs it: the spec, the weights, the precision of the products and
/// the form of the attention.
#[derive(Clone, Copy)]
pub struct MlaCall<'a> {
    pub spec: &'a MlaSpec,
    pub weights: &'a MlaWeights<'a>,
    pub precision: Precision,
    pub form: MlaForm,
    /// The block's selection (`n` rows of the indexer's output), where the spec has one.
    pub select: Option<&'a [f32]>,
}

/// Runs the op over `x` (`n x hidden`), appending this block's latents and rope keys to `kv`
/// (which must hold exactly the positions before `pos0`; later ones are dropped), and writes
/// `out` (`n x hidden`).
pub fn mla(call: &MlaCall, x: &[f32], n: usize, pos0: usize, kv: &mut LayerKv, out: &mut [f32]) {
    let MlaCall { spec: s, weights: w, precision, form, select } = *call;
    let (h, dn, dr, dv, c) = (s.heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank);
    let dq = dn + dr;
    // 1. Queries: n x h x (nope, rope).
    let mut q = vec![0f32; n * h * dq];
    match &w.q {
        QueryWeights::Lora { q_a, q_a_norm, q_b } => {
            let r = q_a.rows;
            let mut qa = vec![0f32; n * r];
            linear(q_a, x, n, &mut qa, precision);
            add_bias(&mut qa, w.q_a_bias);
            let mut qn = vec![0f32; n * r];
            rms_norm(&qa, &mut qn, q_a_norm, s.norm_eps, 0.0);
            linear(q_b, &qn, n, &mut q, precision);
        }
        QueryWeights::Direct(wq) => linear(wq, x, n, &mut q, precision),
    }
    // 2. Latents (normed) and shared rope keys.
    let kw = c + dr;
    let mut ckv = vec![0f32; n * kw];
    linear(&w.kv_a, x, n, &mut ckv, precision);
    add_bias(&mut ckv, w.kv_a_bias);
    let mut lat = vec![0f32; n * c];
    let mut kr = vec![0f32; n * dr];
    for i in 0..n {
        rms_norm(&ckv[i * kw..i * kw + c], &mut lat[i * c..(i + 1) * c], w.kv_a_norm, s.norm_eps, 0.0);
        kr[i * dr..(i + 1) * dr].copy_from_slice(&ckv[i * kw + c..(i + 1) * kw]);
    }
    // 3. RoPE on the rope parts.
    let (freq, mscale) = rope::inv_freq(dr, s.rope_theta, s.rope_scaling);
    let style = if s.rope_interleave { RopeStyle::Interleaved } else { RopeStyle::RotateHalf };
    for i in 0..n {
        let p = pos0 + i;
        rope::apply_row(&mut kr[i * dr..(i + 1) * dr], dr, style, &freq, mscale, p);
        for head in q[i * h * dq..(i + 1) * h * dq].chunks_exact_mut(dq) {
            rope::apply_row(&mut head[dn..], dr, style, &freq, mscale, p);
        }
    }
    // 4. The cache: exactly the positions before this block, then this block's.
    if kv.len() != pos0 {
        kv.truncate(pos0);
    }
    kv.append(&lat, &kr);
    let len = kv.len();
    // 5. Attention: n x h x dv.
    let mut attn = vec![0f32; n * h * dv];
    let cached = Cached { s, kv_b: &w.kv_b, q: &q, lat: &kv.k, kr: &kv.v, pos0, precision, select };
    match form {
        MlaForm::Expanded => expanded(&cached, len, &mut attn),
        MlaForm::Absorbed => absorbed(&cached, &mut attn),
    }
    // 6. Output projection.
    linear(&w.o, &attn, n, out, precision);
    add_bias(out, w.o_bias);
}

/// What both forms attend with: the spec, `kv_b`, the block's rotated queries (`n x heads x
/// (nope, rope)`), the cached latents and rope keys (the block's included), the block's first
/// position and the precision of the products.
struct Cached<'a> {
    s: &'a MlaSpec,
    kv_b: &'a Matrix<'a>,
    q: &'a [f32],
    lat: &'a [f32],
    kr: &'a [f32],
    pos0: usize,
    precision: Precision,
    select: Option<&'a [f32]>,
}

impl Cached<'_> {
    /// The positions row `i` of the block attends over: its selection, else every position up
    /// to its own.
    fn positions(&self, i: usize) -> Vec<usize> {
        let n = self.q.len() / (self.s.heads * (self.s.qk_nope_head_dim + self.s.qk_rope_head_dim));
        match self.select {
            Some(sel) => {
                let w = sel.len() / n.max(1);
                super::indexer::selected(&sel[i * w..(i + 1) * w]).filter(|&t| t <= self.pos0 + i).collect()
            }
            None => (0..=self.pos0 + i).collect(),
        }
    }
}

/// Keys and values of the first `len` cached positions through `kv_b`, then causal attention.
fn expanded(cached: &Cached, len: usize, attn: &mut [f32]) {
    let Cached { s, kv_b, q, lat, kr, pos0, precision, .. } = *cached;
    let (h, dn, dr, dv, c) = (s.heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank);
    let dq = dn + dr;
    let bw = h * (dn + dv);
    let mut kvx = vec![0f32; len * bw];
    linear(kv_b, &lat[..len * c], len, &mut kvx, precision);
    let mut k = vec![0f32; len * h * dq];
    let mut v = vec![0f32; len * h * dv];
    for j in 0..len {
        for hh in 0..h {
            let src = &kvx[j * bw + hh * (dn + dv)..][..dn + dv];
            let kd = &mut k[(j * h + hh) * dq..][..dq];
            kd[..dn].copy_from_slice(&src[..dn]);
            kd[dn..].copy_from_slice(&kr[j * dr..(j + 1) * dr]);
            v[(j * h + hh) * dv..][..dv].copy_from_slice(&src[dn..]);
        }
    }
    if cached.select.is_none() {
        let shape = AttnShape { heads: h, kv_heads: h, head_dim: dq, v_head_dim: dv, scale: s.scale, window: None };
        attend(shape, q, &k, &v, pos0, None, attn);
        return;
    }
    // Over each row's selected positions.
    attn.par_chunks_mut(dv).enumerate().for_each(|(idx, o)| {
        let (i, hh) = (idx / h, idx % h);
        let qh = &q[(i * h + hh) * dq..][..dq];
        let at = cached.positions(i);
        let key = |j: usize| &k[(j * h + hh) * dq..][..dq];
        let scores: Vec<f32> =
            at.iter().map(|&j| qh.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f32>() * s.scale).collect();
        softmax_weighted(&scores, &at, |j| &v[(j * h + hh) * dv..][..dv], o);
    });
}

/// `out = sum_j softmax(scores)_j * row(at_j)`.
fn softmax_weighted<'r>(scores: &[f32], at: &[usize], row: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0f32;
    out.iter_mut().for_each(|a| *a = 0.0);
    for (&sc, &j) in scores.iter().zip(at) {
        let e = (sc - m).exp();
        l += e;
        out.iter_mut().zip(row(j)).for_each(|(a, b)| *a += e * b);
    }
    out.iter_mut().for_each(|a| *a /= l);
}

/// Queries absorbed into latent space through `kv_b`'s key rows; scores on the latents; the
/// weighted latent through `kv_b`'s value rows.
fn absorbed(cached: &Cached, attn: &mut [f32]) {
    let Cached { s, kv_b, q, lat, kr, precision, .. } = *cached;
    let (h, dn, dr, dv, c) = (s.heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank);
    let dq = dn + dr;
    let n = q.len() / (h * dq);
    // q_lat[i, hh] = sum_d q_nope[i, hh, d] * kv_b[hh * (dn + dv) + d, :]
    let mut q_lat = vec![0f32; n * h * c];
    q_lat.par_chunks_mut(c).enumerate().for_each(|(idx, ql)| {
        let (i, hh) = (idx / h, idx % h);
        let qn = &q[(i * h + hh) * dq..][..dn];
        let mut row = vec![0f32; c];
        for (d, &qd) in qn.iter().enumerate() {
            dequant_row(kv_b.format, kv_b.row(hh * (dn + dv) + d), &mut row);
            ql.iter_mut().zip(&row).for_each(|(a, b)| *a += qd * b);
        }
    });
    // Scores and the softmax-weighted latent, per (row, head).
    let mut o_lat = vec![0f32; n * h * c];
    o_lat.par_chunks_mut(c).enumerate().for_each(|(idx, ol)| {
        let (i, hh) = (idx / h, idx % h);
        let ql = &q_lat[idx * c..(idx + 1) * c];
        let qr = &q[(i * h + hh) * dq + dn..][..dr];
        let at = cached.positions(i);
        let scores: Vec<f32> = at
            .iter()
            .map(|&j| {
                let a: f32 = ql.iter().zip(&lat[j * c..(j + 1) * c]).map(|(x, y)| x * y).sum();
                let b: f32 = qr.iter().zip(&kr[j * dr..(j + 1) * dr]).map(|(x, y)| x * y).sum();
                (a + b) * s.scale
            })
            .collect();
        softmax_weighted(&scores, &at, |j| &lat[j * c..(j + 1) * c], ol);
    });
    // attn[i, hh] = kv_b[value rows of hh] . o_lat[i, hh]
    let mut per_head = vec![0f32; n * c];
    let mut out_h = vec![0f32; n * dv];
    for hh in 0..h {
        for i in 0..n {
            per_head[i * c..(i + 1) * c].copy_from_slice(&o_lat[(i * h + hh) * c..][..c]);
        }
        let wv = kv_b.rows_range(hh * (dn + dv) + dn, (hh + 1) * (dn + dv));
        linear(&wv, &per_head, n, &mut out_h, precision);
        for i in 0..n {
            attn[(i * h + hh) * dv..][..dv].copy_from_slice(&out_h[i * dv..(i + 1) * dv]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::WeightFormat;
    use coli_compiler::ir::RopeScaling;

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

    /// Both forms, in blocks of every size, agree with the expanded form over the whole block.
    #[test]
    fn absorbed_and_expanded_forms_agree() {
        let (hidden, h, dn, dr, dv, c, r) = (24, 3, 8, 4, 6, 10, 12);
        let spec = MlaSpec {
            heads: h,
            q_lora_rank: Some(r),
            kv_lora_rank: c,
            qk_nope_head_dim: dn,
            qk_rope_head_dim: dr,
            v_head_dim: dv,
            scale: 0.3,
            weights: vec![],
            rope_theta: 10000.0,
            rope_scaling: RopeScaling::None,
            norm_eps: 1e-6,
            rope_interleave: true,
            select: None,
        };
        let mats: Vec<(usize, usize, Vec<u8>)> =
            [(r, hidden), (h * (dn + dr), r), (c + dr, hidden), (h * (dn + dv), c), (hidden, h * dv)]
                .iter()
                .enumerate()
                .map(|(i, &(rows, cols))| (rows, cols, bytes(&rnd(rows * cols, 7 + i as u32))))
                .collect();
        let m = |i: usize| Matrix::new(WeightFormat::F32, mats[i].0, mats[i].1, &mats[i].2).unwrap();
        let qn = vec![1.0f32; r];
        let kn = vec![1.1f32; c];
        let w = MlaWeights {
            q: QueryWeights::Lora { q_a: m(0), q_a_norm: &qn, q_b: m(1) },
            q_a_bias: None,
            kv_a: m(2),
            kv_a_bias: None,
            kv_a_norm: &kn,
            kv_b: m(3),
            o: m(4),
            o_bias: None,
        };
        let n = 7;
        let x = rnd(n * hidden, 99);
        let mut kv = LayerKv { k_width: c, v_width: dr, ..Default::default() };
        let mut want = vec![0f32; n * hidden];
        let call = |form| MlaCall { spec: &spec, weights: &w, precision: Precision::Exact, form, select: None };
        mla(&call(MlaForm::Expanded), &x, n, 0, &mut kv, &mut want);
        for (form, chunk) in
            [(MlaForm::Absorbed, 1), (MlaForm::Absorbed, 3), (MlaForm::Expanded, 1), (MlaForm::Expanded, 2)]
        {
            let mut kv = LayerKv { k_width: c, v_width: dr, ..Default::default() };
            let mut got = Vec::new();
            for start in (0..n).step_by(chunk) {
                let m = chunk.min(n - start);
                let mut o = vec![0f32; m * hidden];
                mla(&call(form), &x[start * hidden..(start + m) * hidden], m, start, &mut kv, &mut o);
                got.extend(o);
            }
            let err = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(err < 1e-5, "{form:?} in chunks of {chunk}: {err}");
        }
    }
}
