//! Routed experts inside a frame: `out[r] = sum over ranks k of w[r,k] * down_e(glu(gate_e x[r],
//! up_e x[r]))`, where `e` and `w` come from the routing buffer `Route` wrote on the device, so
//! nothing goes back to the host. Reference: `cpu::experts::routed_experts` (same matrices,
//! same activation quantization per precision, each pair's output added to its row in rank
//! order from zero).
//!
//! A layer's experts go up once (`Context::upload_experts`), stacked per role: gate and up of
//! every expert in one matrix (expert e's gate rows, then its up rows), down in another, in
//! the device layout of `layout.rs` (every format the GEMV reads). Two paths:
//! - few rows (decode): per pair a GEMV of its expert (`moe_matvec.comp`): gate, up and the
//!   gated unit in one dispatch over (output rows, pairs), then down and the rank-ordered sum in
//!   one over (output rows, rows). With q8 activations: a quantization before each.
//! - several rows (a batched decode step of several sequences): the pairs grouped by expert
//!   (`moe_group.comp`), then the same GEMVs over (output rows, experts), each expert's weights
//!   read once for up to 8 of its pairs, and the sum (`moe_sum.comp`).
//! - a prompt chunk: pairs grouped by expert on the device (`moe_group.comp`), a tiled GEMM
//!   per expert over its pairs (`moe_matmul.comp`) for gate/up and for down, then the sum
//!   (`moe_sum.comp`). Experts of a format with q8 activations take the cooperative-matrix GEMM
//!   (`moe_matmul_coop.comp`) instead where the device has an int8 shape, from `COOP_MIN_ROWS`
//!   rows; its gate/up stores the raw sums of the stacked gate and up rows (in the scratch's
//!   `gu`), and `moe_glu_q8.comp` (`moe_glu.rs`) makes the gated unit and its 8-bit blocks for down (an ffn
//!   that is not whole blocks of 32 takes the tiled gate/up).
//!
//! Scratch (`MoeScratch`) is the caller's, sized once for the largest chunk and reused by
//! every layer (the frame's hazard tracking orders the reuse).
//!
//! Must not: read an expert id on the host, or accept operands that do not fit (typed errors).

use super::matmul::MatIn;
use super::moe_glu::{glu_args, MoeGluQ8};
use super::moe_scratch::MoeScratch;
use super::{groups_for, u32_arg};
use crate::bytes::as_bytes;
use crate::cpu::experts::ExpertMats;
use crate::cpu::Precision;
use crate::format::WeightFormat;
use crate::vk::context::{Context, DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::{pack, DeviceMatrix, Packed};
use crate::vk::memory::MemoryUse;
use crate::vk::push::{MoeGroupPush, MoeMatmulPush, MoeMatvecPush, MoeSumPush, QuantizeQ8Push};
use crate::vk::shaders::{FormatVariant, Kernel};
use coli_compiler::ir::GluKind;

/// What every routed-experts call (`Frame::moe`, `moe_fused`, `moe_pairs`) takes besides its
/// activations: the layer's experts and the scratch, the rows and ranks, the gated unit, the
/// precision and the kernel path.
#[derive(Clone, Copy)]
pub struct MoeCall<'a> {
    pub experts: &'a DeviceExperts,
    pub scratch: &'a MoeScratch,
    /// Activation rows.
    pub n: usize,
    /// Ranks a row (the tier's slots may be fewer than the model's top-k).
    pub top_k: usize,
    pub glu: GluKind,
    pub precision: Precision,
    pub path: MoePath,
}

/// A router's output that a routed-experts call routes itself (`Frame::moe_paged_routed`):
/// each row's `experts` logits, the correction bias and the `Route` op's options (no hash
/// table, no shared experts).
#[derive(Clone, Copy, Debug)]
pub struct MoeRoute<'a> {
    pub logits: View<'a>,
    pub bias: Option<View<'a>>,
    pub params: super::route::RouteParams,
}

/// Which kernels `Frame::moe` records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MoePath {
    /// Per-pair GEMVs up to `Context::moe_pair_rows` rows, per-expert GEMVs up to
    /// `Context::moe_gemv_rows`, grouped GEMMs from there.
    #[default]
    Auto,
    /// Per-pair GEMVs whatever the row count.
    Gemv,
    /// Per-expert GEMVs over the pairs grouped by expert, whatever the row count.
    ExpertGemv,
    /// Grouped GEMMs whatever the row count.
    Grouped,
}

/// How one call computes its pairs (from `MoePath` and the row count).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// A GEMV per (row, rank) pair.
    Pairs,
    /// The pairs grouped by expert, a GEMV per expert over its pairs.
    ByExpert,
    /// The pairs grouped by expert, a tiled GEMM per expert.
    Gemm,
}

/// The most experts a layer may have (the grouping kernel's shared arrays).
pub const MAX_EXPERTS: usize = 1024;
/// The most ranks a row may have.
pub const MAX_TOP_K: usize = 64;
const NONE: u32 = u32::MAX;
const GEMM_BO: usize = 64;
const GEMM_BR: usize = 32;
/// The cooperative GEMM's tile: weight rows x pairs per workgroup (gate and up: half of the
/// rows are outputs, the other half their up rows).
const COOP_BO: usize = 64;
const COOP_BR: usize = 64;
const MAX_GROUPS: usize = 65535;

/// One layer's routed experts on the device.
#[derive(Debug)]
pub struct DeviceExperts {
    pub experts: usize,
    pub ffn: usize,
    pub hidden: usize,
    /// `experts * 2 * ffn` rows of `hidden`: expert e's gate rows, then its up rows.
    gate_up: DeviceMatrix,
    /// `experts * hidden` rows of `ffn`.
    down: DeviceMatrix,
    /// f32 biases (gpt-oss): `experts * 2 * ffn` for gate/up as their rows, then
    /// `experts * hidden` for down.
    bias: Option<DeviceBuffer>,
    /// Per role (gate/up, down): format, rows, cols, bytes of values and of scales of one
    /// matrix, what every expert written into a slot must have.
    units: [(WeightFormat, usize, usize, usize, usize); 2],
}

impl DeviceExperts {
    /// Device bytes the experts take.
    pub fn device_bytes(&self) -> usize {
        self.gate_up.device_bytes() + self.down.device_bytes() + self.bias.as_ref().map_or(0, |b| b.len_bytes())
    }

    /// Whether the slots hold biases (every expert written needs them, zeros where it has none).
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Whether an expert of these matrices can be written into these slots.
    pub fn holds(&self, m: &ExpertMats) -> bool {
        let [(fg, f, h, _, _), (fd, _, _, _, _)] = self.units;
        let has_bias = m.gate_bias.is_some() || m.up_bias.is_some() || m.down_bias.is_some();
        (m.gate.format, m.gate.rows, m.gate.cols) == (fg, f, h)
            && (m.up.format, m.up.rows, m.up.cols) == (fg, f, h)
            && (m.down.format, m.down.rows, m.down.cols) == (fd, h, f)
            && (!has_bias || self.bias.is_some())
    }
}

/// One expert packed in the device layout, ready to be written into a slot (packing is CPU
/// work; writing is a copy).
pub struct PackedExpert {
    gate: Packed,
    up: Packed,
    down: Packed,
    /// gate, up, down biases (zeros where the expert has none), when the slots have biases.
    bias: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

impl PackedExpert {
    /// Bytes the packed expert takes on the device.
    pub fn bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down].iter().map(|p| p.q.len() + p.s.len()).sum()
    }
}

impl Context {
    /// Packs one expert's matrices (as the CPU reads them) for `write_expert`.
    pub fn pack_expert(m: &ExpertMats, with_bias: bool) -> Result<PackedExpert> {
        let p = |w: &crate::format::Matrix| pack(w.format, w.rows, w.cols, w.bytes());
        let bias = with_bias.then(|| {
            let v = |b: Option<&[f32]>, n: usize| b.map_or_else(|| vec![0.0; n], <[f32]>::to_vec);
            (v(m.gate_bias, m.gate.rows), v(m.up_bias, m.up.rows), v(m.down_bias, m.down.rows))
        });
        Ok(PackedExpert { gate: p(&m.gate)?, up: p(&m.up)?, down: p(&m.down)?, bias })
    }

    /// Device slots for `slots` experts shaped like `like` (gate and up share a format and
    /// shape, as do the downs), stacked per role; contents undefined until `write_expert`.
    pub fn expert_slots(&self, slots: usize, like: &ExpertMats) -> Result<DeviceExperts> {
        self.expert_slots_in(slots, like, MemoryUse::Device)
    }

    /// `expert_slots` in memory of `usage` (the tier's host pool: `MemoryUse::Pool` or
    /// `PoolImport`; the kernels read them where they lie).
    pub fn expert_slots_in(&self, slots: usize, like: &ExpertMats, usage: MemoryUse) -> Result<DeviceExperts> {
        const OP: &str = "expert_slots";
        if slots == 0 || slots > MAX_EXPERTS {
            return Err(VkError::BadArgument { op: OP, msg: format!("{slots} experts (at most {MAX_EXPERTS})") });
        }
        let (ffn, hidden) = (like.gate.rows, like.gate.cols);
        let has_bias = like.gate_bias.is_some() || like.up_bias.is_some() || like.down_bias.is_some();
        let g = pack(like.gate.format, like.gate.rows, like.gate.cols, like.gate.bytes())?;
        let d = pack(like.down.format, like.down.rows, like.down.cols, like.down.bytes())?;
        let gate_up = DeviceMatrix {
            format: like.gate.format,
            variant: g.variant,
            rows: slots * 2 * ffn,
            cols: hidden,
            qs: g.qs,
            ss: g.ss,
            q: self.buffer(usage, g.q.len() * 2 * slots)?,
            s: self.buffer(usage, (g.s.len() * 2 * slots).max(16))?,
        };
        let down = DeviceMatrix {
            format: like.down.format,
            variant: d.variant,
            rows: slots * hidden,
            cols: ffn,
            qs: d.qs,
            ss: d.ss,
            q: self.buffer(usage, d.q.len() * slots)?,
            s: self.buffer(usage, (d.s.len() * slots).max(16))?,
        };
        let bias = if has_bias { Some(self.buffer(usage, slots * (2 * ffn + hidden) * 4)?) } else { None };
        let units = [
            (like.gate.format, ffn, hidden, g.q.len(), g.s.len()),
            (like.down.format, hidden, ffn, d.q.len(), d.s.len()),
        ];
        Ok(DeviceExperts { experts: slots, ffn, hidden, gate_up, down, bias, units })
    }

    /// Writes a packed expert into slot `slot` of `d`; its shapes and formats must be the
    /// slots' own.
    pub fn write_expert(&self, d: &DeviceExperts, slot: usize, p: &PackedExpert) -> Result<()> {
        const OP: &str = "write_expert";
        let [(_, _, _, gq, gs), (_, _, _, dq, ds)] = d.units;
        let fits = |x: &Packed, q: usize, s: usize| x.q.len() == q && x.s.len() == s;
        if slot >= d.experts
            || !fits(&p.gate, gq, gs)
            || !fits(&p.up, gq, gs)
            || !fits(&p.down, dq, ds)
            || p.bias.is_some() != d.bias.is_some()
        {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "slot {slot} of {}: the expert's shape, format or biases differ from the slots'",
                    d.experts
                ),
            });
        }
        self.write(&d.gate_up.q, 2 * slot * gq, &p.gate.q)?;
        self.write(&d.gate_up.q, (2 * slot + 1) * gq, &p.up.q)?;
        self.write(&d.down.q, slot * dq, &p.down.q)?;
        if gs > 0 {
            self.write(&d.gate_up.s, 2 * slot * gs, &p.gate.s)?;
            self.write(&d.gate_up.s, (2 * slot + 1) * gs, &p.up.s)?;
        }
        if ds > 0 {
            self.write(&d.down.s, slot * ds, &p.down.s)?;
        }
        if let (Some(b), Some((gb, ub, db))) = (&d.bias, &p.bias) {
            let (f, h) = (d.ffn, d.hidden);
            if gb.len() != f || ub.len() != f || db.len() != h {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: format!("biases of {}, {}, {} entries for {f}, {f}, {h} rows", gb.len(), ub.len(), db.len()),
                });
            }
            self.write(b, slot * 2 * f * 4, as_bytes(gb))?;
            self.write(b, (slot * 2 * f + f) * 4, as_bytes(ub))?;
            self.write(b, (d.experts * 2 * f + slot * h) * 4, as_bytes(db))?;
        }
        Ok(())
    }

    /// Uploads a layer's `experts` experts (`expert(e)`: its matrices, as the CPU reads them)
    /// into slots 0..experts. Every expert's gate and up must share a format and shape, and so
    /// must every expert's down.
    pub fn upload_experts<'m>(
        &self,
        experts: usize,
        expert: &dyn Fn(usize) -> ExpertMats<'m>,
    ) -> Result<DeviceExperts> {
        if experts == 0 || experts > MAX_EXPERTS {
            return Err(VkError::BadArgument {
                op: "upload_experts",
                msg: format!("{experts} experts (at most {MAX_EXPERTS})"),
            });
        }
        let first = expert(0);
        let d = self.expert_slots(experts, &first)?;
        let (fgu, fd) = (first.gate.format, first.down.format);
        let (ffn, hidden) = (d.ffn, d.hidden);
        for e in 0..experts {
            let m = expert(e);
            let shapes = [
                (m.gate.format, m.gate.rows, m.gate.cols),
                (m.up.format, m.up.rows, m.up.cols),
                (m.down.format, m.down.rows, m.down.cols),
            ];
            if shapes != [(fgu, ffn, hidden), (fgu, ffn, hidden), (fd, hidden, ffn)] {
                return Err(VkError::BadArgument {
                    op: "upload_experts",
                    msg: format!("expert {e}: gate, up, down are {shapes:?}; expected {fgu} {ffn}x{hidden} (gate, up) and {fd} {hidden}x{ffn} (down) like expert 0"),
                });
            }
            self.write_expert(&d, e, &Self::pack_expert(&m, d.bias.is_some())?)?;
        }
        Ok(d)
    }
}

impl<'a> Frame<'a> {
    /// Quantizes `n` rows of `cols` (from element `off` of `x`) into `q`/`d` (`quantize_q8.comp`).
    fn moe_quantize(
        &mut self,
        x: &'a DeviceBuffer,
        off: usize,
        n: usize,
        cols: usize,
        q: &'a DeviceBuffer,
        d: &'a DeviceBuffer,
    ) -> Result<()> {
        const OP: &str = "moe";
        let blocks = n * cols / 32;
        let push = QuantizeQ8Push {
            blocks: u32_arg(OP, "blocks", blocks)?,
            cols: u32_arg(OP, "cols", cols)?,
            x_off: u32_arg(OP, "x offset", off)?,
            pad: 0,
        };
        self.dispatch(
            Kernel::QuantizeQ8,
            None,
            &[Bind::buf(x), Bind::buf(q), Bind::buf(d)],
            &push,
            [groups_for(blocks, 64), 1, 1],
        )
    }

    /// `out[n x hidden] = sum_k w[r,k] * expert_{e[r,k]}(x[r])` over the routing `routing`
    /// (`n x 2 * top_k`: expert as f32, weight) that a `route` in this frame (or an upload)
    /// wrote; reference `cpu::experts::routed_experts(.., precision, ..)`.
    pub fn moe(&mut self, c: MoeCall<'a>, x: View<'a>, routing: View<'a>, out: View<'a>) -> Result<()> {
        self.moe_with(c, MatIn::Plain(x), None, (routing, None), out, true)
    }

    /// `moe` with its input transformed as it is read (`MatIn::Norm`: a norm absorbed by the
    /// experts' quantization; only for experts with 8-bit activations at `Precision::Fast`)
    /// and, with `residual`, `out = residual + the sum` (the residual Add folded into the
    /// store; `residual` may be `out` itself).
    pub fn moe_fused(
        &mut self,
        c: MoeCall<'a>,
        input: MatIn<'a>,
        residual: Option<View<'a>>,
        routing: View<'a>,
        out: View<'a>,
    ) -> Result<()> {
        self.moe_with(c, input, residual, (routing, None), out, true)
    }

    /// Whether `moe_fused` takes a `MatIn::Norm` input for these experts at `precision`.
    pub fn moe_takes_norm(ex: &DeviceExperts, precision: Precision) -> bool {
        precision == Precision::Fast && ex.gate_up.variant.q8_acts()
    }

    /// The pairs' expert outputs, not weighted and not summed: `y[(r*K + k) x hidden] =
    /// expert_{e[r,k]}(x[r])` for every pair whose expert id is valid (other pairs' rows are
    /// left as they were). The expert tier's batches: the host joins each pair to its row in
    /// rank order, beside the pairs the CPU computed.
    pub fn moe_pairs(&mut self, c: MoeCall<'a>, x: View<'a>, routing: View<'a>, y: View<'a>) -> Result<()> {
        self.moe_with(c, MatIn::Plain(x), None, (routing, None), y, false)
    }

    /// The routed experts' kernels; with `route`, the per-pair GEMVs route each row themselves
    /// (the caller checked `routes_in_experts`) and write the pairs into `routing`.
    pub(super) fn moe_with(
        &mut self,
        c: MoeCall<'a>,
        input: MatIn<'a>,
        residual: Option<View<'a>>,
        (routing, route): (View<'a>, Option<MoeRoute<'a>>),
        out: View<'a>,
        sum: bool,
    ) -> Result<()> {
        let MoeCall { experts: ex, scratch: s, n, top_k, glu, precision, path } = c;
        const OP: &str = "moe";
        let x = input.base();
        let (hid, ffn, e) = (ex.hidden, ex.ffn, ex.experts);
        match input {
            MatIn::Plain(_) => {}
            MatIn::Norm { .. } if Self::moe_takes_norm(ex, precision) => {}
            _ => {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: "the experts take a norm only into 8-bit activations".into(),
                })
            }
        }
        if let Some(r) = residual {
            if !sum {
                return Err(VkError::BadArgument { op: OP, msg: "a residual needs the summed output".into() });
            }
            r.check(OP, "residual (n x hidden)", n * hid)?;
        }
        // Slots of the tier (`!sum`) may be fewer than a row's ranks.
        if top_k == 0 || top_k > MAX_TOP_K || (sum && top_k > e) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("top {top_k} of {e} experts (at most {MAX_TOP_K})"),
            });
        }
        if n > s.rows || top_k > s.top_k || hid > s.hidden || ffn > s.ffn || e > s.experts {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "{n} rows, top {top_k}, {hid}x{ffn}, {e} experts exceed the scratch ({} rows, top {}, {}x{}, {})",
                    s.rows, s.top_k, s.hidden, s.ffn, s.experts
                ),
            });
        }
        x.check(OP, "x (n x hidden)", n * hid)?;
        routing.check(OP, "routing (n x 2 top_k)", n * 2 * top_k)?;
        if sum {
            out.check(OP, "out (n x hidden)", n * hid)?;
        } else {
            out.check(OP, "y (n top_k x hidden)", n * top_k * hid)?;
        }
        if n == 0 {
            return Ok(());
        }
        let exact = |v: FormatVariant| if precision == Precision::Exact { v.exact() } else { v };
        let (gv, dv) = (exact(ex.gate_up.variant), exact(ex.down.variant));
        let way = self.moe_way(path, n);
        if route.is_some() && (way != Way::Pairs || !sum) {
            return Err(VkError::BadArgument { op: OP, msg: "only per-pair GEMVs route their rows".into() });
        }
        let (gemv, by_expert) = (way != Way::Gemm, way == Way::ByExpert);
        let pairs = n * top_k;
        if (gemv && pairs > MAX_GROUPS) || (!gemv && n.div_ceil(GEMM_BR) > MAX_GROUPS) {
            return Err(VkError::BadArgument { op: OP, msg: format!("{n} rows exceed one dispatch") });
        }
        let (glu_kind, limit, alpha) = glu_args(glu)?;
        let bias = ex.bias.as_ref().map_or(Bind::UNUSED, Bind::buf);
        let (gb, db) = if ex.bias.is_some() { (0u32, u32_arg(OP, "bias offset", e * 2 * ffn)?) } else { (NONE, NONE) };
        let (r_off, x_off, o_off) = (
            u32_arg(OP, "routing offset", routing.offset)?,
            u32_arg(OP, "x offset", x.offset)?,
            u32_arg(OP, "out offset", out.offset)?,
        );
        let (k32, e32) = (top_k as u32, e as u32);
        // 0. The pairs grouped by expert, for every way but a GEMV per pair.
        if way != Way::Pairs {
            let push = MoeGroupPush { n: n as u32, top_k: k32, experts: e32, r_off };
            self.dispatch(Kernel::MoeGroup, None, &[Bind::buf(routing.buf), Bind::buf(&s.groups)], &push, [1, 1, 1])?;
        }
        // 1. Gate and up, the gated unit into h (pairs x ffn).
        let (xq, xd) = if gv.q8_acts() {
            if let MatIn::Norm { .. } = input {
                let q = self.quantize_input(input, n, hid)?;
                (q.xq, q.xd)
            } else {
                self.moe_quantize(x.buf, x.offset, n, hid, &s.xq, &s.xd)?;
                (Bind::buf(&s.xq), Bind::buf(&s.xd))
            }
        } else {
            (Bind::UNUSED, Bind::UNUSED)
        };
        let gu = &ex.gate_up;
        let (gqs, gss) = (u32_arg(OP, "row units", gu.qs)?, u32_arg(OP, "row scales", gu.ss)?);
        let (f32_, h32) = (ffn as u32, hid as u32);
        // Whether h's 8-bit blocks came with the gated unit (`moe_glu_q8.comp`).
        let mut glu_quantized = false;
        if gemv {
            let per = self.rows_per_group(gv)?;
            // h's 8-bit blocks made by the per-pair GEMV: the subgroup that writes a block's
            // last value quantizes the block (a count a block), so no `QuantizeQ8` dispatch and
            // its barrier sit between the two GEMVs (H100, OLMoE Q8_0 tg128: +1.5%).
            let hq_on = !by_expert && dv.q8_acts() && ffn.is_multiple_of(32);
            let push = MoeMatvecPush {
                rows: f32_,
                cols: h32,
                qs: gqs,
                ss: gss,
                x_off,
                out_off: 0,
                r_off,
                top_k: k32,
                experts: e32,
                mode: if by_expert { 3 } else { 0 },
                glu: glu_kind,
                limit,
                alpha,
                bias_off: gb,
                res_on: 0,
                res_off: 0,
                route: 0,
                l_off: 0,
                rscale: 0.0,
                hq_on: hq_on as u32,
            };
            let (push, made) = match route {
                Some(m) => {
                    let (route, l_off, rscale) = super::route::route_bits(OP, m.logits, m.bias, (n, e), &m.params)?;
                    let made = [
                        Bind::buf(routing.buf),
                        Bind::buf(m.logits.buf),
                        m.bias.map_or(Bind::UNUSED, |b| Bind::buf(b.buf)),
                    ];
                    (MoeMatvecPush { route, l_off, rscale, ..push }, made)
                }
                None => (push, [Bind::UNUSED; 3]),
            };
            let read = if route.is_some() { Bind::UNUSED } else { Bind::buf(routing.buf) };
            let binds = [
                Bind::buf(&gu.q),
                Bind::buf(&gu.s),
                Bind::buf(x.buf),
                xq,
                xd,
                Bind::buf(&s.h),
                read,
                bias,
                Bind::UNUSED,
                Bind::buf(&s.groups),
                made[0],
                made[1],
                made[2],
                if hq_on { Bind::buf(&s.hq) } else { Bind::UNUSED },
                if hq_on { Bind::buf(&s.hd) } else { Bind::UNUSED },
                if hq_on { Bind::buf(&s.h_counts) } else { Bind::UNUSED },
            ];
            let wgs = if by_expert { e } else { pairs };
            self.dispatch(
                Kernel::MoeMatvec,
                Some(gv),
                &binds,
                &push,
                [groups_for(ffn, per).min(MAX_GROUPS as u32), wgs as u32, 1],
            )?;
            glu_quantized = hq_on;
        } else {
            let push = MoeMatmulPush {
                rows: f32_,
                cols: h32,
                qs: gqs,
                ss: gss,
                x_off,
                out_off: 0,
                top_k: k32,
                experts: e32,
                mode: 0,
                glu: glu_kind,
                limit,
                alpha,
                bias_off: gb,
                pad0: 0,
                pad1: 0,
                pad2: 0,
            };
            // On tensor cores: the raw gate and up sums of the stacked 2 ffn rows, then the gated
            // unit and its 8-bit blocks (`moe_glu_q8.comp`); on the tiles, the gated unit in h.
            let raw = self.coop_i8(gv, n) && ffn.is_multiple_of(32);
            let push = if raw { MoeMatmulPush { rows: 2 * f32_, bias_off: NONE, ..push } } else { push };
            let binds = [
                Bind::buf(&gu.q),
                Bind::buf(&gu.s),
                Bind::buf(x.buf),
                xq,
                xd,
                Bind::buf(if raw { &s.gu } else { &s.h }),
                Bind::buf(&s.groups),
                bias,
            ];
            self.moe_matmul(gv, &binds, &push, n, e32, raw)?;
            if raw {
                self.moe_glu_q8(MoeGluQ8 {
                    gu: &s.gu,
                    routing,
                    bias: ex.bias.as_ref(),
                    h: &s.h,
                    hq: &s.hq,
                    hd: &s.hd,
                    pairs,
                    ffn,
                    top_k,
                    experts: e,
                    glu,
                })?;
                glu_quantized = true;
            }
        }
        // 2. Down, and the rank-ordered sum into out.
        let (hq, hd) = if dv.q8_acts() {
            if !glu_quantized {
                self.moe_quantize(&s.h, 0, pairs, ffn, &s.hq, &s.hd)?;
            }
            (Bind::buf(&s.hq), Bind::buf(&s.hd))
        } else {
            (Bind::UNUSED, Bind::UNUSED)
        };
        let dm = &ex.down;
        let (dqs, dss) = (u32_arg(OP, "row units", dm.qs)?, u32_arg(OP, "row scales", dm.ss)?);
        // The down GEMVs' push: h (pairs x ffn) in, `hidden` rows out.
        let down = MoeMatvecPush {
            rows: h32,
            cols: f32_,
            qs: dqs,
            ss: dss,
            x_off: 0,
            out_off: o_off,
            r_off,
            top_k: k32,
            experts: e32,
            mode: 2,
            glu: 0,
            limit: 0.0,
            alpha: 0.0,
            bias_off: db,
            res_on: 0,
            res_off: 0,
            route: 0,
            l_off: 0,
            rscale: 0.0,
            hq_on: 0,
        };
        if way == Way::Pairs {
            let per = self.rows_per_group(dv)?;
            // Mode 1: down and the rank-ordered sum per row; mode 2: down per pair.
            let (mode, wgs) = if sum { (1, n) } else { (2, pairs) };
            let (res_on, res_off) =
                (residual.is_some() as u32, u32_arg(OP, "residual offset", residual.map_or(0, |r| r.offset))?);
            let push = MoeMatvecPush { mode, res_on, res_off, ..down };
            let res = residual.map_or(Bind::UNUSED, |r| Bind::buf(r.buf));
            let binds = [
                Bind::buf(&dm.q),
                Bind::buf(&dm.s),
                Bind::buf(&s.h),
                hq,
                hd,
                Bind::buf(out.buf),
                Bind::buf(routing.buf),
                bias,
                res,
            ];
            self.dispatch(
                Kernel::MoeMatvec,
                Some(dv),
                &binds,
                &push,
                [groups_for(hid, per).min(MAX_GROUPS as u32), wgs as u32, 1],
            )
        } else {
            let (y, y_off) = if sum { (&s.y, 0) } else { (out.buf, o_off) };
            if by_expert {
                // Mode 4: down per pair, an expert's pairs in one pass over its rows.
                let per = self.rows_per_group(dv)?;
                let push = MoeMatvecPush { mode: 4, out_off: y_off, ..down };
                let binds = [
                    Bind::buf(&dm.q),
                    Bind::buf(&dm.s),
                    Bind::buf(&s.h),
                    hq,
                    hd,
                    Bind::buf(y),
                    Bind::buf(routing.buf),
                    bias,
                    Bind::UNUSED,
                    Bind::buf(&s.groups),
                ];
                self.dispatch(
                    Kernel::MoeMatvec,
                    Some(dv),
                    &binds,
                    &push,
                    [groups_for(hid, per).min(MAX_GROUPS as u32), e32, 1],
                )?;
            } else {
                let push = MoeMatmulPush {
                    rows: h32,
                    cols: f32_,
                    qs: dqs,
                    ss: dss,
                    x_off: 0,
                    out_off: y_off,
                    top_k: k32,
                    experts: e32,
                    mode: 1,
                    glu: 0,
                    limit: 0.0,
                    alpha: 0.0,
                    bias_off: db,
                    pad0: 0,
                    pad1: 0,
                    pad2: 0,
                };
                let binds = [
                    Bind::buf(&dm.q),
                    Bind::buf(&dm.s),
                    Bind::buf(&s.h),
                    hq,
                    hd,
                    Bind::buf(y),
                    Bind::buf(&s.groups),
                    bias,
                ];
                let coop = self.coop_i8(dv, n);
                self.moe_matmul(dv, &binds, &push, n, e32, coop)?;
            }
            if !sum {
                return Ok(());
            }
            self.moe_sum(s, (n, hid, top_k, e), routing, residual, out)
        }
    }

    /// The pairs' outputs in the scratch's `y` joined to their rows in rank order
    /// (`moe_sum.comp`): `out = [residual +] sum_k w[r,k] * y[r*K + k]` for `dims` (rows, hidden,
    /// ranks, experts), pairs of invalid experts adding nothing.
    pub(super) fn moe_sum(
        &mut self,
        s: &'a MoeScratch,
        dims: (usize, usize, usize, usize),
        routing: View<'a>,
        residual: Option<View<'a>>,
        out: View<'a>,
    ) -> Result<()> {
        const OP: &str = "moe_sum";
        let (n, hidden, top_k, experts) = dims;
        let push = MoeSumPush {
            n: u32_arg(OP, "n", n)?,
            hidden: u32_arg(OP, "hidden", hidden)?,
            top_k: u32_arg(OP, "top_k", top_k)?,
            experts: u32_arg(OP, "experts", experts)?,
            r_off: u32_arg(OP, "routing offset", routing.offset)?,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            res_on: residual.is_some() as u32,
            res_off: u32_arg(OP, "residual offset", residual.map_or(0, |r| r.offset))?,
        };
        let res = residual.map_or(Bind::UNUSED, |r| Bind::buf(r.buf));
        self.dispatch(
            Kernel::MoeSum,
            None,
            &[Bind::buf(&s.y), Bind::buf(routing.buf), Bind::buf(out.buf), res],
            &push,
            [groups_for(n * hidden, 64), 1, 1],
        )
    }

    /// A grouped expert GEMM of `n` rows into `push.rows` outputs an expert: on int8 tensor cores
    /// (`coop`: the caller has checked `coop_i8`; their gate/up stores raw sums), else the tiled
    /// kernel (its gate/up stores the gated unit).
    fn moe_matmul(
        &mut self,
        v: FormatVariant,
        binds: &[Bind<'a>],
        push: &MoeMatmulPush,
        n: usize,
        experts: u32,
        coop: bool,
    ) -> Result<()> {
        let (kernel, bo, br) =
            if coop { (Kernel::MoeMatmulCoop, COOP_BO, COOP_BR) } else { (Kernel::MoeMatmul, GEMM_BO, GEMM_BR) };
        let groups = [groups_for(push.rows as usize, bo).min(MAX_GROUPS as u32), n.div_ceil(br) as u32, experts];
        self.dispatch(kernel, Some(v), binds, push, groups)
    }

    /// Output rows one workgroup of the per-pair GEMV takes (a subgroup each).
    /// The kernels a call of `n` rows takes on `path`.
    fn moe_way(&self, path: MoePath, n: usize) -> Way {
        match path {
            MoePath::Auto if n <= self.ctx.moe_pair_rows() => Way::Pairs,
            MoePath::Auto if n <= self.ctx.moe_gemv_rows() => Way::ByExpert,
            MoePath::Auto => Way::Gemm,
            MoePath::Gemv => Way::Pairs,
            MoePath::ExpertGemv => Way::ByExpert,
            MoePath::Grouped => Way::Gemm,
        }
    }

    /// Whether a call `c` over `pages` routes its rows itself from `route` (`moe_paged_routed`):
    /// one page, a GEMV per pair for its rows, at most `MAX_E_IN_EXPERTS` experts, the route's
    /// ranks the call's.
    pub(super) fn routes_in_experts(&self, pages: &[DeviceExperts], c: &MoeCall<'a>, route: &MoeRoute<'a>) -> bool {
        matches!(pages, [one] if one.experts <= super::route::MAX_E_IN_EXPERTS)
            && self.moe_way(c.path, c.n) == Way::Pairs
            && route.params.top_k == c.top_k
    }

    fn rows_per_group(&self, v: FormatVariant) -> Result<usize> {
        let wg = self.device_workgroup(Kernel::MoeMatvec, Some(v))? as usize;
        Ok((wg / self.ctx.caps().min_subgroup_size.max(1) as usize).max(1))
    }
}
