//! The expert tier: an adaptive cache of routed experts on the devices, run as a service the
//! executor's MoE host steps call (`ExpertTier::run`).
//!
//! What it keeps: per device it spans (the primary, and a second device that holds no layers),
//! that device's budget (what the plan left there for the tier, or the user's figure for the
//! primary) divided into slots of one expert each, in a few large device pages (`side.rs`:
//! each page a stack of experts the MoE kernels read, `vk::DeviceExperts`). Global slot ids run
//! through the primary's slots, then the second device's. Which expert sits where is
//! `slots::Slots`; how hot each expert is, `heat::Heat`.
//!
//! A step (one MoE layer of one forward, `run`):
//! 1. every (row, rank) pair counts one routing of its expert; pairs whose expert serves from a
//!    slot go to the device holding that slot, the others to the CPU;
//! 2. each device's pairs are recorded as one batch (per page touched: the per-pair expert
//!    kernels of `Frame::moe_pairs`) and submitted from a worker thread of that device's own
//!    (both devices in flight at once), which then writes experts promoted at earlier steps
//!    into that device's slots for as long as the CPU still computes (at least one a step; the
//!    rest wait); meanwhile this thread computes the CPU's pairs (`cpu::experts::pair_outputs`);
//! 3. join: every worker joins (a failed batch on either device is the step's error), the
//!    devices' pair outputs come down, and every pair joins its row in rank order from zero,
//!    the devices' and the CPU's alike (`cpu::experts::join_ranks`), so what was resident, and
//!    where, changes the result only by the devices' and the CPU's rounding of each pair;
//! 4. the CPU's experts of the step, hottest first, are promoted while a slot is free (the
//!    lowest free slot: the primary's first), or take the coldest resident's slot on either
//!    device when they beat it (`heat::beats`), at most `promotions_per_token` per token of the
//!    forward. A promoted expert serves from the step after its upload completed.
//!
//! The host pool (`TierOptions::host_pool`, off by default): slots in host memory after the
//! primary's device slots (`side.rs`, `add_pool`: imported pages where the device has
//! `VK_EXT_external_memory_host`, else the driver's host-visible memory), read by the same
//! kernels over the bus, so its experts' pairs go to the device with no upload. The warm start
//! and promotions take the lowest free slot (the device's first); once the device is full a
//! CPU expert that beats the pool's coldest takes its pool slot, and after each step the pool's
//! experts of the step, hottest first, move up into the coldest device slot they beat, whose
//! expert moves down into the pool slot they left (both packed again; two promotions of the
//! rate). Exclusive with the RAM cache as every slot is: a pool expert is not kept in RAM, and
//! its RAM copy (when held) is what it is packed from before the cache lets it go.
//! With `max_experts: Some(0)` and a pool, the device holds no slot: every expert lives in the
//! pool.
//! The balancer (`balance.rs`, `TierOptions::balance`) gives the CPU a share of the pool's
//! pairs, whole experts, as the measured times say (where the RAM cache does not serve the
//! layer: the CPU reads them from the checkpoint's map).
//!
//! Every batch is joined within its step. How many uploads a step completes depends on how
//! long the CPU's share takes, so which pairs the devices serve can vary from run to run (the
//! sums differ by rounding only); with `deterministic` every upload completes before the next
//! step and streaming (the primary's staging slots only) follows the routing alone, so a run
//! repeats bit for bit.
//!
//! Warm start: the routing history (`history.rs`, a file beside the checkpoint) seeds the heat
//! and fills the slots hottest first at startup (packed in parallel), the primary's before the
//! second device's; the room left takes the experts no history named, one of each layer in
//! turn. At the end of a run the run's routings are merged into the history.
//!
//! Must not: place dense weights or decide frames (the plan did), run when a device failed
//! (the session drops every device and the tier with them), or let a slot serve before its
//! upload completed.

mod balance;
pub use crate::heat;
pub mod history;
mod options;
mod pool;
mod report;
mod side;
pub mod slots;
mod stream;

use crate::cpu::experts::{join_ranks, pair_expert, pair_outputs, ExpertMats, Routed};
use crate::heat::{beats, Heat};
use crate::ramcache::{Fetched, RamCache};
use crate::store::weights::WeightStore;
use crate::vk::{Context, PackedExpert, VkError};
pub use balance::Balance;
use balance::Balancer;
use coli_compiler::ir::{ExpertWeights, GluKind, Op, Program};
use history::History;
pub use options::{PoolBudget, TierDevice, TierDeviceStats, TierOptions, TierRunError, TierStats, TierStep};
use pool::PoolAsk;
use rayon::prelude::*;
use side::{DeviceSide, SideJob, SideSetup, SlotShape};
use slots::{SlotState, Slots};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One MoE layer the tier serves.
struct TierLayer {
    layer: usize,
    weights: ExpertWeights,
    /// The experts a routing names: the routed ones, then the shared ones (Inkling).
    experts: usize,
    routed: usize,
}

impl TierLayer {
    /// Expert `e` of the layer, a shared one past the routed.
    fn mats<'a>(&self, ws: &'a WeightStore, e: usize) -> ExpertMats<'a> {
        ExpertMats::routed_or_shared(ws, &self.weights, self.routed, e)
    }
}

/// Promotions waiting for their upload at most (more are skipped, like a spent rate).
const MAX_PENDING: usize = 64;

/// Rounds of staging slots a step streams at most.
const STREAM_ROUNDS: usize = 4;

/// The expert tier over one or two devices.
pub struct ExpertTier {
    /// One side per device holding slots, the primary's first; global slot ids run through
    /// them in order.
    sides: Vec<DeviceSide>,
    layers: Vec<TierLayer>,
    /// Program layer index -> tier layer index.
    index: Vec<Option<usize>>,
    experts: usize,
    hidden: usize,
    top_k: usize,
    cap_rows: usize,
    expert_bytes: usize,
    with_bias: bool,
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
    balancer: Balancer,
    /// The step's pair outputs (`n x top_k x hidden`), kept from step to step.
    table: Vec<f32>,
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
    /// The tier behind its mutex; a panic that poisoned it left no half-made slot (a slot
    /// serves only after its upload completed), so the tier is used as it stands.
    pub fn locked(m: &std::sync::Mutex<ExpertTier>) -> std::sync::MutexGuard<'_, ExpertTier> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets up the tier for the `RoutedExperts` ops of `ops` (the MoE host steps of the plan's
    /// device layers) on `devices` (the primary first, each within its own budget; `opts.budget`
    /// overrides the primary's): per device pages of slots and scratch for `cap_rows` rows, at
    /// most `opts.max_experts` slots a device and never more than the devices before it leave
    /// of the experts; then the warm start, the primary's slots first.
    pub fn setup(
        devices: &[TierDevice],
        ws: &WeightStore,
        program: &Program,
        ops: &[&Op],
        cap_rows: usize,
        opts: TierOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<TierSetup, VkError> {
        let mut layers = Vec::new();
        let mut shape: Option<(ExpertMats, usize, GluKind)> = None;
        let mut top_k = 0;
        let mut other = Vec::new();
        for op in ops {
            let Op::RoutedExperts { layer, experts, weights, routing, glu, .. } = op else { continue };
            let m = ExpertMats::of(ws, weights, 0);
            // Shared experts beside the routed ones (Inkling) take slots as routed ones do: of
            // their shape, without biases.
            let shared = weights.shared.as_ref().map_or(0, |s| s.count);
            if let Some(s) = &weights.shared {
                let sm = ExpertMats::shared(ws, s, 0);
                let same = (sm.gate.format, sm.gate.rows, sm.gate.cols, sm.down.format)
                    == (m.gate.format, m.gate.rows, m.gate.cols, m.down.format);
                if !same || has_bias(&m) {
                    other.push(layer.0);
                    continue;
                }
            }
            match &shape {
                None => shape = Some((m, *experts, *glu)),
                Some((like, _, g)) => {
                    // One slot shape: a layer whose experts differ (a quant mix) stays on the CPU.
                    let same = (m.gate.format, m.gate.rows, m.gate.cols, m.down.format)
                        == (like.gate.format, like.gate.rows, like.gate.cols, like.down.format)
                        && g == glu;
                    if !same {
                        other.push(layer.0);
                        continue;
                    }
                }
            }
            top_k = top_k.max(program.value(*routing).width / 2);
            let (layer, weights) = (layer.0 as usize, weights.clone());
            layers.push(TierLayer { layer, weights, experts: *experts + shared, routed: *experts });
        }
        let Some((like, _, _)) = shape else {
            return Ok(TierSetup::Off("expert tier: no routed experts through host steps".into()));
        };
        let (hidden, ffn) = (like.gate.cols, like.gate.rows);
        let experts = layers.iter().map(|l| l.experts).max().unwrap_or(0);
        let with_bias = has_bias(&like);
        let packed = Context::pack_expert(&like, with_bias)?;
        let expert_bytes = packed.bytes() + if with_bias { (2 * ffn + hidden) * 4 } else { 0 };
        let cap_rows = cap_rows.max(1);
        let total: usize = layers.iter().map(|l| l.experts).sum();
        let shape = SlotShape { like, hidden, ffn, top_k, cap_rows, packed_bytes: packed.bytes(), expert_bytes };
        // Each device in turn: its side, within its budget and what the devices before it left.
        let mut sides: Vec<DeviceSide> = Vec::new();
        let mut notes = Vec::new();
        let mut pool_note = None;
        let mut budget = 0;
        for (i, d) in devices.iter().enumerate() {
            let b = if i == 0 { opts.budget.unwrap_or(d.budget) } else { d.budget };
            budget += b;
            let held: usize = sides.iter().map(DeviceSide::slots).sum();
            let left = (total - held).min(opts.max_experts.unwrap_or(usize::MAX));
            // The host pool follows the primary's slots, and may take every expert.
            let pool_room = if i == 0 && opts.host_pool != PoolBudget::Off { total } else { 0 };
            if left == 0 && pool_room == 0 {
                if opts.max_experts == Some(0) {
                    notes.push("asked for no experts (--tier-experts 0)".into());
                } else if i > 0 {
                    notes.push(format!("d{} holds none: every expert fits the devices before it", d.device));
                }
                continue;
            }
            // Streaming's staging slots stay on the primary.
            let stream = if sides.is_empty() { opts.stream_slots } else { 0 };
            match DeviceSide::size(&d.ctx, d.device, b, &d.rule, &shape, left, stream, pool_room)? {
                SideSetup::Ready(mut side) => {
                    side.first = held;
                    if i == 0 {
                        let left = total - side.slots();
                        // The experts' host bytes taken as their slots' (the packed form).
                        let other = (ws.bytes() as u64).saturating_sub((total * expert_bytes) as u64);
                        let floor = (layers.len() * top_k * expert_bytes) as u64;
                        let ask = PoolAsk { budget: opts.host_pool, other, floor, import: opts.host_pool_import };
                        pool_note = pool::host_pool(&mut side, ask, &shape, left)?;
                    }
                    if side.slots() == 0 {
                        // No device slot and no pool after all.
                        notes.push(pool_note.take().unwrap_or_else(|| "no slots".into()));
                        continue;
                    }
                    sides.push(*side);
                }
                SideSetup::Off(why) if devices.len() > 1 => notes.push(format!("d{} holds none: {why}", d.device)),
                SideSetup::Off(why) => notes.push(why),
            }
        }
        let Some(first) = sides.first() else {
            let why = notes.first().cloned().unwrap_or_else(|| "no device".into());
            return Ok(TierSetup::Off(format!("expert tier off: {why}; every routed expert on the CPU")));
        };
        let first_name = first.ctx.caps().name.clone();
        let slots_n: usize = sides.iter().map(DeviceSide::slots).sum();
        let mut index = vec![None; program.layers.len()];
        for (i, l) in layers.iter().enumerate() {
            index[l.layer] = Some(i);
        }
        let n_layers = layers.len();
        let mut tier = ExpertTier {
            sides,
            index,
            experts,
            hidden,
            top_k,
            cap_rows,
            expert_bytes,
            with_bias,
            heat: Heat::new(n_layers, experts),
            slots: Slots::new(slots_n, n_layers, experts),
            counts: vec![0; n_layers * experts],
            pending: Vec::new(),
            rate_left: 0,
            cpu_pair_s: None,
            upload_byte_s: 1.0 / 8e9,
            balancer: Balancer::new(opts.balance, opts.deterministic),
            table: Vec::new(),
            budget,
            stats: TierStats::default(),
            line: String::new(),
            layers,
            opts,
        };
        let mut line = tier.setup_line(&first_name, pool_note.as_deref(), &notes, &other);
        if tier.opts.warm_start {
            let t = Instant::now();
            let (from_history, filled) = tier.warm_start(ws, progress)?;
            line.push_str(&format!(
                "; warm start: {filled} experts ({from_history} from the history) in {:.1} s",
                t.elapsed().as_secs_f64()
            ));
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

    /// Slots in all (the host pool's included).
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
    fn warm_start(
        &mut self,
        ws: &WeightStore,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(usize, usize), VkError> {
        let mut named = Vec::new();
        if let Some(path) = &self.opts.history {
            match History::load(path, self.index.len()) {
                Ok(Some(h)) if h.experts == self.experts => {
                    for (t, l) in self.layers.iter().enumerate() {
                        if let Some(c) = h.layers.get(&l.layer) {
                            self.heat.seed(t, c);
                            named.extend((0..l.experts).filter(|&e| c[e] > 0).map(|e| (t, e)));
                        }
                    }
                }
                Ok(Some(h)) => tracing::warn!(
                    "expert tier: {} counts {} experts a layer, the model has {}; ignored",
                    path.display(),
                    h.experts,
                    self.experts
                ),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("expert tier: {e}; the history is ignored and rewritten at the end of the run")
                }
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
        let mut done = 0;
        progress(0, placed.len());
        for chunk in placed.chunks(self.sides[0].per_page.max(8)) {
            let packed: Vec<Result<PackedExpert, VkError>> =
                chunk.par_iter().map(|&(_, t, e)| self.pack(ws, t, e)).collect();
            for (&(s, _, _), p) in chunk.iter().zip(packed) {
                self.upload(s, &p?)?;
                self.slots.settle(s);
                self.stats.warm += 1;
            }
            done += chunk.len();
            progress(done, placed.len());
        }
        Ok((from_history, placed.len()))
    }

    fn pack(&self, ws: &WeightStore, t: usize, e: usize) -> Result<PackedExpert, VkError> {
        let l = &self.layers[t];
        Context::pack_expert(&l.mats(ws, e), self.with_bias)
    }

    /// Writes a packed expert into global slot `s`.
    fn upload(&mut self, s: usize, p: &PackedExpert) -> Result<(), VkError> {
        let side = self.side_of(s)?;
        side.write(s - side.first, p)?;
        side.uploads += 1;
        self.stats.uploads += 1;
        self.stats.upload_bytes += self.expert_bytes as u64;
        Ok(())
    }

    /// The index of the side holding global slot `s`.
    fn side_index(&self, s: usize) -> Result<usize, VkError> {
        self.sides
            .iter()
            .position(|d| d.owns(s))
            .ok_or_else(|| VkError::BadArgument { op: "tier", msg: format!("slot {s} of {}", self.slots.len()) })
    }

    fn side_of(&mut self, s: usize) -> Result<&mut DeviceSide, VkError> {
        let i = self.side_index(s)?;
        Ok(&mut self.sides[i])
    }

    /// Runs a `RoutedExperts` op of a layer the tier serves over `step`'s rows: `x` (`n x
    /// hidden`), `routing` (`n x 2 top_k`), the sum into `out` (`n x hidden`). The CPU's pairs
    /// read their experts from `ram` when it serves the layer (the experts the tier holds are
    /// not kept there), else from the weight store.
    pub fn run(
        &mut self,
        ws: &WeightStore,
        ram: Option<&RamCache>,
        step: TierStep,
        out: &mut [f32],
    ) -> Result<(), TierRunError> {
        let TierStep { op, x, routing, n, precision } = step;
        let t_prep = Instant::now();
        let Op::RoutedExperts { layer, glu, .. } = op else {
            return Err(VkError::BadArgument { op: "tier", msg: "not a routed-experts op".into() }.into());
        };
        let l = layer.0 as usize;
        let t = self
            .index
            .get(l)
            .copied()
            .flatten()
            .ok_or_else(|| VkError::BadArgument { op: "tier", msg: format!("{layer} is not a tier layer") })?;
        let ram_in = ram;
        let ram = ram.filter(|r| r.serves(l));
        let (hidden, top_k) = (self.hidden, routing.len() / n.max(1) / 2);
        if n > self.cap_rows || top_k > self.top_k || x.len() != n * hidden || out.len() != n * hidden {
            return Err(VkError::BadArgument {
                op: "tier",
                msg: format!(
                    "{n} rows of {} (top {top_k}) exceed the tier's {} rows of {hidden} (top {})",
                    x.len() / n.max(1),
                    self.cap_rows,
                    self.top_k
                ),
            }
            .into());
        }
        if self.opts.deterministic {
            self.upload_pending(ws, ram_in)?;
        }
        // 1. Heat, and who computes each pair: the device holding its expert's slot, or the CPU.
        let mut dev_pairs = Vec::new();
        let mut cpu_pairs = Vec::new();
        for r in 0..n {
            for k in 0..top_k {
                let e = pair_expert(routing, top_k, r, k);
                if e >= self.layers[t].experts {
                    return Err(VkError::BadArgument {
                        op: "tier",
                        msg: format!("{layer}: routed to expert {e} of {}", self.layers[t].experts),
                    }
                    .into());
                }
                self.heat.route(t, e);
                self.counts[t * self.experts + e] += 1;
                match self.slots.serving(t, e) {
                    Some(s) => dev_pairs.push((r, k, s)),
                    None => cpu_pairs.push((r, k)),
                }
            }
        }
        // The balancer's share of the pool's pairs to the CPU (none where the RAM cache serves
        // the layer: a pool expert's host copy would come from disk).
        let share = if ram.is_some() { 0.0 } else { self.balancer.share(n) };
        let expert_of = |r, k| pair_expert(routing, top_k, r, k);
        let (pool_pairs, moved) =
            balance::move_pool_pairs(share, expert_of, |s| self.in_pool(s), &mut dev_pairs, &mut cpu_pairs);
        self.stats.pool += (pool_pairs - moved) as u64;
        self.stats.balanced += moved as u64;
        self.stats.routed += (n * top_k) as u64;
        self.stats.device += dev_pairs.len() as u64;
        // 2. A big step streams cold experts routed to many rows (`stream_plan`) through the
        //    primary's staging slots; their pairs leave the CPU's share.
        let streamed = self.stream_plan(routing, top_k, n, &cpu_pairs);
        let mut stream_pairs: Vec<(usize, usize, usize, usize)> = Vec::new();
        if !streamed.is_empty() {
            let at: std::collections::HashMap<usize, (usize, usize)> =
                streamed.iter().map(|&(e, r, sl)| (e, (r, sl))).collect();
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
        // 3. Each side's job (its pairs in local slot ids, the promotions waiting for its slots)
        //    and inputs.
        let tl = &self.layers[t];
        let pending: Vec<(usize, usize, usize)> = std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|s| match self.slots.state(s) {
                SlotState::Loading(pl, pe) => Some((s, pl as usize, pe as usize)),
                _ => None,
            })
            .collect();
        // A promotion packs from the RAM cache's copy when it holds one, else from the store.
        let from_ram: Vec<Option<Fetched>> =
            pending.iter().map(|&(_, pl, pe)| ram_in.and_then(|r| r.held(self.layers[pl].layer, pe))).collect();
        let mut pending_mats = Vec::with_capacity(pending.len());
        for (&(_, pl, pe), f) in pending.iter().zip(&from_ram) {
            pending_mats.push(
                match (ram_in, f) {
                    (Some(r), Some(f)) => r.mats(ws, f, pe)?,
                    _ => None,
                }
                .unwrap_or_else(|| self.layers[pl].mats(ws, pe)),
            );
        }
        let mut jobs: Vec<SideJob> = Vec::with_capacity(self.sides.len());
        for (i, side) in self.sides.iter().enumerate() {
            let mine = |s: &usize| side.owns(*s);
            jobs.push(SideJob {
                pairs: dev_pairs.iter().filter(|p| mine(&p.2)).map(|&(r, k, s)| (r, k, s - side.first)).collect(),
                streamed: if i == 0 { streamed.clone() } else { Vec::new() },
                stream_pairs: if i == 0 { stream_pairs.clone() } else { Vec::new() },
                rounds: if i == 0 { rounds } else { 0 },
                pending: pending
                    .iter()
                    .zip(&pending_mats)
                    .filter(|(p, _)| mine(&p.0))
                    .map(|(&(s, _, _), m)| (s, s - side.first, *m))
                    .collect(),
            });
        }
        let mut touched = Vec::with_capacity(jobs.len());
        for (side, job) in self.sides.iter().zip(&jobs) {
            touched.push(side.write_inputs(x, routing, n, top_k, job)?);
        }
        // 4. Each side's batch, streamed rounds and uploads on a worker of its own (both in
        //    flight at once), the CPU's pairs here; then every worker joins.
        // Every pair's row is written below (the CPU's or a device's), so the table kept from
        // the last step is reused as it is: no zeroing, no fresh pages a step.
        let mut table = std::mem::take(&mut self.table);
        if table.len() < n * top_k * hidden {
            table.resize(n * top_k * hidden, 0.0);
        }
        let table_len = n * top_k * hidden;
        let expert = |e: usize| tl.mats(ws, e);
        // The CPU's experts out of RAM (read from disk on a miss), none kept that the tier holds.
        let fetched = match ram {
            Some(r) if !cpu_pairs.is_empty() => {
                let want = crate::ramcache::pairs_per_expert(routing, top_k, &cpu_pairs);
                let slots = &self.slots;
                Some(r.fetch(l, &want, &|e| !slots.holds(t, e))?)
            }
            _ => None,
        };
        let ram_table = match (ram, &fetched) {
            (Some(r), Some(f)) => r.table(ws, f)?,
            _ => Vec::new(),
        };
        let cpu_expert = |e: usize| ram_table.get(e).copied().flatten().unwrap_or_else(|| expert(e));
        let cpu_done = AtomicBool::new(false);
        let t0 = Instant::now();
        self.stats.host[0] += t0 - t_prep;
        let (results, cpu_time) = std::thread::scope(|sc| {
            let workers: Vec<_> = self
                .sides
                .iter()
                .zip(&jobs)
                .zip(&touched)
                .map(|((side, job), touched)| {
                    let (expert, cpu_done) = (&expert, &cpu_done);
                    let batch = side::Batch { n, glu: *glu, precision };
                    sc.spawn(move || side.work(job, touched, expert, batch, cpu_done))
                })
                .collect();
            if !cpu_pairs.is_empty() {
                let rows = Routed { x, n, hidden, routing, top_k };
                pair_outputs(rows, &cpu_pairs, *glu, precision, &cpu_expert, &mut table[..table_len]);
            }
            cpu_done.store(true, Ordering::Release);
            let cpu_time = t0.elapsed();
            let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
            (results, cpu_time)
        });
        let waited = t0.elapsed().saturating_sub(cpu_time);
        let t_gather = Instant::now();
        // Every worker has joined: a failed batch on either device is the step's error (the
        // session then turns every device off and the CPU runs the forward again).
        let mut done_all = Vec::new();
        let (mut batch_time, mut stream_time) = (Duration::ZERO, Duration::ZERO);
        for r in results {
            let (b, st, done) =
                r.map_err(|_| VkError::BadArgument { op: "tier", msg: "the tier's worker panicked".into() })??;
            batch_time = batch_time.max(b);
            stream_time += st;
            done_all.extend(done);
        }
        self.stats.batch += batch_time;
        if pool_pairs > 0 {
            let device_ran = jobs.iter().any(SideJob::runs);
            let (b, c) = (device_ran.then_some(batch_time), (!cpu_pairs.is_empty()).then_some(cpu_time));
            self.balancer.update(n, b, c);
        }
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
        // Promotions the workers did not reach stay pending, in order.
        let reached: Vec<usize> = done_all.iter().map(|d| d.0).collect();
        self.pending = pending.iter().map(|p| p.0).filter(|s| !reached.contains(s)).collect();
        for (s, r) in done_all {
            match r {
                Ok(()) => {
                    self.settle(s, ram_in);
                    self.stats.uploads += 1;
                    self.stats.upload_bytes += self.expert_bytes as u64;
                    self.side_of(s)?.uploads += 1;
                }
                Err(VkError::OutOfMemory { .. }) => {
                    self.slots.abandon(s);
                    self.stats.failed += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        // The devices' pair outputs come down, each side's pairs into the table beside the
        // CPU's.
        for (side, job) in self.sides.iter_mut().zip(&jobs) {
            if !job.runs() {
                continue;
            }
            let rows =
                (job.pairs.iter().map(|&(r, k, _)| (r, k))).chain(job.stream_pairs.iter().map(|&(r, k, _, _)| (r, k)));
            side.pairs += side.read_pairs(n, top_k, hidden, rows, &mut table[..table_len])?;
        }
        join_ranks(routing, n, top_k, hidden, &table[..table_len], out);
        self.table = table;
        let t_after = Instant::now();
        self.stats.host[1] += t_after - t_gather;
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
                    // A newcomer enters the lowest level there is: the host pool, else the device.
                    let heat = &self.heat;
                    let level = self.pool_range().unwrap_or(0..self.slots.len());
                    match self.slots.coldest_in(level, |l, x| heat.get(l, x)) {
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
        // 6. The host pool's experts of this step move up (the module doc).
        self.promote_from_pool(t, routing, top_k, &dev_pairs);
        self.stats.host[2] += t_after.elapsed();
        Ok(())
    }

    /// The upload into slot `s` completed: it serves, and the RAM cache lets its expert go.
    fn settle(&mut self, s: usize, ram: Option<&RamCache>) {
        self.slots.settle(s);
        if let (Some(r), SlotState::Serving(l, e)) = (ram, self.slots.state(s)) {
            r.forget(self.layers[l as usize].layer, e as usize);
        }
    }

    /// Uploads every pending promotion now (deterministic mode, and the end of a run).
    fn upload_pending(&mut self, ws: &WeightStore, ram: Option<&RamCache>) -> Result<(), TierRunError> {
        for s in std::mem::take(&mut self.pending) {
            let SlotState::Loading(l, e) = self.slots.state(s) else { continue };
            let (l, e) = (l as usize, e as usize);
            let held = ram.and_then(|r| r.held(self.layers[l].layer, e));
            let p = match (ram, &held) {
                (Some(r), Some(f)) => match r.mats(ws, f, e)? {
                    Some(m) => Context::pack_expert(&m, self.with_bias)?,
                    None => self.pack(ws, l, e)?,
                },
                _ => self.pack(ws, l, e)?,
            };
            match self.upload(s, &p) {
                Ok(()) => self.settle(s, ram),
                Err(VkError::OutOfMemory { .. }) => {
                    self.slots.abandon(s);
                    self.stats.failed += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
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
