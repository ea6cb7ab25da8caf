//! Gated DeltaNet (Qwen3-Next's linear-attention mixer, its projections grouped per key head,
//! or Qwen3.5's four apart) on the device: the whole `LinearAttention` op as the CPU runs it
//! (`cpu::deltanet::gated_deltanet`, the reference): the input projections (`matmul`; apart,
//! `in_proj_qkv` and `in_proj_z` into one scratch, `in_proj_b` and `in_proj_a` as two planes of
//! another), the causal convolution over its ring with SiLU (`deltanet_conv.comp`, one
//! invocation per channel, rows in order), the gated delta rule per value head with the gated
//! RMSNorm (`deltanet_rule.comp`, one workgroup per value head, rows in order), and the output
//! projection (`matmul`).
//!
//! The recurrent state is the caller's, in the CPU's layout (`LinearAttentionSpec::
//! state_floats`: every head's `dk x dv` matrix, then the ring of `kernel - 1` rows of the
//! q/k/v channels, oldest first), so the host's copy and the device's are the same bytes.
//! The intermediates live in a `DeltaNetScratch` sized for the most rows of a step.
//!
//! Must not: keep state of its own, decide when the state is reset or copied (the executor
//! does), or take heads wider than `MAX_HEAD_DIM` or a kernel longer than `MAX_KERNEL`.

use super::{groups_for, u32_arg};
use crate::cpu::Precision;
use crate::vk::context::{Context, DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::DeviceMatrix;
use crate::vk::ops::MatmulPath;
use crate::vk::push::{DeltanetConvPush, DeltanetRulePush};
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{LinearAttentionKind, LinearAttentionSpec};

/// The widest key or value head the rule kernel holds (`MAX_D` in `deltanet_rule.comp`).
pub const MAX_HEAD_DIM: usize = 256;
/// The longest convolution (`MAX_K` in `deltanet_conv.comp`).
pub const MAX_KERNEL: usize = 8;

/// The geometry of one Gated DeltaNet op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
    /// The gated RMSNorm's epsilon.
    pub eps: f32,
}

impl DeltaNetShape {
    pub fn of(spec: &LinearAttentionSpec) -> DeltaNetShape {
        DeltaNetShape {
            key_heads: spec.key_heads,
            value_heads: spec.value_heads,
            key_head_dim: spec.key_head_dim,
            value_head_dim: spec.value_head_dim,
            conv_kernel: spec.conv_kernel,
            eps: spec.norm_eps,
        }
    }

    /// Whether the kernels run this op (the op library's claim): this geometry, with either
    /// layout of the input projections.
    pub fn supported(spec: &LinearAttentionSpec) -> bool {
        spec.kind == LinearAttentionKind::GatedDeltaNet && DeltaNetShape::of(spec).check().is_ok()
    }

    /// Channels of the convolution: q and k of every key head, v of every value head.
    pub fn channels(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// Columns of the fused q/k/v/z projection.
    pub fn proj_width(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + 2 * self.value_heads * self.value_head_dim
    }

    /// Columns of the heads' output (the out projection's input).
    pub fn out_heads(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    /// Floats of the heads' matrices (the ring follows them in the state).
    pub fn heads_floats(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Floats of the whole state (heads, then the ring), as `LinearAttentionSpec::state_floats`.
    pub fn state_floats(&self) -> usize {
        self.heads_floats() + self.channels() * self.conv_kernel.saturating_sub(1)
    }

    pub(super) fn check(&self) -> Result<()> {
        let (nk, nv, dk, dv, kk) =
            (self.key_heads, self.value_heads, self.key_head_dim, self.value_head_dim, self.conv_kernel);
        if nk == 0
            || nv % nk != 0
            || dk == 0
            || dv == 0
            || dk > MAX_HEAD_DIM
            || dv > MAX_HEAD_DIM
            || kk == 0
            || kk > MAX_KERNEL
        {
            return Err(VkError::BadArgument {
                op: "deltanet",
                msg: format!(
                    "{nk} key heads of {dk}, {nv} value heads of {dv}, a kernel of {kk} (heads of at most {MAX_HEAD_DIM}, kernels of at most {MAX_KERNEL}, value heads a multiple of key heads)"
                ),
            });
        }
        Ok(())
    }
}

/// The input projections on the device, in the checkpoint's layout.
#[derive(Clone, Copy)]
pub enum DeltaNetIn<'a> {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Grouped { qkvz: &'a DeviceMatrix, ba: &'a DeviceMatrix },
    /// Qwen3.5: `in_proj_qkv` (the convolution's channel order), `in_proj_z`, `in_proj_b`,
    /// `in_proj_a` (per value head).
    Apart { qkv: &'a DeviceMatrix, z: &'a DeviceMatrix, b: &'a DeviceMatrix, a: &'a DeviceMatrix },
}

impl DeltaNetIn<'_> {
    /// `(rows, cols)` of each projection with the rows the geometry needs.
    fn shapes(&self, s: &DeltaNetShape) -> Vec<((usize, usize), usize)> {
        let dims = |m: &DeviceMatrix| (m.rows, m.cols);
        match self {
            DeltaNetIn::Grouped { qkvz, ba } => vec![(dims(qkvz), s.proj_width()), (dims(ba), 2 * s.value_heads)],
            DeltaNetIn::Apart { qkv, z, b, a } => vec![
                (dims(qkv), s.channels()),
                (dims(z), s.out_heads()),
                (dims(b), s.value_heads),
                (dims(a), s.value_heads),
            ],
        }
    }
}

/// The op's weights on the device, by role.
#[derive(Clone, Copy)]
pub struct DeltaNetMats<'a> {
    pub input: DeltaNetIn<'a>,
    pub out: &'a DeviceMatrix,
    /// `[channels, kernel]` taps, f32.
    pub conv: View<'a>,
    pub dt_bias: View<'a>,
    pub a_log: View<'a>,
    /// The gated norm's weight (`value_head_dim`).
    pub norm: View<'a>,
}

/// Where the convolution's input channels lie (`deltanet_conv.comp`'s `planar`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ConvInput {
    /// The fused projection, per key head group: q, k, the group's values, its output gates.
    Grouped,
    /// Three planes of `n` rows each: every q, then every k, then every v.
    Planar,
    /// One row per position in the channels' order (Qwen3.5's `in_proj_qkv`).
    Rows,
}

/// The views of one convolution: its input, its taps (`[channels, kernel]`), the ring and
/// the convolved channels.
#[derive(Clone, Copy)]
pub(super) struct ConvViews<'a> {
    pub proj: View<'a>,
    pub taps: View<'a>,
    pub ring: View<'a>,
    pub conv: View<'a>,
}

/// One layer's op as a call records it: its geometry, its weights, the scratch its kernels
/// work in, and the precision of its products (as `matmul_with`).
#[derive(Clone, Copy)]
pub struct DeltaNetCall<'a> {
    pub shape: DeltaNetShape,
    pub weights: DeltaNetMats<'a>,
    pub scratch: &'a DeltaNetScratch,
    pub precision: Precision,
}

/// The rows `deltanet_rule` reads and writes: the convolved channels `conv`, the fused
/// projection `proj` (for the output gates), `ba`, the `state` (the heads' matrices at its
/// start) and the heads' outputs `heads`.
#[derive(Clone, Copy)]
pub struct RuleViews<'a> {
    pub conv: View<'a>,
    pub proj: View<'a>,
    pub ba: View<'a>,
    pub state: View<'a>,
    pub heads: View<'a>,
}

/// What one op's kernels work in, for steps of at most `rows` rows (one per session serves
/// every DeltaNet layer of a frame: the layers run one after another).
pub struct DeltaNetScratch {
    rows: usize,
    shape: DeltaNetShape,
    proj: DeviceBuffer,
    ba: DeviceBuffer,
    conv: DeviceBuffer,
    heads: DeviceBuffer,
}

impl DeltaNetScratch {
    /// Buffers for steps of at most `rows` rows of ops no larger than `shape` in every
    /// dimension the buffers hold (projection, ba, channels and head outputs per row).
    pub fn new(ctx: &Context, rows: usize, shape: DeltaNetShape) -> Result<DeltaNetScratch> {
        let rows = rows.max(1);
        Ok(DeltaNetScratch {
            rows,
            shape,
            proj: ctx.f32_buffer(rows * shape.proj_width())?,
            ba: ctx.f32_buffer(rows * 2 * shape.value_heads)?,
            conv: ctx.f32_buffer(rows * shape.channels())?,
            heads: ctx.f32_buffer(rows * shape.out_heads())?,
        })
    }

    /// Whether steps of `n` rows of `s` fit.
    fn fits(&self, s: &DeltaNetShape, n: usize) -> bool {
        let c = &self.shape;
        n <= self.rows
            && s.proj_width() <= c.proj_width()
            && s.value_heads <= c.value_heads
            && s.channels() <= c.channels()
            && s.out_heads() <= c.out_heads()
    }
}

impl<'a> Frame<'a> {
    /// The whole Gated DeltaNet op over `n` rows of `x` (`n x hidden`), advancing `state`
    /// (`s.state_floats()` floats) by `n` positions, into `out` (`n x hidden`). Five
    /// dispatches and the projections' activation quantization.
    pub fn deltanet(
        &mut self,
        call: DeltaNetCall<'a>,
        x: View<'a>,
        n: usize,
        state: View<'a>,
        out: View<'a>,
    ) -> Result<()> {
        const OP: &str = "deltanet";
        let DeltaNetCall { shape: s, weights: w, scratch, precision } = call;
        s.check()?;
        if !scratch.fits(&s, n) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{n} rows of {s:?} do not fit a scratch of {} rows of {:?}", scratch.rows, scratch.shape),
            });
        }
        let shapes = w.input.shapes(&s);
        let hidden = w.out.rows;
        if shapes.iter().any(|&((rows, cols), want)| rows != want || cols != hidden) || w.out.cols != s.out_heads() {
            let dims: Vec<(usize, usize)> = shapes.iter().map(|p| p.0).collect();
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("projections {dims:?} and out {}x{} for {s:?}", w.out.rows, w.out.cols),
            });
        }
        let (proj, ba) = (scratch.proj.view(0, n * s.proj_width()), scratch.ba.view(0, n * 2 * s.value_heads));
        let (conv, heads) = (scratch.conv.view(0, n * s.channels()), scratch.heads.view(0, n * s.out_heads()));
        let ring = state.len.checked_sub(s.heads_floats()).map(|len| View {
            buf: state.buf,
            offset: state.offset + s.heads_floats(),
            len,
        });
        let ring =
            ring.ok_or(VkError::ViewTooSmall { op: OP, what: "state", needed: s.state_floats(), have: state.len })?;
        match w.input {
            DeltaNetIn::Grouped { qkvz, ba: ba_w } => {
                self.matmul_with(qkvz, x, n, proj, MatmulPath::Auto, precision)?;
                self.matmul_with(ba_w, x, n, ba, MatmulPath::Auto, precision)?;
                self.deltanet_conv(s, proj, w.conv, ring, conv, n)?;
                self.deltanet_rule(s, w, RuleViews { conv, proj, ba, state, heads }, n)?;
            }
            DeltaNetIn::Apart { qkv, z, b, a } => {
                // qkv's rows then z's rows in the projection scratch; b's plane then a's.
                let (p, b2) = (&scratch.proj, &scratch.ba);
                let (mixed, zs) = (p.view(0, n * s.channels()), p.view(n * s.channels(), n * s.out_heads()));
                let (bs, as_) = (b2.view(0, n * s.value_heads), b2.view(n * s.value_heads, n * s.value_heads));
                for (m, v) in [(qkv, mixed), (z, zs), (b, bs), (a, as_)] {
                    self.matmul_with(m, x, n, v, MatmulPath::Auto, precision)?;
                }
                self.short_conv(s, ConvInput::Rows, ConvViews { proj: mixed, taps: w.conv, ring, conv }, n)?;
                self.rule(s, w, RuleViews { conv, proj: zs, ba, state, heads }, n, true)?;
            }
        }
        self.matmul_with(w.out, heads, n, out, MatmulPath::Auto, precision)
    }

    /// The causal convolution of `n` rows with SiLU: the q/k/v channels of the fused
    /// projection `proj` (`n x proj_width`) after the `ring` (`(kernel - 1) x channels`,
    /// oldest first; left holding the last inputs) into `conv` (`n x channels`).
    pub fn deltanet_conv(
        &mut self,
        s: DeltaNetShape,
        proj: View<'a>,
        taps: View<'a>,
        ring: View<'a>,
        conv: View<'a>,
        n: usize,
    ) -> Result<()> {
        s.check()?;
        proj.check("deltanet_conv", "projection", n * s.proj_width())?;
        self.short_conv(s, ConvInput::Grouped, ConvViews { proj, taps, ring, conv }, n)
    }

    /// `deltanet_conv.comp` over `n` rows, its input in `layout` (`proj` already checked to
    /// hold it).
    pub(super) fn short_conv(&mut self, s: DeltaNetShape, layout: ConvInput, v: ConvViews<'a>, n: usize) -> Result<()> {
        const OP: &str = "deltanet_conv";
        let ConvViews { proj, taps, ring, conv } = v;
        s.check()?;
        let ch = s.channels();
        taps.check(OP, "taps", ch * s.conv_kernel)?;
        ring.check(OP, "ring", ch * (s.conv_kernel - 1))?;
        conv.check(OP, "conv", n * ch)?;
        if taps.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "tap views must start at element 0".into() });
        }
        let push = DeltanetConvPush {
            n: u32_arg(OP, "n", n)?,
            nk: s.key_heads as u32,
            nv: s.value_heads as u32,
            dk: s.key_head_dim as u32,
            dv: s.value_head_dim as u32,
            kk: s.conv_kernel as u32,
            p_off: u32_arg(OP, "projection offset", proj.offset)?,
            ring_off: u32_arg(OP, "ring offset", ring.offset)?,
            conv_off: u32_arg(OP, "conv offset", conv.offset)?,
            planar: match layout {
                ConvInput::Grouped => 0,
                ConvInput::Planar => 1,
                ConvInput::Rows => 2,
            },
            scale: 1.0,
            pad2: 0,
        };
        let binds = [Bind::buf(proj.buf), Bind::buf(taps.buf), Bind::buf(ring.buf), Bind::buf(conv.buf)];
        self.dispatch(Kernel::DeltanetConv, None, &binds, &push, [groups_for(ch, 64), 1, 1])
    }

    /// The gated delta rule over `n` rows of `conv` per value head, advancing the heads'
    /// matrices at the start of `state`, then the gated RMSNorm with the output gates of
    /// `proj` into `heads` (`n x value_heads * value_head_dim`).
    pub fn deltanet_rule(&mut self, s: DeltaNetShape, w: DeltaNetMats<'a>, v: RuleViews<'a>, n: usize) -> Result<()> {
        self.rule(s, w, v, n, false)
    }

    /// `deltanet_rule`, or with `apart` the gates `proj` holds as `n x value_heads *
    /// value_head_dim` and `ba` as a plane of b's then one of a's (`n x value_heads` each).
    fn rule(&mut self, s: DeltaNetShape, w: DeltaNetMats<'a>, v: RuleViews<'a>, n: usize, apart: bool) -> Result<()> {
        const OP: &str = "deltanet_rule";
        let RuleViews { conv, proj, ba, state, heads } = v;
        s.check()?;
        conv.check(OP, "conv", n * s.channels())?;
        proj.check(OP, "projection", n * if apart { s.out_heads() } else { s.proj_width() })?;
        ba.check(OP, "ba", n * 2 * s.value_heads)?;
        w.a_log.check(OP, "A_log", s.value_heads)?;
        w.dt_bias.check(OP, "dt_bias", s.value_heads)?;
        w.norm.check(OP, "norm", s.value_head_dim)?;
        state.check(OP, "state", s.heads_floats())?;
        heads.check(OP, "heads", n * s.out_heads())?;
        if w.a_log.offset != 0 || w.dt_bias.offset != 0 || w.norm.offset != 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: "A_log, dt_bias and norm views must start at element 0".into(),
            });
        }
        let push = DeltanetRulePush {
            n: u32_arg(OP, "n", n)?,
            nk: s.key_heads as u32,
            nv: s.value_heads as u32,
            dk: s.key_head_dim as u32,
            dv: s.value_head_dim as u32,
            eps: s.eps,
            state_off: u32_arg(OP, "state offset", state.offset)?,
            conv_off: u32_arg(OP, "conv offset", conv.offset)?,
            p_off: u32_arg(OP, "projection offset", proj.offset)?,
            ba_off: u32_arg(OP, "ba offset", ba.offset)?,
            out_off: u32_arg(OP, "heads offset", heads.offset)?,
            apart: u32::from(apart),
        };
        let binds = [
            Bind::buf(conv.buf),
            Bind::buf(proj.buf),
            Bind::buf(ba.buf),
            Bind::buf(w.a_log.buf),
            Bind::buf(w.dt_bias.buf),
            Bind::buf(w.norm.buf),
            Bind::buf(state.buf),
            Bind::buf(heads.buf),
        ];
        self.dispatch(Kernel::DeltanetRule, None, &binds, &push, [s.value_heads as u32, 1, 1])
    }
}
