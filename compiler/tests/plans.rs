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
    ("qwen3_5_moe", "qwen3.5-35b-a3b", "gpu-1gb", "two-gpu-1gb"),
    ("kimi_linear", "kimi-linear-48b-a3b", "laptop-2gb", "laptop-2gb-igpu"),
    ("inkling", "inkling-text", "laptop-2gb", "laptop-2gb-igpu"),
    ("gpt_oss", "gpt-oss-20b", "gpu-1gb", "two-gpu-1gb"),
    ("mimo_v2_flash", "mimo-v2-flash", "rtx4060-8gb", "two-rtx4060-8gb"),
    ("deepseek_v32", "deepseek-v3.2", "rtx4060-8gb", "two-rtx4060-8gb"),
    ("glm_moe_dsa", "glm-moe-dsa", "rtx4060-8gb", "two-rtx4060-8gb"),
    ("deepseek_v4", "deepseek-v4-flash", "rtx4060-8gb", "two-rtx4060-8gb"),
];

fn plan(spec: &str, config: &str, profile: &str) -> Plan {
    // The table shows the fit without a KV split; `kv_split_snapshots` shows the split.
    plan_with(spec, config, profile, &Options { kv_split: false, ..Options::default() })
}

fn plan_with(spec: &str, config: &str, profile: &str, options: &Options) -> Plan {
    let spec = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap_or_else(|d| panic!("{d}"));
    let b = Bindings::from_config_json(&graphs().join("configs").join(format!("{config}.json"))).unwrap();
    let profile = DeviceProfile::load(&graphs().join("profiles").join(format!("{profile}.ron")))
        .unwrap_or_else(|d| panic!("{d}"));
    compile(&spec, &b, &profile, options).unwrap_or_else(|d| panic!("{d}"))
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
                "small" => {
                    assert!(on(&p, 0) > 0 && on(&p, 0) < layers, "{spec} on {profile}: {} of {layers}", on(&p, 0))
                }
                _ => assert!(on(&p, 0) > 0 && on(&p, 1) > 0, "{spec} on {profile}: {} and {}", on(&p, 0), on(&p, 1)),
            }
            insta::assert_snapshot!(format!("{spec}@{kind}-{profile}"), p.to_string());
        }
    }
}

/// KV splits: past the budget (llama on 8 GB: more layers with capped mirrors; OLMoE on 1 GB:
/// every layer, its KV at 4096 positions being most of a layer), and forced (gpt-oss: its
/// sliding layers' windows fit the ring and keep whole mirrors, the full layers split).
#[test]
fn kv_split_snapshots() {
    let forced = Options { kv_device_positions: Some(1000), kv_block: 64, ..Options::default() };
    for (spec, config, profile, options, name) in [
        ("llama", "llama-3.1-8b", "rtx4060-8gb", Options::default(), "budget"),
        ("olmoe", "olmoe-1b-7b", "gpu-1gb", Options::default(), "budget"),
        ("gpt_oss", "gpt-oss-20b", "h200", forced, "forced"),
    ] {
        let p = plan_with(spec, config, profile, &options);
        let split = p.placement.kv_split.as_ref().unwrap_or_else(|| panic!("{spec} on {profile}: no split"));
        assert!(split.positions.is_multiple_of(split.block) && split.positions < p.options.context, "{spec}: {split}");
        assert!(
            p.frames.iter().filter(|f| f.kv_split.is_some()).count() == split.layers.len(),
            "{spec}: a split attention ends each split layer's frame"
        );
        let unsplit = plan_with(
            spec,
            config,
            profile,
            &Options { kv_split: false, kv_device_positions: None, ..options.clone() },
        );
        assert!(on(&p, 0) >= on(&unsplit, 0), "{spec} on {profile}: the split placed fewer layers");
        insta::assert_snapshot!(format!("kv_split@{spec}-{name}-{profile}"), p.to_string());
    }
}

/// Draft models (the checkpoints' multi-token prediction layers) on the large GPU: Qwen3-Next's
/// and Qwen3.5's under `mtp.` (their layer body read under `mtp.layers.0.`, a full-attention
/// layer), MiMo-V2-Flash's under `model.mtp.layers.0.` (a sliding-window layer with a dense FFN).
#[test]
fn draft_snapshots() {
    let draft = Options { kv_split: false, draft: coli_compiler::DraftRole::Draft, ..Options::default() };
    for (spec, config) in
        [("qwen3_next", "qwen3-next-80b-a3b"), ("qwen3_5_moe", "qwen3.5-35b-a3b"), ("mimo_v2_flash", "mimo-v2-flash")]
    {
        let p = plan_with(spec, config, "h200", &draft);
        assert_eq!(p.program.layers.len(), 1, "{spec}");
        insta::assert_snapshot!(format!("{spec}@draft-h200"), p.to_string());
    }
}

/// A device whose attention mirrors hold f16 (`Features::kv`): llama's attention layers count
/// half the K/V bytes and at least as many layers fit; DeepSeek V3's MLA latents stay f32.
#[test]
fn f16_mirrors_count_half_the_attention_kv() {
    let options = Options { kv_split: false, ..Options::default() };
    for (spec, config, profile, ratio) in
        [("llama", "llama-3.1-8b", "rtx4060-8gb", 2), ("deepseek_v3", "deepseek-v3", "rtx4060-8gb", 1)]
    {
        let f32s = plan_with(spec, config, profile, &options);
        let mut halved = f32s.profile.clone();
        for d in &mut halved.devices {
            d.features.kv = coli_compiler::profile::KvElement::F16;
        }
        let spec_file = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap();
        let b = Bindings::from_config_json(&graphs().join("configs").join(format!("{config}.json"))).unwrap();
        let f16s = compile(&spec_file, &b, &halved, &options).unwrap_or_else(|d| panic!("{d}"));
        assert!(on(&f16s, 0) >= on(&f32s, 0), "{spec}: {} f16 layers against {} f32", on(&f16s, 0), on(&f32s, 0));
        let (a, h) = (&f32s.placement.costs[0], &f16s.placement.costs[0]);
        assert!(a.kv > 0 && a.kv == h.kv * ratio, "{spec}: kv {} at f32, {} at f16", a.kv, h.kv);
        assert_eq!((a.matrices, a.vectors), (h.matrices, h.vectors), "{spec}");
    }
}
