//! Causal grouped-query attention of a block of query rows over a layer's cached keys and
//! values, with a sliding window and per-head sinks. Reference: `cpu::attention::attend`.
//! Decode (one row) splits the positions across workgroups and joins the partial softmaxes
//! (`attn_split.comp`, `attn_join.comp`); prompt chunks run the flash-style blocked kernel
//! (`attn_block.comp`).
//!
//! Must not: write the KV cache (the executor appends rows before calling).

use super::u32_arg;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame, Push};
use crate::vk::shaders::Kernel;

/// Geometry and options of one attention call (as `cpu::attention::AttnShape`).
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// Which kernel attention takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnPath {
    /// Split positions for one row, blocked for more.
    #[default]
    Auto,
    Split,
    Block,
}

const MAX_D: usize = 256;
const MAX_SPLITS: usize = 32;
const MIN_CHUNK: usize = 64;
const BQ: usize = 16;

impl<'a> Frame<'a> {
    /// `out[n x heads * v_head_dim]`: rows of `q` at positions `pos0..pos0 + n` over keys and
    /// values `0..pos0 + n` of `k`, `v` (`len x kv_heads * head_dim`, `len x kv_heads *
    /// v_head_dim`); `sinks`: one logit per head.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(&mut self, s: AttnShape, q: View<'a>, k: View<'a>, v: View<'a>, sinks: Option<View<'a>>, out: View<'a>, n: usize, pos0: usize, path: AttnPath) -> Result<()> {
        const OP: &str = "attention";
        if s.kv_heads == 0 || s.heads % s.kv_heads != 0 || s.head_dim > MAX_D || s.v_head_dim > MAX_D || s.head_dim == 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{} heads over {} kv heads, head_dim {} / {} (at most {MAX_D})", s.heads, s.kv_heads, s.head_dim, s.v_head_dim),
            });
        }
        if s.window == Some(0) {
            return Err(VkError::BadArgument { op: OP, msg: "a window of 0 positions".into() });
        }
        let len = pos0 + n;
        q.check(OP, "q", n * s.heads * s.head_dim)?;
        k.check(OP, "keys", len * s.kv_heads * s.head_dim)?;
        v.check(OP, "values", len * s.kv_heads * s.v_head_dim)?;
        out.check(OP, "out", n * s.heads * s.v_head_dim)?;
        if let Some(sk) = sinks {
            sk.check(OP, "sinks", s.heads)?;
            if sk.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "sink views must start at element 0".into() });
            }
        }
        if n == 0 {
            return Ok(());
        }
        let span = s.window.map_or(len, |w| w.min(len));
        let splits = span.div_ceil(MIN_CHUNK).clamp(1, MAX_SPLITS);
        let chunk = span.div_ceil(splits);
        let mut push: Push = [
            n as u32,
            s.heads as u32,
            s.kv_heads as u32,
            s.head_dim as u32,
            s.v_head_dim as u32,
            u32_arg(OP, "pos0", pos0)?,
            u32_arg(OP, "window", s.window.unwrap_or(0))?,
            sinks.is_some() as u32,
            s.scale.to_bits(),
            u32_arg(OP, "q offset", q.offset)?,
            u32_arg(OP, "k offset", k.offset)?,
            u32_arg(OP, "v offset", v.offset)?,
            u32_arg(OP, "out offset", out.offset)?,
            splits as u32,
            chunk as u32,
            0,
        ];
        let sink = sinks.map_or(Bind::UNUSED, |b| Bind::buf(b.buf));
        let base = [Bind::buf(q.buf), Bind::buf(k.buf), Bind::buf(v.buf), sink];
        let heads = s.heads as u32;
        let split = match path {
            AttnPath::Auto => n == 1,
            AttnPath::Split => true,
            AttnPath::Block => false,
        };
        if split {
            let slots = n * s.heads * splits;
            let (ml, o) = (self.scratch(slots * 2)?, self.scratch(slots * s.v_head_dim)?);
            let (ml, o) = (self.scratch_bind(ml), self.scratch_bind(o));
            let binds = [base[0], base[1], base[2], base[3], ml, o];
            let rows = u32_arg(OP, "n", n)?;
            self.dispatch(Kernel::AttnSplit, None, &binds, &push, [heads, rows, splits as u32])?;
            let binds = [base[0], base[1], base[2], base[3], ml, o, Bind::buf(out.buf)];
            self.dispatch(Kernel::AttnJoin, None, &binds, &push, [heads, rows, 1])
        } else {
            push[13] = 1;
            let binds = [base[0], base[1], base[2], base[3], Bind::UNUSED, Bind::UNUSED, Bind::buf(out.buf)];
            self.dispatch(Kernel::AttnBlock, None, &binds, &push, [heads, u32_arg(OP, "blocks", n.div_ceil(BQ))?, 1])
        }
    }
}
