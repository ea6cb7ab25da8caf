//! The KV-split flags `coli compile`, `coli exec` and `coli bench` share, and how they set the
//! compile options (`Options::kv_device_positions`, `kv_block`, `kv_split`). This file only
//! maps flags to options; the split itself is the compiler's and the runtime's.

use crate::engine_args::heading;
use coli_compiler::Options;

/// How the KV mirrors of device layers may split between the device and host RAM.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvSplitArgs {
    /// Force a KV split: each device layer keeps a row's newest N positions on the device
    /// (whole blocks), the older ones in host RAM.
    #[arg(long, value_name = "N", value_parser = positive, help_heading = heading::KV_CACHE)]
    pub kv_device_positions: Option<usize>,
    /// Positions per block of a KV split (default 64).
    #[arg(long, value_name = "N", value_parser = crate::checks::block, help_heading = heading::KV_CACHE)]
    pub kv_block: Option<usize>,
    /// Never split the KV mirrors past the device's budget (fewer layers on the device instead).
    #[arg(long, help_heading = heading::KV_CACHE)]
    pub no_kv_split: bool,
}

/// A count of at least 1 (a split keeping no position on the device is not a split).
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1 position (the device keeps whole blocks of the newest positions)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl KvSplitArgs {
    /// `o` with these flags applied.
    pub fn apply(&self, o: Options) -> Options {
        Options {
            kv_device_positions: self.kv_device_positions.or(o.kv_device_positions),
            kv_block: self.kv_block.unwrap_or(o.kv_block),
            kv_split: o.kv_split && !self.no_kv_split,
            ..o
        }
    }
}
