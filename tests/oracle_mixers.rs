//! The CPU path of the mixers beyond plain attention against Hugging Face transformers: tiny
//! random-weight checkpoints (committed under tests/fixtures/, made by tools/make_fixtures.py)
//! of gpt-oss (sliding window with sinks, fused input-major experts with biases, clamped
//! SwiGLU), MiMo-V2-Flash (sliding window with sinks and twice the KV heads, value heads
//! narrower than key heads, scaled values, partial RoPE per layer type), DeepSeek-V3
//! (multi-head latent attention), Qwen3-Next (Gated DeltaNet), Qwen3.5-MoE (its projections
//! apart), Kimi Linear (Kimi Delta Attention beside MLA without RoPE) and Inkling (sliding and
//! global attention with relative-position logits, short convolutions with their own state,
//! shared experts in the router's normalisation), DeepSeek V4 (hyper-connections' streams, K=V
//! attention with RoPE on the heads' tails, hash and sqrt-softplus routing; its sliding layers
//! only, a compressed one refused), and `coli exec` running each one as a process.
//!
//! Tolerance: every logit within 1e-4 of the largest |logit| of transformers (f32 weights and
//! activations; only the order of float operations differs); greedy ids identical; prompts
//! fed whole and in chunks of 1 and 3 give the same logits. This file must not loosen a bound
//! per fixture: a fixture that needs a looser one is a fixture to regenerate.

mod common;

use coli_runtime::cpu::CpuError;
use coli_runtime::exec::{ExecError, LogitRows, Session};
use common::*;
use std::process::Command;

/// `coli exec` on the fixture: the greedy ids of the oracle, printed (no tokenizer).
fn check_exec(name: &str) {
    let dir = fixture_dir(name);
    let oracle = read_json(&dir.join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]).iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let greedy = ids(&oracle["greedy"]);
    let n = greedy.len().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "exec",
            "--device",
            "cpu",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "-n",
            &n,
            "--chunk",
            "5",
        ])
        .current_dir(root())
        .output()
        .expect("coli runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{name}: coli exec failed: {err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let printed: Vec<u32> =
        out.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect();
    assert_eq!(printed, greedy, "{name}: coli exec printed {out:?}");
}

#[test]
fn gpt_oss_matches_transformers() {
    matches_oracle("gpt_oss");
}

#[test]
fn gpt_oss_runs_in_coli_exec() {
    check_exec("gpt_oss");
}

#[test]
fn mimo_v2_flash_matches_transformers() {
    matches_oracle("mimo_v2_flash");
}

#[test]
fn mimo_v2_flash_runs_in_coli_exec() {
    check_exec("mimo_v2_flash");
}

#[test]
fn deepseek_v3_matches_transformers() {
    matches_oracle("deepseek_v3");
}

#[test]
fn deepseek_v3_runs_in_coli_exec() {
    check_exec("deepseek_v3");
}

/// `attention_bias`: biases on the MLA's q_a, kv_a and o projections.
#[test]
fn deepseek_v3_with_attention_biases_matches_transformers() {
    matches_oracle("deepseek_v3_bias");
}

#[test]
fn deepseek_v2_matches_transformers() {
    matches_oracle("deepseek_v2");
}

#[test]
fn deepseek_v2_runs_in_coli_exec() {
    check_exec("deepseek_v2");
}

#[test]
fn qwen3_next_matches_transformers() {
    matches_oracle("qwen3_next");
}

#[test]
fn qwen3_next_runs_in_coli_exec() {
    check_exec("qwen3_next");
}

/// `attention_bias`: the fused query-and-gate projection's bias split by the matrix's rows.
#[test]
fn qwen3_next_with_attention_biases_matches_transformers() {
    matches_oracle("qwen3_next_bias");
}

#[test]
fn qwen3_5_moe_matches_transformers() {
    matches_oracle("qwen3_5_moe");
}

/// transformers reads the rotary fraction from `rope_parameters` (the configuration class puts a
/// top-level `partial_rotary_factor` there only when `rope_parameters` has none): a top-level
/// key that says otherwise is not the one that counts.
#[test]
fn the_rotary_fraction_of_rope_parameters_comes_first() {
    for name in ["qwen3_5_moe", "qwen3_next"] {
        let dir = patched_fixture(name, |c| c["partial_rotary_factor"] = 0.5.into());
        matches_oracle_at(name, &dir);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn qwen3_5_moe_as_published_wrapper_matches_transformers() {
    let dir = common::qwen3_5_moe_as_wrapper("qwen3_5_moe", true);
    matches_oracle_at("qwen3_5_moe", &dir);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_wrapper_config_without_its_text_config_is_refused() {
    let dir = common::qwen3_5_moe_as_wrapper("qwen3_5_moe", false);
    let err = coli_runtime::engine::Engine::load(&dir, &coli_runtime::engine::EngineOptions::default())
        .err()
        .map(|e| e.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    let err = err.expect("a wrapper without text_config must not load");
    assert!(err.contains("text_config") && err.contains("config.json"), "{err}");
}

#[test]
fn deepseek_v4_matches_transformers() {
    matches_oracle("deepseek_v4");
}

#[test]
fn deepseek_v4_runs_in_coli_exec() {
    check_exec("deepseek_v4");
}

/// Compressed layers: heavily compressed (every closed window an entry) and compressed sparse
/// (overlapping windows, the lightning indexer's top-k), beside a sliding one.
#[test]
fn deepseek_v4_compressed_matches_transformers() {
    matches_oracle("deepseek_v4_compressed");
}

#[test]
fn deepseek_v4_compressed_runs_in_coli_exec() {
    check_exec("deepseek_v4_compressed");
}

/// The compressed layers at the rates a `deepseek4` GGUF file can state (compressed sparse 4,
/// heavily compressed 8): the safetensors of the fixture `gguf_mixers.rs` converts.
#[test]
fn deepseek_v4_csa4_matches_transformers() {
    matches_oracle("deepseek_v4_csa4");
}

/// An original checkpoint's top-level `rope_scaling` is refused by name, not run unscaled.
#[test]
fn deepseek_v4_with_a_top_level_rope_scaling_is_refused_by_name() {
    let dir = patched_fixture("deepseek_v4_compressed", |c| {
        c["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
    });
    let err = coli_runtime::engine::Engine::load(&dir, &coli_runtime::engine::EngineOptions::default())
        .err()
        .map(|e| e.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    let err = err.expect("a top-level rope_scaling must not load");
    assert!(err.contains("not served") && err.contains("rope_scaling"), "{err}");
}

#[test]
fn qwen3_5_moe_runs_in_coli_exec() {
    check_exec("qwen3_5_moe");
}

#[test]
fn kimi_linear_matches_transformers() {
    matches_oracle("kimi_linear");
}

#[test]
fn kimi_linear_runs_in_coli_exec() {
    check_exec("kimi_linear");
}

#[test]
fn inkling_matches_transformers() {
    matches_oracle("inkling");
}

#[test]
fn inkling_runs_in_coli_exec() {
    check_exec("inkling");
}

/// Inkling's short convolutions keep their input rows, so the session goes back to any
/// position as a KV cache does: cut to the middle of the prompt and fed the rest again (whole
/// and one row at a time), then the greedy continuation, it gives transformers' logits.
#[test]
fn inkling_short_convolutions_rewind_to_any_position() {
    let dir = fixture_dir("inkling");
    let oracle = read_json(&dir.join("oracle.json"));
    let loaded = load_model(&dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let want = matrix(&oracle["logits"]);
    let greedy = ids(&oracle["greedy"]);
    let greedy_logits = matrix(&oracle["greedy_logits"]);
    let tol = 1e-4 * oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let mut s = Session::new(loaded.model(), 256);
    s.forward(&prompt, LogitRows::Last).unwrap();
    s.forward(&greedy[..3], LogitRows::Last).unwrap();
    for cut in [5, 9] {
        s.try_truncate(cut).expect("a short convolution goes back anywhere");
        let mut got = Vec::new();
        for c in prompt[cut..].chunks(if cut == 5 { prompt.len() } else { 1 }) {
            let l = s.forward(c, LogitRows::All).unwrap();
            got.extend(l.chunks_exact(want[0].len()).map(|r| r.to_vec()));
        }
        let err = max_abs_diff(&got, &want[cut..]);
        assert!(err <= tol, "after a cut to {cut}: max |logit - oracle| = {err} > {tol}");
    }
    for (i, &id) in greedy[..4].iter().enumerate() {
        let l = s.forward(&[id], LogitRows::Last).unwrap();
        let err = max_abs_diff(&[l], &greedy_logits[i + 1..i + 2]);
        assert!(err <= tol, "greedy step {} after the cuts: {err} > {tol}", i + 1);
    }
}

/// A recurrent state (Qwen3-Next's Gated DeltaNet, Kimi Linear's KDA) goes back only to the
/// start or to the start of its last step:
/// `try_truncate` to another middle position is a typed error that changes nothing; back by
/// the last step, the step again gives the same logits; `truncate(0)` resets it (the same
/// logits again); after a plain `truncate` to the middle the next forward is a typed error,
/// never logits from a wrong state.
fn check_rewind(name: &str) {
    let dir = fixture_dir(name);
    let oracle = read_json(&dir.join("oracle.json"));
    let loaded = load_model(&dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let greedy = ids(&oracle["greedy"]);
    let want = matrix(&oracle["greedy_logits"]);
    let tol = 1e-4 * oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let mut s = Session::new(loaded.model(), 256);
    let first = s.forward(&prompt, LogitRows::Last).unwrap();
    assert!(matches!(s.try_truncate(5), Err(ExecError::CannotRewind { .. })));
    assert_eq!(s.pos(), prompt.len());
    let next = s.forward(&[greedy[0]], LogitRows::Last).unwrap();
    assert!(
        max_abs_diff(std::slice::from_ref(&next), &want[1..2]) <= tol,
        "the session still decodes after a refused truncate"
    );
    s.try_truncate(prompt.len()).expect("back to the start of the last step");
    let redo = s.forward(&[greedy[0]], LogitRows::Last).unwrap();
    assert_eq!(redo, next, "the last step again, from the state it started from");
    s.truncate(0);
    let again = s.forward(&prompt, LogitRows::Last).unwrap();
    assert!(max_abs_diff(&[again], &[first]) <= tol, "a truncate to 0 starts a fresh state");
    s.truncate(5);
    match s.forward(&prompt[5..6], LogitRows::Last) {
        Err(ExecError::Cpu(CpuError::RecurrentState { .. })) => {}
        other => panic!("expected a recurrent-state error, got {:?}", other.map(|l| l.len())),
    }
}

#[test]
fn qwen3_next_recurrent_state_goes_back_only_to_the_start() {
    check_rewind("qwen3_next");
}

#[test]
fn kimi_linear_recurrent_state_goes_back_only_to_the_start() {
    check_rewind("kimi_linear");
}
