//! RMSNorm (whole row or per group) and RoPE. References: `cpu::norm::rms_norm` and
//! `cpu::rope::apply_row` (the inverse-frequency table comes from `cpu::rope::inv_freq`, so the
//! scaling rules live in one place).
//!
//! Must not: compute frequencies on the device.

use super::attention::Pos;
use super::{groups_for, u32_arg};
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::{RmsNormPush, RopePush};
use crate::vk::shaders::Kernel;
use coli_compiler::ir::RopeStyle;

/// One norm of `Frame::rms_norm` or `Frame::rms_norm_pair`: rows of `width` from `x` into
/// `out`, groups of `weight.len` columns.
#[derive(Clone, Copy, Debug)]
pub struct NormArgs<'a> {
    pub x: View<'a>,
    pub weight: View<'a>,
    pub out: View<'a>,
    pub width: usize,
}

/// Geometry of a RoPE call.
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    /// Rows of `x` (positions `pos0..pos0 + n`).
    pub n: usize,
    /// Elements per row of `x`.
    pub width: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub style: RopeStyle,
    pub pos0: usize,
    /// cos/sin multiplier (YaRN's attention factor; 1 otherwise).
    pub mscale: f32,
    /// Which columns of each head rotate, and which way (the first ones, forward: default).
    pub part: RopePart,
}

/// The rotated columns of a head and the direction: `Op::Rope`'s `tail` and `inverse`
/// (`cpu::rope::Part`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RopePart {
    /// Columns of each head before the rotated ones (a tail rotation: `head_dim - rotary_dim`).
    pub skip: usize,
    /// By the opposite angles (the rotation undone).
    pub inverse: bool,
}

impl<'a> Frame<'a> {
    /// `out = x / rms(x) * (weight + offset)` over groups of `weight.len` columns of `n` rows
    /// of `width` (`a`); `x` and `out` may be the same view.
    pub fn rms_norm(&mut self, a: NormArgs<'a>, n: usize, eps: f32, offset: f32) -> Result<()> {
        self.rms_norms(a, None, n, (eps, offset, 1.0), None)
    }

    /// `rms_norm` with its output times `scale` (a scaled norm, `rms_norm_scaled`: Inkling's
    /// final norm over `logits_mup_width_multiplier`); reference: `Op::RmsNorm` in
    /// `cpu::run_op`, which scales `cpu::norm::rms_norm`'s output.
    pub fn rms_norm_scaled(&mut self, a: NormArgs<'a>, n: usize, eps: f32, offset: f32, scale: f32) -> Result<()> {
        self.rms_norms(a, None, n, (eps, offset, scale), None)
    }

    /// Two independent `rms_norm`s of `n` rows each (the same `eps` and `offset`) in one
    /// dispatch: neither may read what the other writes.
    pub fn rms_norm_pair(&mut self, a: NormArgs<'a>, b: NormArgs<'a>, n: usize, eps: f32, offset: f32) -> Result<()> {
        self.rms_norms(a, Some(b), n, (eps, offset, 1.0), None)
    }

    /// `rms_norm` without a weight (a weight of ones: `rms_norm_unweighted`, DeepSeek V4's
    /// per-head query norm) over groups of `group` columns of `n` rows of `width`, `x` into
    /// `out` (the same view allowed), `(eps, offset, scale)` as `rms_norm_scaled` takes them;
    /// reference: `Op::RmsNorm` with no weight in `cpu::run_op`.
    pub fn rms_norm_unweighted(
        &mut self,
        x: View<'a>,
        out: View<'a>,
        (n, width, group): (usize, usize, usize),
        params: (f32, f32, f32),
    ) -> Result<()> {
        // The weight's binding is not read: `x` stands in for it.
        self.rms_norms(NormArgs { x, weight: x, out, width }, None, n, params, Some(group))
    }

    /// The norms: `a` (of groups of `ones` columns and no weight where that is set) and `b`;
    /// `(eps, offset, scale)` shared.
    fn rms_norms(
        &mut self,
        a: NormArgs<'a>,
        b: Option<NormArgs<'a>>,
        n: usize,
        (eps, offset, scale): (f32, f32, f32),
        ones: Option<usize>,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        let check = |t: &NormArgs, ones: Option<usize>| -> Result<(u32, u32, u32, u32)> {
            let group = ones.unwrap_or(t.weight.len);
            if group == 0 || !t.width.is_multiple_of(group) {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: format!("row width {} is not a multiple of the group {group}", t.width),
                });
            }
            t.x.check(OP, "x", n * t.width)?;
            t.out.check(OP, "out", n * t.width)?;
            if ones.is_none() {
                t.weight.check(OP, "weight", group)?;
                if t.weight.offset != 0 {
                    return Err(VkError::BadArgument { op: OP, msg: "weight views must start at element 0".into() });
                }
            }
            Ok((
                u32_arg(OP, "width", t.width)?,
                u32_arg(OP, "group", group)?,
                u32_arg(OP, "x offset", t.x.offset)?,
                u32_arg(OP, "out offset", t.out.offset)?,
            ))
        };
        let (w1, g1, x1, o1) = check(&a, ones)?;
        let (w2, g2, x2, o2) = match &b {
            Some(t) => check(t, None)?,
            None => (0, 1, 0, 0),
        };
        let push = RmsNormPush {
            width: w1,
            group: g1,
            eps,
            offset,
            x_off: x1,
            out_off: o1,
            width2: w2,
            group2: g2,
            x2_off: x2,
            out2_off: o2,
            scale,
            unweighted: ones.is_some() as u32,
        };
        let weight = if ones.is_some() { Bind::UNUSED } else { Bind::buf(a.weight.buf) };
        let mut binds = vec![Bind::buf(a.x.buf), weight, Bind::buf(a.out.buf)];
        if let Some(t) = &b {
            binds.extend([Bind::buf(t.x.buf), Bind::buf(t.weight.buf), Bind::buf(t.out.buf)]);
        }
        let groups = (w1 / g1).max(w2 / g2);
        self.dispatch(
            Kernel::RmsNorm,
            None,
            &binds,
            &push,
            [groups, u32_arg(OP, "n", n)?, if b.is_some() { 2 } else { 1 }],
        )
    }

    /// Rotates the first `2 * freq.len` columns of each head in place (`freq`: the inverse
    /// frequencies, `cpu::rope::inv_freq`), or those after `s.part.skip`, by the opposite
    /// angles where `s.part.inverse` says (`cpu::rope::rotate_part`).
    pub fn rope(&mut self, x: View<'a>, freq: View<'a>, s: RopeShape) -> Result<()> {
        self.rope_at(x, freq, s, Pos::Fixed(s.pos0))
    }

    /// `rope` at a position fixed or read on the device (`Pos`; `s.pos0` is not used).
    pub fn rope_at(&mut self, x: View<'a>, freq: View<'a>, s: RopeShape, pos: Pos<'a>) -> Result<()> {
        const OP: &str = "rope";
        let (pos0, dyn_, params) = pos.parts(OP)?;
        let half = freq.len;
        if s.part.skip + 2 * half > s.head_dim || s.heads * s.head_dim > s.width {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "rotary dim {} after {} / head_dim {} / heads {} / width {}",
                    2 * half,
                    s.part.skip,
                    s.head_dim,
                    s.heads,
                    s.width
                ),
            });
        }
        x.check(OP, "x", s.n * s.width)?;
        freq.check(OP, "frequencies", half)?;
        if freq.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "frequency views must start at element 0".into() });
        }
        let push = RopePush {
            n: u32_arg(OP, "n", s.n)?,
            width: u32_arg(OP, "width", s.width)?,
            heads: s.heads as u32,
            head_dim: s.head_dim as u32,
            half_: half as u32,
            interleaved: (s.style == RopeStyle::Interleaved) as u32,
            pos0,
            mscale: s.mscale,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            r#dyn: dyn_,
            skip: s.part.skip as u32,
            inverse: s.part.inverse as u32,
        };
        let count = s.n * s.heads * half;
        self.dispatch(
            Kernel::Rope,
            None,
            &[Bind::buf(x.buf), Bind::buf(freq.buf), params],
            &push,
            [groups_for(count, 64), 1, 1],
        )
    }
}
