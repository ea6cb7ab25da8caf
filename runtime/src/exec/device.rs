//! One device's side of a plan: what the plan's frames on that device read, uploaded; per
//! session, buffers for the row values and the KV mirrors of its layers; and the recording and
//! submission of one of its frames. `exec::chain` runs a plan's frames in order over one of
//! these per device, the host frames on the CPU between them. What crosses is what the plan
//! says: a frame's uploads before it, its downloads after it.
//!
//! Resident experts (the plan's `placement.resident`): a layer whose routing and experts the
//! plan puts in this device's frame has all its experts uploaded at load, stacked per role in
//! pages within the device's buffer range (`Context::upload_expert_pages`), and runs `route`
//! and `moe` in the frame; one scratch serves every such layer.
//!
//! Recording: the frame's calls as the schedule lowered them (`coli_compiler::schedule`: a norm
//! or gated unit into the product that reads it, the residual add into the product's store,
//! RoPE and the KV append into one kernel before attention). A frame the schedule marks
//! replayable is recorded once and replayed at every decode step (`device::replay`): a one-row
//! forward's per session, a batched decode step's (one row of each of several sessions) for
//! those sessions in that order; its kernels read the positions on the device, and the tokens
//! and positions are written before each submit.
//!
//! The KV cache: the host's copy stays canonical. Each device layer keeps a mirror of its K/V
//! rows on the device (an MLA layer: its normalized latents and rope keys, `exec::mla_mirror`,
//! which also records the op); a frame appends the block's rows to the mirror and copies them to a
//! read-back buffer, and the host appends them to its cache after the frame. So when the
//! device fails, the CPU re-runs the forward from the host's cache with the same tokens.
//!
//! A KV split (the plan's `placement.kv_split`, `exec::kv_split`): a split layer's mirror is a
//! ring of its newest positions; its frame ends with the device's part of attention, and after
//! the frame the host attends over the older positions and merges (the output goes up with the
//! next frame, as the plan says).
//!
//! Must not: decide placement (the plan did), run another device's frames or a host frame
//! (`exec::chain` does), or run an op the device library does not claim (`DeviceModel::load`
//! refuses such a plan with a typed error).

use super::step::{HostRows, Step};
use super::weights::visit_weights;
use super::{LogitRows, Model, OpRows};
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::cpu::experts::ExpertMats;
use crate::cpu::rope::inv_freq;
use crate::cpu::Precision;
use crate::exec::kv::KvCache;
use crate::exec::kv_split::{HostPart, Split, SplitState, SplitStats};
use crate::oplib::{op_name, OpLib};
use crate::vk::{
    Broadcast, Context, DeviceBuffer, DeviceMatrix, ExpertPages, MatmulPath, MemoryUse, MoeScratch, VkError, VkOps,
};
use crate::vk::{Frame as VkFrame, KvType, MatIn, NormArgs, Pos, QuantizedActs, Recorded, View};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::ir::{Op, Program, RopeScaling, ValueId};
use coli_compiler::schedule::{Call, FrameCalls, Kernel, MatSrc, Norm, Rows};
use coli_compiler::Plan;
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

mod attention;
mod compressed;
mod compressor;
mod experts;
mod hyper;
mod indexer;
mod kv_rows;
mod replay;
mod rows;

pub use replay::ReplayStats;

/// Rows of a step from which its K/V read-back runs on every core (a decode step's few rows
/// are not worth the threads' wake-up).
const PARALLEL_KV_ROWS: usize = 16;
/// Sequences of a batched step from which their K/V rows are taken in parallel.
const PARALLEL_KV_SEQUENCES: usize = 4;

/// One device's side of a model: the weights its frames read uploaded, and those frames.
pub struct DeviceModel {
    pub ctx: Context,
    /// The plan's device this model runs.
    pub device: DeviceId,
    /// The plan's frames on this device.
    frames: Vec<Frame>,
    /// Each program layer's K/V mirror type (`kv_rows::mirror_types`).
    kv_types: Vec<KvType>,
    mats: HashMap<String, DeviceMatrix>,
    vecs: HashMap<String, DeviceBuffer>,
    /// Inverse RoPE frequencies per distinct (rotary dim, theta, scaling), with their mscale.
    freqs: Vec<(usize, f32, RopeScaling, DeviceBuffer, f32)>,
    /// The most rows one device forward takes.
    pub cap_rows: usize,
    max_context: usize,
    /// Bytes of weights uploaded.
    pub weight_bytes: u64,
    /// Resident routed experts, by layer index.
    experts: HashMap<u32, ExpertPages>,
    /// The largest (top_k, hidden, ffn, experts) of the resident layers.
    moe_dims: Option<(usize, usize, usize, usize)>,
    /// The KV split, when the plan has one.
    kv_split: Option<Split>,
    /// Hyper-connections' mixing weights and grouped projections (`device::hyper`).
    apart: hyper::Apart,
    /// Recordings of batched decode steps, shared with the states (`device::replay`).
    batches: replay::SharedReplays,
}

/// A layer's K/V mirrors and their read-back rows: keys, values, keys back, values back.
type KvMirror = (DeviceBuffer, DeviceBuffer, DeviceBuffer, DeviceBuffer);

/// Per-session device state: value buffers, KV mirrors and their read-back staging. Its
/// buffers are allocated with it and never replaced (recordings name them).
pub struct DeviceState {
    /// This state's id among every state of the process (`device::replay`).
    id: u64,
    /// The model's batched recordings, which this state drops those naming it from when it goes.
    batches: replay::SharedReplays,
    values: Vec<DeviceBuffer>,
    /// Host-cached read-back twins of the values frames download (a device-local buffer may
    /// be mapped write-combined, where reading it from the CPU is very slow).
    twins: Vec<Option<DeviceBuffer>>,
    mirrors: Vec<Option<KvMirror>>,
    /// Rows of each layer's mirror that equal the host's cache.
    watermark: Vec<usize>,
    /// The sliding windows' mirrors that are rings, and the first position each holds for sure.
    rings: Vec<Option<kv_rows::WindowRing>>,
    ring_lo: Vec<usize>,
    /// What the resident experts' kernels work in.
    moe: Option<MoeScratch>,
    /// The forward's token ids (`cap_rows` u32) and its first position (u32 at element 0; in a
    /// replayed batched step, this sequence's).
    tokens: DeviceBuffer,
    pos: DeviceBuffer,
    /// Recordings of one-row forwards, by (frame index, last row only, precision).
    replays: Vec<(usize, bool, Precision, Recorded)>,
    /// The KV split's rings and partial results, when the plan splits.
    split: Option<SplitState>,
    /// The linear-attention layers' recurrent states on the device (`exec::recurrent`).
    recurrent: super::recurrent::Recurrent,
    /// What the MLA layers' kernels work in (`exec::mla_mirror`).
    mla: Option<crate::vk::MlaScratch>,
    /// The indexers' key mirrors and scratch (DeepSeek Sparse Attention, `device::indexer`).
    indexers: Option<indexer::Indexers>,
    /// A grouped projection's regrouped input (`device::hyper::scratch`).
    grouped: Option<DeviceBuffer>,
    /// The compressed attention layers' entry mirrors (DeepSeek V4, `device::compressed`).
    compressed: Option<compressed::CompressedEntries>,
    /// The device's compressors' projection mirrors (DeepSeek V4, `device::compressor`).
    compressors: Option<compressor::Compressors>,
}

/// Why a plan cannot run on the device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Vk(#[from] VkError),
    #[error(
        "the device library cannot run op {op} ({place}); recompile the plan with a profile that keeps it on the host"
    )]
    Unsupported { op: &'static str, place: String },
    #[error("the plan places frames on this device, but only {opened} device(s) were opened")]
    NotOpened { opened: usize },
}

/// A sequence of a frame's step: its rows of the step, its first position (fixed, or its state's
/// `pos` read on the device in a replayed recording), and its state (the KV mirrors it appends
/// to and attends over).
struct SeqState<'a> {
    rows: std::ops::Range<usize>,
    pos: Pos<'a>,
    st: &'a DeviceState,
}

/// What one recording of a frame runs against.
#[derive(Clone, Copy)]
struct Rec<'a, 'p> {
    program: &'p Program,
    /// The state whose value buffers the frame's rows live in (the first sequence's).
    st: &'a DeviceState,
    /// The step's sequences (one unless the step is batched).
    seqs: &'p [SeqState<'a>],
    widths: &'p [usize],
    n: usize,
    /// The first sequence's position (its `SeqState::pos`).
    pos: Pos<'a>,
    precision: Precision,
    /// Only the last row's logits are wanted.
    last_only: bool,
}

impl DeviceModel {
    /// Uploads what the plan's frames on `device` read. `progress(done, total)` per tensor.
    pub fn load(
        ctx: Context,
        plan: &Plan,
        model: &Model,
        device: DeviceId,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<DeviceModel, DeviceError> {
        // The model's program: row selections of fused tensors (Qwen3-Next's query and gate)
        // named as the tensors of their rows the weight store made at load.
        let program = &model.program;
        let lib = VkOps::new(ctx.clone());
        let mut names: Vec<(String, bool)> = Vec::new();
        let mut freqs = Vec::new();
        let mut moe_ops = Vec::new();
        let mut apart_ops = Vec::new();
        let mut joined_taps = Vec::new();
        let frames: Vec<Frame> = plan.frames.iter().filter(|f| f.place == Place::Device(device)).cloned().collect();
        for f in &frames {
            for &id in &f.ops {
                let op = op_of(program, id);
                if !lib.supports(op, None) {
                    return Err(DeviceError::Unsupported { op: op_name(op), place: id.to_string() });
                }
                visit_weights(op, &mut |w, is_vec| names.push((w.name.clone(), is_vec)), &mut |_, _| {});
                if let Op::Rope { rotary_dim, theta, scaling, .. } = op {
                    freqs.push((*rotary_dim, *theta, *scaling));
                }
                if let Op::Mla { spec, .. } = op {
                    freqs.push((spec.qk_rope_head_dim, spec.rope_theta, spec.rope_scaling));
                }
                freqs.extend(compressor::freqs_of(op));
                if let Op::Indexer { spec, .. } = op {
                    freqs.extend((spec.rope_dim > 0).then_some((spec.rope_dim, spec.rope_theta, spec.rope_scaling)));
                }
                if let Op::RoutedExperts { .. } = op {
                    moe_ops.push(op);
                }
                if let Op::HyperPre { .. } | Op::GroupedLinear { .. } = op {
                    apart_ops.push(op);
                }
                if let Op::LinearAttention { spec, .. } = op {
                    joined_taps.extend(super::recurrent::kda_taps(spec));
                }
            }
        }
        names.sort();
        names.dedup();
        // A KDA layer's three convolutions go up joined (below), not one by one.
        names.retain(|(n, _)| !joined_taps.iter().any(|(_, parts)| parts.contains(&n.as_str())));
        let mut mats = HashMap::new();
        let mut vecs = HashMap::new();
        let apart = hyper::upload_apart(&ctx, &apart_ops, &model.weights)?;
        names.retain(|(n, _)| !apart.holds(n));
        let mut weight_bytes = apart.bytes;
        let total = names.len();
        for (i, (name, is_vec)) in names.into_iter().enumerate() {
            progress(i, total);
            if is_vec {
                let b = ctx.upload_f32(model.weights.vector(&name))?;
                weight_bytes += b.len_bytes() as u64;
                vecs.insert(name, b);
            } else {
                let m = model.weights.matrix(&name);
                let dm = ctx.upload_matrix(m.format, m.rows, m.cols, m.bytes())?;
                weight_bytes += m.bytes().len() as u64;
                mats.insert(name, dm);
            }
        }
        // Each device KDA layer's three convolutions' taps side by side, the order of the
        // channels its one convolution dispatch reads (`exec::recurrent::kda_taps`).
        for (key, parts) in joined_taps {
            let taps: Vec<f32> = parts.iter().flat_map(|n| model.weights.vector(n).iter().copied()).collect();
            let b = ctx.upload_f32(&taps)?;
            weight_bytes += b.len_bytes() as u64;
            vecs.insert(key, b);
        }
        // Resident experts, a layer at a time.
        let mut experts = HashMap::new();
        let mut moe_dims: Option<(usize, usize, usize, usize)> = None;
        for op in &moe_ops {
            let Op::RoutedExperts { x, routing, layer, experts: n, weights, .. } = op else { continue };
            let ws = &model.weights;
            // Shared experts (Inkling) stacked after the routed ones, as the routing names them.
            let mats = |e: usize| ExpertMats::routed_or_shared(ws, weights, *n, e);
            let d = ctx.upload_expert_pages(*n + weights.shared.as_ref().map_or(0, |s| s.count), &mats)?;
            weight_bytes += d.device_bytes() as u64;
            let top_k = program.value(*routing).width / 2;
            let dims = (top_k, program.value(*x).width, d.ffn(), d.page_experts());
            moe_dims =
                Some(moe_dims.map_or(dims, |m| (m.0.max(dims.0), m.1.max(dims.1), m.2.max(dims.2), m.3.max(dims.3))));
            experts.insert(layer.0, d);
        }
        progress(total, total);
        let mut fbufs = Vec::new();
        for (rd, theta, scaling) in freqs {
            if fbufs.iter().any(|(r, t, s, _, _): &(usize, f32, RopeScaling, DeviceBuffer, f32)| {
                *r == rd && *t == theta && *s == scaling
            }) {
                continue;
            }
            let (f, mscale) = inv_freq(rd, theta, scaling);
            fbufs.push((rd, theta, scaling, ctx.upload_f32(&f)?, mscale));
        }
        let kv_types = kv_rows::mirror_types(&ctx, program, &frames);
        Ok(DeviceModel {
            ctx,
            device,
            kv_types,
            frames,
            mats,
            vecs,
            freqs: fbufs,
            cap_rows: plan.options.chunk_rows.max(1),
            max_context: plan.options.context.max(1),
            weight_bytes,
            experts,
            moe_dims,
            kv_split: plan.placement.kv_split.clone().map(Split::new),
            apart,
            batches: Default::default(),
        })
    }

    /// Why a step of several sequences cannot run this device's frames, if it cannot: a KV
    /// split's host part follows one sequence a frame.
    pub fn batch_refusal(&self) -> Option<&'static str> {
        self.kv_split.is_some().then_some("the plan splits a KV cache between the device and the host")
    }

    /// What the KV split's layers did so far (`None` without a split).
    pub fn kv_split_stats(&self) -> Option<SplitStats> {
        self.kv_split.as_ref().map(Split::stats)
    }

    /// The resident routed experts, by layer index.
    pub fn resident_experts(&self) -> &HashMap<u32, ExpertPages> {
        &self.experts
    }

    /// The most positions a session on this device holds (the plan's context).
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Whether the plan has frames on this device.
    pub fn has_frames(&self) -> bool {
        !self.frames.is_empty()
    }

    /// Buffers for one sequence of at most `context` positions.
    pub fn new_state(&self, model: &Model, context: usize) -> Result<DeviceState, VkError> {
        let p = &model.program;
        let ctx = &self.ctx;
        // Rows for the values this device's frames touch; a placeholder for the others (the
        // logits of a partial chain whose head is on the host: 96 MiB for SmolLM2's chunk).
        let mut touched = vec![false; p.values.len()];
        for f in &self.frames {
            for &id in &f.ops {
                let (r, w) = coli_compiler::ir::op_io(op_of(p, id));
                for v in r.into_iter().chain(w) {
                    touched[v.0 as usize] = true;
                }
            }
            for v in f.uploads.iter().chain(&f.downloads) {
                touched[v.0 as usize] = true;
            }
        }
        let values = p
            .values
            .iter()
            .zip(&touched)
            .map(|(v, &t)| ctx.f32_buffer(if t { (v.width * self.cap_rows).max(1) } else { 1 }))
            .collect::<Result<Vec<_>, _>>()?;
        let context = context.min(self.max_context);
        let (mirrors, rings) = self.kv_mirrors(p, context)?;
        let mut twins: Vec<Option<DeviceBuffer>> = (0..p.values.len()).map(|_| None).collect();
        for f in &self.frames {
            for &v in &f.downloads {
                if twins[v.0 as usize].is_none() {
                    twins[v.0 as usize] = Some(
                        ctx.buffer(MemoryUse::Readback, (p.values[v.0 as usize].width * self.cap_rows).max(1) * 4)?,
                    );
                }
            }
        }
        let moe = match self.moe_dims {
            Some((top_k, hidden, ffn, experts)) => Some(ctx.moe_scratch(self.cap_rows, top_k, hidden, ffn, experts)?),
            None => None,
        };
        let (tokens, pos) = (ctx.f32_buffer(self.cap_rows.max(1))?, ctx.f32_buffer(4)?);
        let split = match &self.kv_split {
            Some(s) => Some(s.new_state(ctx, p, self.cap_rows)?),
            None => None,
        };
        let recurrent = super::recurrent::Recurrent::new(ctx, (p, &model.weights), &self.frames, self.cap_rows)?;
        let mla = super::mla_mirror::scratch(ctx, p, &self.frames, self.cap_rows)?;
        let indexers = indexer::Indexers::new(ctx, p, &self.frames, self.cap_rows, context)?;
        let grouped = hyper::scratch(ctx, p, &self.frames, self.cap_rows)?;
        let compressed = compressed::CompressedEntries::new(ctx, p, &self.frames, context)?;
        let compressors = compressor::Compressors::new(ctx, p, &self.frames, self.cap_rows, context)?;
        Ok(DeviceState {
            id: replay::new_state_id(),
            batches: self.batches.clone(),
            values,
            twins,
            watermark: vec![0; mirrors.len()],
            ring_lo: vec![0; rings.len()],
            rings,
            mirrors,
            moe,
            tokens,
            pos,
            replays: Vec::new(),
            split,
            recurrent,
            mla,
            indexers,
            grouped,
            compressed,
            compressors,
        })
    }

    fn freq(&self, rd: usize, theta: f32, scaling: RopeScaling) -> (&DeviceBuffer, f32) {
        let (_, _, _, b, m) = self
            .freqs
            .iter()
            .find(|(r, t, s, _, _)| *r == rd && *t == theta && *s == scaling)
            .expect("frequencies uploaded at load");
        (b, *m)
    }

    /// Before a forward from `pos0`: a host write below a mirror's rows (a truncation) lowers
    /// its watermark.
    pub(crate) fn begin_forward(&self, st: &mut DeviceState, kv: &KvCache, pos0: usize) {
        for (l, mark) in st.watermark.iter_mut().enumerate() {
            *mark = (*mark).min(kv.layers.get(l).map_or(0, |c| c.len())).min(pos0);
        }
        if let Some(ix) = st.indexers.as_mut() {
            ix.begin_forward(kv, pos0);
        }
        compressor::begin_forward(st, kv, pos0);
    }

    /// Records `calls` (the schedule's for `frame`) and the copies of the frame's downloads
    /// into their read-back twins, for `n` rows at `pos`.
    fn record<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: Rec<'a, '_>,
        frame: &Frame,
        calls: &[Call],
    ) -> Result<(), VkError> {
        let Rec { program: p, st, widths, n, precision, last_only, .. } = rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let vals = &st.values;
        let view = |v: ValueId| vals[v.0 as usize].view(0, n * w(v));
        // The head of a forward whose last row only is wanted runs on that row.
        let last = |v: ValueId| vals[v.0 as usize].view((n - 1) * w(v), w(v));
        let norm_in = |m: &Norm, pick: &dyn Fn(ValueId) -> View<'a>| MatIn::Norm {
            x: pick(m.x),
            weight: self.vecs[&m.weight.name].all(),
            eps: m.eps,
            offset: m.offset,
        };
        // q8 activations quantized for the products before, shared by the next one that
        // reads the same input: (value, its transform, activations).
        let mut shared_q: Option<(ValueId, &MatSrc, QuantizedActs)> = None;
        const PLAIN: &MatSrc = &MatSrc::Plain;
        for (i, call) in calls.iter().enumerate() {
            let tail = call.rows == Rows::Tail && last_only && n > 1;
            if !matches!(call.kernel, Kernel::Matmul(_)) {
                shared_q = None;
            }
            match &call.kernel {
                Kernel::Matmul(m) => {
                    let (rows, pick) =
                        if tail { (1, &last as &dyn Fn(ValueId) -> _) } else { (n, &view as &dyn Fn(ValueId) -> _) };
                    let mat = &self.mats[&m.weight.name];
                    let src = match &m.src {
                        MatSrc::Norm(nm) => norm_in(nm, pick),
                        MatSrc::Glu { gate, up, kind } => MatIn::Glu { gate: pick(*gate), up: pick(*up), kind: *kind },
                        MatSrc::Plain => MatIn::Plain(pick(m.x)),
                    };
                    let dest = m.dest();
                    let res = m.residual.map(|r| pick(r.other));
                    if precision == Precision::Fast && mat.variant.q8_acts() {
                        let q = match shared_q.take() {
                            Some((kx, ks, q))
                                if kx == m.x && *ks == m.src && q.cols() == mat.cols && q.rows() == rows =>
                            {
                                q
                            }
                            _ => f.quantize_input(src, rows, mat.cols)?,
                        };
                        f.matmul_q_fused(mat, src, &q, pick(dest), res, MatmulPath::Auto)?;
                        shared_q = Some((m.x, &m.src, q));
                    } else {
                        f.matmul_fused(mat, src, rows, pick(dest), res, MatmulPath::Auto, precision)?;
                    }
                    if m.src.sources().contains(&dest) || dest == m.x {
                        shared_q = None;
                    }
                    if let Some(b) = &m.bias {
                        f.add(pick(dest), self.vecs[&b.name].all(), pick(dest), rows, w(dest), Broadcast::Row)?;
                    }
                }
                Kernel::Experts(e) => self.record_experts(f, &rec, e)?,
                Kernel::NormPair(a, b) => {
                    let args = |m: &Norm| NormArgs {
                        x: view(m.x),
                        weight: self.vecs[&m.weight.name].all(),
                        out: view(m.out),
                        width: w(m.x),
                    };
                    f.rms_norm_pair(args(a), args(b), n, a.eps, a.offset)?;
                }
                Kernel::Attention(a) => {
                    let next = calls.get(i + 1).map(|c| &c.kernel);
                    if let Some(q) = self.record_attention(f, &rec, a, next)? {
                        shared_q = Some((a.out, PLAIN, q));
                    }
                }
                Kernel::Linears { .. } => {
                    return Err(VkError::BadArgument { op: "linears", msg: "a host call in a device frame".into() })
                }
                Kernel::Op(op) => self.record_op(f, &rec, op, tail)?,
            }
        }
        // What the host reads goes to the read-back twins in the same submission. The logits of
        // a forward whose last row only is wanted come down as that row.
        let rows_of = |v: ValueId| if last_only && v == p.logits { (n - 1, 1) } else { (0, n) };
        for &v in &frame.downloads {
            let (r0, rn) = rows_of(v);
            let twin = st.twins[v.0 as usize].as_ref().expect("twin allocated");
            f.copy(vals[v.0 as usize].view(r0 * w(v), rn * w(v)), twin.view(r0 * w(v), rn * w(v)))?;
        }
        Ok(())
    }

    /// Records one op on its own (`tail`: on the last row, for the epilogue's norm and head).
    fn record_op<'a>(&'a self, f: &mut VkFrame<'a>, rec: &Rec<'a, '_>, op: &Op, tail: bool) -> Result<(), VkError> {
        let Rec { st, widths, n, precision, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let (rows, r0) = if tail { (1, n - 1) } else { (n, 0) };
        let view = |v: ValueId| st.values[v.0 as usize].view(r0 * w(v), rows * w(v));
        match op {
            Op::Embed { out, table, scale } => {
                f.embed(&self.mats[&table.name], st.tokens.view(0, n), n, *scale, view(*out))?;
            }
            Op::RmsNorm { x, out, weight: Some(weight), eps, offset, scale, .. } => {
                let args =
                    NormArgs { x: view(*x), weight: self.vecs[&weight.name].all(), out: view(*out), width: w(*x) };
                f.rms_norm_scaled(args, rows, *eps, *offset, *scale)?;
            }
            Op::Linear { x, out, weight, bias } => {
                f.matmul_with(&self.mats[&weight.name], view(*x), rows, view(*out), MatmulPath::Auto, precision)?;
                if let Some(b) = bias {
                    f.add(view(*out), self.vecs[&b.name].all(), view(*out), rows, w(*out), Broadcast::Row)?;
                }
            }
            // The other ops run on every row (only the norm and the head are cut to the last).
            _ if tail => return self.record_op(f, rec, op, false),
            // RoPE, routers and the kinds DeepSeek V4 brought (`device/rows.rs`).
            Op::Rope { .. } | Op::Route { .. } | Op::RmsNorm { weight: None, .. } => self.record_rows(f, rec, op)?,
            // DeepSeek V4's streams of the residual and grouped projection (`device/hyper.rs`).
            Op::HyperPre { .. } | Op::HyperPost { .. } | Op::GroupedLinear { .. } => self.record_hyper(f, rec, op)?,
            Op::Act { x, out, act } => f.act(*act, view(*x), view(*out), n * w(*x))?,
            Op::Glu { gate, up, out, kind } => f.glu(*kind, view(*gate), view(*up), view(*out), n * w(*out))?,
            Op::Add { a, b, out } => f.add(view(*a), view(*b), view(*out), n, w(*a), Broadcast::None)?,
            Op::Concat { a, b, out } => f.concat(view(*a), view(*b), view(*out), rows, (w(*a), w(*b)))?,
            Op::Mul { a, b, out } => {
                let mode = if w(*b) == 1 && w(*a) != 1 { Broadcast::PerRow } else { Broadcast::None };
                f.mul(view(*a), view(*b), view(*out), n, w(*a), mode)?
            }
            // Each sequence of a batched step over its own state.
            Op::LinearAttention { x, out, layer, spec } if rec.seqs.len() > 1 => {
                for s in rec.seqs {
                    let rows = |v: ValueId| st.values[v.0 as usize].view(s.rows.start * w(v), s.rows.len() * w(v));
                    let io = OpRows { x: rows(*x), out: rows(*out), n: s.rows.len(), precision };
                    s.st.recurrent.record(f, &self.mats, &self.vecs, spec, *layer, io)?;
                }
            }
            Op::LinearAttention { x, out, layer, spec } => {
                let io = OpRows { x: view(*x), out: view(*out), n, precision };
                st.recurrent.record(f, &self.mats, &self.vecs, spec, *layer, io)?;
            }
            Op::Mla { x, out, layer, spec } => {
                let (fb, mscale) = self.freq(spec.qk_rope_head_dim, spec.rope_theta, spec.rope_scaling);
                // The products over every row; each sequence of a batched step over its own
                // mirror, at its own positions.
                let seqs: Vec<_> = rec
                    .seqs
                    .iter()
                    .map(|s| {
                        let rows = |v: ValueId| st.values[v.0 as usize].view(s.rows.start * w(v), s.rows.len() * w(v));
                        let select = spec.select.map(|v| (if rec.seqs.len() == 1 { view(v) } else { rows(v) }, w(v)));
                        super::mla_mirror::SeqMirror {
                            rows: if rec.seqs.len() == 1 { 0..n } else { s.rows.clone() },
                            mirror: s.st.mirrors[layer.0 as usize].as_ref().expect("mirror allocated"),
                            pos: s.pos,
                            select,
                        }
                    })
                    .collect();
                let inp = super::mla_mirror::MlaInputs {
                    mats: &self.mats,
                    vecs: &self.vecs,
                    freq: (fb, mscale),
                    scratch: st.mla.as_ref(),
                };
                let io = OpRows { x: view(*x), out: view(*out), n, precision };
                super::mla_mirror::record(f, inp, spec, io, &seqs)?;
            }
            Op::Indexer { x, q, out, layer, spec } => self.record_indexer(f, rec, (*x, *q, *out, *layer, spec))?,
            Op::KvCompress { x, q, out, layer, spec } => {
                self.record_compressor(f, rec, (*x, *q, *out, *layer, spec))?
            }
            op => {
                return Err(VkError::BadArgument {
                    op: op_name(op),
                    msg: "not a device op; the plan placed it on a device".into(),
                })
            }
        }
        Ok(())
    }

    /// Runs one of this device's frames, `calls` being its schedule, for `step` (`step.tokens.len()
    /// <= cap_rows`) with each sequence's state (`sts`, in the step's order; the rows' values
    /// live in the first's): its uploads from the host's rows, the frame, its downloads into
    /// the host's rows and each sequence's K/V rows into its host cache (a KV split's host part
    /// after it).
    pub(crate) fn run_frame(
        &self,
        model: &Model,
        sts: &mut [&mut DeviceState],
        frame: &Frame,
        calls: &FrameCalls,
        host: &mut HostRows,
        step: &Step,
    ) -> Result<(), VkError> {
        let HostRows { values: host_values, widths, kv, rest } = host;
        let widths = *widths;
        let (tokens, pos0, precision) = (step.tokens, step.pos0, step.precision);
        let last_only = step.logits == LogitRows::Last;
        let n = tokens.len();
        let p = &model.program;
        let ctx = &self.ctx;
        let w = |v: ValueId| widths[v.0 as usize];
        let seqs = step.sequences();
        let batched = seqs.len() > 1;
        if sts.len() != seqs.len() || (batched && self.batch_refusal().is_some()) {
            let msg = self.batch_refusal().unwrap_or("one state per sequence").to_string();
            return Err(VkError::BadArgument { op: "frame", msg });
        }
        let mut caches: Vec<&mut KvCache> =
            std::iter::once(&mut **kv).chain(rest.iter_mut().map(|k| &mut **k)).collect();
        let mut t = Instant::now();
        // 1. Uploads, and what the frame needs that must outlive it.
        let lead = &sts[0];
        for &v in &frame.uploads {
            let data = &host_values[v.0 as usize][..n * w(v)];
            ctx.write(&lead.values[v.0 as usize], 0, as_bytes(data))?;
        }
        // Mirror rows a sequence's device state lacks (a host write lowered its watermark) go up
        // first.
        let mut attn_layers = Vec::new();
        for &id in &frame.ops {
            if let Op::Attention { layer, .. } | Op::Mla { layer, .. } = op_of(p, id) {
                attn_layers.push((layer.0 as usize, *layer));
            }
        }
        let (index_layers, compressed_layers) = (indexer::layers_of(p, frame), compressor::Layers::of(p, frame));
        for ((st, kv), (_, pos0)) in sts.iter_mut().zip(caches.iter()).zip(&seqs) {
            if let Some(ix) = st.indexers.as_mut() {
                ix.upload(ctx, &index_layers, kv, *pos0)?;
            }
            compressor::upload(ctx, st, &compressed_layers, kv, *pos0)?;
            self.upload_kv_rows(st, kv, &attn_layers, *pos0)?;
        }
        // The embedding and a hash routing read the rows' tokens.
        if frame.ops.iter().any(|&id| matches!(op_of(p, id), Op::Embed { .. } | Op::Route { hash: Some(_), .. })) {
            if let Some(&id) = tokens.iter().find(|&&t| t as usize >= p.dims.vocab) {
                return Err(VkError::BadArgument {
                    op: "embed",
                    msg: format!("token id {id} is outside the vocabulary of {}", p.dims.vocab),
                });
            }
            ctx.write(&sts[0].tokens, 0, as_bytes(tokens))?;
        }
        // The recurrent layers' device states: each sequence's host's at its first position
        // (`exec::recurrent`).
        let mut recurrent = Vec::with_capacity(sts.len());
        for ((st, kv), (_, pos0)) in sts.iter_mut().zip(caches.iter()).zip(&seqs) {
            recurrent.push(st.recurrent.before_frame(ctx, p, frame, kv, *pos0)?);
        }
        // 2. Record and submit; a one-row forward, and a batched decode step (one row for each
        // sequence), replay a recording when the frame allows it (`device::replay`).
        let rows_of = |v: ValueId| if last_only && v == p.logits { (n - 1, 1) } else { (0, n) };
        let phase = |name: &'static str, t: &mut Instant| {
            ctx.note_host(name, *t);
            *t = Instant::now();
        };
        let job = replay::Job { program: p, frame, calls: &calls.calls, widths, precision, last_only };
        phase("uploads", &mut t);
        if n == 1 && calls.replayable {
            self.replay_one(sts[0], job, pos0, &mut t)?;
        } else if batched && calls.replayable && seqs.iter().all(|(rows, _)| rows.len() == 1) {
            self.replay_batch(sts, job, &seqs, &mut t)?;
        } else {
            let mut f = ctx.frame()?;
            let states: Vec<SeqState> = seqs
                .iter()
                .zip(sts.iter())
                .map(|((rows, pos0), st)| SeqState { rows: rows.clone(), pos: Pos::Fixed(*pos0), st })
                .collect();
            let rec =
                Rec { program: p, st: sts[0], seqs: &states, widths, n, pos: Pos::Fixed(pos0), precision, last_only };
            self.record(&mut f, rec, frame, &calls.calls)?;
            phase("recording", &mut t);
            f.run()?;
        }
        phase("submit and wait", &mut t);
        // 3. Downloads, and each sequence's K/V rows into its host cache.
        for &v in &frame.downloads {
            let (r0, rn) = rows_of(v);
            let hv = &mut host_values[v.0 as usize];
            if hv.len() < n * w(v) && (rn < n || hv.capacity() < n * w(v)) {
                // A fresh zeroed allocation maps its pages lazily: rows not read back (all but
                // the last of a prompt's logits) cost nothing, where growing would write them
                // (a session's prompt after its decode steps: 103 MB of OLMoE's logits, 10.7 ms
                // on the H100 machine).
                *hv = vec![0.0; n * w(v)];
            }
            hv.resize(n * w(v), 0.0);
            let twin = sts[0].twins[v.0 as usize].as_ref().expect("twin allocated");
            ctx.read(twin, r0 * w(v) * 4, as_bytes_mut(&mut hv[r0 * w(v)..(r0 + rn) * w(v)]))?;
        }
        phase("downloads", &mut t);
        let attn_layers: Vec<usize> = attn_layers.into_iter().map(|(l, _)| l).collect();
        // A batched step's sequences in parallel: each reads its own mirrors' new rows into its
        // own cache (at 64 sequences 2,048 small reads, 5 ms one after another on the H200).
        if sts.len() >= PARALLEL_KV_SEQUENCES {
            sts.par_iter_mut()
                .zip(caches.par_iter_mut())
                .zip(seqs.par_iter())
                .try_for_each(|((st, kv), (rows, pos0))| self.take_kv_rows(st, kv, &attn_layers, *pos0, rows.len()))?;
        } else {
            for ((st, kv), (rows, pos0)) in sts.iter_mut().zip(caches.iter_mut()).zip(&seqs) {
                self.take_kv_rows(st, kv, &attn_layers, *pos0, rows.len())?;
            }
        }
        for ((st, kv), (rows, pos0)) in sts.iter_mut().zip(caches.iter_mut()).zip(&seqs) {
            if let Some(ix) = st.indexers.as_mut() {
                ix.take_rows(ctx, &index_layers, kv, *pos0, rows.len())?;
            }
            compressor::take(ctx, st, &compressed_layers, kv, (*pos0, rows.len()))?;
        }
        phase("K/V rows into the host's cache", &mut t);
        // Their new states into the host's (the old ones kept to go back to); a batched step's
        // sequences in parallel (each reads megabytes a layer: 768 MiB a step for 64 sequences
        // of Qwen3.5-35B-A3B's 8-layer cut).
        if sts.len() >= PARALLEL_KV_SEQUENCES && recurrent.iter().any(super::recurrent::Touched::any) {
            sts.par_iter_mut().zip(caches.par_iter_mut()).zip(seqs.par_iter()).zip(recurrent.par_iter()).try_for_each(
                |(((st, kv), (rows, pos0)), touched)| st.recurrent.after_frame(ctx, touched, kv, pos0 + rows.len()),
            )?;
        } else {
            for (((st, kv), (rows, pos0)), touched) in sts.iter_mut().zip(caches.iter_mut()).zip(&seqs).zip(&recurrent)
            {
                st.recurrent.after_frame(ctx, touched, kv, pos0 + rows.len())?;
            }
        }
        let st = &mut *sts[0];
        // A split attention ends the frame: the host's part and the merge (`exec::kv_split`).
        if let (Some(id), Some(sp), Some(ss)) = (frame.kv_split, self.kv_split.as_ref(), st.split.as_ref()) {
            if let Op::Attention { q, out, layer, spec, .. } = op_of(p, id) {
                let mut o = std::mem::take(&mut host_values[out.0 as usize]);
                let (q, cache) = (&host_values[q.0 as usize], &caches[0].layers[layer.0 as usize]);
                sp.finish(ctx, ss, HostPart { spec, weights: &model.weights, q, host: cache, n, pos0 }, &mut o)?;
                host_values[out.0 as usize] = o;
            }
        }
        phase("recurrent states, the KV split's host part", &mut t);
        Ok(())
    }
}
