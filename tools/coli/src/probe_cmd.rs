//! `coli probe`: opens the Vulkan device(s) a run would use and prints their profile as RON,
//! the file `coli compile --profile` takes, so that a plan can be studied for this machine
//! without loading a model: `coli probe > me.ron; coli compile graphs/olmoe.ron --profile me.ron`.
//! The profile goes to stdout; what was opened goes to stderr. Must not: load a checkpoint.

use crate::device2_args::SecondDeviceArgs;
use crate::engine_args::heading;
use clap::Args;
use coli_compiler::DeviceProfile;
use coli_runtime::exec::probe::profile_of_devices;
use coli_runtime::vk::{Context, DeviceRole, VkOptions};

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Pick the Vulkan device whose name contains this (default: the best one).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device_name: Option<String>,
    /// Use at most this many MiB of the device's memory (the profile's budget).
    #[arg(long, value_parser = crate::checks::device_mib, help_heading = heading::DEVICES)]
    pub device_mem_mib: Option<u64>,
    #[command(flatten)]
    pub second: SecondDeviceArgs,
}

/// The profile of the devices `a` names.
pub fn probe(a: &ProbeArgs) -> Result<DeviceProfile, String> {
    let vk = VkOptions {
        device_name: a.device_name.clone(),
        memory_cap: a.device_mem_mib.map(|m| m << 20),
        ..Default::default()
    };
    let primary = Context::new(&vk).map_err(|e| format!("no Vulkan device to probe: {e}"))?;
    tracing::info!("probed {}", primary.caps().name);
    let second = match a.second.options(&vk) {
        Some(s) => {
            let opts = VkOptions { role: DeviceRole::Second { primary_name: vk.device_name.clone() }, ..s };
            let c = Context::new(&opts).map_err(|e| format!("the second device: {e}"))?;
            tracing::info!("probed {} as the second device", c.caps().name);
            Some((c, opts.memory_cap))
        }
        None => None,
    };
    let mut devices = vec![(&primary, vk.memory_cap)];
    if let Some((c, cap)) = &second {
        devices.push((c, *cap));
    }
    Ok(profile_of_devices(&devices))
}

/// `profile` as the RON text `DeviceProfile::parse` reads.
pub fn to_ron(profile: &DeviceProfile) -> Result<String, String> {
    let pretty = ron::ser::PrettyConfig::new().struct_names(true);
    let text = ron::ser::to_string_pretty(profile, pretty).map_err(|e| format!("the profile as RON: {e}"))?;
    Ok(format!("// `coli probe` on this machine: a profile for `coli compile --profile`.\n{text}\n"))
}

pub fn run(a: ProbeArgs) -> Result<(), String> {
    print!("{}", to_ron(&probe(&a)?)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn round_trip(p: &DeviceProfile) {
        let text = to_ron(p).expect("RON");
        let back = DeviceProfile::parse(&text, Path::new("probe.ron")).unwrap_or_else(|d| panic!("{d}\n{text}"));
        assert_eq!(&back, p, "{text}");
    }

    #[test]
    fn every_committed_profile_prints_as_it_reads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/profiles");
        for e in std::fs::read_dir(&dir).expect("graphs/profiles") {
            let path = e.expect("entry").path();
            round_trip(&DeviceProfile::load(&path).unwrap_or_else(|d| panic!("{d}")));
        }
    }

    /// What probe prints for this machine's device (Lavapipe in CI) reads back unchanged; a
    /// machine without Vulkan skips with a reason.
    #[test]
    fn the_probed_profile_reads_back() {
        let a = ProbeArgs { device_name: None, device_mem_mib: Some(512), second: SecondDeviceArgs::default() };
        match probe(&a) {
            Ok(p) => {
                assert_eq!(p.devices.len(), 1);
                assert_eq!(p.devices[0].memory_budget, 512 << 20);
                round_trip(&p);
            }
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
