//! DeepSeek Sparse Attention's lightning indexer on the device, as the CPU makes it
//! (`cpu::indexer`, the reference): the index keys' LayerNorm (`layer_norm.comp`), and from a
//! block's rotated index queries, the layer's index-key mirror and the head weights, each row's
//! `topk` best positions at or before it, ascending, `-1` after them where a row sees fewer
//! (`dsa_score.comp` spreads the scores of every (row, position) over the device,
//! `dsa_select.comp` picks a row's best in one workgroup). The scores are the CPU's up to the
//! order of float operations, so a selection agrees wherever the k-th and (k+1)-th scores are
//! apart by more than that. DeepSeek V4's compressor's indexer selects with the same kernels over
//! its entries (`dsa_select_rate`: a row at `p` sees `e < (p + 1) / rate`). The indexer's projections are ordinary products and its RoPE and
//! key append `rope_kv` (`exec::device::indexer` records them).
//!
//! Must not: keep state of its own, or decide what the key mirror holds (the caller uploads
//! what it lacks).

use super::attention::Pos;
use super::u32_arg;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::{DsaScorePush, DsaSelectPush, LayerNormPush};
use crate::vk::shaders::Kernel;
use crate::vk::View;

/// The widest index head `dsa_score.comp` stages (its key tile's `MAXD`).
pub const DSA_MAX_DIM: usize = 128;

/// The geometry of one indexer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsaShape {
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
}

impl DsaShape {
    pub fn of(spec: &coli_compiler::ir::IndexerSpec) -> DsaShape {
        DsaShape { heads: spec.heads, head_dim: spec.head_dim, topk: spec.topk }
    }

    /// Floats of scores the selection of `n` rows needs, `stride` apart (at least the
    /// positions the last row sees).
    pub fn scores_len(n: usize, stride: usize) -> usize {
        n * stride
    }
}

/// What `dsa_select` reads and writes for `n` rows: the rotated queries `q` (`n x heads x
/// head_dim`), the key mirror `keys` (from element 0, every position the rows see), the head
/// weights `w` (`n x heads`, times `w_scale` in the kernel), the `scores` (from element 0,
/// `DsaShape::scores_len(n, stride)` floats: `stride` at least the last row's positions, the
/// context for a position read on the device) and the selection `out` (`n x topk`).
#[derive(Clone, Copy)]
pub struct DsaSelectArgs<'a> {
    pub q: View<'a>,
    pub keys: View<'a>,
    pub w: View<'a>,
    pub w_scale: f32,
    pub scores: View<'a>,
    pub stride: usize,
    pub out: View<'a>,
    pub n: usize,
}

impl<'a> Frame<'a> {
    /// Each row's selection (`dsa_score.comp`, then `dsa_select.comp`) at `pos`.
    pub fn dsa_select(&mut self, s: DsaShape, a: DsaSelectArgs<'a>, pos: Pos<'a>) -> Result<()> {
        self.dsa_select_rate(s, a, pos, 1)
    }

    /// `dsa_select` over a KV compressor's entries (DeepSeek V4's lightning indexer): a row at
    /// `p` sees the keys `e < (p + 1) / rate` (reference: `cpu::compress`'s choice).
    pub fn dsa_select_rate(&mut self, s: DsaShape, a: DsaSelectArgs<'a>, pos: Pos<'a>, rate: usize) -> Result<()> {
        const OP: &str = "dsa_select";
        let DsaSelectArgs { q, keys, w, w_scale, scores, stride, out, n } = a;
        let (pos0, dyn_, params) = pos.parts(OP)?;
        if s.heads == 0 || s.head_dim == 0 || s.head_dim > DSA_MAX_DIM || s.topk == 0 || rate == 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{s:?} rate {rate} (head dims of 1 to {DSA_MAX_DIM})"),
            });
        }
        // A fixed position: what its rows see; one read on the device: the caller's stride.
        let seen = if dyn_ != 0 { stride } else { (pos0 as usize + n) / rate };
        if stride < seen {
            return Err(VkError::BadArgument { op: OP, msg: format!("a stride of {stride} under {seen} positions") });
        }
        q.check(OP, "q", n * s.heads * s.head_dim)?;
        keys.check(OP, "keys", if dyn_ != 0 { n * s.head_dim } else { seen * s.head_dim })?;
        w.check(OP, "w", n * s.heads)?;
        scores.check(OP, "scores", DsaShape::scores_len(n, stride))?;
        out.check(OP, "out", n * s.topk)?;
        if keys.offset != 0 || scores.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "key and score views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = DsaScorePush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            dim: s.head_dim as u32,
            pos0,
            stride: u32_arg(OP, "stride", stride)?,
            scale: (s.head_dim as f32).powf(-0.5),
            w_scale,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            w_off: u32_arg(OP, "w offset", w.offset)?,
            r#dyn: dyn_,
            rate: u32_arg(OP, "rate", rate)?,
            pad1: 0,
        };
        let binds = [Bind::buf(q.buf), Bind::buf(keys.buf), Bind::buf(w.buf), Bind::buf(scores.buf), params];
        let groups = [u32_arg(OP, "positions", seen.div_ceil(16).max(1))?, u32_arg(OP, "n", n)?, 1];
        self.dispatch(Kernel::DsaScore, None, &binds, &push, groups)?;
        let push = DsaSelectPush {
            n: push.n,
            pos0,
            topk: u32_arg(OP, "topk", s.topk)?,
            stride: push.stride,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            r#dyn: dyn_,
            rate: push.rate,
            pad1: 0,
        };
        let binds = [Bind::buf(scores.buf), Bind::buf(out.buf), params];
        self.dispatch(Kernel::DsaSelect, None, &binds, &push, [push.n, 1, 1])
    }

    /// `out = (x - mean) / sqrt(var + eps) * weight + bias` over `n` rows of `weight.len`
    /// (`layer_norm.comp`; reference `cpu::norm::layer_norm`); `x` and `out` may be the same.
    pub fn layer_norm(
        &mut self,
        x: View<'a>,
        weight: View<'a>,
        bias: Option<View<'a>>,
        out: View<'a>,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layer_norm";
        let width = weight.len;
        if width == 0 {
            return Err(VkError::BadArgument { op: OP, msg: "a norm of no columns".into() });
        }
        x.check(OP, "x", n * width)?;
        out.check(OP, "out", n * width)?;
        if let Some(b) = bias {
            b.check(OP, "bias", width)?;
        }
        if weight.offset != 0 || bias.is_some_and(|b| b.offset != 0) {
            return Err(VkError::BadArgument { op: OP, msg: "weight and bias views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = LayerNormPush {
            width: u32_arg(OP, "width", width)?,
            eps,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            has_bias: bias.is_some() as u32,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let binds = [
            Bind::buf(x.buf),
            Bind::buf(weight.buf),
            bias.map_or(Bind::UNUSED, |b| Bind::buf(b.buf)),
            Bind::buf(out.buf),
        ];
        self.dispatch(Kernel::LayerNorm, None, &binds, &push, [u32_arg(OP, "n", n)?, 1, 1])
    }
}
