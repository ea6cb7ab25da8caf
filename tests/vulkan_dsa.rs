//! DeepSeek Sparse Attention with a Vulkan device (Lavapipe in CI) against the CPU: the
//! DeepSeek-V3.2 and GLM-MoE-DSA fixtures' logits and greedy tokens, prompts whole and in
//! chunks of 1 and 3, every full layer's indexer (its key LayerNorm, its index-key mirror
//! behind the host's keys, the selection) and every layer's MLA over the selection (its latent
//! mirror behind the host's cache) on the device, the routed experts on the CPU (several frames
//! a step) or resident (one frame a step, replayed); a device lost mid-decode that the CPU
//! finishes with the same tokens; the session cut back mid-sequence.
//!
//! Tolerance: logits within 1e-4 of the largest |logit| (f32 weights: the device and the CPU
//! differ only in the order of float operations); greedy tokens identical.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::LogitRows;
use coli_runtime::oplib::op_name;
use coli_runtime::vk::{FaultInjection, VkOptions};
use common::*;
use std::path::Path;

const FIXTURES: &[&str] = &["deepseek_v32", "glm_moe_dsa"];

/// `dir` on the device with every routed expert on the CPU (no tier, none resident), so a
/// decode step is several device frames with host steps between them.
fn load_on_device(dir: &Path, fault: Option<FaultInjection>) -> Engine {
    load_with(dir, fault, false)
}

/// `dir` on the device, its routed experts resident there when `resident` (a decode step one
/// frame), else on the CPU.
fn load_with(dir: &Path, fault: Option<FaultInjection>, resident: bool) -> Engine {
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions { fault, ..Default::default() }),
        compile: Options {
            context: 256,
            chunk_rows: 8,
            expert_tier: resident,
            resident_experts: resident,
            ..Options::default()
        },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn run(l: &Engine, prompt: &[u32], chunk: usize, steps: usize) -> (Vec<Vec<f32>>, Vec<u32>, Option<String>) {
    let r = run_greedy(l, prompt, chunk, steps, 256, false);
    (r.rows, r.toks, r.notice)
}

#[test]
fn dsa_fixtures_with_a_device_match_the_cpu() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let oracle = read_json(&dir.join("oracle.json"));
        let prompt = ids(&oracle["prompt_ids"]);
        let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
        let (want, want_toks, _) = run(&load_model(&dir), &prompt, prompt.len(), 12);
        for resident in [false, true] {
            let dev = load_with(&dir, None, resident);
            if dev.device().is_none() {
                eprintln!("no Vulkan device: {}", dev.device_note());
                return;
            }
            let (host, device) = (layer_ops(&dev, true), layer_ops(&dev, false));
            let layers = dev.plan().program.dims.layers;
            let program = &dev.plan().program;
            let full = program.layers.iter().filter(|l| l.ops.iter().any(|o| op_name(o) == "indexer")).count();
            assert_eq!(device.iter().filter(|o| **o == "indexer").count(), full, "{name}: {device:?}");
            assert_eq!(device.iter().filter(|o| **o == "mla").count(), layers, "{name}: {device:?}");
            assert!(!host.contains(&"mla") && !host.contains(&"indexer"), "{name}: {host:?}");
            assert_eq!(host.contains(&"routed_experts"), !resident, "{name}: {host:?}");
            for chunk in [prompt.len(), 1, 3] {
                let (got, toks, notice) = run(&dev, &prompt, chunk, 12);
                assert!(notice.is_none(), "{name}: {notice:?}");
                let err = max_abs_diff(&got, &want);
                let what = format!("{name} chunk {chunk}, experts resident {resident}");
                eprintln!("{what}: max |device - cpu| = {err:.3e} (bound {:.3e})", 1e-4 * max);
                assert!(err <= 1e-4 * max, "{what}: max |device - cpu| = {err}");
                assert_eq!(toks, want_toks, "{what}: greedy tokens differ");
            }
        }
    }
}

/// A submit failing in the middle of a decode step (after an earlier frame's index keys and
/// MLA rows reached the host's cache) re-runs the step on the CPU from the host's cache, and
/// the CPU finishes the run with the same tokens; before that, a session on the device cut back
/// by one step and to 0 lands on the same logits.
#[test]
fn a_device_lost_mid_decode_of_a_dsa_model_is_finished_by_the_cpu() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let oracle = read_json(&dir.join("oracle.json"));
        let prompt = ids(&oracle["prompt_ids"]);
        let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
        let (_, want_toks, _) = run(&load_model(&dir), &prompt, prompt.len(), 12);
        let clean = load_on_device(&dir, None);
        if clean.device().is_none() {
            eprintln!("no Vulkan device: {}", clean.device_note());
            return;
        }
        let (mut s, DecodeSubmits { first, steps, starts, per_step }) = decode_six_on_device(&clean, &prompt);
        assert!(per_step >= 2, "{name}: a decode step should take several frames, took {per_step}");
        s.truncate(prompt.len() + 5);
        let again = s.forward(&[argmax(&steps[4])], LogitRows::Last).unwrap();
        assert!(max_abs_diff(&[again], &[steps[5].clone()]) <= 1e-5 * max, "{name}: the last step again");
        s.truncate(0);
        let again = s.forward(&prompt, LogitRows::Last).unwrap();
        assert!(max_abs_diff(&[again], &[first]) <= 1e-5 * max, "{name}: the prompt again");
        assert!(s.take_notice().is_none() && s.on_a_device(), "{name}: all of it with the device");
        // The second submit of the sixth decode step: the first frame and layer 0's host steps done.
        let dev = load_on_device(&dir, Some(FaultInjection { fail_submit: Some(starts[5] + 2), fail_alloc: None }));
        let (_, toks, notice) = run(&dev, &prompt, prompt.len(), 12);
        assert!(notice.is_some_and(|n| n.contains("continue on the CPU")), "{name}: the fallback says so");
        assert_eq!(toks, want_toks, "{name}: the CPU finishes the run with the same tokens");
    }
}
