//! Elementwise ops: gated units (SwiGLU, GeGLU, clamped SwiGLU), plain activations, residual
//! add and products with broadcasting. Reference: `cpu::elementwise` and the CPU's `Add`/`Mul`.
//!
//! Must not: allocate (every op writes a view the caller owns).

use super::{groups_for, u32_arg};
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::{BinaryPush, GluPush};
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{Activation, GluKind};

/// How the second operand of `add`/`mul` spreads over the first (`n` rows of `width`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broadcast {
    /// Same shape.
    None,
    /// One value per row (`b` has `n` elements).
    PerRow,
    /// One row for all rows (`b` has `width` elements: a bias).
    Row,
}

impl<'a> Frame<'a> {
    /// `out[i] = glu(gate[i], up[i])` over `count` elements.
    pub fn glu(&mut self, kind: GluKind, gate: View<'a>, up: View<'a>, out: View<'a>, count: usize) -> Result<()> {
        let (k, limit, alpha) = match kind {
            GluKind::SwiGlu => (0, 0.0, 0.0),
            GluKind::GeGlu => (1, 0.0, 0.0),
            GluKind::ClampedSwiGlu { limit, alpha } => (2, limit, alpha),
            GluKind::LimitedSwiGlu { limit } => (3, limit, 0.0),
        };
        up.check("glu", "up", count)?;
        self.elementwise(Unary { op: "glu", kind: k, limit, alpha }, gate, Some(up), out, count)
    }

    /// `out[i] = act(x[i])` over `count` elements.
    pub fn act(&mut self, act: Activation, x: View<'a>, out: View<'a>, count: usize) -> Result<()> {
        let k = match act {
            Activation::Silu => 10,
            Activation::Sigmoid => 11,
            Activation::Relu => 12,
            Activation::Gelu => 13,
            Activation::GeluTanh => 14,
        };
        self.elementwise(Unary { op: "act", kind: k, limit: 0.0, alpha: 0.0 }, x, None, out, count)
    }

    fn elementwise(&mut self, f: Unary, g: View<'a>, u: Option<View<'a>>, out: View<'a>, count: usize) -> Result<()> {
        let Unary { op, kind, limit, alpha } = f;
        g.check(op, "input", count)?;
        out.check(op, "out", count)?;
        let push = GluPush {
            count: u32_arg(op, "count", count)?,
            kind,
            limit,
            alpha,
            g_off: g.offset as u32,
            u_off: u.map_or(0, |u| u.offset as u32),
            o_off: out.offset as u32,
            pad: 0,
        };
        let binds = [Bind::buf(g.buf), u.map_or(Bind::UNUSED, |u| Bind::buf(u.buf)), Bind::buf(out.buf)];
        self.dispatch(Kernel::Glu, None, &binds, &push, [groups_for(count, 64), 1, 1])
    }

    /// `out = a + b` over `n` rows of `width` (`b` broadcast as `bmode` says).
    pub fn add(
        &mut self,
        a: View<'a>,
        b: View<'a>,
        out: View<'a>,
        n: usize,
        width: usize,
        bmode: Broadcast,
    ) -> Result<()> {
        self.binary(Binary { op: "add", code: 0, bmode }, a, b, out, n, width)
    }

    /// `out = a * b` over `n` rows of `width` (`b` broadcast as `bmode` says).
    pub fn mul(
        &mut self,
        a: View<'a>,
        b: View<'a>,
        out: View<'a>,
        n: usize,
        width: usize,
        bmode: Broadcast,
    ) -> Result<()> {
        self.binary(Binary { op: "mul", code: 1, bmode }, a, b, out, n, width)
    }

    fn binary(&mut self, f: Binary, a: View<'a>, b: View<'a>, out: View<'a>, n: usize, width: usize) -> Result<()> {
        let Binary { op, code, bmode } = f;
        let count = n * width;
        if width == 0 {
            return Err(VkError::BadArgument { op, msg: "zero width".into() });
        }
        a.check(op, "a", count)?;
        out.check(op, "out", count)?;
        let (blen, mode) = match bmode {
            Broadcast::None => (count, 0),
            Broadcast::PerRow => (n, 1),
            Broadcast::Row => (width, 2),
        };
        b.check(op, "b", blen)?;
        let push = BinaryPush {
            count: u32_arg(op, "count", count)?,
            width: width as u32,
            op: code,
            bmode: mode,
            a_off: a.offset as u32,
            b_off: b.offset as u32,
            o_off: out.offset as u32,
            pad: 0,
        };
        let binds = [Bind::buf(a.buf), Bind::buf(b.buf), Bind::buf(out.buf)];
        self.dispatch(Kernel::Binary, None, &binds, &push, [groups_for(count, 64), 1, 1])
    }
}

/// The function `glu.comp` applies: the op's name (for errors), the shader's kind code and
/// the clamped SwiGLU's limit and alpha (0 for the others).
#[derive(Clone, Copy)]
struct Unary {
    op: &'static str,
    kind: u32,
    limit: f32,
    alpha: f32,
}

/// The operation `binary.comp` applies: the op's name (for errors), the shader's code, and
/// how `b` is broadcast.
#[derive(Clone, Copy)]
struct Binary {
    op: &'static str,
    code: u32,
    bmode: Broadcast,
}
