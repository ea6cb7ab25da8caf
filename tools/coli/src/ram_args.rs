//! The RAM expert cache's flags, shared by `coli exec`, `serve`, `chat` and `bench`, and what
//! they become (`coli_runtime::ramcache::RamOptions`).
//!
//! Must not: hold cache logic (the runtime's `ramcache` module does).

use crate::engine_args::heading;
use clap::Args;
use coli_runtime::ramcache::RamOptions;

#[derive(Args, Debug, Clone)]
pub struct RamArgs {
    /// The RAM expert cache's budget in MiB: the CPU computes routed experts from copies held
    /// within it and reads the others from the checkpoint file as needed (default: no cache,
    /// experts read through the file's memory map).
    #[arg(long, value_parser = crate::checks::mib, help_heading = heading::EXPERT_TIER)]
    pub ram_mib: Option<u64>,
    /// Reader threads of the RAM cache's disk reads.
    #[arg(long, default_value_t = 4, value_parser = crate::checks::rows, help_heading = heading::EXPERT_TIER)]
    pub ram_readers: usize,
    /// Buffered reads for the RAM cache (default: direct I/O where the file system takes it).
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_direct_io: bool,
}

impl RamArgs {
    pub fn options(&self) -> RamOptions {
        RamOptions { budget: self.ram_mib.map(|m| m << 20), readers: self.ram_readers, direct_io: !self.no_direct_io }
    }
}
