//! DeepSeek V4's spec bound to GGUF metadata as llama.cpp's converter writes it (architecture
//! `deepseek4`, V4-Flash's geometry): the layer kinds and their rates from the per-layer
//! `compress_ratios` (0 sliding, 4 compressed sparse, any other heavily compressed at it; the
//! MTP layer's entry after the others), the hash layers from `hash_layer_count`, the compressed
//! layers' YaRN from `rope.scaling.*` with the attention factor 1 (`FrequenciesOnly`), the clamp
//! from a list of one value per layer; and what such a file cannot be.

use coli_compiler::bind::{Bindings, Naming};
use coli_compiler::ir::*;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options, Plan};
use serde_json::{json, Map, Value};
use std::path::Path;

const LAYERS: usize = 43;

/// The rate of layer `i` in the metadata below: two sliding layers, then compressed sparse and
/// heavily compressed in turn, the last heavily compressed one at 64; one more entry (0) for the
/// MTP layer.
fn ratios() -> Vec<i64> {
    let mut r: Vec<i64> = (0..LAYERS)
        .map(|i| {
            if i < 2 {
                0
            } else if i % 2 == 0 {
                4
            } else {
                128
            }
        })
        .collect();
    r[41] = 64;
    r.push(0);
    r
}

fn metadata() -> Value {
    json!({
        "general.architecture": "deepseek4",
        "deepseek4.block_count": LAYERS,
        "deepseek4.context_length": 1048576,
        "deepseek4.embedding_length": 4096,
        "deepseek4.vocab_size": 129280,
        "deepseek4.attention.head_count": 64,
        "deepseek4.attention.head_count_kv": 1,
        "deepseek4.attention.key_length": 512,
        "deepseek4.attention.value_length": 512,
        "deepseek4.attention.q_lora_rank": 1024,
        "deepseek4.attention.output_lora_rank": 1024,
        "deepseek4.attention.output_group_count": 8,
        "deepseek4.attention.sliding_window": 128,
        "deepseek4.attention.layer_norm_rms_epsilon": 1e-6,
        "deepseek4.attention.compress_ratios": ratios(),
        "deepseek4.attention.compress_rope_freq_base": 160000.0,
        "deepseek4.attention.indexer.head_count": 64,
        "deepseek4.attention.indexer.key_length": 128,
        "deepseek4.attention.indexer.top_k": 512,
        "deepseek4.rope.dimension_count": 64,
        "deepseek4.rope.freq_base": 10000.0,
        "deepseek4.rope.scaling.type": "yarn",
        "deepseek4.rope.scaling.factor": 16.0,
        "deepseek4.rope.scaling.original_context_length": 65536,
        "deepseek4.rope.scaling.yarn_beta_fast": 32.0,
        "deepseek4.rope.scaling.yarn_beta_slow": 1.0,
        "deepseek4.expert_count": 256,
        "deepseek4.expert_used_count": 6,
        "deepseek4.expert_feed_forward_length": 2048,
        "deepseek4.expert_shared_count": 1,
        "deepseek4.expert_weights_scale": 1.5,
        "deepseek4.expert_weights_norm": true,
        "deepseek4.expert_gating_func": 4,
        "deepseek4.hash_layer_count": 3,
        "deepseek4.swiglu_clamp_exp": vec![10.0; LAYERS],
        "deepseek4.nextn_predict_layers": 1,
        "deepseek4.hyper_connection.count": 4,
        "deepseek4.hyper_connection.sinkhorn_iterations": 20,
        "deepseek4.hyper_connection.epsilon": 1e-6,
    })
}

fn compile_gguf(meta: &Value) -> Result<Plan, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/deepseek_v4.ron");
    let spec = Spec::load(&path).map_err(|d| d.to_string())?;
    let config: Map<String, Value> = meta.as_object().unwrap().clone();
    let b = Bindings { source: "v4.gguf".into(), naming: Naming::Gguf, config, tensors: None };
    compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).map_err(|d| d.to_string())
}

/// Each layer's kind, compressor rate and attention rate, and its rotations' scalings.
fn layer(p: &Program, l: usize) -> (&'static str, Option<usize>, Option<usize>, Vec<RopeScaling>) {
    let ops = &p.layers[l].ops;
    let c = ops.iter().find_map(|op| if let Op::KvCompress { spec, .. } = op { Some(spec.clone()) } else { None });
    let kind = match &c {
        None => "sliding",
        Some(s) if s.index.is_some() && s.overlap => "csa",
        Some(s) if s.index.is_none() && !s.overlap => "hca",
        Some(_) => "mixed",
    };
    let attn = ops
        .iter()
        .find_map(|op| if let Op::Attention { spec, .. } = op { Some(spec.compressed.map(|c| c.rate)) } else { None })
        .flatten();
    let scalings = ops
        .iter()
        .filter_map(|op| match op {
            Op::Rope { scaling, .. } => Some(*scaling),
            Op::KvCompress { spec, .. } => Some(spec.rope_scaling),
            _ => None,
        })
        .collect();
    (kind, c.map(|s| s.rate), attn, scalings)
}

#[test]
fn the_schedule_and_the_compressed_rope_come_from_the_metadata() {
    let plan = compile_gguf(&metadata()).unwrap_or_else(|d| panic!("{d}"));
    let p = &plan.program;
    assert_eq!((p.dims.hidden, p.dims.streams, p.layers.len()), (4096, 4, LAYERS));
    let yarn = RopeScaling::Yarn {
        factor: 16.0,
        original_max_position: 65536,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    for (l, &r) in ratios()[..LAYERS].iter().enumerate() {
        let (kind, rate, attn, scalings) = layer(p, l);
        let r = r as usize;
        match r {
            0 => assert_eq!(
                (kind, rate, attn, scalings),
                ("sliding", None, None, vec![RopeScaling::None; 3]),
                "layer {l}"
            ),
            4 => assert_eq!((kind, rate, attn, scalings), ("csa", Some(4), Some(4), vec![yarn; 4]), "layer {l}"),
            _ => assert_eq!((kind, rate, attn, scalings), ("hca", Some(r), Some(r), vec![yarn; 4]), "layer {l}"),
        }
        let hash = p.layers[l].ops.iter().any(|op| matches!(op, Op::Route { hash: Some(_), .. }));
        assert_eq!(hash, l < 3, "layer {l}");
    }
    let limits: Vec<f32> = p.layers[5]
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Glu { kind: GluKind::LimitedSwiGlu { limit }, .. } => Some(*limit),
            Op::RoutedExperts { glu: GluKind::LimitedSwiGlu { limit }, .. } => Some(*limit),
            _ => None,
        })
        .collect();
    assert_eq!(limits, [10.0, 10.0]);
}

#[test]
fn what_a_deepseek4_file_cannot_be() {
    // Clamps that differ between layers.
    let mut m = metadata();
    m["deepseek4.swiglu_clamp_exp"][7] = json!(7.0);
    let d = compile_gguf(&m).unwrap_err();
    assert!(d.contains("`deepseek4.swiglu_clamp_exp`") && d.contains("a list of it repeated"), "{d}");
    // Fewer rates than layers.
    let mut m = metadata();
    m["deepseek4.attention.compress_ratios"] = json!(ratios()[..40]);
    let d = compile_gguf(&m).unwrap_err();
    assert!(d.contains("not served: a `compress_ratios` list shorter than `block_count`"), "{d}");
    // A gating function llama.cpp does not number.
    let mut m = metadata();
    m["deepseek4.expert_gating_func"] = json!(3);
    let d = compile_gguf(&m).unwrap_err();
    assert!(d.contains("not served: an `expert_gating_func` other than"), "{d}");
    // A key the loader requires.
    let mut m = metadata();
    m.as_object_mut().unwrap().remove("deepseek4.hyper_connection.epsilon");
    let d = compile_gguf(&m).unwrap_err();
    assert!(d.contains("`deepseek4.hyper_connection.epsilon`") && d.contains("has no value"), "{d}");
}
