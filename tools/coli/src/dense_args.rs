//! The flags that say where the dense weights' host copies go, shared by `coli exec` and
//! `coli bench`, and what they become (`EngineOptions::host_copies`). This file only maps
//! flags to that option.

use crate::engine_args::heading;
use coli_runtime::engine::HostCopies;

/// Whether the host keeps copies of the matrices the devices hold.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DenseArgs {
    /// Release the host copies of the matrices the devices hold once they are uploaded (the
    /// default on a device that shares the CPU's RAM); a lost device reads a matrix back from
    /// the checkpoint when the CPU first needs it.
    #[arg(long, conflicts_with = "keep_host_copies", help_heading = heading::DEVICES)]
    pub dense_device_only: bool,
    /// Keep the host copies of the matrices the devices hold (the default on a discrete GPU).
    #[arg(long, help_heading = heading::DEVICES)]
    pub keep_host_copies: bool,
}

impl DenseArgs {
    /// `Release` / `Keep` when a flag says so; else by the device's kind.
    pub fn host_copies(&self) -> HostCopies {
        match (self.dense_device_only, self.keep_host_copies) {
            (true, _) => HostCopies::Release,
            (_, true) => HostCopies::Keep,
            _ => HostCopies::ByDevice,
        }
    }
}
