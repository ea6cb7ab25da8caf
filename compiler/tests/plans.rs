//! Plan snapshots: every spec under graphs/ with a reference configuration, on a table of
//! device profiles (no device; one large GPU that holds every dense part; one small GPU that
//! holds some layers; two GPUs, the second taking layers after the first's). A plan's text is
//! its snapshot: reviewing a snapshot diff is how a lowering change is reviewed.

use coli_compiler::bind::Bindings;
use coli_compiler::ids::Place;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options, Plan};
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

/// `(spec, config, small profile, two-device profile)`: the profiles are chosen so that the
/// small one holds some but not all of the model's layers and the two-device one puts layers
/// on both devices.
const TABLE: &[(&str, &str, &str, &str)] = &[
    ("llama", "llama-3.1-8b", "rtx4060-8gb", "two-rtx4060-8gb"),
    ("olmoe", "olmoe-1b-7b", "gpu-1gb", "two-gpu-1gb"),
    ("qwen3_moe", "qwen3-30b-a3b", "laptop-2gb", "laptop-2gb-igpu"),
    ("mixtral", "mixtral-8x7b", "laptop-2gb", "laptop-2gb-igpu"),
    ("deepseek_v3", "deepseek-v3", "rtx4060-8gb", "two-rtx4060-8gb"),
    ("qwen3_next", "qwen3-next-80b-a3b", "laptop-2gb", "laptop-2gb-igpu"),
    ("gpt_oss", "gpt-oss-20b", "gpu-1gb", "two-gpu-1gb"),
    ("mimo_v2_flash", "mimo-v2-flash", "rtx4060-8gb", "two-rtx4060-8gb"),
];

fn plan(spec: &str, config: &str, profile: &str) -> Plan {
    let spec = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap_or_else(|d| panic!("{d}"));
    let b = Bindings::from_config_json(&graphs().join("configs").join(format!("{config}.json"))).unwrap();
    let profile = DeviceProfile::load(&graphs().join("profiles").join(format!("{profile}.ron"))).unwrap_or_else(|d| panic!("{d}"));
    compile(&spec, &b, &profile, &Options::default()).unwrap_or_else(|d| panic!("{d}"))
}

fn on(plan: &Plan, d: u32) -> usize {
    plan.placement.layers.iter().filter(|p| **p == Place::Device(coli_compiler::ids::DeviceId(d))).count()
}

#[test]
fn plan_snapshots() {
    for &(spec, config, small, two) in TABLE {
        for (kind, profile) in [("cpu", "cpu-only"), ("large", "h200"), ("small", small), ("two", two)] {
            let p = plan(spec, config, profile);
            let layers = p.program.layers.len();
            match kind {
                "cpu" => assert_eq!(on(&p, 0), 0),
                "large" => assert_eq!(on(&p, 0), layers, "{spec} on {profile}"),
                "small" => assert!(on(&p, 0) > 0 && on(&p, 0) < layers, "{spec} on {profile}: {} of {layers}", on(&p, 0)),
                _ => assert!(on(&p, 0) > 0 && on(&p, 1) > 0, "{spec} on {profile}: {} and {}", on(&p, 0), on(&p, 1)),
            }
            insta::assert_snapshot!(format!("{spec}@{kind}-{profile}"), p.to_string());
        }
    }
}
