//! DeepSeek Sparse Attention in the IR: the indexer is an op whose output (a selection) a later
//! MLA reads, so GLM-MoE-DSA's shared layers read the last full layer's selection instead of
//! recomputing it; the indexer's roles and shapes are located diagnostics; where a profile lists
//! no kinds the indexer and the MLA over its selection run on the device, in one frame; a
//! profile that names kinds without `indexer` keeps the indexer on the host.

use coli_compiler::bind::Bindings;
use coli_compiler::ids::Place;
use coli_compiler::ir::Op;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Diagnostics, Options, Plan};
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

fn glm_fixture() -> PathBuf {
    graphs().join("../tests/fixtures/glm_moe_dsa/config.json")
}

fn compile_text(spec: &str, text: &str, config: &Path, profile: &DeviceProfile) -> Result<Plan, Diagnostics> {
    let spec = Spec::parse(text, &graphs().join(spec)).unwrap_or_else(|d| panic!("{d}"));
    let b = Bindings::from_config_json(config).unwrap();
    compile(&spec, &b, profile, &Options::default())
}

fn glm_text() -> String {
    std::fs::read_to_string(graphs().join("glm_moe_dsa.ron")).unwrap()
}

#[test]
fn shared_layers_read_the_last_full_layers_selection() {
    let plan = compile_text("glm_moe_dsa.ron", &glm_text(), &glm_fixture(), &DeviceProfile::cpu_only())
        .unwrap_or_else(|d| panic!("{d}"));
    // The fixture's layers: full, shared, full, shared.
    let mut last = None;
    for (i, l) in plan.program.layers.iter().enumerate() {
        let index = l.ops.iter().find_map(|op| match op {
            Op::Indexer { out, spec, .. } => Some((*out, spec.topk, spec.rope_style)),
            _ => None,
        });
        assert_eq!(index.is_some(), i % 2 == 0, "layer {i}");
        if let Some((out, topk, style)) = index {
            assert_eq!((topk, style), (6, coli_compiler::ir::RopeStyle::Interleaved));
            last = Some(out);
        }
        let select = l.ops.iter().find_map(|op| match op {
            Op::Mla { spec, .. } => spec.select,
            _ => None,
        });
        assert_eq!(select, last, "layer {i} attends over the last full layer's selection");
        let kinds: Vec<_> = l.ops.iter().map(|op| op.kind().info().name).collect();
        assert!(kinds.contains(&"mla_sparse") && !kinds.contains(&"mla"), "{kinds:?}");
    }
    let text = plan.program.to_string();
    assert!(text.contains("= indexer v") && text.contains(" select v"), "{text}");
}

/// Where each indexer and sparse MLA of DeepSeek-V3.2's plan runs for `profile`, and how many
/// frames the plan has.
fn places(profile: &DeviceProfile) -> (Vec<(&'static str, Place)>, usize) {
    let text = std::fs::read_to_string(graphs().join("deepseek_v32.ron")).unwrap();
    let config = graphs().join("configs/deepseek-v3.2.json");
    let plan = compile_text("deepseek_v32.ron", &text, &config, profile).unwrap_or_else(|d| panic!("{d}"));
    let mut out = Vec::new();
    for f in &plan.frames {
        for &id in &f.ops {
            let kind = coli_compiler::frames::op_of(&plan.program, id).kind().info().name;
            if kind == "indexer" || kind == "mla_sparse" {
                out.push((kind, f.place));
            }
        }
    }
    (out, plan.frames.len())
}

/// A profile that lists no kinds puts the indexer and the MLA over its selection on the device;
/// one that names its kinds without `indexer` keeps the indexer on the host, a frame cut at each.
#[test]
fn the_indexer_runs_on_the_device_by_default_and_on_the_host_where_a_profile_leaves_it_out() {
    let mut profile = DeviceProfile::load(&graphs().join("profiles/h200.ron")).unwrap_or_else(|d| panic!("{d}"));
    let (on, frames) = places(&profile);
    assert!(on.iter().any(|(k, _)| *k == "indexer"), "{on:?}");
    assert!(on.iter().all(|(_, p)| *p != Place::Host), "{on:?}");
    let kinds =
        coli_compiler::ops::OpKind::all().filter(|k| k.info().by_default && *k != coli_compiler::ops::OpKind::Indexer);
    profile.devices[0].features.ops = Some(kinds.collect());
    let (apart, more) = places(&profile);
    for (kind, place) in &apart {
        assert_eq!(*place == Place::Host, *kind == "indexer", "{kind}: {apart:?}");
    }
    assert!(more > frames, "a host frame per indexer: {more} frames against {frames}");
}

#[test]
fn indexer_roles_and_shapes_are_located_diagnostics() {
    let text = glm_text();
    let cpu = DeviceProfile::cpu_only();
    let check = |from: &str, to: &str, want: &str| {
        let t = text.replacen(from, to, 1);
        assert_ne!(t, text, "the spec's text moved: {from}");
        let d = compile_text("glm_moe_dsa.ron", &t, &glm_fixture(), &cpu).unwrap_err().to_string();
        assert!(d.contains(want) && d.contains("glm_moe_dsa.ron:"), "{d}");
    };
    check(r#""k": "ix_k""#, r#""k": "ix_w""#, "indexer weight `k` has shape [6, 56], the geometry needs [24, 56]");
    check(r#", "w": "ix_w"}"#, "}", "the indexer needs weight role `w`");
    check(r#""q_b": "ix_q_b""#, r#""q_b": "ix_q_b", "v": "ix_w""#, "the indexer has no weight role `v`");
    check(r#"rope_dim: "rope_dim""#, r#"rope_dim: "25""#, "an even rope part within the head");
    check(r#"out: "select", heads"#, r#"out: "x", heads"#, "the indexer's top-k");
    // No layer runs an indexer: the MLA reads a selection nothing wrote.
    check(r#"cond: "!contains(shared_types, i)""#, r#"cond: "false""#, "select");
}

#[test]
fn a_first_layer_that_shares_is_refused() {
    let src = std::fs::read_to_string(glm_fixture()).unwrap();
    let dir = std::env::temp_dir().join(format!("coli-dsa-refuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, src.replacen(r#""full","#, r#""shared","#, 1)).unwrap();
    let d = compile_text("glm_moe_dsa.ron", &glm_text(), &path, &DeviceProfile::cpu_only()).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).ok();
    assert!(d.contains("not served: a shared indexer layer needs a full one before it"), "{d}");
}
