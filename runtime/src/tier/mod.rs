//! The expert tier: an adaptive cache of routed experts on the device, run as a service the
//! executor's MoE host steps call (`ExpertTier::run`).
//!
//! What it keeps: the budget (what the plan left on the device for the tier, or the user's
//! figure) divided into slots of one expert each, in a few large device pages (`pages`, each a
//! stack of experts the MoE kernels read, `vk::DeviceExperts`). Which expert sits where is
//! `slots::Slots`; how hot each expert is, `heat::Heat`.
//!
//! A step (one MoE layer of one forward, `run`):
//! 1. every (row, rank) pair counts one routing of its expert; pairs whose expert serves from a
//!    slot go to the device, the others to the CPU;
//! 2. the device's pairs are recorded as one batch (per page touched: the per-pair expert
//!    kernels of `Frame::moe_pairs`) and submitted from a worker thread, which then writes
//!    experts promoted at earlier steps into their slots for as long as the CPU still computes
//!    (at least one a step; the rest wait); meanwhile this thread computes the CPU's pairs
//!    (`cpu::experts::pair_outputs`);
//! 3. join: the device's pair outputs come down, and every pair joins its row in rank order
//!    from zero, the device's and the CPU's alike (`cpu::experts::join_ranks`), so what was
//!    resident changes the result only by the device's and the CPU's rounding of each pair;
//! 4. the CPU's experts of the step, hottest first, are promoted while a slot is free, or take
//!    the coldest resident's slot when they beat it (`heat::beats`), at most
//!    `promotions_per_token` per token of the forward. A promoted expert serves from the step
//!    after its upload completed.
//!
//! Every batch is joined within its step. How many uploads a step completes depends on how
//! long the CPU's share takes, so which pairs the device serves can vary from run to run (the
//! sums differ by rounding only); with `deterministic` every upload completes before the next
//! step and streaming follows the routing alone, so a run repeats bit for bit.
//!
//! Warm start: the routing history (`history.rs`, a file beside the checkpoint) seeds the heat
//! and fills the slots hottest first at startup (packed in parallel); the room left takes the
//! experts no history named, one of each layer in turn. At the end of a run the run's routings
//! are merged into the history.
//!
//! Must not: place dense weights or decide frames (the plan did), run when the device failed
//! (the session drops the device and the tier with it), or let a slot serve before its upload
//! completed.

pub mod heat;
pub mod history;
pub mod slots;

use crate::cpu::experts::{join_ranks, pair_expert, pair_outputs, ExpertMats};
use crate::cpu::Precision;
use crate::exec::Model;
use crate::vk::{Context, DeviceBuffer, DeviceExperts, MemoryUse, MoePath, MoeScratch, PackedExpert, VkError};
use coli_compiler::cost::human;
use coli_compiler::ir::{ExpertWeights, GluKind, Op};
use heat::{beats, Heat};
use history::History;
use rayon::prelude::*;
use slots::{SlotState, Slots};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How the tier behaves (the CLI's tier flags).
#[derive(Clone, Debug)]
pub struct TierOptions {
    /// The budget in bytes; `None`: what the plan left on the device for the tier.
    pub budget: Option<u64>,
    /// At most this many experts resident, whatever the budget.
    pub max_experts: Option<usize>,
    /// Promotions per token of a forward at most.
    pub promotions_per_token: usize,
    /// Fill the budget at startup (from the history, then one expert of each layer in turn).
    pub warm_start: bool,
    /// The routing history file (read at startup, merged at `save_history`); `None`: none.
    pub history: Option<PathBuf>,
    /// Uploads complete before the next step starts (instead of beside it), and streaming
    /// follows the routing alone (not measured times).
    pub deterministic: bool,
    /// Staging slots for streaming a big step's cold experts to the device (0, the default: no
    /// streaming; measured on the H200 it did not yet shorten a prompt).
    pub stream_slots: usize,
    /// Rows from which a step may stream.
    pub stream_min_rows: usize,
}

impl Default for TierOptions {
    fn default() -> TierOptions {
        TierOptions { budget: None, max_experts: None, promotions_per_token: 16, warm_start: true, history: None, deterministic: false, stream_slots: 0, stream_min_rows: 32 }
    }
}

/// What the tier did, for the per-run line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TierStats {
    /// Routed (row, rank) pairs, and those the device served.
    pub routed: u64,
    pub device: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
    /// Uploads of the warm start (part of `uploads`).
    pub warm: u64,
    pub evictions: u64,
    /// Promotions not made because the forward's rate was spent.
    pub skipped: u64,
    /// Uploads the device refused (their slots went back to free).
    pub failed: u64,
    /// Host time of the device batches (submit to fence), of the CPU's share, and what the
    /// join waited for the device after the CPU was done.
    pub batch: Duration,
    pub cpu: Duration,
    pub waited: Duration,
    /// Experts streamed through the staging slots (and their pairs, part of `device`).
    pub streamed: u64,
    pub streamed_pairs: u64,
}

/// One MoE layer the tier serves.
struct TierLayer {
    layer: usize,
    weights: ExpertWeights,
    experts: usize,
}

/// The device side of the cache: pages of slots and the buffers a batch works in.
struct DeviceSide {
    pages: Vec<DeviceExperts>,
    per_page: usize,
    scratch: MoeScratch,
    /// The step's rows (`cap_rows x hidden`), per page the routing in local slot ids
    /// (`cap_rows x 2 top_k`), the pairs' outputs and their read-back twin
    /// (`cap_rows x top_k x hidden`).
    xs: DeviceBuffer,
    routing: Vec<DeviceBuffer>,
    y: DeviceBuffer,
    y_back: DeviceBuffer,
    /// The staging slots of streaming and a routing buffer per round.
    stream: Option<(DeviceExperts, Vec<DeviceBuffer>)>,
}

/// Promotions waiting for their upload at most (more are skipped, like a spent rate).
const MAX_PENDING: usize = 64;

/// Rounds of staging slots a step streams at most.
const STREAM_ROUNDS: usize = 4;

/// The expert tier of one device.
pub struct ExpertTier {
    ctx: Context,
    dev: DeviceSide,
    layers: Vec<TierLayer>,
    /// Program layer index -> tier layer index.
    index: Vec<Option<usize>>,
    experts: usize,
    hidden: usize,
    top_k: usize,
    cap_rows: usize,
    expert_bytes: usize,
    heat: Heat,
    slots: Slots,
    /// This run's routings per (tier layer, expert), for the history.
    counts: Vec<u64>,
    /// Slots promoted and not yet uploaded.
    pending: Vec<usize>,
    rate_left: usize,
    /// Measured: seconds per pair the CPU takes in a big step, seconds per byte of a
    /// streamed expert (packing and writing).
    cpu_pair_s: Option<f64>,
    upload_byte_s: f64,
    opts: TierOptions,
    budget: u64,
    stats: TierStats,
    line: String,
}

/// Why a tier was not set up (the line the user sees), or the device error that stopped it.
pub enum TierSetup {
    Ready(Box<ExpertTier>),
    Off(String),
}

impl ExpertTier {
    /// Sets up the tier for the `RoutedExperts` ops of `ops` (the MoE host steps of the plan's
    /// device layers) within `budget` bytes (`opts.budget` overrides it): pages of slots,
    /// scratch for `cap_rows` rows, and the warm start. `rule` says where the budget came
    /// from, for the startup line.
    pub fn new(ctx: &Context, model: &Model, ops: &[&Op], budget: u64, rule: &str, cap_rows: usize, opts: TierOptions) -> Result<TierSetup, VkError> {
        let budget = opts.budget.unwrap_or(budget);
        let ws = &model.weights;
        let mut layers = Vec::new();
        let mut shape: Option<(ExpertMats, usize, GluKind)> = None;
        let mut top_k = 0;
        let mut other = Vec::new();
        for op in ops {
            let Op::RoutedExperts { layer, experts, weights, routing, glu, .. } = op else { continue };
            let m = ExpertMats::of(ws, weights, 0);
            match &shape {
                None => shape = Some((m, *experts, *glu)),
                Some((like, _, g)) => {
                    // One slot shape: a layer whose experts differ (a quant mix) stays on the CPU.
                    let same = (m.gate.format, m.gate.rows, m.gate.cols, m.down.format) == (like.gate.format, like.gate.rows, like.gate.cols, like.down.format) && g == glu;
                    if !same {
                        other.push(layer.0);
                        continue;
                    }
                }
            }
            top_k = top_k.max(model.program.value(*routing).width / 2);
            layers.push(TierLayer { layer: layer.0 as usize, weights: weights.clone(), experts: *experts });
        }
        let Some((like, _, _)) = shape else { return Ok(TierSetup::Off("expert tier: no routed experts through host steps".into())) };
        let (hidden, ffn) = (like.gate.cols, like.gate.rows);
        let experts = layers.iter().map(|l| l.experts).max().unwrap_or(0);
        let packed = Context::pack_expert(&like, has_bias(&like))?;
        let expert_bytes = packed.bytes() + if has_bias(&like) { (2 * ffn + hidden) * 4 } else { 0 };
        let cap_rows = cap_rows.max(1);
        // The batch's buffers come out of the budget first.
        let pairs = cap_rows * top_k;
        let buffers = (cap_rows * hidden + 2 * pairs * hidden) as u64 * 4;
        let total: usize = layers.iter().map(|l| l.experts).sum();
        let caps = ctx.caps();
        let max_buf = caps.max_storage_buffer_range.min(caps.max_allocation_size.max(1 << 20)).min(1 << 30) as usize;
        let gate_up_each = (packed.bytes() * 2 / 3).max(1);
        let per_page_max = (max_buf / gate_up_each).clamp(1, crate::vk::MOE_MAX_EXPERTS);
        let scratch_for = |per_page: usize| scratch_bytes(cap_rows, top_k, hidden, ffn, per_page);
        let room = budget.saturating_sub(buffers + scratch_for(per_page_max.min(total)));
        // Streaming's staging slots come first when they take at most a quarter of the room.
        let stream_slots = opts.stream_slots.min(crate::vk::MOE_MAX_EXPERTS);
        let stream_bytes = (stream_slots * expert_bytes) as u64;
        let stream_slots = if stream_slots > 0 && room >= 4 * stream_bytes { stream_slots } else { 0 };
        let room = room - (stream_slots * expert_bytes) as u64;
        let want = ((room / expert_bytes.max(1) as u64) as usize).min(total).min(opts.max_experts.unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(TierSetup::Off(format!(
                "expert tier off: its budget of {} ({rule}) holds no expert of {} beside the batch's buffers",
                human(budget),
                human(expert_bytes as u64)
            )));
        }
        let mut per_page = per_page_max.min(want);
        // The batch's buffers, then the pages (each with its routing buffer). The device may
        // refuse what the plan counted (its own buffers take a little more than the plan
        // says): the tier then takes smaller pages, or fewer, or stays off with a line.
        let oom = |e: &VkError| matches!(e, VkError::OutOfMemory { .. });
        let off = |e: VkError| -> Result<TierSetup, VkError> {
            if oom(&e) {
                Ok(TierSetup::Off(format!("expert tier off: the device refused its buffers ({e}); every routed expert on the CPU")))
            } else {
                Err(e)
            }
        };
        let buffers = (|| -> Result<_, VkError> {
            Ok((
                ctx.moe_scratch(cap_rows, top_k, hidden, ffn, per_page)?,
                ctx.f32_buffer(cap_rows * hidden)?,
                ctx.f32_buffer(pairs * hidden)?,
                ctx.buffer(MemoryUse::Readback, pairs * hidden * 4)?,
            ))
        })();
        let (scratch, xs, y, y_back) = match buffers {
            Ok(b) => b,
            Err(e) => return off(e),
        };
        let mut pages = Vec::new();
        let mut routing = Vec::new();
        let mut refused = false;
        while pages.len() * per_page < want {
            let slots = per_page.min(want - pages.len() * per_page);
            let page = ctx.expert_slots(slots, &like).and_then(|p| Ok((p, ctx.f32_buffer(cap_rows * 2 * top_k)?)));
            match page {
                Ok((p, r)) => {
                    pages.push(p);
                    routing.push(r);
                }
                Err(e) if oom(&e) && pages.is_empty() && per_page > 1 => per_page /= 2,
                Err(e) if oom(&e) && !pages.is_empty() => {
                    refused = true;
                    break;
                }
                Err(e) => return off(e),
            }
        }
        let slots_n: usize = pages.iter().map(|p| p.experts).sum();
        // Staging slots for streaming (reserved above); refused: no streaming.
        let stream = if stream_slots > 0 {
            let page = ctx.expert_slots(stream_slots, &like).and_then(|p| {
                let r = (0..STREAM_ROUNDS).map(|_| ctx.f32_buffer(cap_rows * 2 * top_k)).collect::<Result<Vec<_>, _>>()?;
                Ok((p, r))
            });
            match page {
                Ok(p) => Some(p),
                Err(e) if oom(&e) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let dev = DeviceSide { scratch, xs, routing, y, y_back, pages, per_page, stream };
        let mut index = vec![None; model.program.layers.len()];
        for (i, l) in layers.iter().enumerate() {
            index[l.layer] = Some(i);
        }
        let n_layers = layers.len();
        let mut tier = ExpertTier {
            ctx: ctx.clone(),
            dev,
            index,
            experts,
            hidden,
            top_k,
            cap_rows,
            expert_bytes,
            heat: Heat::new(n_layers, experts),
            slots: Slots::new(slots_n, n_layers, experts),
            counts: vec![0; n_layers * experts],
            pending: Vec::new(),
            rate_left: 0,
            cpu_pair_s: None,
            upload_byte_s: 1.0 / 8e9,
            budget,
            stats: TierStats::default(),
            line: String::new(),
            layers,
            opts,
        };
        let mut line = format!(
            "expert tier on {}: budget {} ({rule}) = {} experts of {} in {} page{}, up to {} promotions per token{}",
            caps.name,
            human(budget),
            slots_n,
            human(expert_bytes as u64),
            tier.dev.pages.len(),
            if tier.dev.pages.len() == 1 { "" } else { "s" },
            tier.opts.promotions_per_token,
            if tier.opts.deterministic { ", deterministic" } else { "" }
        );
        if refused {
            line.push_str("; the device refused more pages");
        }
        match &tier.dev.stream {
            Some((p, _)) => line.push_str(&format!("; streams big steps' cold experts through {} staging slots", p.experts)),
            None => line.push_str("; no streaming"),
        }
        if !other.is_empty() {
            line.push_str(&format!("; experts of {} differ in shape and stay on the CPU", coli_compiler::print::layer_ranges(&other)));
        }
        if tier.opts.warm_start {
            let t = Instant::now();
            let (from_history, filled) = tier.warm_start(model)?;
            line.push_str(&format!("; warm start: {filled} experts ({from_history} from the history) in {:.1} s", t.elapsed().as_secs_f64()));
        }
        tier.line = line;
        Ok(TierSetup::Ready(Box::new(tier)))
    }

    /// The startup line(s).
    pub fn line(&self) -> &str {
        &self.line
    }

    pub fn stats(&self) -> &TierStats {
        &self.stats
    }

    /// Experts serving from the device.
    pub fn resident(&self) -> usize {
        self.slots.resident()
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether the tier serves layer `layer`'s routed experts.
    pub fn serves(&self, layer: usize) -> bool {
        self.index.get(layer).is_some_and(Option::is_some)
    }

    /// Whether expert `e` of layer `layer` serves from the device now.
    pub fn is_resident(&self, layer: usize, e: usize) -> bool {
        self.index.get(layer).copied().flatten().is_some_and(|t| self.slots.serving(t, e).is_some())
    }

    /// A forward of `n` rows starts: heat ages, the promotion rate refills.
    pub fn begin_forward(&mut self, n: usize) {
        self.heat.tokens(n);
        self.rate_left = self.opts.promotions_per_token.saturating_mul(n);
    }

    /// 1. Seeds the heat from the history; 2. orders the experts: the history's by seeded heat
    ///    (hottest first), then the rest one of each layer in turn; 3. packs them in parallel
    ///    and writes them into the slots. Returns (experts from the history, experts filled).
    fn warm_start(&mut self, model: &Model) -> Result<(usize, usize), VkError> {
        let mut named = Vec::new();
        if let Some(path) = &self.opts.history {
            match History::load(path) {
                Ok(Some(h)) if h.experts == self.experts => {
                    for (t, l) in self.layers.iter().enumerate() {
                        if let Some(c) = h.layers.get(&l.layer) {
                            self.heat.seed(t, c);
                            named.extend((0..l.experts).filter(|&e| c[e] > 0).map(|e| (t, e)));
                        }
                    }
                }
                Ok(Some(h)) => eprintln!("expert tier: {} counts {} experts a layer, the model has {}; ignored", path.display(), h.experts, self.experts),
                Ok(None) => {}
                Err(e) => eprintln!("expert tier: {e}; the history is ignored and rewritten at the end of the run"),
            }
        }
        named.sort_by(|a, b| self.heat.get(b.0, b.1).total_cmp(&self.heat.get(a.0, a.1)).then(a.cmp(b)));
        let from_history = named.len().min(self.slots.len());
        let mut order = named;
        let mut seen = vec![false; self.layers.len() * self.experts];
        for &(t, e) in &order {
            seen[t * self.experts + e] = true;
        }
        for e in 0..self.experts {
            for (t, l) in self.layers.iter().enumerate() {
                if e < l.experts && !seen[t * self.experts + e] {
                    order.push((t, e));
                }
            }
        }
        order.truncate(self.slots.len());
        let mut placed = Vec::new();
        for &(t, e) in &order {
            if let Some(s) = self.slots.take_free(t, e) {
                placed.push((s, t, e));
            }
        }
        // Packing is CPU work: in parallel, a page's worth at a time (bounded memory).
        for chunk in placed.chunks(self.dev.per_page.max(8)) {
            let packed: Vec<Result<PackedExpert, VkError>> = chunk.par_iter().map(|&(_, t, e)| self.pack(model, t, e)).collect();
            for (&(s, _, _), p) in chunk.iter().zip(packed) {
                self.upload(s, &p?)?;
                self.slots.settle(s);
                self.stats.warm += 1;
            }
        }
        Ok((from_history, placed.len()))
    }

    fn pack(&self, model: &Model, t: usize, e: usize) -> Result<PackedExpert, VkError> {
        let l = &self.layers[t];
        let m = ExpertMats::of(&model.weights, &l.weights, e);
        Context::pack_expert(&m, self.dev.pages[0].has_bias())
    }

    /// Writes a packed expert into global slot `s`.
    fn upload(&mut self, s: usize, p: &PackedExpert) -> Result<(), VkError> {
        let (page, local) = (s / self.dev.per_page, s % self.dev.per_page);
        self.ctx.write_expert(&self.dev.pages[page], local, p)?;
        self.stats.uploads += 1;
        self.stats.upload_bytes += self.expert_bytes as u64;
        Ok(())
    }

    /// Runs a `RoutedExperts` op of a layer the tier serves over `n` rows: `x` (`n x hidden`),
    /// `routing` (`n x 2 top_k`), the sum into `out` (`n x hidden`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(&mut self, model: &Model, op: &Op, x: &[f32], routing: &[f32], n: usize, out: &mut [f32], precision: Precision) -> Result<(), VkError> {
        let Op::RoutedExperts { layer, glu, .. } = op else {
            return Err(VkError::BadArgument { op: "tier", msg: "not a routed-experts op".into() });
        };
        let l = layer.0 as usize;
        let t = self.index.get(l).copied().flatten().ok_or_else(|| VkError::BadArgument { op: "tier", msg: format!("{layer} is not a tier layer") })?;
        let (hidden, top_k) = (self.hidden, routing.len() / n.max(1) / 2);
        if n > self.cap_rows || top_k > self.top_k || x.len() != n * hidden || out.len() != n * hidden {
            return Err(VkError::BadArgument { op: "tier", msg: format!("{n} rows of {} (top {top_k}) exceed the tier's {} rows of {hidden} (top {})", x.len() / n.max(1), self.cap_rows, self.top_k) });
        }
        if self.opts.deterministic {
            self.upload_pending(model)?;
        }
        // 1. Heat, and who computes each pair.
        let mut dev_pairs = Vec::new();
        let mut cpu_pairs = Vec::new();
        for r in 0..n {
            for k in 0..top_k {
                let e = pair_expert(routing, top_k, r, k);
                if e >= self.layers[t].experts {
                    return Err(VkError::BadArgument { op: "tier", msg: format!("{layer}: routed to expert {e} of {}", self.layers[t].experts) });
                }
                self.heat.route(t, e);
                self.counts[t * self.experts + e] += 1;
                match self.slots.serving(t, e) {
                    Some(s) => dev_pairs.push((r, k, s)),
                    None => cpu_pairs.push((r, k)),
                }
            }
        }
        self.stats.routed += (n * top_k) as u64;
        self.stats.device += dev_pairs.len() as u64;
        // 2. A big step streams cold experts routed to many rows (`stream_plan`); their pairs
        //    leave the CPU's share.
        let streamed = self.stream_plan(routing, top_k, n, &cpu_pairs);
        let mut stream_pairs: Vec<(usize, usize, usize, usize)> = Vec::new();
        if !streamed.is_empty() {
            let at: std::collections::HashMap<usize, (usize, usize)> = streamed.iter().map(|&(e, r, sl)| (e, (r, sl))).collect();
            cpu_pairs.retain(|&(r, k)| match at.get(&pair_expert(routing, top_k, r, k)) {
                Some(&(round, slot)) => {
                    stream_pairs.push((r, k, round, slot));
                    false
                }
                None => true,
            });
            self.stats.streamed += streamed.len() as u64;
            self.stats.streamed_pairs += stream_pairs.len() as u64;
            self.stats.device += stream_pairs.len() as u64;
        }
        let rounds = streamed.iter().map(|s| s.1 + 1).max().unwrap_or(0);
        // 3. The device batch's inputs: the rows and, per page touched, the local routing.
        let mut touched = vec![false; self.dev.pages.len()];
        if !dev_pairs.is_empty() || !stream_pairs.is_empty() {
            self.ctx.write(&self.dev.xs, 0, as_bytes(x))?;
            for &(_, _, s) in &dev_pairs {
                touched[s / self.dev.per_page] = true;
            }
            for (p, _) in touched.iter().enumerate().filter(|t| *t.1) {
                let mut local = vec![-1.0f32; n * 2 * top_k];
                for &(r, k, s) in &dev_pairs {
                    let at = r * 2 * top_k + 2 * k;
                    local[at + 1] = routing[at + 1];
                    if s / self.dev.per_page == p {
                        local[at] = (s % self.dev.per_page) as f32;
                    }
                }
                self.ctx.write(&self.dev.routing[p], 0, as_bytes(&local))?;
            }
        }
        if let Some((_, bufs)) = &self.dev.stream {
            for (round, buf) in bufs.iter().enumerate().take(rounds) {
                let mut local = vec![-1.0f32; n * 2 * top_k];
                for &(r, k, rd, slot) in &stream_pairs {
                    let at = r * 2 * top_k + 2 * k;
                    local[at + 1] = routing[at + 1];
                    if rd == round {
                        local[at] = slot as f32;
                    }
                }
                self.ctx.write(buf, 0, as_bytes(&local))?;
            }
        }
        let pending: Vec<(usize, usize, usize)> = std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|s| match self.slots.state(s) {
                SlotState::Loading(pl, pe) => Some((s, pl as usize, pe as usize)),
                _ => None,
            })
            .collect();
        // 4. The batch, the streamed rounds and the uploads on a worker, the CPU's pairs here;
        //    then join.
        let mut table = vec![0.0f32; n * top_k * hidden];
        let tl = &self.layers[t];
        let ws = &model.weights;
        let expert = |e: usize| ExpertMats::of(ws, &tl.weights, e);
        let (dev, ctx) = (&self.dev, &self.ctx);
        let with_bias = dev.pages[0].has_bias();
        let batch = !dev_pairs.is_empty();
        let any_device = batch || rounds > 0;
        let cpu_done = AtomicBool::new(false);
        let t0 = Instant::now();
        let (worker, cpu_time) = std::thread::scope(|sc| {
            let w = sc.spawn(|| -> Result<(Duration, Duration, Vec<(usize, Result<(), VkError>)>), VkError> {
                let tb = Instant::now();
                let mut stream_time = Duration::ZERO;
                let views = || (dev.xs.view(0, n * hidden), dev.y.view(0, n * top_k * hidden));
                // The resident pages, then each round of streamed experts: written into the
                // staging slots, then run. The last submission copies the outputs down.
                let jobs = usize::from(batch) + rounds;
                for j in 0..jobs {
                    let round = if batch { j.checked_sub(1) } else { Some(j) };
                    if let (Some(round), Some((page, _))) = (round, &dev.stream) {
                        let tu = Instant::now();
                        for &(e, _, slot) in streamed.iter().filter(|s| s.1 == round) {
                            let p = Context::pack_expert(&expert(e), with_bias)?;
                            ctx.write_expert(page, slot, &p)?;
                        }
                        stream_time += tu.elapsed();
                    }
                    let mut f = ctx.frame()?;
                    let (xv, yv) = views();
                    match (round, &dev.stream) {
                        (None, _) => {
                            for (p, _) in touched.iter().enumerate().filter(|t| *t.1) {
                                f.moe_pairs(&dev.pages[p], xv, dev.routing[p].view(0, n * 2 * top_k), yv, n, top_k, *glu, precision, MoePath::Auto, &dev.scratch)?;
                            }
                        }
                        (Some(round), Some((page, bufs))) => {
                            f.moe_pairs(page, xv, bufs[round].view(0, n * 2 * top_k), yv, n, top_k, *glu, precision, MoePath::Auto, &dev.scratch)?;
                        }
                        (Some(_), None) => {}
                    }
                    if j + 1 == jobs {
                        f.copy(yv, dev.y_back.view(0, n * top_k * hidden))?;
                    }
                    f.run()?;
                }
                let batch_time = tb.elapsed().saturating_sub(stream_time);
                // Uploads of earlier promotions while the CPU still computes its pairs (at least
                // one a step, so they drain); the rest wait for the next step.
                let mut done = Vec::new();
                for (i, &(s, pl, pe)) in pending.iter().enumerate() {
                    if i > 0 && cpu_done.load(Ordering::Acquire) {
                        break;
                    }
                    let m = ExpertMats::of(ws, &self.layers[pl].weights, pe);
                    let r = Context::pack_expert(&m, with_bias).and_then(|p| ctx.write_expert(&dev.pages[s / dev.per_page], s % dev.per_page, &p));
                    done.push((s, r));
                }
                Ok((batch_time, stream_time, done))
            });
            if !cpu_pairs.is_empty() {
                pair_outputs(x, n, hidden, routing, top_k, &cpu_pairs, *glu, precision, &expert, &mut table);
            }
            cpu_done.store(true, Ordering::Release);
            let cpu_time = t0.elapsed();
            (w.join(), cpu_time)
        });
        let waited = t0.elapsed().saturating_sub(cpu_time);
        let (batch_time, stream_time, done) = worker.map_err(|_| VkError::BadArgument { op: "tier", msg: "the tier's worker panicked".into() })??;
        self.stats.batch += batch_time;
        // What the rule measures: the CPU's time per pair in a big step, the staging time per byte.
        if n >= self.opts.stream_min_rows && !cpu_pairs.is_empty() {
            let per = cpu_time.as_secs_f64() / cpu_pairs.len() as f64;
            self.cpu_pair_s = Some(self.cpu_pair_s.map_or(per, |c| 0.5 * (c + per)));
        }
        if !streamed.is_empty() {
            let per = stream_time.as_secs_f64() / (streamed.len() * self.expert_bytes) as f64;
            self.upload_byte_s = 0.5 * (self.upload_byte_s + per);
        }
        self.stats.cpu += cpu_time;
        self.stats.waited += waited;
        // Promotions the worker did not reach stay pending, in order.
        let reached: Vec<usize> = done.iter().map(|d| d.0).collect();
        self.pending = pending.iter().map(|p| p.0).filter(|s| !reached.contains(s)).collect();
        for (s, r) in done {
            match r {
                Ok(()) => {
                    self.slots.settle(s);
                    self.stats.uploads += 1;
                    self.stats.upload_bytes += self.expert_bytes as u64;
                }
                Err(VkError::OutOfMemory { .. }) => {
                    self.slots.abandon(s);
                    self.stats.failed += 1;
                }
                Err(e) => return Err(e),
            }
        }
        if any_device {
            // The device's pair outputs come down whole into a second table; the CPU's rows
            // are copied over them (fewer than the device's in a big step).
            let mut dev_table = vec![0.0f32; n * top_k * hidden];
            self.ctx.read(&self.dev.y_back, 0, as_bytes_mut(&mut dev_table))?;
            for &(r, k) in &cpu_pairs {
                let at = (r * top_k + k) * hidden;
                dev_table[at..at + hidden].copy_from_slice(&table[at..at + hidden]);
            }
            table = dev_table;
        }
        join_ranks(routing, n, top_k, hidden, &table, out);
        // 5. Promotions: the CPU's experts of this step, hottest first (streamed experts are
        //    not candidates: a prompt's whole working set passes through the staging slots).
        let mut cands: Vec<usize> = cpu_pairs.iter().map(|&(r, k)| pair_expert(routing, top_k, r, k)).collect();
        cands.sort_unstable();
        cands.dedup();
        cands.sort_by(|a, b| self.heat.get(t, *b).total_cmp(&self.heat.get(t, *a)).then(a.cmp(b)));
        for (i, &e) in cands.iter().enumerate() {
            if self.slots.holds(t, e) {
                continue;
            }
            if self.rate_left == 0 || self.pending.len() >= MAX_PENDING {
                self.stats.skipped += (cands.len() - i) as u64;
                break;
            }
            let slot = match self.slots.take_free(t, e) {
                Some(s) => Some(s),
                None => {
                    let heat = &self.heat;
                    match self.slots.coldest(|l, x| heat.get(l, x)) {
                        Some((s, h)) if beats(self.heat.get(t, e), h) => {
                            self.slots.replace(s, t, e);
                            self.stats.evictions += 1;
                            Some(s)
                        }
                        _ => None,
                    }
                }
            };
            if let Some(s) = slot {
                self.pending.push(s);
                self.rate_left -= 1;
            }
        }
        Ok(())
    }

    /// The experts a step streams: (expert, round, staging slot). Only steps of at least
    /// `stream_min_rows` rows, only experts the CPU would compute, most rows first. The rule:
    /// an expert moves to the device while that shortens the step, the device's side costing
    /// the expert's bytes at the measured staging rate (its compute hides behind the next
    /// upload), the CPU's its rows at the measured time per pair; no measurement yet, no
    /// streaming. In deterministic mode the routing alone decides: every expert of two rows
    /// or more, while slots last.
    fn stream_plan(&self, routing: &[f32], top_k: usize, n: usize, cpu_pairs: &[(usize, usize)]) -> Vec<(usize, usize, usize)> {
        let Some((page, _)) = &self.dev.stream else { return Vec::new() };
        if n < self.opts.stream_min_rows || cpu_pairs.is_empty() {
            return Vec::new();
        }
        let mut rows: std::collections::BTreeMap<usize, usize> = Default::default();
        for &(r, k) in cpu_pairs {
            *rows.entry(pair_expert(routing, top_k, r, k)).or_default() += 1;
        }
        let mut cands: Vec<(usize, usize)> = rows.into_iter().collect();
        cands.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let cap = page.experts * STREAM_ROUNDS;
        let mut out = Vec::new();
        if self.opts.deterministic {
            for &(e, r) in cands.iter().filter(|c| c.1 >= 2).take(cap) {
                let _ = r;
                out.push(e);
            }
        } else {
            let Some(c) = self.cpu_pair_s else { return Vec::new() };
            let per = self.expert_bytes as f64 * self.upload_byte_s;
            let (mut dev_t, mut cpu_t) = (0.0f64, cpu_pairs.len() as f64 * c);
            for &(e, r) in cands.iter().take(cap) {
                let (d2, c2) = (dev_t + per, cpu_t - r as f64 * c);
                if d2.max(c2) >= dev_t.max(cpu_t) {
                    break;
                }
                (dev_t, cpu_t) = (d2, c2);
                out.push(e);
            }
        }
        out.into_iter().enumerate().map(|(i, e)| (e, i / page.experts, i % page.experts)).collect()
    }

    /// Uploads every pending promotion now (deterministic mode, and the end of a run).
    fn upload_pending(&mut self, model: &Model) -> Result<(), VkError> {
        for s in std::mem::take(&mut self.pending) {
            let SlotState::Loading(l, e) = self.slots.state(s) else { continue };
            let p = self.pack(model, l as usize, e as usize)?;
            match self.upload(s, &p) {
                Ok(()) => self.slots.settle(s),
                Err(VkError::OutOfMemory { .. }) => {
                    self.slots.abandon(s);
                    self.stats.failed += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The per-run line: where the routed pairs ran, what is resident, what moved, and the
    /// time the batches took and the CPU waited for them.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let share = if s.routed == 0 { 0.0 } else { 100.0 * s.device as f64 / s.routed as f64 };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let resident = self.slots.resident();
        format!(
            "expert tier run: device {} of {} routed pairs ({share:.1}%), CPU {} | resident {resident} of {} slots ({} of {}) | uploads {} ({}, {} warm), evictions {}, skipped {} (rate or queue), failed {} | batches {:.1} ms, CPU share {:.1} ms, waited {:.1} ms | streamed {} experts ({} pairs)",
            s.device,
            s.routed,
            s.routed - s.device,
            self.slots.len(),
            human((resident * self.expert_bytes) as u64),
            human(self.budget),
            s.uploads,
            human(s.upload_bytes),
            s.warm,
            s.evictions,
            s.skipped,
            s.failed,
            ms(s.batch),
            ms(s.cpu),
            ms(s.waited),
            s.streamed,
            s.streamed_pairs,
        )
    }

    /// Merges this run's routings into the history file; `Ok(None)` without one.
    pub fn save_history(&self) -> Result<Option<PathBuf>, history::HistoryError> {
        let Some(path) = &self.opts.history else { return Ok(None) };
        let mut h = History::new(self.experts);
        for (t, l) in self.layers.iter().enumerate() {
            h.add(l.layer, &self.counts[t * self.experts..(t + 1) * self.experts]);
        }
        h.merge_into(path)?;
        Ok(Some(path.clone()))
    }
}

/// Device bytes of `Context::moe_scratch(rows, top_k, hidden, ffn, experts)`: q8 input rows,
/// per pair the gated rows (f32 and q8) and the outputs, the grouping table.
fn scratch_bytes(rows: usize, top_k: usize, hidden: usize, ffn: usize, experts: usize) -> u64 {
    let q8 = |elems: usize| elems.div_ceil(32) as u64 * 40;
    let pairs = rows * top_k;
    q8(rows * hidden) + (pairs * (ffn + hidden)) as u64 * 4 + q8(pairs * ffn) + (experts + 1 + pairs) as u64 * 4
}

fn has_bias(m: &ExpertMats) -> bool {
    m.gate_bias.is_some() || m.up_bias.is_some() || m.down_bias.is_some()
}

fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every byte pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
