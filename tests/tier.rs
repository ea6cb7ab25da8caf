//! The expert tier's first slice end to end: where the device's budget holds every routed
//! expert of a layer, the layer's routing and experts run inside the device frame. Every MoE
//! fixture (gpt-oss: expert biases and the clamped SwiGLU; Inkling: shared experts its router
//! weighs beside the routed ones, resident after them), and pymoe-22m when
//! `../shared/models/pymoe-22m` is there, on whatever Vulkan device
//! the machine has (Lavapipe in CI), against the CPU path: prompts in chunks of 1, 3 and whole
//! (the per-pair GEMVs and the grouped GEMMs), then greedy decoding; and a budget that holds
//! only some layers' experts, where the plan leaves every layer to host steps and the adaptive
//! tier (tests/expert_tier.rs tests the tier itself).
//!
//! Tolerance: logits within 1e-4 of the largest |logit| (the fixtures are f32, pymoe-22m bf16
//! with f32 activations: the device and the CPU differ in the order of float operations only);
//! greedy tokens identical.

mod common;

use coli_compiler::ids::{Part, Place};
use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::vk::VkOptions;
use common::*;
use std::path::{Path, PathBuf};

const CONTEXT: usize = 256;

/// The MoE models: (name, directory, prompt, largest |logit| when an oracle says it).
fn models() -> Vec<(String, PathBuf, Vec<u32>, Option<f32>)> {
    let mut out = Vec::new();
    for name in ["olmoe", "qwen3_moe", "mixtral", "gpt_oss", "inkling"] {
        let dir = fixture_dir(name);
        let oracle = read_json(&dir.join("oracle.json"));
        let max = oracle["max_abs_logit"].as_f64().map(|m| m as f32);
        out.push((name.to_string(), dir, ids(&oracle["prompt_ids"]), max));
    }
    if let Some(dir) = shared_model("pymoe-22m") {
        let prompt: Vec<u32> = (0..19).map(|i| (i * 211 + 17) % 4096).collect();
        out.push(("pymoe-22m".into(), dir, prompt, None));
    }
    out
}

fn load_on_device(dir: &Path, memory_cap: Option<u64>) -> Engine {
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions { memory_cap, ..Default::default() }),
        compile: Options { context: CONTEXT, chunk_rows: 8, ..Options::default() },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Logits of every prompt row (in chunks of `chunk`) and `steps` greedy tokens.
fn run(l: &Engine, prompt: &[u32], chunk: usize, steps: usize) -> (Vec<Vec<f32>>, Vec<u32>, Option<String>) {
    let r = run_greedy(l, prompt, chunk, steps, CONTEXT, false);
    (r.rows, r.toks, r.notice)
}

/// Layers whose routing and experts the plan runs in a device frame, and those it leaves to
/// host steps, from the frames themselves.
fn expert_layers(l: &Engine) -> (Vec<u32>, Vec<u32>) {
    let (mut dev, mut host) = (Vec::new(), Vec::new());
    for f in &l.plan().frames {
        for id in &f.ops {
            let op = coli_compiler::frames::op_of(&l.plan().program, *id);
            if let (Part::Layer(layer), coli_compiler::ir::Op::RoutedExperts { .. }) = (id.part, op) {
                if f.place == Place::Host {
                    host.push(layer.0)
                } else {
                    dev.push(layer.0)
                }
            }
        }
    }
    (dev, host)
}

#[test]
fn every_moe_model_routes_in_frame_and_matches_the_cpu() {
    for (name, dir, prompt, max) in models() {
        let cpu = load_model(&dir);
        let (want, want_toks, _) = run(&cpu, &prompt, prompt.len(), 12);
        let max = max.unwrap_or_else(|| max_abs(&want));
        let dev = load_on_device(&dir, None);
        let d = dev.device().unwrap_or_else(|| panic!("{name}: {}", dev.device_note()));
        let program = &dev.plan().program;
        let moe = |l: &coli_compiler::ir::Layer| {
            l.ops.iter().any(|o| matches!(o, coli_compiler::ir::Op::RoutedExperts { .. }))
        };
        let layers: Vec<u32> = program.layers.iter().filter(|l| moe(l)).map(|l| l.id.0).collect();
        assert_eq!(expert_layers(&dev), (layers, vec![]), "{name}: every layer's experts in frame\n{}", dev.plan());
        // The host runs the embedding only: no host step between layers.
        for f in dev.plan().frames.iter().filter(|f| f.place == Place::Host) {
            assert!(f.ops.iter().all(|id| id.part == Part::Prologue), "{name}: host frame {} inside the forward", f.id);
        }
        let line = d.tier_line().unwrap_or_default();
        assert!(line.contains("resident") && line.contains("rule:"), "{name}: {line}");
        for chunk in [prompt.len(), 1, 3] {
            let before = d.ctx.dispatches();
            let (got, toks, notice) = run(&dev, &prompt, chunk, 12);
            assert!(notice.is_none(), "{name}: {notice:?}");
            assert!(d.ctx.dispatches() > before, "{name}: the device ran the forward");
            let err = max_abs_diff(&got, &want);
            assert!(err <= 1e-4 * max, "{name} chunk {chunk}: max |device - cpu| = {err} (max |logit| {max})");
            assert_eq!(toks, want_toks, "{name} chunk {chunk}: greedy tokens differ");
        }
    }
}

/// A layer's resident experts past one buffer go up in pages (as GLM-5's 6 GiB of int8 gate
/// and up rows do on a device of 4 GiB buffers): with pages of 16 KiB every fixture's layers
/// take several, and the logits stay within 1e-4 of the largest |logit| of the CPU with the
/// same greedy tokens (olmoe; gpt_oss with its biases; inkling with its shared experts).
#[test]
fn resident_experts_in_pages_match_the_cpu() {
    for (name, dir, prompt, max) in models().into_iter().filter(|m| ["olmoe", "gpt_oss", "inkling"].contains(&&*m.0)) {
        let cpu = load_model(&dir);
        let (want, want_toks, _) = run(&cpu, &prompt, prompt.len(), 8);
        let max = max.unwrap_or_else(|| max_abs(&want));
        let req = EngineOptions {
            device: DeviceRequest::Vulkan(VkOptions { expert_page_bytes: Some(16 << 10), ..Default::default() }),
            compile: Options { context: CONTEXT, chunk_rows: 8, ..Options::default() },
            ..EngineOptions::default()
        };
        let dev = Engine::load(&dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let d = dev.device().unwrap_or_else(|| panic!("{name}: {}", dev.device_note()));
        let pages: Vec<usize> = d.devices()[0].resident_experts().values().map(|e| e.pages().len()).collect();
        assert!(!pages.is_empty() && pages.iter().all(|&p| p > 1), "{name}: pages per layer {pages:?}");
        for chunk in [prompt.len(), 3] {
            let (got, toks, notice) = run(&dev, &prompt, chunk, 8);
            assert!(notice.is_none(), "{name}: {notice:?}");
            let err = max_abs_diff(&got, &want);
            eprintln!("{name} chunk {chunk}, pages {pages:?}: max |device - cpu| = {err:.3e} (max |logit| {max})");
            assert!(err <= 1e-4 * max, "{name} chunk {chunk}: max |device - cpu| = {err} (max |logit| {max})");
            assert_eq!(toks, want_toks, "{name} chunk {chunk}: greedy tokens differ");
        }
    }
}

/// Runs `dir` with a budget that holds the dense part and `keep` of its layers' experts; with
/// `cap` the budget is a device memory cap (as `--device-mem-mib`), else the plan's profile
/// alone says it (the device keeps its memory: the fixtures' experts are so small that the
/// allocator's blocks, an eighth of a tiny cap, blur a cap aimed between two layers).
fn check_budget(name: &str, dir: &Path, prompt: &[u32], max: Option<f32>, cap: bool) {
    let cpu = load_model(dir);
    let (want, want_toks, _) = run(&cpu, prompt, 5, 8);
    let max = max.unwrap_or_else(|| max_abs(&want));
    // What the uncapped plan places: the dense part, and per layer its experts.
    let full = load_on_device(dir, None);
    let layers = full.plan().program.layers.len() as u64;
    let fit = &full.plan().placement.fits[0];
    let (experts, scratch) = full.plan().placement.resident.bytes[0];
    let per_layer = experts / layers;
    let keep = layers / 2;
    // Room for `keep` layers' experts and three quarters of another: with a cap, the runtime
    // holds a little the plan does not count (read-back twins, the frames' scratch arena, the
    // allocator's partly used blocks), which must fit in what is left.
    let budget = fit.bytes + scratch + keep * per_layer + per_layer * 3 / 4;
    let dev = if cap {
        load_on_device(dir, Some(budget))
    } else {
        let mut profile = full.plan().profile.clone();
        profile.devices[0].memory_budget = budget;
        profile.devices[0].reserve = 0;
        let req = EngineOptions {
            device: DeviceRequest::Vulkan(VkOptions::default()),
            profile: Some(profile),
            compile: Options { context: CONTEXT, chunk_rows: 8, ..Options::default() },
            ..EngineOptions::default()
        };
        Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
    };
    assert!(dev.device().is_some(), "{name} budget {budget}: {}", dev.device_note());
    let (on, host) = expert_layers(&dev);
    // All or nothing: a budget short of every layer's experts makes no layer resident in
    // frame; every layer goes through host steps, served by the adaptive tier.
    assert!(on.is_empty(), "{name} budget {budget}: no layer's experts in frame\n{}", dev.plan());
    assert_eq!(host, (0..layers as u32).collect::<Vec<_>>(), "{name}: every layer through host steps");
    if !cap {
        assert!(
            dev.plan().placement.layers.iter().all(|p| *p != Place::Host),
            "{name}: every dense layer still on the device"
        );
    }
    let d = dev.device().unwrap();
    let line = d.tier_line().unwrap_or_default().to_string();
    assert!(line.starts_with("expert tier on"), "{name}: {line}");
    let slots = d.with_tier(|t| t.capacity()).unwrap() as u64;
    let experts_per_layer = dev.plan().placement.expert_bytes[0].2 as u64;
    assert!(
        slots >= keep * experts_per_layer / 2 && slots < layers * experts_per_layer,
        "{name}: {slots} slots for a budget of {keep} layers' experts and some\n{line}"
    );
    let (got, toks, notice) = run(&dev, prompt, 5, 8);
    assert!(notice.is_none(), "{name}: {notice:?}");
    let err = max_abs_diff(&got, &want);
    assert!(err <= 1e-4 * max, "{name} budget {budget}: max |device - cpu| = {err}");
    assert_eq!(toks, want_toks, "{name} budget {budget}: greedy tokens differ");
}

#[test]
fn a_budget_short_of_every_layer_runs_the_adaptive_tier_with_the_same_tokens() {
    for (name, dir, prompt, max) in models() {
        match name.as_str() {
            "olmoe" => check_budget(&name, &dir, &prompt, max, false),
            // Six layers of 6 MiB of experts each: a memory cap means what it says.
            "pymoe-22m" => check_budget(&name, &dir, &prompt, max, true),
            _ => {}
        }
    }
}
