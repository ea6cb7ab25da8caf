//! The routed experts' gated unit after the cooperative gate/up GEMM (`moe_glu_q8.comp`): the
//! raw gate and up sums of each (row, rank) pair, side by side, in; the gated unit `h` (with
//! the biases of the pair's expert from the routing) and h's 8-bit blocks for the down product
//! out. Reference: `cpu::elementwise::glu` of the biased sums for `h`, and
//! `format::QuantizedActs::new(h)` for the blocks, bit for bit (quantize_q8.comp's arithmetic).
//!
//! Must not: take an ffn that is not whole blocks of 32 (the caller takes the tiled gate/up).

use super::{groups_for, u32_arg};
use crate::vk::context::{DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::MoeGluQ8Push;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::GluKind;

/// Blocks of 32 one workgroup takes (its workgroup is 32 times as many invocations).
const GLU_BLOCKS: usize = 8;
const NONE: u32 = u32::MAX;

/// The operands of `Frame::moe_glu_q8`; every buffer from its element 0 but the routing.
#[derive(Clone, Copy)]
pub struct MoeGluQ8<'a> {
    /// `pairs x 2 ffn`: pair p's raw gate sums, then its up sums (p = row * top_k + rank).
    pub gu: &'a DeviceBuffer,
    /// Route's output: per row `top_k` (expert as f32, weight) by rank.
    pub routing: View<'a>,
    /// The experts' f32 biases: expert e's gate then up biases at `e * 2 ffn`.
    pub bias: Option<&'a DeviceBuffer>,
    /// `pairs x ffn`, the gated unit.
    pub h: &'a DeviceBuffer,
    /// h's blocks: 32 codes (8 words) a block, and (d, d * sum of codes) a block.
    pub hq: &'a DeviceBuffer,
    pub hd: &'a DeviceBuffer,
    pub pairs: usize,
    pub ffn: usize,
    pub top_k: usize,
    pub experts: usize,
    pub glu: GluKind,
}

impl<'a> Frame<'a> {
    /// Records `moe_glu_q8.comp` over `a.pairs` pairs (see the module).
    pub fn moe_glu_q8(&mut self, a: MoeGluQ8<'a>) -> Result<()> {
        const OP: &str = "moe_glu_q8";
        let (pairs, ffn, k) = (a.pairs, a.ffn, a.top_k);
        if ffn == 0 || !ffn.is_multiple_of(32) || k == 0 || !pairs.is_multiple_of(k) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{pairs} pairs of top {k}, ffn {ffn} (whole blocks of 32, whole rows)"),
            });
        }
        let blocks = pairs * ffn / 32;
        a.gu.all().check(OP, "gu (pairs x 2 ffn)", pairs * 2 * ffn)?;
        a.h.all().check(OP, "h (pairs x ffn)", pairs * ffn)?;
        a.hq.all().check(OP, "hq (8 words a block)", blocks * 8)?;
        a.hd.all().check(OP, "hd (2 floats a block)", blocks * 2)?;
        a.routing.check(OP, "routing (rows x 2 top_k)", pairs * 2)?;
        if let Some(b) = a.bias {
            b.all().check(OP, "bias (experts x 2 ffn)", a.experts * 2 * ffn)?;
        }
        if pairs == 0 {
            return Ok(());
        }
        let (glu, limit, alpha) = glu_args(a.glu)?;
        let push = MoeGluQ8Push {
            blocks: u32_arg(OP, "blocks", blocks)?,
            ffn: u32_arg(OP, "ffn", ffn)?,
            top_k: u32_arg(OP, "top_k", k)?,
            experts: u32_arg(OP, "experts", a.experts)?,
            r_off: u32_arg(OP, "routing offset", a.routing.offset)?,
            glu,
            limit,
            alpha,
            bias_off: if a.bias.is_some() { 0 } else { NONE },
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let binds = [
            Bind::buf(a.gu),
            Bind::buf(a.h),
            Bind::buf(a.hq),
            Bind::buf(a.hd),
            Bind::buf(a.routing.buf),
            a.bias.map_or(Bind::UNUSED, Bind::buf),
        ];
        self.dispatch(Kernel::MoeGluQ8, None, &binds, &push, [groups_for(blocks, GLU_BLOCKS), 1, 1])
    }
}

/// The gated unit's kind and parameters as the shaders take them (`moe.glsl`'s `moe_glu`).
pub(super) fn glu_args(kind: GluKind) -> Result<(u32, f32, f32)> {
    Ok(match kind {
        GluKind::SwiGlu => (0, 0.0, 0.0),
        GluKind::GeGlu => (1, 0.0, 0.0),
        GluKind::ClampedSwiGlu { limit, alpha } => (2, limit, alpha),
        GluKind::LimitedSwiGlu { limit } => (3, limit, 0.0),
    })
}
