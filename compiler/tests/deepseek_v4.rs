//! DeepSeek V4's spec lowered with the configuration class's defaults (every layer sliding): the
//! residual as `hc_mult` streams, hash routing on the first layers, its op kinds only the CPU
//! has left on the host by a device that lists the kinds it runs; the compressed layer types by
//! `layer_types` or transformers' default schedule; unserved options refused by name; and the
//! spec language's checks of the multi-stream ops.

use coli_compiler::bind::Bindings;
use coli_compiler::frames::op_of;
use coli_compiler::ids::Place;
use coli_compiler::ir::*;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn spec_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/deepseek_v4.ron")
}

fn config() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/configs/deepseek-v4-flash.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Bindings of `config` (written to a directory of its own, `tag` in its name).
fn bind(config: &serde_json::Value, tag: &str) -> Bindings {
    let dir = std::env::temp_dir().join(format!("coli-v4-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("config.json");
    std::fs::write(&p, config.to_string()).unwrap();
    let b = Bindings::from_config_json(&p).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    b
}

fn compile_text(text: &str, config: &serde_json::Value, tag: &str) -> Result<coli_compiler::Plan, String> {
    let spec = Spec::parse(text, &spec_path()).map_err(|d| d.to_string())?;
    compile(&spec, &bind(config, tag), &DeviceProfile::cpu_only(), &Options::default()).map_err(|d| d.to_string())
}

#[test]
fn the_residual_is_four_streams_and_the_first_layers_route_by_hash() {
    let text = std::fs::read_to_string(spec_path()).unwrap();
    let plan = compile_text(&text, &config(), "plain").unwrap_or_else(|d| panic!("{d}"));
    let p = &plan.program;
    assert_eq!((p.dims.hidden, p.dims.streams, p.dims.layers), (4096, 4, 43));
    assert_eq!(p.value(p.residual).width, 4 * 4096);
    for l in &p.layers {
        let routes: Vec<_> = l.ops.iter().filter(|op| matches!(op, Op::Route { .. })).collect();
        let hash = l.id.0 < 3;
        assert!(
            matches!(routes[..], [Op::Route { scoring: RouterScoring::SqrtSoftplus, hash: h, correction_bias: b, top_k: 6, .. }] if h.is_some() == hash && b.is_some() != hash),
            "{}: {routes:?}",
            l.id
        );
        let mixes = l.ops.iter().filter(|op| matches!(op, Op::HyperPre { mix: Some(_), .. })).count();
        assert_eq!(mixes, 2, "{}: two hyper-connection sites", l.id);
        assert_eq!(l.mixer, MixerKind::SlidingAttention);
    }
    assert!(matches!(p.prologue[..], [Op::Embed { .. }, Op::HyperPost { residual: None, mix: None, streams: 4, .. }]));
    assert!(matches!(p.epilogue[0], Op::HyperPre { mix: None, .. }), "the head collapses the streams first");
}

/// A device listing the kinds it runs (as a probed Vulkan profile does) takes the projections,
/// norms and attention and leaves V4's new kinds on the host.
#[test]
fn the_new_kinds_stay_on_the_host() {
    let spec = Spec::load(&spec_path()).unwrap_or_else(|d| panic!("{d}"));
    let profile = DeviceProfile::parse(
        r#"Profile(name: "listed", devices: [(name: "gpu", kind: Discrete, memory_budget: 400_000_000_000_000,
            reserve: 0, features: (ops: [Embed, RmsNorm, Linear, Rope, Attention, Act, Glu, Add, Mul, Route,
            RoutedExperts]))])"#,
        Path::new("listed.ron"),
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let plan =
        compile(&spec, &bind(&config(), "listed"), &profile, &Options::default()).unwrap_or_else(|d| panic!("{d}"));
    let (mut host, mut device) = (BTreeMap::new(), BTreeMap::new());
    for f in &plan.frames {
        let on = if f.place == Place::Host { &mut host } else { &mut device };
        for &id in &f.ops {
            *on.entry(op_of(&plan.program, id).kind().info().name).or_insert(0) += 1;
        }
    }
    // Per layer, plus the head's `hyper_pre` and the embedding's `hyper_post`.
    let counts = [
        ("hyper_pre", 2 * 43 + 1),
        ("hyper_post", 2 * 43 + 1),
        ("grouped_linear", 43),
        ("rms_norm_unweighted", 43),
        ("rope_tail", 3 * 43),
        ("routed_experts_limited", 43),
        ("glu_limited", 43),
    ];
    for (k, n) in counts {
        assert_eq!((host.get(k), device.get(k)), (Some(&n), None), "{k}\n{plan}");
    }
    assert_eq!((host.get("route_hash"), host.get("route_sqrt_softplus")), (Some(&3), Some(&40)));
    assert!(device.get("linear").is_some_and(|&n| n > 0) && device.get("attention") == Some(&43), "{plan}");
}

/// The compressed layer types lower to a `KvCompress` (with its indexer in compressed sparse
/// layers) and an attention over its entries, on the "compress" RoPE; without `layer_types`,
/// transformers' schedule (two heavily compressed layers, then the two kinds in turn).
#[test]
fn compressed_layers_follow_layer_types_or_the_default_schedule() {
    let text = std::fs::read_to_string(spec_path()).unwrap();
    let kinds_of = |p: &Program| -> Vec<&'static str> {
        p.layers
            .iter()
            .map(|l| {
                let c =
                    l.ops.iter().find_map(|op| if let Op::KvCompress { spec, .. } = op { Some(spec) } else { None });
                match c {
                    None => "sliding",
                    Some(s) if s.index.is_some() => "csa",
                    Some(_) => "hca",
                }
            })
            .collect()
    };
    let mut c = config();
    c["layer_types"][1] = serde_json::json!("compressed_sparse_attention");
    c["layer_types"][2] = serde_json::json!("heavily_compressed_attention");
    let plan = compile_text(&text, &c, "typed").unwrap_or_else(|d| panic!("{d}"));
    let p = &plan.program;
    assert_eq!(kinds_of(p)[..4], ["sliding", "csa", "hca", "sliding"]);
    let (csa, hca) = (&p.layers[1].ops, &p.layers[2].ops);
    let compress = |ops: &[Op]| {
        ops.iter().find_map(|op| if let Op::KvCompress { spec, .. } = op { Some(spec.clone()) } else { None }).unwrap()
    };
    let (cs, hs) = (compress(csa), compress(hca));
    assert_eq!((cs.rate, cs.overlap, cs.index.map(|i| (i.heads, i.head_dim, i.topk))), (4, true, Some((64, 128, 512))));
    assert_eq!((hs.rate, hs.overlap, hs.index), (128, false, None));
    assert_eq!((cs.rope_theta, cs.rope_dim), (160000.0, 64));
    let attn = |ops: &[Op]| {
        ops.iter()
            .find_map(|op| if let Op::Attention { spec, .. } = op { Some(spec.compressed) } else { None })
            .unwrap()
    };
    assert!(attn(csa).is_some_and(|c| c.rate == 4 && c.select.is_some()));
    assert!(attn(hca).is_some_and(|c| c.rate == 128 && c.select.is_none()));
    // The compressed layers' q, kv and output rotations are the "compress" RoPE's.
    let thetas = |ops: &[Op]| -> Vec<f32> {
        ops.iter().filter_map(|op| if let Op::Rope { theta, .. } = op { Some(*theta) } else { None }).collect()
    };
    assert_eq!((thetas(csa), thetas(&p.layers[0].ops)), (vec![160000.0; 3], vec![10000.0; 3]));
    let mut c = config();
    c.as_object_mut().unwrap().remove("layer_types");
    let plan = compile_text(&text, &c, "no-layer-types").unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(kinds_of(&plan.program)[..6], ["hca", "hca", "hca", "csa", "hca", "csa"]);
    // YaRN in the compress parameters (as transformers writes V4's): the compressed layers'
    // rotations and compressor take it, with its attention factor; the sliding ones do not.
    let mut c = config();
    c["layer_types"][1] = serde_json::json!("compressed_sparse_attention");
    c["rope_parameters"]["compress"] = serde_json::json!({"rope_type": "yarn", "rope_theta": 160000.0,
        "factor": 16.0, "original_max_position_embeddings": 65536, "attention_factor": 1.0, "partial_rotary_factor": 0.125});
    let plan = compile_text(&text, &c, "compress-yarn").unwrap_or_else(|d| panic!("{d}"));
    let scalings = |l: usize| -> Vec<RopeScaling> {
        plan.program.layers[l]
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Rope { scaling, .. } => Some(*scaling),
                Op::KvCompress { spec, .. } => Some(spec.rope_scaling),
                _ => None,
            })
            .collect()
    };
    let yarn = RopeScaling::Yarn {
        factor: 16.0,
        original_max_position: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    assert_eq!((scalings(1), scalings(0)), (vec![yarn; 4], vec![RopeScaling::None; 3]));
}

#[test]
fn unserved_options_are_refused_by_name() {
    let text = std::fs::read_to_string(spec_path()).unwrap();
    let mut c = config();
    c["layer_types"][7] = serde_json::json!("chunked_attention");
    let d = compile_text(&text, &c, "unknown-type").unwrap_err();
    assert!(d.contains("deepseek_v4.ron:") && d.contains("not served: a `layer_types` entry"), "{d}");
    let mut c = config();
    c["rope_parameters"]["main"]["rope_type"] = serde_json::json!("yarn");
    let d = compile_text(&text, &c, "yarn").unwrap_err();
    assert!(d.contains("not served: a scaled RoPE"), "{d}");
    let mut c = config();
    c["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 16.0});
    let d = compile_text(&text, &c, "legacy-yarn").unwrap_err();
    assert!(d.contains("not served: a top-level `rope_scaling`"), "{d}");
    for (key, value, want) in [("hidden_act", "\"gelu\"", "`hidden_act`"), ("mlp_bias", "true", "`mlp_bias`")] {
        let mut c = config();
        c[key] = serde_json::from_str(value).unwrap();
        let d = compile_text(&text, &c, key).unwrap_err();
        assert!(d.contains("not served") && d.contains(want), "{d}");
    }
}

/// The multi-stream ops' widths and operands are checked, each error located in the spec.
#[test]
fn multi_stream_ops_are_checked() {
    let text = std::fs::read_to_string(spec_path()).unwrap();
    let cases = [
        // The residual's width against `streams` x `hidden`.
        (r#"streams: "hc","#, r#"streams: "2","#, "the residual `h` has width 16384, 2 stream(s)"),
        // `HyperPost` with a residual but no mix.
        (
            r#"HyperPost(x: "o", out: "h", residual: "h", mix: "mix", streams: "hc"),"#,
            r#"HyperPost(x: "o", out: "h", residual: "h", streams: "hc"),"#,
            "HyperPost takes both `residual` and `mix`, or neither",
        ),
        // A layer's site with the head's `fn`.
        (r#"fn: "attn_hc_fn","#, r#"fn: "head_hc_fn","#, "hyper-connections of 4 streams need [24, 16384]"),
        // The mix buffer's width.
        (
            r#""mix": "hc * (hc + 1)","#,
            r#""mix": "hc * hc","#,
            "value `mix` has width 16, post and comb of the streams needs 20",
        ),
        // A layer's site without its Sinkhorn iterations.
        (
            r#"scale: "attn_hc_scale", sinkhorn_iters: "hc_iters","#,
            r#"scale: "attn_hc_scale","#,
            "a layer's hyper-connection (with `mix`) needs `sinkhorn_iters`",
        ),
        // The grouped projection's groups against its weight.
        (r#"groups: "o_groups""#, r#"groups: "3""#, "3 groups do not divide the 8192 rows of the weight"),
        // A hash table that is not `[vocab, top_k]`.
        (
            r#"gguf: "blk.{i}.ffn_gate_tid2eid.weight", shape: ["vocab", "top_k"]),"#,
            r#"gguf: "blk.{i}.ffn_gate_tid2eid.weight", shape: ["vocab", "2"]),"#,
            "the hash table has shape [129280, 2], the router needs [vocab, 6]",
        ),
    ];
    for (from, to, want) in cases {
        let bad = text.replacen(from, to, 1);
        assert_ne!(bad, text, "{from} is in the spec");
        let d = compile_text(&bad, &config(), "bad").map(|_| ()).unwrap_err();
        assert!(d.contains("deepseek_v4.ron:") && d.contains(want), "{want}:\n{d}");
    }
}
