//! The adaptive expert tier (`coli_runtime::tier`) end to end, on whatever Vulkan device the
//! machine has (Lavapipe in CI), against the CPU path. Every MoE layer runs through host steps
//! (`Options::resident_experts` off), so the tier serves what it holds and the CPU the rest:
//! - every MoE fixture (gpt-oss: expert biases and the clamped SwiGLU; DeepSeek-V3: sigmoid
//!   routing beside MLA host steps; MiMo-V2-Flash: sigmoid routing with a dense first layer and
//!   sliding windows with sinks on the device; Inkling: shared experts the routing weighs, held
//!   as experts past the routed ones), and pymoe-22m when `../shared/models/pymoe-22m` is there,
//!   with a handful of slots (eviction every few steps), with and without the warm start, and
//!   with room for every expert;
//! - a deterministic run repeats bit for bit (the default gives the same tokens);
//! - the warm start from a routing history puts each layer's hottest expert on the device;
//! - a stress run (one row a step, many promotions and evictions) leaves no device memory
//!   held once the model is dropped.
//!
//! Tolerance: logits within 1e-4 of the largest |logit| (f32 fixtures: the device and the CPU
//! differ in the order of float operations only); greedy tokens identical. Every test also
//! checks that the device served routed pairs (no silent CPU fallback).

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::tier::history::History;
use coli_runtime::tier::{TierOptions, TierStats};
use coli_runtime::vk::VkOptions;
use common::*;
use std::path::{Path, PathBuf};

const CONTEXT: usize = 256;

/// The MoE models: (name, directory, prompt, largest |logit| when an oracle says it).
fn models() -> Vec<(String, PathBuf, Vec<u32>, Option<f32>)> {
    let mut out = Vec::new();
    for name in ["olmoe", "qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3", "deepseek_v2", "mimo_v2_flash", "inkling"] {
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

fn tier(max_experts: Option<usize>, warm_start: bool, deterministic: bool) -> TierOptions {
    TierOptions { max_experts, warm_start, deterministic, ..TierOptions::default() }
}

fn load_tier(dir: &Path, t: TierOptions) -> Engine {
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows: 8, resident_experts: false, ..Options::default() },
        tier: t,
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Logits of every prompt row (in chunks of `chunk`) and of `steps` greedy tokens.
fn run(l: &Engine, prompt: &[u32], chunk: usize, steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let r = run_greedy(l, prompt, chunk, steps, CONTEXT, true);
    assert_eq!(r.on_device, l.device().is_some(), "the run stayed on the device: {:?}", r.notice);
    (r.rows, r.toks)
}

fn stats(l: &Engine) -> TierStats {
    l.device().and_then(|d| d.with_tier(|t| t.stats().clone())).expect("a tier")
}

#[test]
fn every_moe_model_matches_the_cpu_with_a_handful_of_slots_or_room_for_all() {
    let mut evictions = 0;
    for (name, dir, prompt, max) in models() {
        let cpu = load_model(&dir);
        let (want, want_toks) = run(&cpu, &prompt, 5, 10);
        let max = max.unwrap_or_else(|| max_abs(&want));
        for (slots, warm) in [(Some(3), false), (Some(3), true), (None, true)] {
            let dev = load_tier(&dir, tier(slots, warm, true));
            let d = dev.device().unwrap_or_else(|| panic!("{name}: {}", dev.device_note()));
            let line = d.tier_line().unwrap_or_default().to_string();
            assert!(line.starts_with("expert tier on"), "{name}: {line}");
            let cap = d.with_tier(|t| t.capacity()).unwrap();
            if let Some(k) = slots {
                assert_eq!(cap, k, "{name}: {line}");
            }
            assert_eq!(
                d.with_tier(|t| t.resident()).unwrap(),
                if warm { cap } else { 0 },
                "{name}: the warm start fills every slot"
            );
            for chunk in [5, 1] {
                let (got, toks) = run(&dev, &prompt, chunk, 10);
                let err = max_abs_diff(&got, &want);
                assert!(
                    err <= 1e-4 * max,
                    "{name} slots {slots:?} warm {warm} chunk {chunk}: max |tier - cpu| = {err} (max |logit| {max})"
                );
                assert_eq!(toks, want_toks, "{name} slots {slots:?} warm {warm} chunk {chunk}: greedy tokens differ");
            }
            let s = stats(&dev);
            assert!(s.device > 0, "{name} slots {slots:?} warm {warm}: the device served no routed pair ({s:?})");
            assert!(s.device <= s.routed);
            if slots.is_none() {
                assert_eq!(s.device, s.routed, "{name}: with room for every expert the device serves every pair");
            }
            evictions += s.evictions;
            let summary = d.tier_summary().unwrap();
            assert!(summary.contains("routed pairs") && summary.contains("evictions"), "{summary}");
        }
    }
    assert!(evictions > 0, "a handful of slots evicts");
}

#[test]
fn the_trunk_on_the_cpu_with_the_experts_through_the_tier_matches_the_cpu() {
    // `device_layers: 0`: attention and the dense parts on the CPU, the routed experts the
    // device tier holds on the device (the seed's layout for integrated GPUs).
    for name in ["olmoe", "qwen3_moe"] {
        let dir = fixture_dir(name);
        let prompt = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
        let cpu = load_model(&dir);
        let (want, want_toks) = run(&cpu, &prompt, 5, 8);
        let req = EngineOptions {
            device: DeviceRequest::Vulkan(VkOptions::default()),
            compile: Options {
                context: CONTEXT,
                chunk_rows: 8,
                resident_experts: false,
                device_layers: Some(0),
                ..Options::default()
            },
            tier: tier(Some(3), true, true),
            ..EngineOptions::default()
        };
        let dev = Engine::load(&dir, &req).unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = dev.device().unwrap_or_else(|| panic!("{name}: {}", dev.device_note()));
        assert!(!d.has_device_frames(), "{name}: no layer on the device");
        assert!(dev.device_note().contains("0 of"), "{}", dev.device_note());
        let (got, toks) = run(&dev, &prompt, 5, 8);
        let err = max_abs_diff(&got, &want);
        assert!(err <= 1e-4 * max_abs(&want), "{name}: max |trunk on cpu - cpu| = {err}");
        assert_eq!(toks, want_toks, "{name}");
        let s = stats(&dev);
        assert!(s.device > 0 && s.device < s.routed, "{name}: the device served part of the pairs ({s:?})");
    }
}

#[test]
fn a_deterministic_run_repeats_bit_for_bit() {
    let dir = fixture_dir("olmoe");
    let prompt = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
    let a = run(&load_tier(&dir, tier(Some(3), false, true)), &prompt, 3, 12);
    let b = run(&load_tier(&dir, tier(Some(3), false, true)), &prompt, 3, 12);
    assert_eq!(a, b);
    // Without it, uploads land as the CPU's share allows: the same tokens, sums within rounding.
    let c = run(&load_tier(&dir, tier(Some(3), false, false)), &prompt, 3, 12);
    assert_eq!(c.1, a.1);
    assert!(max_abs_diff(&c.0, &a.0) <= 1e-4 * max_abs(&a.0));
}

#[test]
fn the_warm_start_puts_the_historys_hottest_experts_on_the_device() {
    let dir = fixture_dir("olmoe");
    let oracle = read_json(&dir.join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]);
    let tmp = std::env::temp_dir().join(format!("coli-tier-history-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("olmoe.coli_usage");
    let _ = std::fs::remove_file(&path);
    // A history made by hand: in each layer, expert 5 hottest, then 2.
    let mut h = History::new(8);
    for l in 0..2 {
        h.add(l, &[0, 40, 90, 0, 0, 200, 0, 0]);
    }
    h.merge_into(&path, 2).unwrap();
    let with = |warm: bool| {
        load_tier(
            &dir,
            TierOptions {
                max_experts: Some(4),
                warm_start: warm,
                history: Some(path.clone()),
                deterministic: true,
                ..TierOptions::default()
            },
        )
    };
    let dev = with(true);
    let d = dev.device().unwrap();
    assert!(d.tier_line().unwrap().contains("(4 from the history)"), "{}", d.tier_line().unwrap());
    for l in 0..2 {
        for e in [5, 2] {
            assert!(d.with_tier(|t| t.is_resident(l, e)).unwrap(), "l{l}.e{e} resident after the warm start");
        }
    }
    let cpu = load_model(&dir);
    let (want, want_toks) = run(&cpu, &prompt, 5, 8);
    let (got, toks) = run(&dev, &prompt, 5, 8);
    assert!(max_abs_diff(&got, &want) <= 1e-4 * oracle["max_abs_logit"].as_f64().unwrap() as f32);
    assert_eq!(toks, want_toks);
    // The run's routings are merged into the file.
    let before: u64 = History::load(&path, 2).unwrap().unwrap().layers.values().flatten().sum();
    d.save_tier_history().unwrap();
    let after: u64 = History::load(&path, 2).unwrap().unwrap().layers.values().flatten().sum();
    assert_eq!(after - before, stats(&dev).routed, "every routed pair counted once");
    // Without the warm start the slots start empty.
    let cold = with(false);
    assert_eq!(cold.device().unwrap().with_tier(|t| t.resident()).unwrap(), 0);
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_stress_run_promotes_and_evicts_and_leaves_no_memory_held() {
    let dir = fixture_dir("olmoe");
    let dev = load_tier(
        &dir,
        TierOptions { max_experts: Some(4), warm_start: false, promotions_per_token: 64, ..TierOptions::default() },
    );
    let ctx = dev.device().unwrap().ctx.clone();
    let cpu = load_model(&dir);
    // A long prompt a row at a time: every step routes, promotes and evicts.
    let prompt: Vec<u32> = (0..120).map(|i| (i * 37 + 11) % 100).collect();
    let (want, _) = run(&cpu, &prompt, 1, 0);
    let (got, _) = run(&dev, &prompt, 1, 0);
    let max = max_abs(&want);
    assert!(max_abs_diff(&got, &want) <= 1e-4 * max);
    let s = stats(&dev);
    assert!(s.uploads > 4 && s.evictions > 0 && s.device > 0, "{s:?}");
    assert_eq!(s.failed, 0);
    drop(dev);
    // The context keeps spare recording resources for later frames; trimmed, nothing is held.
    ctx.trim();
    assert_eq!(ctx.memory_stats().used_bytes, 0, "every device buffer freed");
}

#[test]
fn big_steps_stream_cold_experts_and_match_the_cpu() {
    let mut streamed = 0;
    for (name, dir, prompt, max) in models() {
        let cpu = load_model(&dir);
        let (want, want_toks) = run(&cpu, &prompt, prompt.len(), 6);
        let max = max.unwrap_or_else(|| max_abs(&want));
        // Two staging slots (so several rounds), steps of two rows and up stream; then more
        // staging slots than device slots (the batch's scratch serves the larger page: it
        // was sized for the slots' pages only, and such a tier failed its first big step).
        for staging in [2, 5] {
            let t = TierOptions {
                max_experts: Some(2),
                warm_start: false,
                deterministic: true,
                stream_slots: staging,
                stream_min_rows: 2,
                ..TierOptions::default()
            };
            let dev = load_tier(&dir, t);
            let line = dev.device().unwrap().tier_line().unwrap().to_string();
            assert!(line.contains(&format!("{staging} staging slots")), "{name}: {line}");
            for chunk in [prompt.len(), 3] {
                let (got, toks) = run(&dev, &prompt, chunk, 6);
                let err = max_abs_diff(&got, &want);
                assert!(err <= 1e-4 * max, "{name} chunk {chunk}: max |streamed - cpu| = {err} (max |logit| {max})");
                assert_eq!(toks, want_toks, "{name} chunk {chunk}: greedy tokens differ");
            }
            let s = stats(&dev);
            assert!(s.streamed_pairs <= s.device && s.streamed > 0, "{name}, {staging} staging slots: {s:?}");
            streamed += s.streamed;
            // Streamed experts are not promoted: only the CPU's experts were candidates.
            assert!(s.uploads <= s.routed - s.device + s.warm, "{name}: {s:?}");
        }
    }
    assert!(streamed > 0, "the fixtures' steps streamed");
}

/// A tier asked to hold nothing says so (not "no device") and the CPU computes every expert.
#[test]
fn a_tier_of_no_experts_says_why_and_matches_the_cpu() {
    let dir = fixture_dir("olmoe");
    let prompt = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
    let dev = load_tier(&dir, tier(Some(0), true, true));
    let line = dev.device().unwrap().tier_line().unwrap().to_string();
    assert!(line.contains("expert tier off") && line.contains("asked for no experts"), "{line}");
    let (got, toks) = run(&dev, &prompt, 5, 4);
    let (want, want_toks) = run(&load_model(&dir), &prompt, 5, 4);
    assert_eq!(toks, want_toks);
    assert!(max_abs_diff(&got, &want) <= 1e-4 * max_abs(&want));
}

/// The load reports the warm start's progress: it starts at 0, never goes back, and ends with
/// every expert the tier filled (the tier's resident count), after the weights' uploads.
#[test]
fn the_warm_start_reports_its_progress_to_the_last_expert() {
    use coli_runtime::engine::Stage;
    let dir = fixture_dir("olmoe");
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows: 8, resident_experts: false, ..Options::default() },
        tier: tier(Some(5), true, true),
        ..EngineOptions::default()
    };
    let mut events: Vec<(Stage, usize, usize)> = Vec::new();
    let l = Engine::load_with_progress(&dir, &req, &mut |s, d, t| events.push((s, d, t)))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let warm: Vec<(usize, usize)> =
        events.iter().filter(|e| e.0 == Stage::WarmStart).map(|&(_, d, t)| (d, t)).collect();
    let resident = l.device().and_then(|d| d.with_tier(|t| t.resident())).expect("a tier");
    assert!(resident > 0, "the warm start filled no slot");
    assert_eq!(warm.first(), Some(&(0, resident)), "{warm:?}");
    assert_eq!(warm.last(), Some(&(resident, resident)), "{warm:?}");
    assert!(warm.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1), "{warm:?}");
    let first_warm = events.iter().position(|e| e.0 == Stage::WarmStart).unwrap();
    assert!(events[..first_warm].iter().any(|e| e.0 == Stage::Upload), "the weights go up first");
}
