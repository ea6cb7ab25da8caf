//! Matrix products and the embedding gather. `matmul` computes `out[n x rows] = x[n x cols] *
//! W^T` as the CPU's `cpu::linear` does: with `Precision::Fast` (`format::matmul`) integer
//! formats take the activations quantized to 8 bits per block of 32 exactly as the CPU
//! quantizes them (`quantize_q8.comp`); with `Precision::Exact`, and for the float formats,
//! activations stay f32 and each weight is decoded and multiplied in f32. One row (decode) runs the GEMV (`matvec.comp`); from two rows the tiled GEMM
//! (`matmul.comp`), or for the formats with q8 activations from `COOP_MIN_ROWS` rows, where
//! the device has an int8 cooperative-matrix shape, the tensor-core GEMM (`matmul_coop.comp`:
//! each block's integer products exact, scaled per weight and activation block). `embed` gathers table rows (any format) as `dequant_row` decodes them.
//!
//! Fused forms (`matmul_fused`): the input may be the RMSNorm of a row or a gated unit of two
//! rows (`MatIn`), computed as the kernel reads it (float activations) or as it quantizes it
//! (q8 activations, `quantize_rows.comp`), in the CPU's arithmetic; and a residual may be
//! added to the product as it is stored (`out = residual + x W^T`, the CPU's Linear then Add).
//! So an RMSNorm, a gated unit and a residual add take no dispatch of their own.
//!
//! Must not: accept operands that do not fit (typed errors instead).

use super::{groups_for, u32_arg};
use crate::cpu::Precision;
use crate::vk::context::{Context, DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::DeviceMatrix;
use crate::vk::memory::MemoryUse;
use crate::vk::push::{EmbedPush, MatmulPush, MatvecPush, QuantizeRowsPush};
use crate::vk::shaders::Kernel;
use coli_compiler::ir::GluKind;

/// Which kernel a matrix product takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPath {
    /// The GEMV up to the device's `gemv_rows` rows (and for a router's narrow matrix, whose
    /// tiles would be too few to fill the device), the tiled GEMM beyond.
    #[default]
    Auto,
    /// The GEMV for every row (one activation row per workgroup row).
    Gemv,
    /// The tiled GEMM whatever the row count.
    Gemm,
}

/// What a matrix product reads: stored activations, or a transform of them the kernel
/// computes as it reads them (no dispatch and no buffer of its own).
#[derive(Clone, Copy, Debug)]
pub enum MatIn<'a> {
    /// `x` as stored.
    Plain(View<'a>),
    /// `x / rms(x) * (weight + offset)` over whole rows (`weight`: one per column);
    /// reference `cpu::norm::rms_norm`.
    Norm { x: View<'a>, weight: View<'a>, eps: f32, offset: f32 },
    /// `glu(gate, up)`; reference `cpu::elementwise::glu`.
    Glu { gate: View<'a>, up: View<'a>, kind: GluKind },
}

impl<'a> MatIn<'a> {
    /// The view the kernel reads rows from (x, or the gate).
    pub(crate) fn base(&self) -> View<'a> {
        match *self {
            MatIn::Plain(x) | MatIn::Norm { x, .. } => x,
            MatIn::Glu { gate, .. } => gate,
        }
    }

    /// (mode, auxiliary view, p0, p1) as fuse_in.glsl takes them.
    fn mode(&self) -> (u32, Option<View<'a>>, f32, f32) {
        match *self {
            MatIn::Plain(_) => (0, None, 0.0, 0.0),
            MatIn::Norm { weight, eps, offset, .. } => (1, Some(weight), eps, offset),
            MatIn::Glu { up, kind, .. } => match kind {
                GluKind::SwiGlu => (2, Some(up), 0.0, 0.0),
                GluKind::GeGlu => (3, Some(up), 0.0, 0.0),
                GluKind::ClampedSwiGlu { limit, alpha } => (4, Some(up), limit, alpha),
                GluKind::LimitedSwiGlu { limit } => (5, Some(up), limit, 0.0),
            },
        }
    }

    /// Checks the operands for `n` rows of `cols`.
    fn check(&self, op: &'static str, n: usize, cols: usize) -> Result<()> {
        self.base().check(op, "x (n x cols)", n * cols)?;
        match self {
            MatIn::Plain(_) => Ok(()),
            MatIn::Norm { weight, .. } => {
                weight.check(op, "norm weight", cols)?;
                if weight.len != cols {
                    return Err(VkError::BadArgument {
                        op,
                        msg: format!("a fused norm is over whole rows: {} weights for rows of {cols}", weight.len),
                    });
                }
                Ok(())
            }
            MatIn::Glu { up, .. } => up.check(op, "up (n x cols)", n * cols),
        }
    }

    /// The views the kernel reads.
    fn reads(&self) -> [Option<View<'a>>; 2] {
        [Some(self.base()), self.mode().1]
    }
}

fn same_range(a: &View, b: &View) -> bool {
    std::ptr::eq(a.buf, b.buf) && a.offset < b.offset + b.len && b.offset < a.offset + a.len
}

/// Activations quantized on the device (`Frame::quantize_acts`), valid for the frame.
#[derive(Clone, Copy)]
pub struct QuantizedActs {
    pub(crate) xq: Bind<'static>,
    pub(crate) xd: Bind<'static>,
    n: usize,
    cols: usize,
}

impl QuantizedActs {
    /// Activations another kernel wrote into frame scratch (`n` rows of `cols`).
    pub(crate) fn from_parts(xq: Bind<'static>, xd: Bind<'static>, n: usize, cols: usize) -> QuantizedActs {
        QuantizedActs { xq, xd, n, cols }
    }

    /// Activation rows.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

const GEMM_BO: usize = 64;
const GEMM_BR: usize = 32;
/// Decode GEMVs of at most this many weight rows split each row over several subgroups
/// (`matvec.comp`'s `ksplit`).
const KSPLIT_ROWS: usize = 512;
/// The cooperative GEMM's tile: weight rows x activation rows per workgroup.
const COOP_BO: usize = 64;
const COOP_BR: usize = 64;
const MAX_GROUPS: usize = 65535;
/// `MatmulPath::Auto` takes the GEMV past `gemv_rows` for a matrix of at most `NARROW_ROWS`
/// rows of at least `NARROW_COLS` columns (a router's) whose f32 tiles would be fewer than
/// `FEW_TILES` workgroups.
const NARROW_ROWS: usize = 256;
const NARROW_COLS: usize = 1024;
const FEW_TILES: usize = 64;

/// One product's operands as `matmul_full` takes them: the input (and its transform), its q8
/// blocks when the caller quantized them already, the rows, the output, the residual to add,
/// the kernel choice and the precision.
struct Product<'a, 'q> {
    input: MatIn<'a>,
    pre: Option<&'q QuantizedActs>,
    n: usize,
    out: View<'a>,
    residual: Option<View<'a>>,
    path: MatmulPath,
    precision: Precision,
    /// Floats from one output row to the next (0: the matrix's rows, packed).
    stride: usize,
}

impl<'a> Frame<'a> {
    /// `out[n x rows] = x[n x cols] * W^T`; reference `format::matmul` (`Precision::Fast`).
    pub fn matmul(&mut self, w: &'a DeviceMatrix, x: View<'a>, n: usize, out: View<'a>) -> Result<()> {
        self.matmul_with(w, x, n, out, MatmulPath::Auto, Precision::Fast)
    }

    /// `matmul` with the kernel and the precision chosen by the caller; reference
    /// `cpu::linear::linear(.., precision)`.
    pub fn matmul_with(
        &mut self,
        w: &'a DeviceMatrix,
        x: View<'a>,
        n: usize,
        out: View<'a>,
        path: MatmulPath,
        precision: Precision,
    ) -> Result<()> {
        let input = MatIn::Plain(x);
        self.matmul_full(w, Product { input, pre: None, n, out, residual: None, path, precision, stride: 0 })
    }

    /// Quantizes `n` rows of `cols` activations to 8 bits per block of 32 once, for several
    /// `matmul_q` calls that share the input (q/k/v, gate/up, experts), as `format::matmul_q`.
    pub fn quantize_acts(&mut self, x: View<'a>, n: usize, cols: usize) -> Result<QuantizedActs> {
        self.quantize_input(MatIn::Plain(x), n, cols)
    }

    /// `quantize_acts` of a fused input (`MatIn`): the q8 blocks of the normed row or of the
    /// gated unit, computed in one dispatch (`quantize_rows.comp`, an invocation per element).
    pub fn quantize_input(&mut self, input: MatIn<'a>, n: usize, cols: usize) -> Result<QuantizedActs> {
        const OP: &str = "quantize";
        if !cols.is_multiple_of(32) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{cols} columns are not a whole number of 32-blocks"),
            });
        }
        input.check(OP, n, cols)?;
        let blocks = n * cols / 32;
        let (xq, xd) = (self.scratch(blocks * 8)?, self.scratch(blocks * 2)?);
        let (xq, xd) = (self.scratch_bind(xq), self.scratch_bind(xd));
        let (mode, aux, p0, p1) = input.mode();
        let x = input.base();
        let push = QuantizeRowsPush {
            rows: u32_arg(OP, "rows", n)?,
            cols: u32_arg(OP, "cols", cols)?,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            in_mode: mode,
            aux_off: u32_arg(OP, "aux offset", aux.map_or(0, |a| a.offset))?,
            p0,
            p1,
            pad: 0,
        };
        let binds = [Bind::buf(x.buf), xq, xd, aux.map_or(Bind::UNUSED, |a| Bind::buf(a.buf))];
        if n > MAX_GROUPS {
            return Err(VkError::BadArgument { op: OP, msg: format!("{n} rows exceed one dispatch") });
        }
        self.dispatch(Kernel::QuantizeRows, None, &binds, &push, [groups_for(cols / 32, 8), n as u32, 1])?;
        Ok(QuantizedActs { xq, xd, n, cols })
    }

    /// `out = residual + input W^T` (`residual` absent: `input W^T`), the input transform and
    /// the residual add fused into the product's kernels; reference: the CPU's ops one after
    /// another (`rms_norm` or `glu`, `linear(.., precision)`, the `Add`). `residual` may be
    /// `out` itself (an in-place residual stream); `out` must not overlap the inputs.
    // Seven operands, each a different type that the schedule's call site names, in the order
    // of the CPU's ops; a struct would only repeat the names.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_fused(
        &mut self,
        w: &'a DeviceMatrix,
        input: MatIn<'a>,
        n: usize,
        out: View<'a>,
        residual: Option<View<'a>>,
        path: MatmulPath,
        precision: Precision,
    ) -> Result<()> {
        self.matmul_full(w, Product { input, pre: None, n, out, residual, path, precision, stride: 0 })
    }

    /// `matmul_q` with a fused input (the one `q` was quantized from, for the float formats
    /// that read it directly) and residual.
    pub fn matmul_q_fused(
        &mut self,
        w: &'a DeviceMatrix,
        input: MatIn<'a>,
        q: &QuantizedActs,
        out: View<'a>,
        residual: Option<View<'a>>,
        path: MatmulPath,
    ) -> Result<()> {
        if q.cols != w.cols {
            return Err(VkError::BadArgument {
                op: "matmul",
                msg: format!("activations of {} columns for a matrix of {}", q.cols, w.cols),
            });
        }
        let n = q.n;
        self.matmul_full(
            w,
            Product { input, pre: Some(q), n, out, residual, path, precision: Precision::Fast, stride: 0 },
        )
    }

    /// `matmul` (`Precision::Fast`) with the activations quantized already (`quantize_acts`
    /// of the same `x`): integer formats agree with `format::matmul_q`; float formats read
    /// `x` in f32, as `format::matmul` does (the CPU's `matmul_q` would take the q8 values).
    pub fn matmul_q(
        &mut self,
        w: &'a DeviceMatrix,
        x: View<'a>,
        q: &QuantizedActs,
        out: View<'a>,
        path: MatmulPath,
    ) -> Result<()> {
        if q.cols != w.cols {
            return Err(VkError::BadArgument {
                op: "matmul",
                msg: format!("activations of {} columns for a matrix of {}", q.cols, w.cols),
            });
        }
        let (input, n) = (MatIn::Plain(x), q.n);
        let p = Product { input, pre: Some(q), n, out, residual: None, path, precision: Precision::Fast, stride: 0 };
        self.matmul_full(w, p)
    }

    /// `matmul_with` storing output row `i` at `i * stride` of `out` (`stride >= rows`): a
    /// block of the columns of wider rows (a grouped product's group).
    pub fn matmul_strided(
        &mut self,
        w: &'a DeviceMatrix,
        x: View<'a>,
        n: usize,
        (out, stride): (View<'a>, usize),
        precision: Precision,
    ) -> Result<()> {
        if stride < w.rows {
            return Err(VkError::BadArgument {
                op: "matmul",
                msg: format!("an output stride of {stride} for rows of {}", w.rows),
            });
        }
        let (input, path) = (MatIn::Plain(x), MatmulPath::Auto);
        self.matmul_full(w, Product { input, pre: None, n, out, residual: None, path, precision, stride })
    }

    fn matmul_full(&mut self, w: &'a DeviceMatrix, p: Product<'a, '_>) -> Result<()> {
        let Product { input, pre, n, out, residual, path, precision, stride } = p;
        const OP: &str = "matmul";
        input.check(OP, n, w.cols)?;
        let stride = if stride == 0 { w.rows } else { stride };
        out.check(OP, "out (n x rows)", (n * stride).saturating_sub(stride - w.rows))?;
        if let Some(r) = residual {
            r.check(OP, "residual (n x rows)", n * w.rows)?;
        }
        let fused = !matches!(input, MatIn::Plain(_)) || residual.is_some();
        if fused && input.reads().iter().flatten().any(|v| same_range(v, &out)) {
            return Err(VkError::BadArgument { op: OP, msg: "a fused product's output overlaps its input".into() });
        }
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        let x = input.base();
        let variant = if precision == Precision::Exact { w.variant.exact() } else { w.variant };
        // A router's matrix (a few hundred rows of long ones) on the f32 tiles is a handful of
        // workgroups each walking the whole row: one workgroup a row on the GEMV keeps more of
        // the device busy (OLMoE's, 64 rows of a 64-stream step: 223 us a call on the tiles).
        let router_like = w.rows <= NARROW_ROWS
            && w.cols >= NARROW_COLS
            && !self.coop_i8(variant, n)
            && groups_for(w.rows, GEMM_BO) as usize * n.div_ceil(GEMM_BR) < FEW_TILES;
        let gemm = match path {
            MatmulPath::Auto => n > self.ctx.gemv_rows() && !router_like,
            MatmulPath::Gemv => false,
            MatmulPath::Gemm => true,
        };
        let (rows, cols) = (u32_arg(OP, "rows", w.rows)?, u32_arg(OP, "cols", w.cols)?);
        // Integer formats: quantize the activations once (blocks of 32) into scratch.
        let (xq, xd) = if variant.q8_acts() {
            let q = match pre {
                Some(q) => *q,
                None => self.quantize_input(input, n, w.cols)?,
            };
            (q.xq, q.xd)
        } else {
            (Bind::UNUSED, Bind::UNUSED)
        };
        // q8 activations carry the input transform already.
        let (mode, aux, p0, p1) = if variant.q8_acts() { (0, None, 0.0, 0.0) } else { input.mode() };
        let aux_off = u32_arg(OP, "aux offset", aux.map_or(0, |a| a.offset))?;
        let res_off = u32_arg(OP, "residual offset", residual.map_or(0, |r| r.offset))?;
        let push = MatmulPush {
            rows,
            cols,
            qs: u32_arg(OP, "row units", w.qs)?,
            ss: u32_arg(OP, "row scales", w.ss)?,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            out_stride: u32_arg(OP, "out stride", stride)?,
            n: u32_arg(OP, "n", n)?,
            in_mode: mode,
            aux_off,
            p0,
            p1,
            res_on: residual.is_some() as u32,
            res_off,
            pad0: 0,
            pad1: 0,
        };
        let binds = [
            Bind::buf(&w.q),
            Bind::buf(&w.s),
            Bind::buf(x.buf),
            xq,
            xd,
            Bind::buf(out.buf),
            aux.map_or(Bind::UNUSED, |a| Bind::buf(a.buf)),
            residual.map_or(Bind::UNUSED, |r| Bind::buf(r.buf)),
        ];
        self.hint(match (mode, residual.is_some()) {
            (0, false) => "",
            (0, true) => "+res",
            (1, false) => "norm",
            (1, true) => "norm+res",
            (_, false) => "glu",
            (_, true) => "glu+res",
        });
        let coop = gemm && self.coop_i8(variant, n);
        let variant = Some(variant);
        if coop {
            let gy = n.div_ceil(COOP_BR);
            if gy > MAX_GROUPS {
                return Err(VkError::BadArgument { op: OP, msg: format!("{n} rows exceed one dispatch") });
            }
            self.dispatch(
                Kernel::MatmulCoop,
                variant,
                &binds,
                &push,
                [groups_for(w.rows, COOP_BO).min(MAX_GROUPS as u32), gy as u32, 1],
            )
        } else if gemm {
            let gy = n.div_ceil(GEMM_BR);
            if gy > MAX_GROUPS {
                return Err(VkError::BadArgument { op: OP, msg: format!("{n} rows exceed one dispatch") });
            }
            self.dispatch(
                Kernel::Matmul,
                variant,
                &binds,
                &push,
                [groups_for(w.rows, GEMM_BO).min(MAX_GROUPS as u32), gy as u32, 1],
            )
        } else {
            if n > MAX_GROUPS {
                return Err(VkError::BadArgument { op: OP, msg: format!("{n} rows exceed one dispatch") });
            }
            let wg = self.device_workgroup(Kernel::Matvec, variant)? as usize;
            let per = (wg / self.ctx.caps().min_subgroup_size.max(1) as usize).max(1);
            // Few rows (a router's): subgroups share a row, so more of the device reads it.
            let ks = if w.rows <= KSPLIT_ROWS { per.min(4) } else { 1 };
            let p = push;
            let push = MatvecPush {
                rows: p.rows,
                cols: p.cols,
                qs: p.qs,
                ss: p.ss,
                x_off: p.x_off,
                out_off: p.out_off,
                out_stride: p.out_stride,
                n: p.n,
                in_mode: p.in_mode,
                aux_off: p.aux_off,
                p0: p.p0,
                p1: p.p1,
                res_on: p.res_on,
                res_off: p.res_off,
                ksplit: ks as u32,
                pad1: 0,
            };
            self.dispatch(
                Kernel::Matvec,
                variant,
                &binds,
                &push,
                [groups_for(w.rows, (per / ks).max(1)).min(MAX_GROUPS as u32), n as u32, 1],
            )
        }
    }

    /// `out[i] = scale * table[tokens[i]]` for `n` tokens; reference: the CPU's `Embed`
    /// (`dequant_row`, then the scale when it is not 1). Token ids past the table give zeros;
    /// `Context::upload_tokens` checks them on the host.
    pub fn embed(
        &mut self,
        table: &'a DeviceMatrix,
        tokens: View<'a>,
        n: usize,
        scale: f32,
        out: View<'a>,
    ) -> Result<()> {
        const OP: &str = "embed";
        tokens.check(OP, "tokens", n)?;
        out.check(OP, "out (n x cols)", n * table.cols)?;
        if n > MAX_GROUPS {
            return Err(VkError::BadArgument { op: OP, msg: format!("{n} tokens exceed one dispatch") });
        }
        let push = EmbedPush {
            rows: u32_arg(OP, "rows", table.rows)?,
            cols: u32_arg(OP, "cols", table.cols)?,
            qs: table.qs as u32,
            ss: table.ss as u32,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            scale,
            pad0: 0,
            pad1: 0,
        };
        // The tokens are read from element `tokens.offset`: bind through a shifted push.
        if tokens.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "token views must start at element 0".into() });
        }
        let binds = [Bind::buf(&table.q), Bind::buf(&table.s), Bind::buf(tokens.buf), Bind::buf(out.buf)];
        self.dispatch(Kernel::Embed, Some(table.variant), &binds, &push, [n as u32, 1, 1])
    }
}

impl Context {
    /// Token ids checked against the vocabulary and uploaded for `Frame::embed`.
    pub fn upload_tokens(&self, tokens: &[u32], vocab: usize) -> Result<DeviceBuffer> {
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(VkError::BadArgument {
                op: "embed",
                msg: format!("token id {id} is outside the vocabulary of {vocab}"),
            });
        }
        let b = self.buffer(MemoryUse::Device, tokens.len().max(1) * 4)?;
        self.write(&b, 0, crate::bytes::as_bytes(tokens))?;
        Ok(b)
    }
}
