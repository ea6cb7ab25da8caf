//! The flags that say where the dense weights' host copies go, shared by `coli exec` and
//! `coli bench`, and what they become (`LoadRequest::dense_device_only`). This file only maps
//! flags to that option.

/// Whether the host keeps copies of the matrices the devices hold.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DenseArgs {
    /// Release the host copies of the matrices the devices hold once they are uploaded (the
    /// default on a device that shares the CPU's RAM); a lost device reads a matrix back from
    /// the checkpoint when the CPU first needs it.
    #[arg(long, conflicts_with = "keep_host_copies")]
    pub dense_device_only: bool,
    /// Keep the host copies of the matrices the devices hold (the default on a discrete GPU).
    #[arg(long)]
    pub keep_host_copies: bool,
}

impl DenseArgs {
    /// `Some(true)` / `Some(false)` when a flag says so; `None`: by the device's kind.
    pub fn choice(&self) -> Option<bool> {
        match (self.dense_device_only, self.keep_host_copies) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}
