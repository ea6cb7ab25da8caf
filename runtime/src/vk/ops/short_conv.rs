//! A short convolution on a row stream (Inkling's `*_sconv`: `LinearAttentionKind::ShortConv`)
//! on the device: per channel, `out[t] = s x[t] + sum_j w[c, j] * s x[t - kernel + 1 + j]`, `s`
//! the op's input scale (1 without one), over a ring of the `kernel - 1` scaled inputs before
//! the block. It is Gated DeltaNet's convolution kernel (`deltanet_conv.comp`) in its row mode
//! (`planar` 3: no SiLU, the input added, the scale). Reference: `cpu::short_conv::short_conv`
//! as `cpu::run_short_conv` calls it (the inputs scaled first).
//!
//! Must not: keep state of its own (the ring is the caller's, as the executor mirrors it from
//! the host's rows), or take a kernel longer than `MAX_KERNEL`.

use super::deltanet::MAX_KERNEL;
use super::{groups_for, u32_arg};
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::DeltanetConvPush;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{LinearAttentionKind, LinearAttentionSpec};

/// The operands of one short convolution of `n` rows of `width` channels.
#[derive(Clone, Copy, Debug)]
pub struct RowConv<'a> {
    /// The block's input rows (`n x width`).
    pub x: View<'a>,
    /// The taps, `[width, kernel]` (the oldest first), from element 0.
    pub taps: View<'a>,
    /// The scaled inputs of the `kernel - 1` positions before the block (`(kernel - 1) x
    /// width`, oldest first; zeros before position 0), left holding the block's last ones.
    pub ring: View<'a>,
    /// The output rows (`n x width`); may be `x` (in place).
    pub out: View<'a>,
    pub n: usize,
    pub width: usize,
    pub kernel: usize,
    /// Multiplies the input first (`input_scale`; 1 without one).
    pub input_scale: f32,
}

/// Whether the device runs this op (the op library's claim): a short convolution of a kernel of
/// 1 to `MAX_KERNEL` taps.
pub fn supported(spec: &LinearAttentionSpec) -> bool {
    spec.kind == LinearAttentionKind::ShortConv && (1..=MAX_KERNEL).contains(&spec.conv_kernel)
}

impl<'a> Frame<'a> {
    /// The short convolution `a` (one invocation per channel, the rows in order).
    pub fn row_conv(&mut self, a: RowConv<'a>) -> Result<()> {
        const OP: &str = "short_conv";
        let RowConv { x, taps, ring, out, n, width, kernel, input_scale } = a;
        if kernel == 0 || kernel > MAX_KERNEL || width == 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("a kernel of {kernel} over {width} channels (kernels of 1 to {MAX_KERNEL})"),
            });
        }
        x.check(OP, "x", n * width)?;
        out.check(OP, "out", n * width)?;
        taps.check(OP, "taps", width * kernel)?;
        ring.check(OP, "ring", width * (kernel - 1))?;
        if taps.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "tap views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = DeltanetConvPush {
            n: u32_arg(OP, "n", n)?,
            nk: 0,
            nv: 1,
            dk: 0,
            dv: u32_arg(OP, "width", width)?,
            kk: kernel as u32,
            p_off: u32_arg(OP, "x offset", x.offset)?,
            ring_off: u32_arg(OP, "ring offset", ring.offset)?,
            conv_off: u32_arg(OP, "out offset", out.offset)?,
            planar: 3,
            scale: input_scale,
            pad2: 0,
        };
        let binds = [Bind::buf(x.buf), Bind::buf(taps.buf), Bind::buf(ring.buf), Bind::buf(out.buf)];
        self.dispatch(Kernel::DeltanetConv, None, &binds, &push, [groups_for(width, 64), 1, 1])
    }
}
