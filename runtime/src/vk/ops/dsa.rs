//! DeepSeek Sparse Attention's selection on the device (`dsa_select.comp`), as the CPU makes it
//! (`cpu::indexer::select_rows`, the reference): from a block's rotated index queries, the
//! layer's index-key mirror and the head weights, each row's `topk` best positions at or
//! before it, ascending, `-1` after them where a row sees fewer. The scores are the CPU's up to
//! the order of float operations, so a selection agrees wherever the k-th and (k+1)-th scores
//! are apart by more than that.
//!
//! The executor does not record it yet: the indexer's projections, its key LayerNorm and its
//! key cache run on the host (`indexer` is a kind the Vulkan library does not claim), and the
//! selection goes up to the device's MLA (`mla_attn_sparse.comp`).
//!
//! Must not: keep state of its own, or decide what the key mirror holds (the caller uploads
//! what it lacks).

use super::u32_arg;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::DsaSelectPush;
use crate::vk::shaders::Kernel;
use crate::vk::View;

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

    /// Floats of scratch the selection of `n` rows at positions `pos0..` needs.
    pub fn scratch_len(n: usize, pos0: usize) -> usize {
        2 * n * (pos0 + n)
    }
}

/// What `dsa_select` reads and writes for `n` rows: the rotated queries `q` (`n x heads x
/// head_dim`), the key mirror `keys` (from element 0, positions `0..pos0 + n`), the head
/// weights `w` (`n x heads`), a `scratch` of `DsaShape::scratch_len` floats and the selection
/// `out` (`n x topk`).
#[derive(Clone, Copy)]
pub struct DsaSelectArgs<'a> {
    pub q: View<'a>,
    pub keys: View<'a>,
    pub w: View<'a>,
    pub scratch: View<'a>,
    pub out: View<'a>,
    pub n: usize,
}

impl<'a> Frame<'a> {
    /// Each row's selection (`dsa_select.comp`).
    pub fn dsa_select(&mut self, s: DsaShape, a: DsaSelectArgs<'a>, pos0: usize) -> Result<()> {
        const OP: &str = "dsa_select";
        let DsaSelectArgs { q, keys, w, scratch, out, n } = a;
        if s.heads == 0 || s.head_dim == 0 || s.topk == 0 {
            return Err(VkError::BadArgument { op: OP, msg: format!("{s:?}") });
        }
        q.check(OP, "q", n * s.heads * s.head_dim)?;
        keys.check(OP, "keys", (pos0 + n) * s.head_dim)?;
        w.check(OP, "w", n * s.heads)?;
        scratch.check(OP, "scratch", DsaShape::scratch_len(n, pos0))?;
        out.check(OP, "out", n * s.topk)?;
        if keys.offset != 0 || scratch.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "key and scratch views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = DsaSelectPush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            dim: s.head_dim as u32,
            pos0: u32_arg(OP, "pos0", pos0)?,
            topk: u32_arg(OP, "topk", s.topk)?,
            stride: u32_arg(OP, "positions", pos0 + n)?,
            scale: (s.head_dim as f32).powf(-0.5),
            q_off: u32_arg(OP, "q offset", q.offset)?,
            w_off: u32_arg(OP, "w offset", w.offset)?,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            pad0: 0,
            pad1: 0,
        };
        let binds =
            [Bind::buf(q.buf), Bind::buf(keys.buf), Bind::buf(w.buf), Bind::buf(scratch.buf), Bind::buf(out.buf)];
        self.dispatch(Kernel::DsaSelect, None, &binds, &push, [u32_arg(OP, "n", n)?, 1, 1])
    }
}
