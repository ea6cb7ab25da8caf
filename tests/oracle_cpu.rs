//! The CPU path against an oracle nobody here wrote: logits and greedy tokens of Hugging Face
//! transformers for tiny random-weight checkpoints of each architecture (committed under
//! tests/fixtures/), and for two real trained models (pymoe-22m from ../shared, SmolLM2 from
//! the user's cache; CI fetches it first).
//!
//! Tolerance: every logit within 1e-4 of the largest |logit| of transformers (f32 weights,
//! f32 activations; only the order of float operations differs). Greedy ids identical.

mod common;

use coli_runtime::cpu::Precision;
use coli_runtime::exec::{LogitRows, Session};
use common::*;

fn check_fixture(name: &str) {
    let dir = fixture_dir(name);
    let oracle = read_json(&dir.join("oracle.json"));
    let loaded = load_model(&dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let want = matrix(&oracle["logits"]);
    let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let tol = 1e-4 * max;

    // Every prompt position, in one block and in chunks of 1 and 3.
    for chunk in [prompt.len(), 1, 3] {
        let mut s = Session::new(loaded.model(), 256);
        let mut got = Vec::new();
        for c in prompt.chunks(chunk) {
            let l = s.forward(c, LogitRows::All).unwrap();
            got.extend(l.chunks_exact(want[0].len()).map(|r| r.to_vec()));
        }
        let err = max_abs_diff(&got, &want);
        assert!(err <= tol, "{name}: chunk {chunk}: max |logit - oracle| = {err} > {tol}");
    }

    // Greedy continuation.
    let greedy = ids(&oracle["greedy"]);
    let mut s = Session::new(loaded.model(), 256);
    let mut last = s.forward(&prompt, LogitRows::Last).unwrap();
    let mut got = Vec::new();
    for _ in 0..greedy.len() {
        let id = argmax(&last);
        got.push(id);
        last = s.forward(&[id], LogitRows::Last).unwrap();
    }
    assert_eq!(got, greedy, "{name}: greedy tokens differ from transformers'");
}

#[test]
fn llama_matches_transformers() {
    check_fixture("llama");
}

#[test]
fn llama_tied_matches_transformers() {
    check_fixture("llama_tied");
}

#[test]
fn llama_with_biases_matches_transformers() {
    check_fixture("llama_bias");
}

/// OLMoE's `clip_qkv` (q, k and v clamped) is not served: refused by name, never run as an
/// unclamped model.
#[test]
fn olmoe_with_clip_qkv_is_refused() {
    let dir = patched_fixture("olmoe", |c| c["clip_qkv"] = serde_json::json!(8.0));
    let err = coli_runtime::engine::Engine::load(&dir, &Default::default()).err().map(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    let err = err.expect("clip_qkv must not load");
    assert!(err.contains("not served") && err.contains("clip_qkv"), "{err}");
}

#[test]
fn olmoe_matches_transformers() {
    check_fixture("olmoe");
}

#[test]
fn qwen3_moe_matches_transformers() {
    check_fixture("qwen3_moe");
}

#[test]
fn mixtral_matches_transformers() {
    check_fixture("mixtral");
}

#[test]
fn pymoe_matches_transformers() {
    let Some(dir) = shared_model("pymoe-22m") else { return };
    let oracle = read_json(&fixture_dir("pymoe_ref").join("oracle.json"));
    let loaded = load_model(&dir);
    let tok = loaded.tokenizer().expect("pymoe has a tokenizer.json");
    for p in oracle["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), prompt, "tokenizer ids for {text:?}");
        let want = matrix(&p["logits"]);
        let max = p["max_abs_logit"].as_f64().unwrap() as f32;
        let mut s = Session::new(loaded.model(), 512);
        let l = s.forward(&prompt, LogitRows::All).unwrap();
        let got: Vec<Vec<f32>> = l.chunks_exact(want[0].len()).map(|r| r.to_vec()).collect();
        let err = max_abs_diff(&got, &want);
        // The oracle's logits carry 6 significant digits: allow their rounding on top.
        let tol = 1e-4 * max + 1e-5 * max;
        assert!(err <= tol, "pymoe {text:?}: max |logit - oracle| = {err} > {tol}");
        let greedy = ids(&p["greedy"]);
        let mut last = got.last().unwrap().clone();
        let mut out = Vec::new();
        for _ in 0..greedy.len() {
            let id = argmax(&last);
            out.push(id);
            last = s.forward(&[id], LogitRows::Last).unwrap();
        }
        assert_eq!(out, greedy, "pymoe {text:?}: greedy tokens differ");
    }
}

#[test]
fn smollm2_matches_transformers() {
    let Some(path) = default_model_path() else { return };
    let oracle = read_json(&fixture_dir("smollm2_ref").join("oracle.json"));
    let loaded = load_model(&path);
    let tok = loaded.tokenizer().expect("the GGUF carries a tokenizer");
    for p in oracle["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt_ids"]);
        let text = if p["chat_template_applied"].as_bool().unwrap() {
            let rendered = p["rendered"].as_str().unwrap().to_string();
            let msgs: Vec<coli_runtime::text::ChatMessage> = p["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    coli_runtime::text::ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                })
                .collect();
            let ours = tok.chat_template().unwrap().render(&msgs, true).unwrap();
            assert_eq!(ours, rendered, "chat template rendering");
            rendered
        } else {
            p["text"].as_str().unwrap().to_string()
        };
        assert_eq!(tok.encode(&text, false).unwrap(), prompt, "tokenizer ids for {text:?}");
        let want = floats(&p["last_logits"]);
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        // Exact: the weights' blocks decoded and multiplied in f32, as the oracle did after
        // dequantizing; only the order of float operations differs. Fast: activations are
        // quantized to 8 bits per block of 32 (as llama.cpp does), which moves logits by a few
        // percent of the largest; the greedy tokens must still agree.
        let greedy = ids(&p["greedy"]);
        let margins = floats(&p["greedy_margins"]);
        for (precision, rel) in [(Precision::Exact, 1e-4), (Precision::Fast, 0.05)] {
            let mut s = Session::new(loaded.model(), 512);
            s.set_precision(precision);
            let last = s.forward(&prompt, LogitRows::Last).unwrap();
            let err = want.iter().zip(&last).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("smollm2 {precision:?} {text:?}: max |logit - oracle| = {err} (max |logit| {max})");
            assert!(err <= rel * max, "smollm2 {precision:?} {text:?}: max |logit - oracle| = {err} > {}", rel * max);
            // The oracle's greedy tokens fed back (teacher forcing): each step must pick the
            // oracle's token wherever the oracle's top-1/top-2 margin exceeds twice our bound.
            let mut last = last;
            for (i, &id) in greedy.iter().enumerate() {
                if margins[i] > 2.0 * rel * max {
                    assert_eq!(
                        argmax(&last),
                        id,
                        "smollm2 {precision:?} {text:?}: greedy step {i} (oracle margin {})",
                        margins[i]
                    );
                }
                last = s.forward(&[id], LogitRows::Last).unwrap();
            }
            if precision == Precision::Exact {
                // Free-running greedy decode gives the oracle's tokens exactly.
                let mut s = Session::new(loaded.model(), 512);
                s.set_precision(precision);
                let mut last = s.forward(&prompt, LogitRows::Last).unwrap();
                let mut out = Vec::new();
                for _ in 0..greedy.len() {
                    let id = argmax(&last);
                    out.push(id);
                    last = s.forward(&[id], LogitRows::Last).unwrap();
                }
                assert_eq!(out, greedy, "smollm2 {text:?}: greedy tokens differ");
            }
        }
    }
}
