//! The expert tier's flags, shared by `coli exec` and `coli bench`, and what they become
//! (`coli_runtime::tier::TierOptions`).
//!
//! Must not: hold tier logic (the runtime's `tier` module does).

use crate::engine_args::heading;
use clap::Args;
use coli_runtime::tier::{history, Balance, PoolBudget, TierOptions};
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct TierArgs {
    /// The expert tier's device budget in MiB (default: what the plan leaves on the device).
    #[arg(long, value_parser = crate::checks::mib, help_heading = heading::EXPERT_TIER)]
    pub tier_mib: Option<u64>,
    /// At most this many experts in the tier on each device, whatever the budget (0 with
    /// --host-pool-mib: no device slot, every expert in the host pool).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub tier_experts: Option<usize>,
    /// Promotions into the tier per token at most.
    #[arg(long, default_value_t = 16, help_heading = heading::EXPERT_TIER)]
    pub tier_promotions: usize,
    /// Start with an empty tier instead of filling it (history first) at startup.
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_warm_start: bool,
    /// The routing history file (default for `exec`: `<checkpoint>.coli_usage` beside it).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub tier_history: Option<PathBuf>,
    /// Neither read nor write a routing history.
    #[arg(long, conflicts_with = "tier_history", help_heading = heading::EXPERT_TIER)]
    pub no_tier_history: bool,
    /// Each step's uploads complete before the next step (reproducible runs, tests).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub tier_deterministic: bool,
    /// Staging slots through which big prompt steps stream cold experts (0, the default: no
    /// streaming; on the H200 it has not yet made a prompt faster, docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 0, help_heading = heading::EXPERT_TIER)]
    pub tier_stream_slots: usize,
    /// Rows from which a step may stream.
    #[arg(long, default_value_t = 32, help_heading = heading::EXPERT_TIER)]
    pub tier_stream_rows: usize,
    /// The host pool's budget in MiB, or `auto` (from free memory: every expert the device
    /// leaves where they fit): experts the device does not hold kept in host memory it reads
    /// over the bus, so their pairs run on the device with no upload (default: no pool, that
    /// RAM stays the RAM cache's).
    #[arg(long, value_parser = pool_budget, help_heading = heading::EXPERT_TIER)]
    pub host_pool_mib: Option<PoolBudget>,
    /// The host pool in the driver's host-visible memory even where the device can import the
    /// process's own pages (VK_EXT_external_memory_host).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_host_pool_import: bool,
    /// Which of the host pool's pairs the CPU computes instead of the device: `auto` (the
    /// default: the share follows the measured times, none in deterministic runs), `off`, or a
    /// fixed share from 0 to 1.
    #[arg(long, default_value = "auto", value_parser = balance, help_heading = heading::EXPERT_TIER)]
    pub pool_balance: Balance,
}

/// `--host-pool-mib`: `auto` or MiB.
fn pool_budget(s: &str) -> Result<PoolBudget, String> {
    match s {
        "auto" => Ok(PoolBudget::Auto),
        _ => crate::checks::mib(s).map(|m| PoolBudget::Bytes(m << 20)).map_err(|e| format!("'{s}': auto or MiB ({e})")),
    }
}

/// `--pool-balance`: `auto`, `off` or a share from 0 to 1.
fn balance(s: &str) -> Result<Balance, String> {
    match s {
        "auto" => Ok(Balance::Adaptive),
        "off" => Ok(Balance::Off),
        _ => match s.parse::<f32>() {
            Ok(v) if (0.0..=1.0).contains(&v) => Ok(Balance::Fixed(v)),
            _ => Err(format!("'{s}': auto, off, or a share from 0 to 1")),
        },
    }
}

impl TierArgs {
    /// Whether the user sized the tier; then the plan sends every MoE layer through the tier
    /// (no layer resident in frame by the plan's own budget).
    pub fn sized(&self) -> bool {
        self.tier_mib.is_some() || self.tier_experts.is_some()
    }

    /// The tier's options for the checkpoint at `model`; `default_history` says whether the
    /// history beside the checkpoint is used when no path is given.
    pub fn options(&self, model: &Path, default_history: bool) -> TierOptions {
        let history = match (&self.tier_history, self.no_tier_history) {
            (_, true) => None,
            (Some(p), false) => Some(p.clone()),
            (None, false) => default_history.then(|| history::path_for(model)),
        };
        TierOptions {
            budget: self.tier_mib.map(|m| m << 20),
            max_experts: self.tier_experts,
            promotions_per_token: self.tier_promotions,
            warm_start: !self.no_warm_start,
            history,
            deterministic: self.tier_deterministic,
            stream_slots: self.tier_stream_slots,
            stream_min_rows: self.tier_stream_rows,
            host_pool: self.host_pool_mib.unwrap_or_default(),
            host_pool_import: !self.no_host_pool_import,
            balance: self.pool_balance,
        }
    }
}
