//! DeepSeek Sparse Attention on the CPU against Hugging Face transformers: the tiny
//! random-weight checkpoints of DeepSeek-V3.2 (an indexer per layer, RoPE on halves) and
//! GLM-MoE-DSA (RoPE on adjacent pairs, layers that reuse the last full layer's selection),
//! made by tools/make_fixtures.py with `index_topk` below the prompt's length and a clear gap at
//! every top-k cut (`min_index_score_gap` in the oracle).
//!
//! Tolerance: every logit within 1e-4 of the largest |logit| of transformers (f32 weights and
//! activations; only the order of float operations differs); greedy ids identical; the prompt
//! whole (the expanded MLA form) and in chunks of 1 (the absorbed form) and 3 gives the same
//! logits. The selection must matter: the same weights with a top-k that keeps every position
//! land beyond that bound.

mod common;

use coli_runtime::exec::{LogitRows, Session};
use common::*;
use serde_json::Value;

/// The fixture's top-k cut has a clear gap (so the oracle's selection is no tie), then
/// `matches_oracle`. Returns the largest error seen.
fn check_fixture(name: &str) -> f32 {
    let dir = fixture_dir(name);
    let oracle = read_json(&dir.join("oracle.json"));
    assert!(
        oracle["min_index_score_gap"].as_f64().unwrap() >= 2e-4,
        "{name}: the fixture's top-k cut has no clear gap"
    );
    matches_oracle(name)
}

/// With a top-k that keeps every position the attention is dense: the logits leave the
/// oracle's bound by far, so the fixtures check the selection, not only MLA.
fn selection_matters(name: &str) {
    let oracle = read_json(&fixture_dir(name).join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]);
    let want = matrix(&oracle["logits"]);
    let tol = 1e-4 * oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let dense = patched_fixture(name, |c| c["index_topk"] = Value::from(1024));
    let got = logit_rows(&mut Session::new(load_model(&dense).model(), 256), &prompt, prompt.len());
    std::fs::remove_dir_all(&dense).ok();
    let err = max_abs_diff(&got, &want);
    eprintln!("{name}: dense attention: max |logit - oracle| = {err:.3e} (the sparse bound {tol:.3e})");
    assert!(err > 100.0 * tol, "{name}: dense attention lands within {err} of the sparse oracle");
    // The rows that see no more than index_topk positions are dense either way.
    let k = oracle_config(name)["index_topk"].as_u64().unwrap() as usize;
    let early = max_abs_diff(&got[..k], &want[..k]);
    assert!(early <= tol, "{name}: the first {k} rows differ by {early}");
}

fn oracle_config(name: &str) -> Value {
    read_json(&fixture_dir(name).join("config.json"))
}

/// A session cut back mid-sequence (as speculation and slots do) re-runs the cut positions and
/// lands on the same logits: the index keys go back with the latent cache.
fn truncate_rewinds_the_index_keys(name: &str) {
    let oracle = read_json(&fixture_dir(name).join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]);
    let want = matrix(&oracle["logits"]);
    let tol = 1e-4 * oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let loaded = load_model(&fixture_dir(name));
    let mut s = Session::new(loaded.model(), 256);
    s.forward(&prompt, LogitRows::All).unwrap();
    // Cut to 9 positions, feed other tokens, cut back, then the true rest again.
    s.truncate(9);
    s.forward(&[5, 6, 7], LogitRows::All).unwrap();
    s.truncate(9);
    let rest = s.forward(&prompt[9..], LogitRows::All).unwrap();
    let got: Vec<Vec<f32>> = rest.chunks_exact(want[0].len()).map(|r| r.to_vec()).collect();
    let err = max_abs_diff(&got, &want[9..]);
    assert!(err <= tol, "{name}: after truncating, max |logit - oracle| = {err} > {tol}");
}

#[test]
fn deepseek_v32_matches_transformers() {
    check_fixture("deepseek_v32");
}

#[test]
fn glm_moe_dsa_matches_transformers() {
    check_fixture("glm_moe_dsa");
}

#[test]
fn the_selection_matters() {
    selection_matters("deepseek_v32");
    selection_matters("glm_moe_dsa");
}

#[test]
fn truncating_a_session_rewinds_the_index_keys() {
    truncate_rewinds_the_index_keys("deepseek_v32");
    truncate_rewinds_the_index_keys("glm_moe_dsa");
}
