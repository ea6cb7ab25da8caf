//! The expert tier's options (what the CLI's tier flags set), the devices it is given, a step
//! it is asked to run and how that fails, and what it reports: its totals for the per-run line
//! and each device's share.

use crate::cpu::Precision;
use crate::ramcache::RamError;
use crate::vk::{Context, VkError};
use coli_compiler::ir::Op;
use std::path::PathBuf;
use std::time::Duration;

/// How the tier behaves (the CLI's tier flags).
#[derive(Clone, Debug)]
pub struct TierOptions {
    /// The primary device's budget in bytes; `None`: what the plan left on it for the tier (a
    /// second device's budget is always what the plan left there).
    pub budget: Option<u64>,
    /// At most this many experts resident on each device, whatever the budget.
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
    /// The host pool's budget (`--host-pool-mib`): slots in host memory beside the primary's,
    /// which the device reads over the bus; `PoolBudget::Off` (the default): no pool, as the
    /// pool's RAM is the RAM cache's to take otherwise.
    pub host_pool: PoolBudget,
    /// The pool in the process's own pages imported with `VK_EXT_external_memory_host` where
    /// the device has it (else, and when false, in the driver's host-visible memory).
    pub host_pool_import: bool,
    /// Which of the pool's pairs the CPU computes instead (`balance.rs`).
    pub balance: super::Balance,
}

/// The host pool's budget (`TierOptions::host_pool`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolBudget {
    /// No pool.
    #[default]
    Off,
    /// This many bytes (`--host-pool-mib N`).
    Bytes(u64),
    /// From the host's free memory (`--host-pool-mib auto`, `pool::auto_pool_budget`'s rule):
    /// every expert the device slots leave where they fit, else what is free less the other
    /// weights, a reserve and the RAM cache's floor.
    Auto,
}

impl Default for TierOptions {
    fn default() -> TierOptions {
        TierOptions {
            budget: None,
            max_experts: None,
            promotions_per_token: 16,
            warm_start: true,
            history: None,
            deterministic: false,
            stream_slots: 0,
            stream_min_rows: 32,
            host_pool: PoolBudget::Off,
            host_pool_import: true,
            balance: super::Balance::Adaptive,
        }
    }
}

/// What the tier did, for the per-run line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TierStats {
    /// Routed (row, rank) pairs, those the device served (the host pool's included), and those
    /// it served from the host pool.
    pub routed: u64,
    pub device: u64,
    pub pool: u64,
    /// Experts moved up from the host pool into a device slot.
    pub pool_promotions: u64,
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
    /// The host's own time in a step: before the batch (who computes what, the inputs
    /// written), after it (the outputs read and joined), and the promotions' choice.
    pub host: [Duration; 3],
    /// Pairs of host pool experts the balancer gave the CPU (not part of `device` or `pool`).
    pub balanced: u64,
    /// Experts streamed through the staging slots (and their pairs, part of `device`).
    pub streamed: u64,
    pub streamed_pairs: u64,
}

/// One device's share of the tier, for reports and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierDeviceStats {
    /// The chain's index of the device (0: the primary).
    pub device: usize,
    pub slots: usize,
    pub resident: usize,
    /// Pairs it served (streamed ones included) and experts written into its slots.
    pub pairs: u64,
    pub uploads: u64,
}

/// A device the tier may hold slots on: its context, its budget and where that came from.
#[derive(Clone)]
pub struct TierDevice {
    pub ctx: Context,
    /// The chain's index of the device (0: the primary).
    pub device: usize,
    pub budget: u64,
    pub rule: String,
}

/// One MoE step the tier runs (`ExpertTier::run`): the op, its `n` rows `x` and their
/// routing, and the precision of the CPU's products.
#[derive(Clone, Copy)]
pub struct TierStep<'a> {
    pub op: &'a Op,
    pub x: &'a [f32],
    pub routing: &'a [f32],
    pub n: usize,
    pub precision: Precision,
}

/// Why a tier step failed: a device (the session goes on without devices), or the RAM
/// cache's reads (the forward fails).
#[derive(Debug, thiserror::Error)]
pub enum TierRunError {
    #[error(transparent)]
    Device(#[from] VkError),
    #[error(transparent)]
    Ram(#[from] RamError),
}
