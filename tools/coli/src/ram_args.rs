//! The RAM expert cache's flags, shared by `coli exec`, `serve`, `chat` and `bench`, and what
//! they become (`coli_runtime::ramcache::RamOptions`).
//!
//! Must not: hold cache logic (the runtime's `ramcache` module does).

use crate::engine_args::heading;
use clap::Args;
use coli_runtime::ramcache::{RamBudget, RamOptions};

#[derive(Args, Debug, Clone)]
pub struct RamArgs {
    /// The RAM expert cache's budget in MiB: the CPU computes routed experts from copies held
    /// within it and reads the others from the checkpoint file as needed (default: a cache only
    /// when the routed experts do not fit in the free memory beside the rest of the model, with
    /// what is free less the rest and a reserve; else experts read through the file's memory map).
    #[arg(long, value_parser = crate::checks::mib, help_heading = heading::EXPERT_TIER)]
    pub ram_mib: Option<u64>,
    /// No RAM expert cache whatever the free memory: routed experts read through the file's
    /// memory map.
    #[arg(long, conflicts_with = "ram_mib", help_heading = heading::EXPERT_TIER)]
    pub no_ram_cache: bool,
    /// Reader threads of the RAM cache's disk reads.
    #[arg(long, default_value_t = 4, value_parser = crate::checks::rows, help_heading = heading::EXPERT_TIER)]
    pub ram_readers: usize,
    /// Buffered reads for the RAM cache (default: direct I/O where the file system takes it).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_direct_io: bool,
    /// Prefetch the next layer's likely experts into the RAM cache: while a layer runs, the next
    /// layer's router applied to its input starts their reads early (off by default: on the
    /// H200 machine it read 1.8x the bytes and halved decode, docs/BENCHMARKS.md).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub prefetch: bool,
    /// MiB of the routing history's hottest experts pinned in the RAM cache at startup (read
    /// before the first step, never evicted; within the cache's budget; default 0: no pins).
    #[arg(long, default_value_t = 0, value_parser = crate::checks::mib, help_heading = heading::EXPERT_TIER)]
    pub ram_pin_mib: u64,
}

impl RamArgs {
    pub fn options(&self) -> RamOptions {
        let budget = match (self.no_ram_cache, self.ram_mib) {
            (true, _) => RamBudget::Off,
            (false, Some(m)) => RamBudget::Bytes(m << 20),
            (false, None) => RamBudget::Auto,
        };
        RamOptions {
            budget,
            readers: self.ram_readers,
            direct_io: !self.no_direct_io,
            prefetch: self.prefetch,
            pin: self.ram_pin_mib << 20,
        }
    }
}
