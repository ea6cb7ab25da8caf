//! The second-device flags `coli exec` and `coli bench` share, and what they become: the
//! second device's `VkOptions` (opened beside the primary by `Engine::load`) and the compile option
//! that forces its layers. This file only maps flags to options.

use crate::engine_args::heading;
use coli_compiler::Options;
use coli_runtime::vk::{FaultInjection, VkOptions};

/// A second Vulkan device: it takes the layers after the primary's (its own fit over its own
/// memory); on a machine with one device, that device opened again as a second logical one.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SecondDeviceArgs {
    /// Devices to run on: 1, or 2 for a second device beside the primary.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2), help_heading = heading::DEVICES)]
    pub devices: u32,
    /// Pick the second device whose name contains this (default: the best other GPU, else the
    /// primary's device opened again).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device2_name: Option<String>,
    /// Use at most this many MiB of the second device's memory (default: --device-mem-mib).
    #[arg(long, value_parser = crate::checks::device_mib, help_heading = heading::DEVICES)]
    pub device2_mem_mib: Option<u64>,
    /// Keep this many layers on the second device (instead of the most that fit).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device2_layers: Option<usize>,
    /// Fault injection for tests: the second device fails at its n-th submit.
    #[arg(long, hide = true)]
    pub fail_submit2: Option<u64>,
}

impl SecondDeviceArgs {
    /// The second device's options, given the primary's (its memory cap applies to both unless
    /// --device2-mem-mib says otherwise); `None` with one device.
    pub fn options(&self, primary: &VkOptions) -> Option<VkOptions> {
        (self.devices > 1).then(|| VkOptions {
            device_name: self.device2_name.clone(),
            memory_cap: self.device2_mem_mib.map(|m| m << 20).or(primary.memory_cap),
            fault: self.fail_submit2.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None }),
            ..primary.clone()
        })
    }

    /// `o` with the second device's forced layers.
    pub fn apply(&self, o: Options) -> Options {
        Options { second_device_layers: self.device2_layers.or(o.second_device_layers), ..o }
    }
}
