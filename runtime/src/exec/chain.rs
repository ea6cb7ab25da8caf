//! Runs a plan's frames over its devices: one `DeviceModel` per device of the plan (each with
//! the weights its own frames read, its own mirrors and per-session state), the host frames on
//! the CPU between them, in the plan's order. Values move between the host and the devices by
//! the frames' uploads and downloads only: a value made on d0 and read on d1 (the residual at
//! a handoff) goes down from d0 into the host's row buffers and up to d1 from there, so the
//! host's buffers hold every value the CPU would have, and the host's KV cache stays canonical
//! for the layers of every device. A failure of any device is an `ExecError::Device`; the
//! session then drops the whole chain and re-runs the forward on the CPU.
//!
//! The chain also owns the expert tier (`runtime::tier`): the adaptive cache that serves the
//! routed experts of the MoE layers the plan runs as host steps, within what the plan left on
//! the primary device and, when every layer fits the primary, on the second device too. A
//! failed tier batch on either device is an `ExecError::Device` like a failed frame.
//!
//! Must not: decide placement (the plan did), or record device commands (`exec::device` does).

use super::device::{DeviceError, DeviceModel, DeviceState, ReplayStats};
use super::kv_split::SplitStats;
use super::step::{HostRows, Step};
use super::{ExecError, Model};
use crate::tier::{ExpertTier, TierDevice, TierOptions, TierSetup};
use crate::vk::{Context, ExpertPages, VkError};
use coli_compiler::cost::human;
use coli_compiler::frames::Frame;
use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::ir::Op;
use coli_compiler::ops::OpKind;
use coli_compiler::schedule::{FrameCalls, Schedule};
use coli_compiler::Plan;
use std::sync::{Mutex, MutexGuard};

fn lock(m: &Mutex<ExpertTier>) -> MutexGuard<'_, ExpertTier> {
    ExpertTier::locked(m)
}

/// What `Chain::load` reports progress on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uploading {
    /// The tensors the frames of a device read (per device, each from 0).
    Weights,
    /// The experts the tier's warm start writes into its slots.
    TierExperts,
}

/// The device side of a model: one `DeviceModel` per device of the plan, the plan's frames,
/// and the expert tier.
pub struct Chain {
    /// The primary device's context (d0).
    pub ctx: Context,
    devices: Vec<DeviceModel>,
    frames: Vec<Frame>,
    /// The plan's frames as calls (`coli_compiler::schedule`).
    schedule: Schedule,
    /// The most rows one forward takes.
    pub cap_rows: usize,
    tier_line: Option<String>,
    /// The adaptive cache serving the MoE host steps (layers not resident in a frame).
    tier: Option<Mutex<ExpertTier>>,
}

/// Per-session state: one `DeviceState` per device.
pub struct ChainState {
    states: Vec<DeviceState>,
}

impl ChainState {
    /// Bytes of the K/V mirrors (keys and values; a split's or a sliding window's ring) on
    /// every device.
    pub fn kv_mirror_bytes(&self) -> u64 {
        self.states.iter().map(DeviceState::kv_mirror_bytes).sum()
    }
}

/// A device of the chain that could not take its part of the plan.
#[derive(Debug, thiserror::Error)]
#[error("{device}: {error}")]
pub struct ChainError {
    pub device: DeviceId,
    #[source]
    pub error: DeviceError,
}

impl Chain {
    /// Loads the plan's device frames: `ctxs[d]` runs the frames on `d` (the primary first).
    /// Then the expert tier for the MoE host steps within what the plan left on the primary
    /// and on a second device that holds no layers (`tier`: its options). `progress(what,
    /// done, total)`: per tensor, per device, then per expert of the tier's warm start.
    pub fn load(
        ctxs: Vec<Context>,
        plan: &Plan,
        model: &Model,
        tier: &TierOptions,
        progress: &mut dyn FnMut(Uploading, usize, usize),
    ) -> Result<Chain, ChainError> {
        // 1. Every device the plan places frames on has a context.
        for f in &plan.frames {
            if let Place::Device(d) = f.place {
                if d.0 as usize >= ctxs.len() {
                    return Err(ChainError { device: d, error: DeviceError::NotOpened { opened: ctxs.len() } });
                }
            }
        }
        let Some(primary) = ctxs.first().cloned() else {
            return Err(ChainError { device: DeviceId(0), error: DeviceError::NotOpened { opened: 0 } });
        };
        // 2. Each device uploads what its own frames read.
        // From the model's program: its weight names are the weight store's (row selections named).
        let schedule = Schedule::build(&model.program, &plan.frames);
        let mut devices = Vec::with_capacity(ctxs.len());
        for (i, ctx) in ctxs.into_iter().enumerate() {
            let device = DeviceId(i as u32);
            devices.push(
                DeviceModel::load(ctx, plan, model, device, &mut |d, t| progress(Uploading::Weights, d, t))
                    .map_err(|error| ChainError { device, error })?,
            );
        }
        // 3. The adaptive tier: every routed-experts op that runs as a host step.
        let program = &plan.program;
        let resident = |l: u32| devices.iter().any(|d| d.resident_experts().contains_key(&l));
        let mut tier_line = tier_line(plan, &devices);
        let mut tier_service = None;
        let host_moe: Vec<&Op> = program
            .layers
            .iter()
            .flat_map(|l| &l.ops)
            // Experts with shared ones beside them (Inkling) too: the tier holds the shared ones
            // as the routing names them, past the routed; DeepSeek V4's (their limited SwiGLU).
            .filter(|op| {
                matches!(op.kind(), OpKind::RoutedExperts | OpKind::RoutedExpertsShared | OpKind::RoutedExpertsLimited)
            })
            .filter(|op| matches!(op, Op::RoutedExperts { layer, .. } if !resident(layer.0)))
            .collect();
        if plan.options.expert_tier && !host_moe.is_empty() {
            let tier_devices = tier_devices(plan, &devices, tier);
            if !tier_devices.is_empty() {
                let setup = ExpertTier::setup(
                    &tier_devices,
                    &model.weights,
                    &model.program,
                    &host_moe,
                    plan.options.chunk_rows.max(1),
                    tier.clone(),
                    &mut |d, t| progress(Uploading::TierExperts, d, t),
                );
                match setup.map_err(|e| ChainError { device: DeviceId(0), error: e.into() })? {
                    TierSetup::Ready(t) => {
                        tier_line = Some(t.line().to_string());
                        tier_service = Some(Mutex::new(*t));
                    }
                    TierSetup::Off(why) => tier_line = Some(why),
                }
            }
        }
        Ok(Chain {
            ctx: primary,
            devices,
            frames: plan.frames.clone(),
            schedule,
            cap_rows: plan.options.chunk_rows.max(1),
            tier_line,
            tier: tier_service,
        })
    }

    /// The per-device models, d0 first.
    pub fn devices(&self) -> &[DeviceModel] {
        &self.devices
    }

    /// Whether any frame runs on a device.
    pub fn has_device_frames(&self) -> bool {
        self.devices.iter().any(DeviceModel::has_frames)
    }

    /// Bytes of weights uploaded, over every device.
    pub fn weight_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.weight_bytes).sum()
    }

    /// The most positions a session holds (the plan's context).
    pub fn max_context(&self) -> usize {
        self.devices.iter().map(DeviceModel::max_context).min().unwrap_or(1)
    }

    /// What the KV split's layers did so far, over every device (`None` without a split).
    pub fn kv_split_stats(&self) -> Option<SplitStats> {
        self.devices.iter().filter_map(DeviceModel::kv_split_stats).reduce(|a, b| SplitStats {
            steps: a.steps + b.steps,
            host_steps: a.host_steps + b.host_steps,
            host_positions: a.host_positions + b.host_positions,
        })
    }

    /// How the batched decode steps' frames ran, over every device: recordings made, replays,
    /// recordings dropped (`exec::device::ReplayStats`).
    pub fn replay_stats(&self) -> ReplayStats {
        self.devices.iter().map(DeviceModel::replay_stats).fold(ReplayStats::default(), |a, b| ReplayStats {
            recorded: a.recorded + b.recorded,
            replayed: a.replayed + b.replayed,
            dropped: a.dropped + b.dropped,
        })
    }

    /// One line for the user: the expert tier's budget, how many experts of which size are
    /// resident, and the rule that put them there; `None` for a model without routed experts.
    pub fn tier_line(&self) -> Option<&str> {
        self.tier_line.as_deref()
    }

    /// The expert tier's per-run line, when there is a tier.
    pub fn tier_summary(&self) -> Option<String> {
        self.tier.as_ref().map(|t| lock(t).summary())
    }

    /// Runs `f` on the expert tier, when there is one (tests and reports).
    pub fn with_tier<R>(&self, f: impl FnOnce(&mut ExpertTier) -> R) -> Option<R> {
        self.tier.as_ref().map(|t| f(&mut lock(t)))
    }

    /// Merges the run's routings into the tier's history file; the path written, if any.
    pub fn save_tier_history(&self) -> Result<Option<std::path::PathBuf>, crate::tier::history::HistoryError> {
        match &self.tier {
            Some(t) => lock(t).save_history(),
            None => Ok(None),
        }
    }

    /// Buffers for one sequence of at most `context` positions, on every device.
    pub fn new_state(&self, model: &Model, context: usize) -> Result<ChainState, VkError> {
        let states = self.devices.iter().map(|d| d.new_state(model, context)).collect::<Result<Vec<_>, _>>()?;
        Ok(ChainState { states })
    }

    /// Checks that a session's buffers for `context` positions fit on every device (made and
    /// freed); the error names the device that refused.
    pub fn check_state(&self, model: &Model, context: usize) -> Result<(), ChainError> {
        for d in &self.devices {
            d.new_state(model, context).map_err(|e| ChainError { device: d.device, error: e.into() })?;
        }
        Ok(())
    }

    /// The schedule of the plan's frames.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The expert tier, when there is one.
    pub fn tier(&self) -> Option<&Mutex<ExpertTier>> {
        self.tier.as_ref()
    }

    /// Before a forward: every sequence's mirrors on every device checked against its host
    /// cache, the tier's heat aged. `st` holds one state per sequence of the step.
    pub(crate) fn begin_forward(
        &self,
        st: &mut [&mut ChainState],
        host: &HostRows,
        step: &Step,
    ) -> Result<(), ExecError> {
        let seqs = step.sequences();
        if st.len() != seqs.len() || host.rest.len() + 1 != seqs.len() {
            return Err(ExecError::Batch("one device state and one cache per sequence"));
        }
        let caches = std::iter::once(&*host.kv).chain(host.rest.iter().map(|k| &**k));
        for ((s, kv), (_, pos0)) in st.iter_mut().zip(caches).zip(&seqs) {
            for (d, ds) in self.devices.iter().zip(&mut s.states) {
                d.begin_forward(ds, kv, *pos0);
            }
        }
        if let Some(t) = &self.tier {
            lock(t).begin_forward(step.tokens.len());
        }
        Ok(())
    }

    /// Why sessions of this chain cannot share a forward (`Session::forward_batch`), if they
    /// cannot: a KV split, or a device layer keeping a recurrent state, runs one sequence a
    /// frame.
    pub fn batch_refusal(&self) -> Option<&'static str> {
        self.devices.iter().find_map(DeviceModel::batch_refusal)
    }

    /// Runs one device frame's calls on device `d` (its uploads from the host's rows before,
    /// its downloads into them after), with each sequence's state.
    pub(crate) fn run_device_frame(
        &self,
        d: DeviceId,
        model: &Model,
        st: &mut [&mut ChainState],
        calls: &FrameCalls,
        host: &mut HostRows,
        step: &Step,
    ) -> Result<(), ExecError> {
        let i = d.0 as usize;
        let frame = self.frames.iter().find(|f| f.id == calls.frame).ok_or(ExecError::NoDevice(calls.frame.0))?;
        let mut states: Vec<&mut DeviceState> = st.iter_mut().map(|s| &mut s.states[i]).collect();
        self.devices[i].run_frame(model, &mut states, frame, calls, host, step).map_err(ExecError::Device)
    }
}

/// The devices the adaptive tier may hold slots on, each with its budget: the primary, within
/// what the plan left there beside its layers and in-frame residents; and the second device
/// when it holds no layers (every layer fits the primary), within what its own fit left.
fn tier_devices(plan: &Plan, devices: &[DeviceModel], tier: &TierOptions) -> Vec<TierDevice> {
    let pl = &plan.placement;
    let mut out = Vec::new();
    for (i, (fit, d)) in pl.fits.iter().zip(devices).enumerate() {
        if i > 1 || (i == 1 && fit.layers > 0) {
            continue;
        }
        let (b, sc) = pl.resident.bytes.get(i).copied().unwrap_or((0, 0));
        let rule = match i {
            0 if tier.budget.is_some() => "as asked".to_string(),
            0 => "what the plan left on d0 beside its layers and reserve".to_string(),
            _ => format!("what the plan left on d{i}, which holds no layers"),
        };
        out.push(TierDevice { ctx: d.ctx.clone(), device: i, budget: fit.tier.saturating_sub(b + sc), rule });
    }
    out
}

/// The tier's startup line: its budget on the devices (what the dense fit left), the resident
/// experts (count, bytes each, layers, device) and the rule that chose them.
fn tier_line(plan: &Plan, devices: &[DeviceModel]) -> Option<String> {
    let pl = &plan.placement;
    let (_, _, per_layer) = *pl.expert_bytes.first()?;
    let budget: u64 = pl.fits.iter().map(|f| f.tier).sum();
    let names: Vec<&str> = devices.iter().map(|d| d.ctx.caps().name.as_str()).collect();
    if !plan.options.expert_tier || plan.profile.devices.is_empty() {
        return Some(format!("expert tier off: every routed expert on the CPU ({per_layer} experts a layer)"));
    }
    let mut held = Vec::new();
    let mut all: Vec<u32> = Vec::new();
    for d in devices {
        let experts = d.resident_experts();
        let mut layers: Vec<u32> = experts.keys().copied().collect();
        if layers.is_empty() {
            continue;
        }
        layers.sort();
        all.extend(&layers);
        let count: usize = experts.values().map(ExpertPages::experts).sum();
        let bytes: usize = experts.values().map(ExpertPages::device_bytes).sum();
        let each = bytes.checked_div(count).unwrap_or(0);
        let on = if devices.len() > 1 { format!(" on {}", d.device) } else { String::new() };
        held.push(format!(
            "{count} experts of {} resident{on} ({}, {} in all)",
            human(each as u64),
            coli_compiler::print::layer_ranges(&layers),
            human(bytes as u64)
        ));
    }
    let host: Vec<u32> = pl.expert_bytes.iter().map(|(l, _, _)| l.0).filter(|l| !all.contains(l)).collect();
    let rule = "the budget holds every expert of every MoE layer, routed in the frames";
    let rest = if host.is_empty() {
        String::new()
    } else {
        format!("; experts of {} on the CPU (host steps)", coli_compiler::print::layer_ranges(&host))
    };
    let held = if held.is_empty() { "no layer's experts resident".to_string() } else { held.join(", ") };
    Some(format!("expert tier on {}: budget {}; {held}; rule: {rule}{rest}", names.join(" and "), human(budget)))
}
