//! Lowering of the shipped specs to programs: each spec with its reference configuration, and
//! checks of the op order against the transformers modeling code of each family.

use coli_compiler::bind::{Bindings, Naming, TensorInfo};
use coli_compiler::ir::*;
use coli_compiler::spec::{spec_for_architecture, Spec};
use coli_compiler::{compile, DeviceProfile, Options};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

fn program(spec: &str, config: Option<&str>) -> Program {
    let spec = Spec::load(&graphs().join(spec)).unwrap_or_else(|d| panic!("{d}"));
    let config = config.map(|c| graphs().join("configs").join(c)).unwrap_or_else(|| spec.default_config().unwrap());
    let b = Bindings::from_config_json(&config).unwrap();
    compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_or_else(|d| panic!("{d}")).program
}

#[test]
fn every_spec_compiles_with_its_default_config() {
    for s in [
        "llama.ron",
        "olmoe.ron",
        "qwen3_moe.ron",
        "mixtral.ron",
        "deepseek_v3.ron",
        "qwen3_next.ron",
        "qwen3_5_moe.ron",
        "kimi_linear.ron",
        "inkling.ron",
        "gpt_oss.ron",
        "mimo_v2_flash.ron",
        "deepseek_v32.ron",
        "glm_moe_dsa.ron",
        "deepseek_v4.ron",
    ] {
        let p = program(s, None);
        println!("{p}");
    }
}

#[test]
fn specs_are_found_by_architecture() {
    let g = graphs();
    assert_eq!(spec_for_architecture(&g, "LlamaForCausalLM").unwrap().file_name().unwrap(), "llama.ron");
    assert_eq!(spec_for_architecture(&g, "llama").unwrap().file_name().unwrap(), "llama.ron");
    assert_eq!(spec_for_architecture(&g, "OlmoeForCausalLM").unwrap().file_name().unwrap(), "olmoe.ron");
    assert_eq!(spec_for_architecture(&g, "qwen3moe").unwrap().file_name().unwrap(), "qwen3_moe.ron");
    assert_eq!(spec_for_architecture(&g, "MixtralForCausalLM").unwrap().file_name().unwrap(), "mixtral.ron");
    assert_eq!(spec_for_architecture(&g, "Qwen3_5MoeForCausalLM").unwrap().file_name().unwrap(), "qwen3_5_moe.ron");
    assert_eq!(spec_for_architecture(&g, "KimiLinearForCausalLM").unwrap().file_name().unwrap(), "kimi_linear.ron");
    assert_eq!(spec_for_architecture(&g, "InklingForCausalLM").unwrap().file_name().unwrap(), "inkling.ron");
    assert_eq!(spec_for_architecture(&g, "DeepseekV32ForCausalLM").unwrap().file_name().unwrap(), "deepseek_v32.ron");
    assert_eq!(spec_for_architecture(&g, "GlmMoeDsaForCausalLM").unwrap().file_name().unwrap(), "glm_moe_dsa.ron");
    assert_eq!(spec_for_architecture(&g, "DeepseekV4ForCausalLM").unwrap().file_name().unwrap(), "deepseek_v4.ron");
    assert!(spec_for_architecture(&g, "NoSuchForCausalLM").is_none());
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// pymoe-22m's config.json and its safetensors tensor table (names, shapes, dtypes).
fn pymoe_bindings() -> Bindings {
    let mut b = Bindings::from_config_json(&data("pymoe-22m.config.json")).unwrap();
    let table: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(data("pymoe-22m.tensors.json")).unwrap()).unwrap();
    let tensors = table
        .into_iter()
        .map(|(k, v)| {
            let shape = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            (k, TensorInfo { shape, dtype: v["dtype"].as_str().unwrap().into(), bytes: v["bytes"].as_u64().unwrap() })
        })
        .collect();
    b.tensors = Some(tensors);
    b
}

#[test]
fn pymoe_binds_against_its_tensor_table() {
    let spec = Spec::load(&graphs().join("olmoe.ron")).unwrap();
    let b = pymoe_bindings();
    let p =
        compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_or_else(|d| panic!("{d}")).program;
    assert_eq!((p.dims.hidden, p.dims.vocab, p.dims.layers), (256, 4096, 6));
    let l = &p.layers[2];
    assert_eq!(l.ffn, FfnKind::Moe);
    // rope_parameters.rope_theta (transformers 5 layout) is read.
    assert!(l.ops.iter().any(|op| matches!(op, Op::Rope { theta, .. } if *theta == 10000.0)));
    // norm_topk_prob false: no renormalization; top-4 of 32.
    assert!(l.ops.iter().any(|op| matches!(op, Op::Route { top_k: 4, renormalize: false, .. })));
    // OLMoE's q/k norms are over the whole projection.
    let groups: Vec<usize> =
        l.ops.iter().filter_map(|op| if let Op::RmsNorm { group, .. } = op { Some(*group) } else { None }).collect();
    assert_eq!(groups, [256, 256, 256, 256]);
    assert!(matches!(&p.epilogue[1], Op::Linear { weight, .. } if weight.name == "lm_head.weight"));

    // A missing tensor and a wrong shape are located diagnostics.
    let mut bad = pymoe_bindings();
    let t = bad.tensors.as_mut().unwrap();
    t.remove("model.layers.3.self_attn.q_norm.weight");
    t.get_mut("model.layers.1.mlp.experts.5.up_proj.weight").unwrap().shape = vec![64, 256];
    let d = compile(&spec, &bad, &DeviceProfile::cpu_only(), &Options::default()).unwrap_err();
    let text = d.to_string();
    assert!(text.contains("tensor `model.layers.3.self_attn.q_norm.weight` is not in the checkpoint"), "{text}");
    assert!(text.contains("first: `model.layers.1.mlp.experts.5.up_proj.weight`"), "{text}");
    assert!(text.contains("olmoe.ron:"), "{text}");
}

/// SmolLM2-135M as its GGUF describes itself (metadata keys, tensors outermost-first), tied.
fn smollm2_gguf_bindings(with_output: bool) -> Bindings {
    let mut config = serde_json::Map::new();
    for (k, v) in [
        ("general.architecture", serde_json::json!("llama")),
        ("llama.embedding_length", serde_json::json!(576)),
        ("llama.block_count", serde_json::json!(30)),
        ("llama.feed_forward_length", serde_json::json!(1536)),
        ("llama.attention.head_count", serde_json::json!(9)),
        ("llama.attention.head_count_kv", serde_json::json!(3)),
        ("llama.rope.freq_base", serde_json::json!(100000.0)),
        ("llama.context_length", serde_json::json!(8192)),
        ("llama.attention.layer_norm_rms_epsilon", serde_json::json!(1e-5)),
    ] {
        config.insert(k.into(), v);
    }
    let mut t = BTreeMap::new();
    let mut add = |name: String, shape: Vec<usize>| {
        t.insert(name, TensorInfo { shape, dtype: "Q4_1".into(), bytes: 0 });
    };
    add("token_embd.weight".into(), vec![49152, 576]);
    add("output_norm.weight".into(), vec![576]);
    if with_output {
        add("output.weight".into(), vec![49152, 576]);
    }
    for i in 0..30 {
        add(format!("blk.{i}.attn_norm.weight"), vec![576]);
        add(format!("blk.{i}.attn_q.weight"), vec![576, 576]);
        add(format!("blk.{i}.attn_k.weight"), vec![192, 576]);
        add(format!("blk.{i}.attn_v.weight"), vec![192, 576]);
        add(format!("blk.{i}.attn_output.weight"), vec![576, 576]);
        add(format!("blk.{i}.ffn_norm.weight"), vec![576]);
        add(format!("blk.{i}.ffn_gate.weight"), vec![1536, 576]);
        add(format!("blk.{i}.ffn_up.weight"), vec![1536, 576]);
        add(format!("blk.{i}.ffn_down.weight"), vec![576, 1536]);
    }
    Bindings { source: "SmolLM2-135M-Instruct.Q4_1.gguf".into(), naming: Naming::Gguf, config, tensors: Some(t) }
}

#[test]
fn smollm2_gguf_uses_interleaved_rope_and_a_tied_head() {
    let spec = Spec::load(&graphs().join("llama.ron")).unwrap();
    let p = compile(&spec, &smollm2_gguf_bindings(false), &DeviceProfile::cpu_only(), &Options::default())
        .unwrap_or_else(|d| panic!("{d}"))
        .program;
    assert_eq!((p.dims.hidden, p.dims.vocab, p.dims.layers, p.dims.max_context), (576, 49152, 30, 8192));
    let l = &p.layers[7];
    assert!(matches!(&l.ops[1], Op::Linear { weight, .. } if weight.name == "blk.7.attn_q.weight"));
    assert!(l.ops.iter().any(|op| matches!(op, Op::Rope { style: RopeStyle::Interleaved, heads: 9, head_dim: 64, theta, .. } if *theta == 100000.0)));
    assert!(l
        .ops
        .iter()
        .any(|op| matches!(op, Op::Attention { spec, .. } if spec.kv_heads == 3 && spec.scale == 0.125)));
    assert!(matches!(&p.epilogue[1], Op::Linear { weight, .. } if weight.name == "token_embd.weight"));
    // With `output.weight` present, the head is untied.
    let p =
        compile(&spec, &smollm2_gguf_bindings(true), &DeviceProfile::cpu_only(), &Options::default()).unwrap().program;
    assert!(matches!(&p.epilogue[1], Op::Linear { weight, .. } if weight.name == "output.weight"));
}

#[test]
fn qwen3_moe_dense_layers_follow_sparse_step_and_mlp_only_layers() {
    let spec = Spec::load(&graphs().join("qwen3_moe.ron")).unwrap();
    let mut b = Bindings::from_config_json(&graphs().join("configs/qwen3-30b-a3b.json")).unwrap();
    b.config.insert("decoder_sparse_step".into(), serde_json::json!(2));
    b.config.insert("mlp_only_layers".into(), serde_json::json!([3]));
    let p = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap().program;
    let kinds: Vec<FfnKind> = p.layers.iter().take(6).map(|l| l.ffn).collect();
    use FfnKind::*;
    assert_eq!(kinds, [Dense, Moe, Dense, Dense, Dense, Moe]);
    assert!(p.layers[0].ops.iter().any(|op| matches!(op, Op::Linear { weight, .. } if weight.shape == [6144, 2048])));
    // `sliding_window` counts only with `use_sliding_window` (transformers' mask, every layer).
    let windows = |b: &Bindings| -> Vec<Option<usize>> {
        let p = compile(&spec, b, &DeviceProfile::cpu_only(), &Options::default()).unwrap().program;
        p.layers
            .iter()
            .flat_map(|l| &l.ops)
            .filter_map(|op| if let Op::Attention { spec, .. } = op { Some(spec.window) } else { None })
            .collect()
    };
    b.config.insert("sliding_window".into(), serde_json::json!(64));
    assert!(windows(&b).iter().all(|w| w.is_none()));
    b.config.insert("use_sliding_window".into(), serde_json::json!(true));
    assert!(windows(&b).iter().all(|w| *w == Some(64)));
}

/// MiMo-V2-Flash as transformers builds it (modeling_mimo_v2_flash.py): per `layer_types`, the
/// sliding layers have twice the KV heads, sinks and the window, the full ones neither; the
/// values are scaled by `attention_value_scale`; RoPE rotates int(head_dim x
/// partial_rotary_factor) columns with the layer type's theta; `mlp_layer_types` picks dense
/// or MoE (sigmoid routing with the correction bias, scaled).
#[test]
fn mimo_v2_flash_layers_follow_their_types() {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mimo_v2_flash");
    let mut b = Bindings::from_config_json(&d.join("config.json")).unwrap();
    b.tensors = Some(safetensors_table(&d.join("model.safetensors")));
    let spec = Spec::load(&graphs().join("mimo_v2_flash.ron")).unwrap();
    let p =
        compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_or_else(|d| panic!("{d}")).program;
    use FfnKind::*;
    use MixerKind::*;
    let kinds: Vec<(MixerKind, FfnKind)> = p.layers.iter().map(|l| (l.mixer, l.ffn)).collect();
    assert_eq!(kinds, [(Attention, Dense), (SlidingAttention, Moe), (SlidingAttention, Moe), (Attention, Moe)]);
    let attn = |l: usize| {
        p.layers[l]
            .ops
            .iter()
            .find_map(|op| if let Op::Attention { spec, .. } = op { Some(spec.clone()) } else { None })
            .unwrap()
    };
    let (full, swa) = (attn(0), attn(1));
    assert_eq!((full.heads, full.kv_heads, full.head_dim, full.v_head_dim, full.window), (4, 1, 32, 16, None));
    assert!(full.sinks.is_none());
    assert_eq!((swa.kv_heads, swa.window), (2, Some(4)));
    assert_eq!(swa.sinks.unwrap().name, "model.layers.1.self_attn.attention_sink_bias");
    assert_eq!((full.value_scale, swa.value_scale), (0.707, 0.707));
    let ropes = |l: usize| -> Vec<(usize, usize, f32)> {
        p.layers[l]
            .ops
            .iter()
            .filter_map(|op| {
                if let Op::Rope { heads, rotary_dim, theta, .. } = op {
                    Some((*heads, *rotary_dim, *theta))
                } else {
                    None
                }
            })
            .collect()
    };
    assert_eq!(ropes(0), [(4, 10, 5e6), (1, 10, 5e6)]);
    assert_eq!(ropes(2), [(4, 10, 1e4), (2, 10, 1e4)]);
    assert!(p.layers[3].ops.iter().any(|op| matches!(op, Op::Route { scoring: RouterScoring::Sigmoid, top_k: 2, renormalize: true, correction_bias: Some(_), scale, .. } if *scale == 1.5)));
    // The scale is the configuration's, and transformers' default without the key.
    let value_scale = |b: &Bindings| {
        let p = compile(&spec, b, &DeviceProfile::cpu_only(), &Options::default()).unwrap().program;
        p.layers[0]
            .ops
            .iter()
            .find_map(|op| if let Op::Attention { spec, .. } = op { Some(spec.value_scale) } else { None })
            .unwrap()
    };
    b.config.insert("attention_value_scale".into(), serde_json::json!(0.5));
    assert_eq!(value_scale(&b), 0.5);
    b.config.remove("attention_value_scale");
    assert_eq!(value_scale(&b), 0.707);
    // Without `mlp_layer_types`, the first layer is dense and the rest MoE (transformers' default);
    // the configuration alone (the fixture's tensors follow its own types).
    b.tensors = None;
    b.config.insert("mlp_layer_types".into(), serde_json::json!(["sparse", "dense", "sparse", "sparse"]));
    let ffn = |b: &Bindings| {
        compile(&spec, b, &DeviceProfile::cpu_only(), &Options::default())
            .unwrap()
            .program
            .layers
            .iter()
            .map(|l| l.ffn)
            .collect::<Vec<_>>()
    };
    assert_eq!(ffn(&b), [Moe, Dense, Moe, Moe]);
    b.config.remove("mlp_layer_types");
    assert_eq!(ffn(&b), [Dense, Moe, Moe, Moe]);
}

/// The tensor table of a safetensors file (its JSON header), as the runtime's reader gives it.
fn safetensors_table(path: &Path) -> BTreeMap<String, TensorInfo> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let off = v["data_offsets"].as_array().unwrap();
            let bytes = off[1].as_u64().unwrap() - off[0].as_u64().unwrap();
            (k, TensorInfo { shape, dtype: v["dtype"].as_str().unwrap().into(), bytes })
        })
        .collect()
}

/// The repository's transformers-made fixtures: each binds to its spec, every tensor the
/// program reads is in the checkpoint with its shape, and every checkpoint tensor is read.
#[test]
fn transformers_fixtures_bind_to_their_specs() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    for (dir, spec) in [
        ("llama", "llama"),
        ("llama_tied", "llama"),
        ("mixtral", "mixtral"),
        ("olmoe", "olmoe"),
        ("qwen3_moe", "qwen3_moe"),
        ("mimo_v2_flash", "mimo_v2_flash"),
    ] {
        let d = fixtures.join(dir);
        if !d.join("model.safetensors").exists() {
            continue;
        }
        let mut b = Bindings::from_config_json(&d.join("config.json")).unwrap();
        let table = safetensors_table(&d.join("model.safetensors"));
        b.tensors = Some(table.clone());
        let spec = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap();
        let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default())
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
        let p = &plan.program;
        let mut read = std::collections::BTreeSet::new();
        for op in p.prologue.iter().chain(p.layers.iter().flat_map(|l| &l.ops)).chain(&p.epilogue) {
            for w in coli_compiler::place::size::op_weights(op) {
                read.insert(w.name.clone());
            }
            if let Op::RoutedExperts { weights, experts, .. } = op {
                for t in [&weights.gate, &weights.up, &weights.down] {
                    for e in 0..*experts {
                        read.insert(t.name_of(e).0);
                    }
                }
            }
        }
        let unread: Vec<&String> = table.keys().filter(|k| !read.contains(*k)).collect();
        assert!(unread.is_empty(), "{dir}: tensors the program does not read: {unread:?}");
    }
}

/// SmolLM2-135M-Instruct.Q4_1.gguf as its header describes it (metadata without the
/// tokenizer, tensor table outermost-first), extracted once into tests/data.
pub fn smollm2_real_gguf() -> Bindings {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("smollm2-135m-q4_1.gguf.json")).unwrap()).unwrap();
    let config = v["config"].as_object().unwrap().clone();
    let tensors = v["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| {
            let shape = t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            (
                k.clone(),
                TensorInfo { shape, dtype: t["dtype"].as_str().unwrap().into(), bytes: t["bytes"].as_u64().unwrap() },
            )
        })
        .collect();
    Bindings { source: "SmolLM2-135M-Instruct.Q4_1.gguf".into(), naming: Naming::Gguf, config, tensors: Some(tensors) }
}

#[test]
fn the_real_smollm2_gguf_binds_and_is_sized_in_its_formats() {
    let spec = Spec::load(&graphs().join("llama.ron")).unwrap();
    let profile = DeviceProfile::load(&graphs().join("profiles/lavapipe.ron")).unwrap();
    let plan = compile(&spec, &smollm2_real_gguf(), &profile, &Options::default()).unwrap_or_else(|d| panic!("{d}"));
    let p = &plan.program;
    assert_eq!((p.dims.hidden, p.dims.vocab, p.dims.layers, p.dims.max_context), (576, 49152, 30, 8192));
    assert!(matches!(&p.epilogue[1], Op::Linear { weight, .. } if weight.name == "token_embd.weight"));
    assert!(p.layers[0].ops.iter().any(|op| matches!(op, Op::Rope { style: RopeStyle::Interleaved, .. })));
    // q_proj is Q4_1: 576 rows of 18 blocks of 20 bytes.
    assert_eq!(plan.placement.costs[0].matrices, (576 * 2 + 192 * 2) * 18 * 20 + 3 * 1536 * 18 * 20);
    insta::assert_snapshot!("llama@smollm2-q4_1-gguf-lavapipe", plan.to_string());
}

/// A Gated DeltaNet takes one set of input projections: Qwen3.5's apart roles beside one of
/// Qwen3-Next's grouped roles are a located diagnostic, not a program.
#[test]
fn deltanet_projections_grouped_and_apart_at_once_are_refused() {
    let path = graphs().join("qwen3_5_moe.ron");
    let text = std::fs::read_to_string(&path).unwrap();
    let mixed = text.replacen(r#""in_proj_qkv": "la_qkv","#, r#""in_proj_qkv": "la_qkv", "in_proj_ba": "la_a","#, 1);
    assert_ne!(mixed, text, "the spec's roles moved");
    let spec = Spec::parse(&mixed, &path).unwrap_or_else(|d| panic!("{d}"));
    let b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
    let d = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_err();
    let text = d.to_string();
    assert!(text.contains("no weight role `in_proj_ba` beside `in_proj_qkv`"), "{text}");
    assert!(text.contains("qwen3_5_moe.ron:"), "{text}");
}

/// Kimi Delta Attention's geometry and roles are checked where the spec names them: a missing
/// role, and key heads unlike the value heads, are located diagnostics, not programs; its op
/// kind is `kda` (a device runs it where its profile lists it) and its MLA rotates nothing (`NoPe`).
#[test]
fn kda_roles_and_geometry_are_checked() {
    let path = graphs().join("kimi_linear.ron");
    let text = std::fs::read_to_string(&path).unwrap();
    let compile_text = |t: &str| {
        let spec = Spec::parse(t, &path).unwrap_or_else(|d| panic!("{d}"));
        let b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
        compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default())
    };
    let plan = compile_text(&text).unwrap_or_else(|d| panic!("{d}"));
    let kinds: Vec<_> = plan.program.layers.iter().flat_map(|l| l.ops.iter().map(|op| op.kind().info().name)).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "kda").count(), 21, "the 48B's 21 KDA layers");
    assert_eq!(kinds.iter().filter(|k| **k == "mla").count(), 6, "and its 6 MLA layers (4, 8, .., 24)");
    assert!(plan.program.to_string().contains("scaling NoPe"), "MLA without rotation");
    let no_gate = text.replacen(r#""g_b": "g_b", "#, "", 1);
    assert_ne!(no_gate, text, "the spec's roles moved");
    let d = compile_text(&no_gate).unwrap_err().to_string();
    assert!(d.contains("Kimi Delta Attention needs weight role `g_b`") && d.contains("kimi_linear.ron:"), "{d}");
    let uneven = text.replacen(
        r#"key_heads: "lin_heads", value_heads: "lin_heads","#,
        r#"key_heads: "1", value_heads: "lin_heads","#,
        1,
    );
    assert_ne!(uneven, text, "the spec's heads moved");
    let d = compile_text(&uneven).unwrap_err().to_string();
    assert!(d.contains("as many key as value heads"), "{d}");
}

/// A device that lists the op kinds it runs without `kda` gets Kimi Linear's MLA layers while
/// every KDA op stays in a host frame; listing `kda` too (as a probed Vulkan profile does)
/// puts the KDA ops in device frames.
#[test]
fn kda_goes_to_a_device_only_where_its_profile_lists_it() {
    let spec = Spec::load(&graphs().join("kimi_linear.ron")).unwrap_or_else(|d| panic!("{d}"));
    let b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
    let kinds = |extra: &str| {
        let profile = DeviceProfile::parse(
            &format!(
                r#"Profile(name: "listed", devices: [(name: "gpu", kind: Discrete, memory_budget: 400_000_000_000,
            reserve: 0, features: (ops: [Embed, RmsNorm, Linear, Rope, Attention, Act, Glu, Add, Mul, Route,
            RoutedExperts, LinearAttention, Mla{extra}]))])"#
            ),
            Path::new("listed.ron"),
        )
        .unwrap_or_else(|d| panic!("{d}"));
        let plan = compile(&spec, &b, &profile, &Options::default()).unwrap_or_else(|d| panic!("{d}"));
        let (mut host, mut device) = (BTreeMap::new(), BTreeMap::new());
        for f in &plan.frames {
            let on = if f.place == coli_compiler::ids::Place::Host { &mut host } else { &mut device };
            for &id in &f.ops {
                *on.entry(coli_compiler::frames::op_of(&plan.program, id).kind().info().name).or_insert(0) += 1;
            }
        }
        (host, device, plan)
    };
    let (host, device, plan) = kinds("");
    assert_eq!((host.get("kda"), device.get("kda")), (Some(&21), None), "{plan}");
    assert_eq!((host.get("mla"), device.get("mla")), (None, Some(&6)), "{plan}");
    let (host, device, plan) = kinds(", Kda");
    assert_eq!((host.get("kda"), device.get("kda")), (None, Some(&21)), "{plan}");
    assert_eq!((host.get("mla"), device.get("mla")), (None, Some(&6)), "{plan}");
}

/// Kimi Linear's layer split as the remote code's configuration gives it: without
/// `layer_types` and `mlp_layer_types`, MLA where `linear_attn_config.full_attn_layers`
/// (1-indexed) says and dense FFNs for the first `first_k_dense_replace` layers; the fixture's
/// configuration with those two lists taken out lowers to the same layers as with them.
#[test]
fn kimi_linear_reads_linear_attn_config_without_layer_types() {
    let spec = Spec::load(&graphs().join("kimi_linear.ron")).unwrap_or_else(|d| panic!("{d}"));
    let path = graphs().join("../tests/fixtures/kimi_linear/config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let layers = |config: &serde_json::Value| {
        let b = Bindings::from_config_text(&config.to_string(), &path).unwrap();
        let plan =
            compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_or_else(|d| panic!("{d}"));
        plan.program.layers.iter().map(|l| (l.mixer, l.ffn)).collect::<Vec<_>>()
    };
    let with_lists = layers(&config);
    let obj = config.as_object_mut().unwrap();
    assert!(obj.remove("layer_types").is_some() && obj.remove("mlp_layer_types").is_some());
    assert_eq!(layers(&config), with_lists);
    use FfnKind::*;
    use MixerKind::*;
    assert_eq!(with_lists, [(LinearAttention, Dense), (LinearAttention, Moe), (Mla, Moe), (LinearAttention, Moe)]);
}

/// Inkling's layers as its configuration class gives them (every sixth layer global, the rest
/// sliding; every layer sparse), each new op of its own kind, which a device listing the kinds
/// it runs (as a probed Vulkan profile does) leaves on the host while it takes the rest of the
/// layer; a configuration that sets `log_scaling_n_floor` or a smaller `unpadded_vocab_size`
/// (not served) is a located diagnostic,
/// and so is a short convolution whose taps do not match its input.
#[test]
fn inkling_ops_stay_on_the_host_and_unserved_options_are_refused() {
    let path = graphs().join("inkling.ron");
    let text = std::fs::read_to_string(&path).unwrap();
    let spec = Spec::parse(&text, &path).unwrap_or_else(|d| panic!("{d}"));
    let config = spec.default_config().unwrap();
    let b = Bindings::from_config_json(&config).unwrap();
    let profile = DeviceProfile::parse(
        r#"Profile(name: "listed", devices: [(name: "gpu", kind: Discrete, memory_budget: 400_000_000_000_000,
            reserve: 0, features: (ops: [Embed, RmsNorm, Linear, Rope, Attention, Act, Glu, Add, Mul, Route,
            RoutedExperts, LinearAttention, Mla]))])"#,
        Path::new("listed.ron"),
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let plan = compile(&spec, &b, &profile, &Options::default()).unwrap_or_else(|d| panic!("{d}"));
    let (mut host, mut device) = (BTreeMap::new(), BTreeMap::new());
    for f in &plan.frames {
        let on = if f.place == coli_compiler::ids::Place::Host { &mut host } else { &mut device };
        for &id in &f.ops {
            *on.entry(coli_compiler::frames::op_of(&plan.program, id).kind().info().name).or_insert(0) += 1;
        }
    }
    assert_eq!((host.get("attention_rel"), device.get("attention_rel")), (Some(&66), None), "{plan}");
    assert_eq!((host.get("short_conv"), device.get("short_conv")), (Some(&(4 * 66)), None), "{plan}");
    assert_eq!(host.get("route_shared"), Some(&66), "{plan}");
    assert_eq!(host.get("routed_experts_shared"), Some(&66), "{plan}");
    assert_eq!((host.get("rms_norm_scaled"), device.get("rms_norm_scaled")), (Some(&1), None), "{plan}");
    assert!(device.get("linear").is_some_and(|&n| n > 0), "the projections on the device\n{plan}");
    let windows = plan.program.layers.iter().filter(|l| l.mixer == coli_compiler::ir::MixerKind::SlidingAttention);
    assert_eq!(windows.count(), 55, "all but each sixth layer sliding");

    let with = |key: &str, value: &str| {
        let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        j[key] = serde_json::from_str(value).unwrap();
        let dir = std::env::temp_dir().join(format!("coli-inkling-{key}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.json");
        std::fs::write(&p, j.to_string()).unwrap();
        Bindings::from_config_json(&p).unwrap()
    };
    let d = compile(&spec, &with("log_scaling_n_floor", "128"), &DeviceProfile::cpu_only(), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(d.contains("inkling.ron:"), "{d}");
    assert!(d.contains("not served: log_scaling_n_floor"), "{d}");
    let d = compile(&spec, &with("unpadded_vocab_size", "200058"), &DeviceProfile::cpu_only(), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(d.contains("inkling.ron:"), "{d}");
    assert!(d.contains("not served: an unpadded_vocab_size"), "{d}");
    let d = compile(&spec, &with("conv_kernel_size", "3"), &DeviceProfile::cpu_only(), &Options::default());
    assert!(d.is_ok(), "the kernel is the configuration's");
    let bad = text.replacen(r#"weights: {"conv1d": "attn_conv"}"#, r#"weights: {"conv1d": "k_conv"}"#, 1);
    assert_ne!(bad, text, "the spec's roles moved");
    let spec = Spec::parse(&bad, &path).unwrap_or_else(|d| panic!("{d}"));
    let d = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_err().to_string();
    assert!(d.contains("a short convolution weight `conv1d` has shape"), "{d}");
}

/// A profile that lists no op kinds (the Vulkan library's) runs Inkling's attention with
/// relative logits, short convolutions and scaled norm on the device, and its router and
/// experts (shared ones included) too where the budget holds them all (resident); a forced KV
/// split leaves its attention layers' mirrors whole (the
/// split's parts do not add relative logits), so the plan has no split.
#[test]
fn inkling_runs_its_attention_on_a_device_and_never_splits_its_kv() {
    let spec = Spec::load(&graphs().join("inkling.ron")).unwrap();
    let b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
    let profile = DeviceProfile::parse(
        r#"Profile(name: "gpu", devices: [(name: "gpu", kind: Discrete, memory_budget: 400_000_000_000_000,
            reserve: 0, features: (subgroup_size: 32))])"#,
        Path::new("gpu.ron"),
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let options = Options { kv_device_positions: Some(256), kv_split: true, ..Options::default() };
    let plan = compile(&spec, &b, &profile, &options).unwrap_or_else(|d| panic!("{d}"));
    assert!(plan.placement.kv_split.is_none(), "no split of relative-logit layers\n{plan}");
    let (mut host, mut device) = (BTreeMap::new(), BTreeMap::new());
    for f in &plan.frames {
        let on = if f.place == coli_compiler::ids::Place::Host { &mut host } else { &mut device };
        for &id in &f.ops {
            *on.entry(coli_compiler::frames::op_of(&plan.program, id).kind().info().name).or_insert(0) += 1;
        }
    }
    assert_eq!((host.get("attention_rel"), device.get("attention_rel")), (None, Some(&66)), "{plan}");
    assert_eq!((host.get("short_conv"), device.get("short_conv")), (None, Some(&(4 * 66))), "{plan}");
    assert_eq!(device.get("rms_norm_scaled"), Some(&1), "{plan}");
    assert_eq!((host.get("route_shared"), host.get("routed_experts_shared")), (None, None), "{plan}");
    assert_eq!((device.get("route_shared"), device.get("routed_experts_shared")), (Some(&66), Some(&66)), "{plan}");
}

/// DeepSeek-V2's router from the V3 spec (`model_type` "deepseek_v2"): softmax, no bias, no
/// renormalization, groups scored by their best; `topk_method: "greedy"` drops the groups; a
/// `model_type` that is not a string is a located diagnostic.
#[test]
fn deepseek_v2_routes_by_softmax_and_its_groups_best_score() {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v2");
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let spec = Spec::load(&graphs().join("deepseek_v3.ron")).unwrap();
    let route = |config: &serde_json::Value| {
        let path = std::env::temp_dir().join(format!("coli-v2-{}.json", std::process::id()));
        std::fs::write(&path, serde_json::to_vec(config).unwrap()).unwrap();
        let b = Bindings::from_config_json(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).map_err(|d| d.to_string())?;
        let p = plan.program;
        Ok::<_, String>(p.layers[1].ops.iter().find(|op| matches!(op, Op::Route { .. })).cloned().unwrap())
    };
    let Op::Route { scoring, renormalize, correction_bias, groups, group_score, scale, .. } = route(&config).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(
        (scoring, renormalize, correction_bias, groups, group_score),
        (RouterScoring::Softmax, false, None, Some((4, 2)), GroupScore::Max)
    );
    assert_eq!(scale, 1.5);
    let mut greedy = config.clone();
    greedy["topk_method"] = "greedy".into();
    let Op::Route { groups, .. } = route(&greedy).unwrap() else { unreachable!() };
    assert_eq!(groups, Some((1, 1)));
    let mut v3 = config.clone();
    v3["model_type"] = "deepseek_v3".into();
    let Op::Route { scoring, .. } = route(&v3).unwrap() else { unreachable!() };
    assert_eq!(scoring, RouterScoring::Sigmoid);
    let mut bad = config;
    bad["model_type"] = 2.into();
    let err = route(&bad).unwrap_err();
    assert!(err.contains("configuration key `model_type` is `2`, the spec expects a string"), "{err}");
}

/// `attention_bias` switches on the weights a spec marks `when: "attn_bias"`: a `Linear`'s
/// bias (with the row selection of its fused matrix, Qwen3-Next's query and gate), an MLA's
/// optional roles; without it neither is looked for.
#[test]
fn attention_bias_switches_the_marked_biases_on() {
    let with_bias = |spec: &str, on: bool| {
        let spec = Spec::load(&graphs().join(spec)).unwrap();
        let mut b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
        b.config.insert("attention_bias".into(), serde_json::json!(on));
        compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap_or_else(|d| panic!("{d}")).program
    };
    let biases = |p: &Program| -> Vec<(String, Option<RowSelect>)> {
        p.layers
            .iter()
            .flat_map(|l| &l.ops)
            .filter_map(|op| match op {
                Op::Linear { bias: Some(b), .. } => Some((b.name.clone(), b.rows)),
                _ => None,
            })
            .collect()
    };
    for spec in ["olmoe.ron", "qwen3_moe.ron", "qwen3_next.ron", "qwen3_5_moe.ron", "mimo_v2_flash.ron"] {
        assert!(biases(&with_bias(spec, false)).is_empty(), "{spec}");
    }
    let next = with_bias("qwen3_next.ron", true);
    let full = next.layers.iter().position(|l| l.mixer == MixerKind::Attention).unwrap();
    let layer: Vec<_> = biases(&next).into_iter().filter(|(n, _)| n.contains(&format!(".{full}."))).collect();
    let name = |p: &str| format!("model.layers.{full}.self_attn.{p}.bias");
    let names: Vec<&str> = layer.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [name("q_proj"), name("q_proj"), name("k_proj"), name("v_proj"), name("o_proj")]);
    // The query's and the gate's entries are the matrix's rows: per head, query then gate.
    let (q, gate) = (layer[0].1.unwrap(), layer[1].1.unwrap());
    assert_eq!((q.stride, q.offset, q.take), (2 * q.take, 0, q.take));
    assert_eq!((gate.stride, gate.offset), (2 * q.take, q.take));
    let mimo = biases(&with_bias("mimo_v2_flash.ron", true));
    assert!(
        mimo.iter().any(|(n, _)| n.ends_with("k_proj.bias")) && !mimo.iter().any(|(n, _)| n.ends_with("o_proj.bias"))
    );
    let mla_roles = |on: bool| -> Vec<String> {
        let p = with_bias("deepseek_v3.ron", on);
        p.layers[0]
            .ops
            .iter()
            .find_map(|op| {
                if let Op::Mla { spec, .. } = op {
                    Some(spec.weights.iter().map(|(r, _)| r.clone()).collect())
                } else {
                    None
                }
            })
            .unwrap()
    };
    assert!(!mla_roles(false).iter().any(|r| r.ends_with("bias")));
    let on = mla_roles(true);
    for role in ["q_a_bias", "kv_a_bias", "o_bias"] {
        assert!(on.iter().any(|r| r == role), "{role} in {on:?}");
    }
}

/// MiMo-V2-Flash's RoPE scaling is each layer type's (`rope_parameters.full_attention`,
/// `.sliding_attention`), as transformers reads it; none where the type's is the default.
#[test]
fn mimo_v2_flash_scales_rope_per_layer_type() {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/mimo_v2_flash");
    let mut b = Bindings::from_config_json(&d.join("config.json")).unwrap();
    let spec = Spec::load(&graphs().join("mimo_v2_flash.ron")).unwrap();
    let scalings = |b: &Bindings| -> Vec<Vec<RopeScaling>> {
        let p = compile(&spec, b, &DeviceProfile::cpu_only(), &Options::default())
            .unwrap_or_else(|d| panic!("{d}"))
            .program;
        p.layers
            .iter()
            .map(|l| {
                l.ops
                    .iter()
                    .filter_map(|op| if let Op::Rope { scaling, .. } = op { Some(*scaling) } else { None })
                    .collect()
            })
            .collect()
    };
    assert!(scalings(&b).iter().flatten().all(|s| *s == RopeScaling::None));
    b.config.insert(
        "rope_parameters".into(),
        serde_json::json!({
            "full_attention": {"rope_type": "yarn", "rope_theta": 5e6, "factor": 4.0, "original_max_position_embeddings": 8},
            "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
        }),
    );
    let s = scalings(&b);
    // Layers: full, sliding, sliding, full (the fixture's `layer_types`).
    assert!(matches!(s[0][..], [RopeScaling::Yarn { factor: 4.0, original_max_position: 8, .. }, _]), "{s:?}");
    assert_eq!(s[1], [RopeScaling::Linear { factor: 2.0 }; 2]);
}

/// An activation other than silu (`hidden_act`) is refused by name in every family whose
/// transformers class reads it, never run as SwiGLU.
#[test]
fn an_activation_other_than_silu_is_refused_by_name() {
    for name in [
        "llama.ron",
        "olmoe.ron",
        "qwen3_moe.ron",
        "mixtral.ron",
        "deepseek_v3.ron",
        "qwen3_next.ron",
        "qwen3_5_moe.ron",
        "kimi_linear.ron",
        "mimo_v2_flash.ron",
        "deepseek_v32.ron",
        "glm_moe_dsa.ron",
    ] {
        let spec = Spec::load(&graphs().join(name)).unwrap();
        let mut b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
        b.config.insert("hidden_act".into(), serde_json::json!("silu"));
        assert!(compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).is_ok(), "{name}");
        b.config.insert("hidden_act".into(), serde_json::json!("gelu"));
        let d =
            compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).map(|_| ()).unwrap_err().to_string();
        assert!(d.contains("not served") && d.contains("`hidden_act`"), "{name}: {d}");
    }
}

/// gpt-oss's attention biases follow `attention_bias`, on unless the configuration says off.
#[test]
fn gpt_oss_attention_biases_follow_attention_bias() {
    let spec = Spec::load(&graphs().join("gpt_oss.ron")).unwrap();
    let mut b = Bindings::from_config_json(&spec.default_config().unwrap()).unwrap();
    let biased = |b: &Bindings| {
        let p = compile(&spec, b, &DeviceProfile::cpu_only(), &Options::default()).unwrap().program;
        p.layers[0]
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Linear { bias: Some(w), .. } if w.name.contains("self_attn")))
            .count()
    };
    b.config.remove("attention_bias");
    assert_eq!(biased(&b), 4);
    b.config.insert("attention_bias".into(), serde_json::json!(false));
    assert_eq!(biased(&b), 0);
}
