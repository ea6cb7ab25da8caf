//! The GGUF names of the mixer specs, end to end: the tiny Hugging Face fixtures of DeepSeek-V3,
//! gpt-oss, MiMo-V2-Flash, Qwen3-Next, Qwen3.5-MoE and Kimi Linear converted to GGUF as llama.cpp's
//! converter lays them out (tests/fixtures/gguf_mixers/, `tools/make_gguf_mixers.py`: `deepseek2`
//! with the split `attn_k_b` / `attn_v_b`, `gpt-oss` with its experts output-major and split,
//! `mimo2` with per-layer KV heads and sliding pattern and its MTP blocks counted, `qwen3next`
//! with its norms plus 1, `attn_qkv` / `attn_gate`, `ssm_a` = -exp(A_log) and squeezed
//! convolutions, `qwen35moe` with its value heads tiled too, `kimi-linear` with per-layer KV
//! heads, the split MLA pair and 4-D convolutions, Mixtral as a `llama` file with experts, GLM-MoE-DSA
//! as `glm-dsa` with its indexer, DeepSeek V4 as `deepseek4` with its schedule as `compress_ratios`),
//! run by coli.
//!
//! Reference: transformers' logits (the fixture's oracle.json), where the GGUF states the same
//! model. Where llama.cpp's format cannot state a setting of the fixture, the reference is
//! coli's Hugging Face path on the fixture with that setting changed to what llama.cpp assumes
//! (that path is itself checked against transformers in `oracle_mixers.rs`):
//! - deepseek2: YaRN's `mscale` (1 in the fixture) has no key; llama.cpp takes it equal to
//!   `mscale_all_dim` (0.707).
//! - gpt-oss: YaRN's `truncate: false` has no key; llama.cpp rounds the correction dims out
//!   (`truncate: true`).
//! - mimo2: `routed_scaling_factor` (1.5 in the fixture) has no key; llama.cpp scales by 1
//!   (MiMo-V2-Flash's own configuration says null).
//! - qwen3next: a dense layer (`mlp_only_layers` [1] in the fixture) has no place in the format;
//!   the file's layer 1 is sparse, with seeded weights the reference reads as a second shard.
//!
//! llama.cpp's greedy ids on the same files (llama-server, the oracle's prompt as ids,
//! temperature 0; recorded in tests/fixtures/README.md) are checked too.
//!
//! Tolerance: every logit of the prompt (whole, in chunks of 1 and 3) and of 20 greedy decode
//! steps within 1e-4 of the largest |logit| of the reference; greedy ids identical. The Vulkan
//! device (Lavapipe in CI) within 1e-4 of the CPU.

mod common;

use coli_runtime::cpu::Precision;
use coli_runtime::engine::{Engine, EngineOptions};
use common::*;
use serde_json::Value;
use std::path::PathBuf;

const STEPS: usize = 20;

fn gguf(file: &str) -> PathBuf {
    fixture_dir("gguf_mixers").join(file)
}

/// Prompt rows and `STEPS` greedy steps of `path` on the CPU, the prompt in chunks of `chunk`.
fn run(path: &std::path::Path, prompt: &[u32], chunk: usize) -> Run {
    run_greedy(&load_model(path), prompt, chunk, STEPS, 256, true)
}

/// The GGUF `file` against `reference` (a checkpoint of the same model; `None`: the fixture's
/// transformers oracle), and its greedy ids against llama.cpp's on the same file where llama.cpp
/// loads it.
fn check(file: &str, fixture: &str, reference: Option<PathBuf>, llama_cpp: Option<&[u32]>) {
    let oracle = read_json(&fixture_dir(fixture).join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]);
    let mut hf_rows = matrix(&oracle["logits"]);
    let greedy = ids(&oracle["greedy"]);
    hf_rows.extend(matrix(&oracle["greedy_logits"])[1..].iter().cloned());
    let (want_rows, want_toks) = match &reference {
        Some(dir) => {
            let r = run(dir, &prompt, prompt.len());
            let _ = std::fs::remove_dir_all(dir);
            (r.rows, r.toks)
        }
        None => (hf_rows.clone(), greedy.clone()),
    };
    let tol = 1e-4 * max_abs(&want_rows);
    for chunk in [prompt.len(), 1, 3] {
        let got = run(&gguf(file), &prompt, chunk);
        // The last decode step's logits are the row after the last greedy id.
        let got_rows = &got.rows[..want_rows.len()];
        let err = max_abs_diff(got_rows, &want_rows);
        // Against transformers on the prompt's rows (past them the greedy ids may part).
        let n = prompt.len();
        let vs_hf = max_abs_diff(&got.rows[..n], &hf_rows[..n]);
        eprintln!("{file}: chunk {chunk}: max |logit - reference| = {err:.3e} (bound {tol:.3e}); prompt rows against transformers {vs_hf:.3e}");
        assert!(err <= tol, "{file}: chunk {chunk}: max |logit - reference| = {err} > {tol}");
        assert_eq!(got.toks, want_toks, "{file}: chunk {chunk}: greedy ids differ from the reference's");
        if let Some(ids) = llama_cpp {
            assert_eq!(got.toks, ids, "{file}: chunk {chunk}: greedy ids differ from llama.cpp's");
        }
    }
}

#[test]
fn deepseek2_gguf_matches_the_fixture() {
    let reference = patched_fixture("deepseek_v3", |c| {
        let all = c["rope_parameters"]["mscale_all_dim"].clone();
        c["rope_parameters"]["mscale"] = all;
    });
    // llama.cpp agrees with transformers' greedy ids for 13 steps, then follows its `mscale`.
    let llama_cpp = [1, 106, 109, 116, 116, 116, 219, 59, 124, 78, 63, 58, 268, 202, 166, 55, 134, 149, 262, 180];
    check("deepseek2.gguf", "deepseek_v3", Some(reference), Some(&llama_cpp));
}

/// DeepSeek-V3.2 from a `deepseek32` file (glm-dsa's layout with an indexer in every layer; the
/// indexer's RoPE on halves as transformers', which llama.cpp runs as NEOX on the same weights).
/// The reference is the fixture with YaRN's `mscale` equal to `mscale_all_dim`, as llama.cpp reads
/// a GGUF file (it stores no `mscale`).
#[test]
fn deepseek32_gguf_matches_the_fixture() {
    let reference = patched_fixture("deepseek_v32", |c| {
        let all = c["rope_parameters"]["mscale_all_dim"].clone();
        c["rope_parameters"]["mscale"] = all;
    });
    check("deepseek32.gguf", "deepseek_v32", Some(reference), None);
}

/// DeepSeek-V2's softmax router from a `deepseek2` file (`expert_gating_func` 1): every setting
/// of the fixture has its key, so the reference is transformers itself. llama.cpp does not load
/// this file: without a query LoRA it expects V2-Lite's 26 or 27 layers.
#[test]
fn deepseek2_softmax_gguf_matches_transformers() {
    check("deepseek2-v2.gguf", "deepseek_v2", None, None);
}

/// A `deepseek2` file whose gating function is neither softmax nor sigmoid is refused by name.
#[test]
fn deepseek2_unknown_gating_is_refused() {
    let mut bytes = std::fs::read(gguf("deepseek2-v2.gguf")).unwrap();
    let key = b"deepseek2.expert_gating_func";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the gating key") + key.len();
    // The value's type (4: UINT32), then the value.
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes());
    bytes[at + 4..at + 8].copy_from_slice(&3u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("coli-gating-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = Engine::load(&path, &EngineOptions::default()).err().map(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let err = err.expect("an unknown gating function must not load");
    assert!(err.contains("not served") && err.contains("expert_gating_func"), "{err}");
}

#[test]
fn gpt_oss_gguf_matches_the_fixture() {
    let reference = patched_fixture("gpt_oss", |c| c["rope_parameters"]["truncate"] = Value::Bool(true));
    let llama_cpp = [189, 37, 169, 69, 221, 245, 252, 188, 274, 276, 95, 143, 156, 218, 203, 127, 228, 214, 271, 197];
    check("gpt-oss.gguf", "gpt_oss", Some(reference), Some(&llama_cpp));
}

#[test]
fn mimo2_gguf_matches_the_fixture() {
    let reference = patched_fixture("mimo_v2_flash", |c| c["routed_scaling_factor"] = Value::Null);
    // llama.cpp agrees with transformers' greedy ids for 7 steps, then follows its scale of 1.
    let llama_cpp = [148, 80, 224, 70, 129, 43, 233, 253, 183, 155, 108, 146, 208, 245, 318, 112, 95, 94, 208, 42];
    check("mimo2.gguf", "mimo_v2_flash", Some(reference), Some(&llama_cpp));
}

/// The split MLA pair is joined back into each layer's `attn_kv_b` (the file has none), the
/// same bytes as the fixture's `kv_b_proj`.
#[test]
fn deepseek2_kv_b_is_joined_from_k_b_and_v_b() {
    use coli_runtime::model::{Checkpoint, LoadOptions};
    let g = Checkpoint::open(&gguf("deepseek2.gguf"), &LoadOptions::default()).unwrap();
    let hf = Checkpoint::open(&fixture_dir("deepseek_v3"), &LoadOptions::default()).unwrap();
    for layer in 0..3 {
        let name = format!("blk.{layer}.attn_kv_b.weight");
        assert!(g.has(&name) && g.names().any(|n| n == name), "{name} is not listed");
        let joined = g.tensor(&name).unwrap();
        let want = hf.tensor(&format!("model.layers.{layer}.self_attn.kv_b_proj.weight")).unwrap();
        assert_eq!(joined.shape, want.shape, "{name}");
        assert_eq!(joined.bytes(), want.bytes(), "{name}: bytes differ from kv_b_proj");
        let info = &g.bindings().tensors.unwrap()[&name];
        assert_eq!((info.shape.clone(), info.bytes), (want.shape.clone(), want.bytes().len() as u64));
    }
}

/// The tensor names of a safetensors file (its JSON header's keys).
fn safetensors_names(path: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}

/// `fixture` with its configuration patched and `extra` (a safetensors file of further
/// tensors) as a second shard: a reference for a GGUF that holds weights the fixture lacks.
fn fixture_with_shard(fixture: &str, extra: &std::path::Path, patch: impl Fn(&mut Value)) -> PathBuf {
    let dir = patched_fixture(fixture, patch);
    std::fs::rename(dir.join("model.safetensors"), dir.join("a.safetensors")).unwrap();
    std::fs::copy(extra, dir.join("b.safetensors")).unwrap();
    let mut map = serde_json::Map::new();
    for (file, names) in
        [("a.safetensors", safetensors_names(&dir.join("a.safetensors"))), ("b.safetensors", safetensors_names(extra))]
    {
        for n in names {
            map.insert(n, Value::String(file.into()));
        }
    }
    let index = serde_json::json!({ "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    dir
}

/// llama.cpp's qwen3next holds no dense layer (its converter maps no dense FFN, its loader
/// wants experts in every layer), so the fixture's `mlp_only_layers` [1] becomes a sparse
/// layer of seeded weights (`qwen3next-moe.safetensors`, written by the same tool); the
/// reference is the fixture with those weights and no dense layer. llama.cpp does not load
/// this file (its loader takes the value heads as wide as the key heads, 16; here 12).
#[test]
fn qwen3next_gguf_matches_the_fixture() {
    let reference = fixture_with_shard("qwen3_next", &gguf("qwen3next-moe.safetensors"), |c| {
        c["mlp_only_layers"] = Value::Array(vec![])
    });
    check("qwen3next.gguf", "qwen3_next", Some(reference), None);
}

/// The derived tensors of a qwen3next file: `ssm_a_log` is the fixture's `A_log` (through
/// llama.cpp's `-exp`), `ssm_conv1d.kernel` its convolution as `[channels, 1, kernel]`.
#[test]
fn qwen3next_ssm_tensors_are_derived_back() {
    use coli_runtime::model::{Checkpoint, LoadOptions};
    let g = Checkpoint::open(&gguf("qwen3next.gguf"), &LoadOptions::default()).unwrap();
    let hf = Checkpoint::open(&fixture_dir("qwen3_next"), &LoadOptions::default()).unwrap();
    let a = g.tensor("blk.0.ssm_a_log").unwrap().to_f32_vec().unwrap();
    let want = hf.tensor("model.layers.0.linear_attn.A_log").unwrap().to_f32_vec().unwrap();
    let err = a.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(a.len() == want.len() && err < 1e-6, "ssm_a_log differs from A_log by {err}");
    let conv = g.tensor("blk.0.ssm_conv1d.kernel").unwrap();
    let want = hf.tensor("model.layers.0.linear_attn.conv1d.weight").unwrap();
    assert_eq!((conv.shape.clone(), conv.bytes()), (want.shape.clone(), want.bytes()));
}

/// Every setting of the fixture has its key, so the reference is transformers itself; the value
/// heads the converter tiled (6 value heads over 2 key heads) are read grouped again. llama.cpp
/// does not load this file (value heads of 10, key heads of 12; its loader wants them equal).
#[test]
fn qwen35moe_gguf_matches_transformers() {
    check("qwen35moe.gguf", "qwen3_5_moe", None, None);
}

/// The tiled value heads of a qwen35moe file come back grouped, bit for bit: the qkv and z
/// projections (rows), the out projection (columns), the convolution (its value channels), the
/// decay's inputs.
#[test]
fn qwen35moe_value_heads_are_grouped_back() {
    use coli_runtime::model::{Checkpoint, LoadOptions};
    let g = Checkpoint::open(&gguf("qwen35moe.gguf"), &LoadOptions::default()).unwrap();
    let hf = Checkpoint::open(&fixture_dir("qwen3_5_moe"), &LoadOptions::default()).unwrap();
    for (derived, name) in [
        ("blk.0.attn_gate.grouped", "model.layers.0.linear_attn.in_proj_z.weight"),
        ("blk.0.attn_qkv.grouped", "model.layers.0.linear_attn.in_proj_qkv.weight"),
        ("blk.0.ssm_out.grouped", "model.layers.0.linear_attn.out_proj.weight"),
        ("blk.0.ssm_alpha.grouped", "model.layers.0.linear_attn.in_proj_a.weight"),
        ("blk.0.ssm_conv1d.kernel", "model.layers.0.linear_attn.conv1d.weight"),
        ("blk.0.ssm_dt.grouped", "model.layers.0.linear_attn.dt_bias"),
    ] {
        let (a, b) = (g.tensor(derived).unwrap(), hf.tensor(name).unwrap());
        assert_eq!((a.shape.clone(), a.bytes()), (b.shape.clone(), b.bytes()), "{derived}");
    }
    let a = g.tensor("blk.0.ssm_a_log").unwrap().to_f32_vec().unwrap();
    let want = hf.tensor("model.layers.0.linear_attn.A_log").unwrap().to_f32_vec().unwrap();
    let err = a.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(a.len() == want.len() && err < 1e-6, "ssm_a_log differs from A_log by {err}");
}

/// Every setting of the fixture has its key (the gating function written as sigmoid, as
/// Kimi-Linear's own configuration says), so the reference is transformers itself.
#[test]
fn kimi_linear_gguf_matches_transformers() {
    // llama.cpp's greedy ids on this file equal transformers' (20 of 20).
    let llama_cpp = [229, 86, 282, 242, 128, 233, 169, 174, 232, 133, 162, 181, 83, 214, 289, 204, 295, 9, 143, 220];
    check("kimi-linear.gguf", "kimi_linear", None, Some(&llama_cpp));
}

/// Mixtral as llama.cpp writes it: architecture `llama` with `llama.expert_count` and stacked
/// `ffn_*_exps`, q/k rows permuted for interleaved RoPE; served by llama.ron's expert path.
/// Every setting has its key, so the reference is transformers itself.
#[test]
fn mixtral_as_llama_gguf_matches_transformers() {
    // llama.cpp's greedy ids on this file equal transformers' (20 of 20).
    let llama_cpp = [90, 165, 17, 185, 166, 226, 188, 65, 7, 100, 111, 77, 56, 142, 165, 227, 242, 243, 77, 14];
    check("mixtral.gguf", "mixtral", None, Some(&llama_cpp));
}

/// GLM-MoE-DSA as llama.cpp writes it (`glm-dsa`: deepseek2's layout, the indexer under
/// `blk.N.indexer.*`, `indexer_types` as Bools); every setting has its key, so the reference is
/// transformers itself. llama.cpp aborts on this file while building the graph: it rotates the
/// indexer's keys and queries by a Walsh-Hadamard matrix at least 64 wide, and this indexer's
/// heads are 24 wide.
#[test]
fn glm_dsa_gguf_matches_transformers() {
    check("glm-dsa.gguf", "glm_moe_dsa", None, None);
}

/// DeepSeek V4 as llama.cpp's converter writes the original checkpoints (`deepseek4`: the
/// tensors under llama.cpp's names, the experts stacked, `tid2eid` in I32, the schedule as
/// `compress_ratios` and `hash_layer_count`, the clamp once per layer); every setting of the
/// fixture has its key, so the reference is transformers itself. Every layer sliding, the
/// first two hashed.
#[test]
fn deepseek4_gguf_matches_transformers() {
    check("deepseek4.gguf", "deepseek_v4", None, None);
}

/// The compressed layers from a `deepseek4` file: `compress_ratios` [8, 4, 0, 4] (and 0 for the
/// MTP layer the converter leaves out) are a heavily compressed layer at 8, a compressed sparse
/// one (overlapping windows, the indexer's `indexer_compressor_*`, `indexer.attn_q_b`,
/// `indexer.proj`), a sliding one and another compressed sparse one; the compressed layers'
/// YaRN from `rope.scaling.*` with its attention factor 1, as transformers' (which forces it)
/// and llama.cpp's. llama.cpp does not load this file (its loader takes the rates 0, 4 and 128
/// only).
#[test]
fn deepseek4_compressed_gguf_matches_transformers() {
    check("deepseek4-compressed.gguf", "deepseek_v4_csa4", None, None);
}

/// `bytes` with the first occurrence of `key` changed in one letter (so the key or tensor it
/// names is gone), loaded from a file of its own: the error, if it fails to load.
fn load_without(file: &str, key: &str) -> Option<String> {
    let mut bytes = std::fs::read(gguf(file)).unwrap();
    let at = bytes.windows(key.len()).position(|w| w == key.as_bytes()).expect("the key");
    bytes[at + key.len() - 4] = b'X';
    let path = std::env::temp_dir().join(format!("coli-without-{}-{file}", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = Engine::load(&path, &EngineOptions::default()).err().map(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    err
}

/// A `deepseek4` file without a tensor the spec needs (the hash table of a hash layer, the
/// indexer's compressor of a compressed sparse one) is refused with the tensor's name; one
/// whose gating function is not one of llama.cpp's three (here 3) is refused by the key's.
#[test]
fn deepseek4_without_a_tensor_or_with_an_unknown_gating_is_refused() {
    for (file, tensor) in [
        ("deepseek4.gguf", "blk.1.ffn_gate_tid2eid.weight"),
        ("deepseek4-compressed.gguf", "blk.3.indexer_compressor_ape.weight"),
    ] {
        let err = load_without(file, tensor).unwrap_or_else(|| panic!("{file} without {tensor} must not load"));
        assert!(err.contains(tensor), "{file}: {err}");
    }
    let mut bytes = std::fs::read(gguf("deepseek4.gguf")).unwrap();
    let key = b"deepseek4.expert_gating_func";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the gating key") + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes()); // UINT32
    bytes[at + 4..at + 8].copy_from_slice(&3u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("coli-ds4-gating-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = Engine::load(&path, &EngineOptions::default()).err().map(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let err = err.expect("a deepseek4 file with gating function 3 must not load");
    assert!(err.contains("not served") && err.contains("expert_gating_func"), "{err}");
}

/// The converters of qwen35moe, glm-dsa and deepseek32 count the MTP blocks in `block_count` and say how
/// many in `nextn_predict_layers`; the specs run the others only. Here the fixtures' files with
/// one more block declared (its tensors absent, as in a file whose MTP block was left out): n
/// layers, not n + 1; without the `nextn_predict_layers` key the last block's tensors are missing.
#[test]
fn mtp_blocks_counted_in_block_count_are_not_run() {
    use coli_compiler::{compile, DeviceProfile, Options, Spec};
    use coli_runtime::model::{Checkpoint, LoadOptions};
    for (file, arch, spec) in [
        ("qwen35moe.gguf", "qwen35moe", "qwen3_5_moe.ron"),
        ("glm-dsa.gguf", "glm-dsa", "glm_moe_dsa.ron"),
        ("deepseek32.gguf", "deepseek32", "deepseek_v32.ron"),
    ] {
        let spec = Spec::load(&root().join("graphs").join(spec)).unwrap_or_else(|d| panic!("{d}"));
        let mut b = Checkpoint::open(&gguf(file), &LoadOptions::default()).unwrap().bindings();
        let n = b.config[&format!("{arch}.block_count")].as_u64().unwrap() as usize;
        b.config.insert(format!("{arch}.block_count"), Value::from(n + 1));
        let cpu = DeviceProfile::cpu_only();
        let err = compile(&spec, &b, &cpu, &Options::default()).err().map(|d| d.to_string());
        assert!(err.as_deref().is_some_and(|e| e.contains(&format!("blk.{n}."))), "{file}: {err:?}");
        b.config.insert(format!("{arch}.nextn_predict_layers"), Value::from(1));
        let plan = compile(&spec, &b, &cpu, &Options::default()).unwrap_or_else(|d| panic!("{file}: {d}"));
        assert_eq!(plan.program.layers.len(), n, "{file}");
    }
}

/// A `kimi-linear` file whose router is not the sigmoid one (here softmax, 1) is refused by name.
#[test]
fn kimi_linear_softmax_gating_is_refused() {
    let mut bytes = std::fs::read(gguf("kimi-linear.gguf")).unwrap();
    let key = b"kimi-linear.expert_gating_func";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the gating key") + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes()); // UINT32
    bytes[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("coli-kimi-gating-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let err = Engine::load(&path, &EngineOptions::default()).err().map(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let err = err.expect("a softmax kimi-linear file must not load");
    assert!(err.contains("not served") && err.contains("expert_gating_func"), "{err}");
}

/// A file without a key the spec needs is refused with the key's name, not a panic (for
/// qwen35moe that key also says how its value heads were tiled; for deepseek4 the keys its
/// loader requires have no default).
#[test]
fn a_file_without_a_required_key_is_refused() {
    for (file, key) in [
        ("qwen3next.gguf", "qwen3next.ssm.group_count"),
        ("qwen35moe.gguf", "qwen35moe.ssm.inner_size"),
        ("deepseek4.gguf", "deepseek4.hyper_connection.count"),
        ("deepseek4-compressed.gguf", "deepseek4.attention.compress_ratios"),
    ] {
        let err = load_without(file, key).unwrap_or_else(|| panic!("{file} without {key} must not load"));
        assert!(err.contains(key) && err.contains("has no value"), "{file}: {err}");
    }
}

#[test]
fn the_ggufs_on_the_device_match_the_cpu() {
    for (file, fixture) in [
        ("deepseek2.gguf", "deepseek_v3"),
        ("deepseek2-v2.gguf", "deepseek_v2"),
        ("gpt-oss.gguf", "gpt_oss"),
        ("mimo2.gguf", "mimo_v2_flash"),
        ("qwen3next.gguf", "qwen3_next"),
        ("qwen35moe.gguf", "qwen3_5_moe"),
        ("kimi-linear.gguf", "kimi_linear"),
        ("mixtral.gguf", "mixtral"),
        ("glm-dsa.gguf", "glm_moe_dsa"),
        ("deepseek32.gguf", "deepseek_v32"),
        ("deepseek4.gguf", "deepseek_v4"),
        ("deepseek4-compressed.gguf", "deepseek_v4_csa4"),
    ] {
        let prompt = ids(&read_json(&fixture_dir(fixture).join("oracle.json"))["prompt_ids"]);
        device_matches_cpu(&gguf(file), file, &prompt, &[(Precision::Exact, 4, 1e-4)]);
    }
}
