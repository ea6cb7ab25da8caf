//! A KV split on the device: the mirror of a split layer is a ring (position `p` in row
//! `p % ring`), `rope_kv_ring` appends a block's rows to it (`rope_kv` with the ring), and
//! `attn_part` attends each query row over its device share only, writing the unnormalized
//! part `(acc, m, l)` the host merges with its own (`attn_part.comp`). Reference:
//! `cpu::attn_part::attend_part` over `device_from(p)..=p` (the compiler's
//! `place::kv_split::device_from`, which the shader computes the same way).
//!
//! Must not: normalize, add the sinks (the host's part holds them), or read positions outside a
//! row's share (the ring holds nothing else for sure).

use super::attention::{KvType, Pos};
use super::u32_arg;
use crate::cpu::attention::AttnShape;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::AttnPartPush;
use crate::vk::shaders::Kernel;

/// A split's numbers on the device: a row's share holds at most `positions` (whole blocks of
/// `block`), the mirror is a ring of `ring` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitShape {
    pub positions: usize,
    pub block: usize,
    pub ring: usize,
}

/// What `attn_part` reads and writes: `n` query rows `q` (rotated) at `pos`, the ring
/// mirrors `k`, `v` (from element 0), and the part's outputs `acc` (`n x heads *
/// v_head_dim`) and `ml` (`n x heads x 2`).
#[derive(Clone, Copy, Debug)]
pub struct PartArgs<'a> {
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    pub acc: View<'a>,
    pub ml: View<'a>,
    pub n: usize,
    pub pos: Pos<'a>,
    /// The rings' element type.
    pub kv: KvType,
}

const MAX_D: usize = 256;

impl<'a> Frame<'a> {
    /// The device part of `n` query rows at positions `pos..pos + n` (`q`: `n x heads *
    /// head_dim`, rotated) over their shares in the ring mirrors `k`, `v` (`split.ring` rows,
    /// from element 0; the rows of every share present): `acc` gets `n x heads * v_head_dim`
    /// unnormalized sums, `ml` `n x heads x 2` (`m`, `l`). The window of `s` bounds a share;
    /// its sinks are not this part's, nor is a value scale (the host's merge applies it). The
    /// geometry is the CPU reference's own `AttnShape`.
    pub fn attn_part(&mut self, s: AttnShape, split: SplitShape, a: PartArgs<'a>) -> Result<()> {
        const OP: &str = "attn_part";
        let PartArgs { q, k: mk, v: mv, acc, ml, n, pos, kv } = a;
        let (pos0, dyn_, params) = pos.parts(OP)?;
        if s.kv_heads == 0
            || !s.heads.is_multiple_of(s.kv_heads)
            || s.head_dim == 0
            || s.head_dim > MAX_D
            || s.v_head_dim > MAX_D
        {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "{} heads over {} kv heads, head_dim {} / {} (at most {MAX_D})",
                    s.heads, s.kv_heads, s.head_dim, s.v_head_dim
                ),
            });
        }
        if split.block == 0
            || split.positions < split.block
            || !split.positions.is_multiple_of(split.block)
            || split.ring == 0
            || s.window == Some(0)
        {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "a share of {} positions in blocks of {}, a ring of {}, window {:?}",
                    split.positions, split.block, split.ring, s.window
                ),
            });
        }
        // A step's shares span at most positions + n - 1 positions: the ring must hold them.
        if dyn_ == 0 && split.ring < (pos0 as usize + n).min(split.positions + n - 1) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("a ring of {} holds less than a step of {n} rows' shares", split.ring),
            });
        }
        q.check(OP, "q", n * s.heads * s.head_dim)?;
        kv.check_widths(OP, &[s.kv_heads * s.head_dim, s.kv_heads * s.v_head_dim])?;
        mk.check(OP, "k ring", kv.words(split.ring * s.kv_heads * s.head_dim))?;
        mv.check(OP, "v ring", kv.words(split.ring * s.kv_heads * s.v_head_dim))?;
        acc.check(OP, "acc", n * s.heads * s.v_head_dim)?;
        ml.check(OP, "m and l", n * s.heads * 2)?;
        if mk.offset != 0 || mv.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "ring views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = AttnPartPush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.head_dim as u32,
            v_head_dim: s.v_head_dim as u32,
            pos0,
            window: u32_arg(OP, "window", s.window.unwrap_or(0))?,
            r#dyn: dyn_,
            scale: s.scale,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            ring: u32_arg(OP, "ring", split.ring)?,
            positions: u32_arg(OP, "positions", split.positions)?,
            block: u32_arg(OP, "block", split.block)?,
            acc_off: u32_arg(OP, "acc offset", acc.offset)?,
            ml_off: u32_arg(OP, "ml offset", ml.offset)?,
            pad0: 0,
        };
        let binds =
            [Bind::buf(q.buf), Bind::buf(mk.buf), Bind::buf(mv.buf), Bind::buf(acc.buf), Bind::buf(ml.buf), params];
        self.dispatch(kv.kernel(Kernel::AttnPart), None, &binds, &push, [s.heads as u32, u32_arg(OP, "n", n)?, 1])
    }
}
