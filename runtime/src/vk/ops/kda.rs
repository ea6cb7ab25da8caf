//! Kimi Delta Attention (Kimi Linear's mixer) on the device: the whole `LinearAttention` op of
//! kind `Kda` as the CPU runs it (`cpu::kda::kda`, the reference): the q, k and v projections
//! (`matmul`, three planes of rows), the low-rank decay and output-gate projections and beta's
//! (`matmul`), the three short convolutions with SiLU as one (`deltanet_conv.comp` with its
//! input in planes: the math per channel is Gated DeltaNet's; the caller gives the three
//! convolutions' taps side by side), the channel-wise gated delta rule per
//! head with the sigmoid-gated output norm (`kda_rule.comp`, one workgroup per head, rows in
//! order), and the output projection (`matmul`).
//!
//! The recurrent state is the caller's, in the CPU's layout (`LinearAttentionSpec::
//! state_floats`: every head's `d x d` matrix, key channel major, then the ring of
//! `kernel - 1` rows of the `[q | k | v]` channels, oldest first), so the host's copy and the
//! device's are the same bytes. The intermediates live in a `KdaScratch` sized for the most
//! rows of a step.
//!
//! Must not: keep state of its own, decide when the state is reset or copied (the executor
//! does), or take heads wider than `deltanet::MAX_HEAD_DIM` or a kernel longer than
//! `deltanet::MAX_KERNEL`.

use super::deltanet::{ConvInput, ConvViews, MAX_HEAD_DIM, MAX_KERNEL};
use super::{u32_arg, DeltaNetShape};
use crate::cpu::Precision;
use crate::vk::context::{Context, DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::DeviceMatrix;
use crate::vk::ops::MatmulPath;
use crate::vk::push::KdaRulePush;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{LinearAttentionKind, LinearAttentionSpec};

/// The geometry of one KDA op: `heads` heads of width `head_dim` (keys and values alike).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaShape {
    pub heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    /// The output norm's epsilon.
    pub eps: f32,
}

impl KdaShape {
    pub fn of(spec: &LinearAttentionSpec) -> KdaShape {
        KdaShape {
            heads: spec.value_heads,
            head_dim: spec.value_head_dim,
            conv_kernel: spec.conv_kernel,
            eps: spec.norm_eps,
        }
    }

    /// Whether the kernels run this op (the op library's claim): a KDA op whose key and value
    /// heads agree (the compiler checks that they do) within the kernels' limits.
    pub fn supported(spec: &LinearAttentionSpec) -> bool {
        spec.kind == LinearAttentionKind::Kda
            && spec.key_heads == spec.value_heads
            && spec.key_head_dim == spec.value_head_dim
            && KdaShape::of(spec).check().is_ok()
    }

    /// Columns of q, k, v, the decay and the output gate each (`heads * head_dim`).
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Floats of the heads' matrices (the ring follows them in the state).
    pub fn heads_floats(&self) -> usize {
        self.heads * self.head_dim * self.head_dim
    }

    /// Floats of the whole state (heads, then the ring), as `LinearAttentionSpec::state_floats`.
    pub fn state_floats(&self) -> usize {
        self.heads_floats() + 3 * self.width() * self.conv_kernel.saturating_sub(1)
    }

    /// The convolution's geometry in Gated DeltaNet's terms: one value head per key head.
    fn conv_shape(&self) -> DeltaNetShape {
        DeltaNetShape {
            key_heads: self.heads,
            value_heads: self.heads,
            key_head_dim: self.head_dim,
            value_head_dim: self.head_dim,
            conv_kernel: self.conv_kernel,
            eps: self.eps,
        }
    }

    fn check(&self) -> Result<()> {
        let (h, d, kk) = (self.heads, self.head_dim, self.conv_kernel);
        if h == 0 || d == 0 || d > MAX_HEAD_DIM || kk == 0 || kk > MAX_KERNEL {
            return Err(VkError::BadArgument {
                op: "kda",
                msg: format!(
                    "{h} heads of {d}, a kernel of {kk} (heads of at most {MAX_HEAD_DIM}, kernels of at most {MAX_KERNEL})"
                ),
            });
        }
        Ok(())
    }
}

/// The op's weights on the device, by role (`cpu::kda::KdaWeights`'s).
#[derive(Clone, Copy)]
pub struct KdaMats<'a> {
    pub q: &'a DeviceMatrix,
    pub k: &'a DeviceMatrix,
    pub v: &'a DeviceMatrix,
    pub f_a: &'a DeviceMatrix,
    pub f_b: &'a DeviceMatrix,
    pub b: &'a DeviceMatrix,
    pub g_a: &'a DeviceMatrix,
    pub g_b: &'a DeviceMatrix,
    pub out: &'a DeviceMatrix,
    /// q's, k's and v's convolution taps side by side (`[3 * width, kernel]`, the order of the
    /// convolution's channels), f32.
    pub conv: View<'a>,
    /// `[width]`.
    pub dt_bias: View<'a>,
    /// `[heads]`.
    pub a_log: View<'a>,
    /// The output norm's weight (`head_dim`).
    pub norm: View<'a>,
}

/// One layer's op as a call records it: its geometry, its weights, the scratch its kernels
/// work in, and the precision of its products (as `matmul_with`).
#[derive(Clone, Copy)]
pub struct KdaCall<'a> {
    pub shape: KdaShape,
    pub weights: KdaMats<'a>,
    pub scratch: &'a KdaScratch,
    pub precision: Precision,
}

/// What one op's kernels work in, for steps of at most `rows` rows (one per session serves
/// every KDA layer of a frame: the layers run one after another).
pub struct KdaScratch {
    rows: usize,
    shape: KdaShape,
    /// q, k and v: three planes of `rows x width`.
    qkv: DeviceBuffer,
    /// The low-rank projections' middles: the decay's, then the gate's (`rows x head_dim` each).
    mid: DeviceBuffer,
    /// Per plane of rows: the decay's pre-activations, the gate's (`width` each), b (`heads`).
    aux: DeviceBuffer,
    conv: DeviceBuffer,
    heads: DeviceBuffer,
}

impl KdaScratch {
    /// Buffers for steps of at most `rows` rows of ops no larger than `shape` in every
    /// dimension (heads, head width, kernel).
    pub fn new(ctx: &Context, rows: usize, shape: KdaShape) -> Result<KdaScratch> {
        let rows = rows.max(1);
        let w = shape.width();
        Ok(KdaScratch {
            rows,
            shape,
            qkv: ctx.f32_buffer(3 * rows * w)?,
            mid: ctx.f32_buffer(2 * rows * shape.head_dim)?,
            aux: ctx.f32_buffer(rows * (2 * w + shape.heads))?,
            conv: ctx.f32_buffer(3 * rows * w)?,
            heads: ctx.f32_buffer(rows * w)?,
        })
    }

    /// Whether steps of `n` rows of `s` fit.
    fn fits(&self, s: &KdaShape, n: usize) -> bool {
        let c = &self.shape;
        n <= self.rows && s.width() <= c.width() && s.heads <= c.heads && s.head_dim <= c.head_dim
    }
}

impl<'a> Frame<'a> {
    /// The whole KDA op over `n` rows of `x` (`n x hidden`), advancing `state`
    /// (`s.state_floats()` floats) by `n` positions, into `out` (`n x hidden`): nine
    /// products and two kernels.
    pub fn kda(&mut self, call: KdaCall<'a>, x: View<'a>, n: usize, state: View<'a>, out: View<'a>) -> Result<()> {
        const OP: &str = "kda";
        let KdaCall { shape: s, weights: w, scratch: sc, precision } = call;
        s.check()?;
        if !sc.fits(&s, n) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{n} rows of {s:?} do not fit a scratch of {} rows of {:?}", sc.rows, sc.shape),
            });
        }
        let (wd, d, hidden) = (s.width(), s.head_dim, w.q.cols);
        let shapes_ok = [w.q, w.k, w.v].iter().all(|m| m.rows == wd && m.cols == hidden)
            && (w.f_a.rows, w.f_a.cols, w.g_a.rows, w.g_a.cols) == (d, hidden, d, hidden)
            && (w.f_b.rows, w.f_b.cols, w.g_b.rows, w.g_b.cols) == (wd, d, wd, d)
            && (w.b.rows, w.b.cols) == (s.heads, hidden)
            && (w.out.rows, w.out.cols) == (hidden, wd);
        if !shapes_ok {
            return Err(VkError::BadArgument { op: OP, msg: format!("projections that do not fit {s:?}") });
        }
        let mm = MatmulPath::Auto;
        // 1. Projections: q, k, v in three planes; the two low-rank pairs; b.
        for (j, m) in [w.q, w.k, w.v].into_iter().enumerate() {
            self.matmul_with(m, x, n, sc.qkv.view(j * n * wd, n * wd), mm, precision)?;
        }
        let (fmid, gmid) = (sc.mid.view(0, n * d), sc.mid.view(n * d, n * d));
        let (f, g, b) = (sc.aux.view(0, n * wd), sc.aux.view(n * wd, n * wd), sc.aux.view(2 * n * wd, n * s.heads));
        self.matmul_with(w.f_a, x, n, fmid, mm, precision)?;
        self.matmul_with(w.g_a, x, n, gmid, mm, precision)?;
        self.matmul_with(w.f_b, fmid, n, f, mm, precision)?;
        self.matmul_with(w.g_b, gmid, n, g, mm, precision)?;
        self.matmul_with(w.b, x, n, b, mm, precision)?;
        // 2. The three convolutions as one over [q | k | v].
        let kk = s.conv_kernel;
        w.conv.check(OP, "taps", 3 * wd * kk)?;
        let ring = state.len.checked_sub(s.heads_floats()).map(|len| View {
            buf: state.buf,
            offset: state.offset + s.heads_floats(),
            len,
        });
        let ring =
            ring.ok_or(VkError::ViewTooSmall { op: OP, what: "state", needed: s.state_floats(), have: state.len })?;
        let conv = sc.conv.view(0, n * 3 * wd);
        let views = ConvViews { proj: sc.qkv.view(0, 3 * n * wd), taps: w.conv, ring, conv };
        self.short_conv(s.conv_shape(), ConvInput::Planar, views, n)?;
        // 3. The rule and the gated norm; 4. the output projection.
        let heads = sc.heads.view(0, n * wd);
        self.kda_rule(s, w, KdaRuleViews { conv, aux: sc.aux.view(0, n * (2 * wd + s.heads)), state, heads }, n)?;
        self.matmul_with(w.out, heads, n, out, mm, precision)
    }

    /// The channel-wise gated delta rule over `n` rows of `conv` per head, advancing the
    /// heads' matrices at the start of `state`, then the gated norm into `heads`
    /// (`n x width`). `aux` holds the decay's pre-activations, the gate's (`n x width` each)
    /// and b (`n x heads`), one after another.
    pub fn kda_rule(&mut self, s: KdaShape, w: KdaMats<'a>, v: KdaRuleViews<'a>, n: usize) -> Result<()> {
        const OP: &str = "kda_rule";
        let KdaRuleViews { conv, aux, state, heads } = v;
        s.check()?;
        let wd = s.width();
        conv.check(OP, "conv", n * 3 * wd)?;
        aux.check(OP, "aux", n * (2 * wd + s.heads))?;
        w.a_log.check(OP, "A_log", s.heads)?;
        w.dt_bias.check(OP, "dt_bias", wd)?;
        w.norm.check(OP, "norm", s.head_dim)?;
        state.check(OP, "state", s.heads_floats())?;
        heads.check(OP, "heads", n * wd)?;
        if w.a_log.offset != 0 || w.dt_bias.offset != 0 || w.norm.offset != 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: "A_log, dt_bias and norm views must start at element 0".into(),
            });
        }
        let push = KdaRulePush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            d: s.head_dim as u32,
            eps: s.eps,
            state_off: u32_arg(OP, "state offset", state.offset)?,
            conv_off: u32_arg(OP, "conv offset", conv.offset)?,
            f_off: u32_arg(OP, "aux offset", aux.offset)?,
            g_off: u32_arg(OP, "aux offset", aux.offset + n * wd)?,
            b_off: u32_arg(OP, "aux offset", aux.offset + 2 * n * wd)?,
            out_off: u32_arg(OP, "heads offset", heads.offset)?,
            pad0: 0,
            pad1: 0,
        };
        let binds = [
            Bind::buf(conv.buf),
            Bind::buf(aux.buf),
            Bind::buf(w.a_log.buf),
            Bind::buf(w.dt_bias.buf),
            Bind::buf(w.norm.buf),
            Bind::buf(state.buf),
            Bind::buf(heads.buf),
        ];
        self.dispatch(Kernel::KdaRule, None, &binds, &push, [s.heads as u32, 1, 1])
    }
}

/// The rows `kda_rule` reads and writes: the convolved channels `conv`, the `aux` rows (the
/// decay's and gate's pre-activations, b), the `state` (the heads' matrices at its start) and
/// the heads' outputs `heads`.
#[derive(Clone, Copy)]
pub struct KdaRuleViews<'a> {
    pub conv: View<'a>,
    pub aux: View<'a>,
    pub state: View<'a>,
    pub heads: View<'a>,
}
