//! The adaptive expert tier over two devices, end to end: the machine's Vulkan device opened
//! twice (two logical devices; Lavapipe in CI) stands in for two GPUs. Every layer fits the
//! primary, so the second device holds no layers and its memory goes to the tier: the warm
//! start fills d0's slots, then d1's; a step sends each device the pairs of its own slots, both
//! in flight at once, and every pair joins its row in rank order on the host. Checked:
//! - every MoE fixture with a few slots on each device (eviction across both), prompts in
//!   chunks and greedy decode, against the CPU, and both devices serving pairs;
//! - the second device lost mid-decode: both devices off, the CPU finishes with the same tokens.
//!
//! Tolerance: logits within 1e-4 of the largest |logit| (f32 fixtures: the devices and the CPU
//! differ in the order of float operations only); greedy tokens identical.

mod common;

use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::tier::{TierDeviceStats, TierOptions};
use coli_runtime::vk::{FaultInjection, VkOptions};
use common::*;
use std::path::Path;

const CONTEXT: usize = 256;

const FIXTURES: &[&str] = &["olmoe", "qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3", "mimo_v2_flash", "qwen3_next"];

/// Both devices, every MoE layer through host steps, at most `slots` experts a device.
fn load_two(dir: &Path, slots: usize, warm_start: bool, fault1: Option<u64>) -> Engine {
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        second_device: Some(VkOptions {
            fault: fault1.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None }),
            ..Default::default()
        }),
        compile: Options { context: CONTEXT, chunk_rows: 8, resident_experts: false, ..Options::default() },
        tier: TierOptions { max_experts: Some(slots), warm_start, deterministic: true, ..TierOptions::default() },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Logits of every prompt row (in chunks of `chunk`) and of `steps` greedy tokens.
fn run(l: &Engine, prompt: &[u32], chunk: usize, steps: usize) -> Run {
    run_greedy(l, prompt, chunk, steps, CONTEXT, true)
}

fn tier_devices(l: &Engine) -> Vec<TierDeviceStats> {
    l.device().and_then(|d| d.with_tier(|t| t.devices())).expect("a tier")
}

#[test]
fn every_moe_fixture_with_slots_on_both_devices_matches_the_cpu() {
    let mut evictions = 0;
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let oracle = read_json(&dir.join("oracle.json"));
        let prompt = ids(&oracle["prompt_ids"]);
        let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
        let cpu = load_model(&dir);
        let want = run(&cpu, &prompt, 5, 10);
        for warm in [true, false] {
            let dev = load_two(&dir, 3, warm, None);
            let d = dev.device().unwrap_or_else(|| panic!("{name}: {}", dev.device_note()));
            assert_eq!(d.devices().len(), 2, "{name}: two devices opened");
            assert!(
                dev.plan().placement.layers.iter().all(|p| *p == Place::Device(DeviceId(0))),
                "{name}: every layer on d0\n{}",
                dev.plan()
            );
            assert_eq!(dev.plan().placement.fits[1].layers, 0, "{name}");
            let line = d.tier_line().unwrap_or_default().to_string();
            assert!(line.contains("and on d1"), "{name}: {line}");
            let per = tier_devices(&dev);
            assert_eq!(
                per.iter().map(|p| (p.device, p.slots)).collect::<Vec<_>>(),
                [(0, 3), (1, 3)],
                "{name}: three slots a device\n{line}"
            );
            if warm {
                // The warm start fills d0's slots, then d1's.
                assert!(per.iter().all(|p| p.resident == 3), "{name}: {per:?}");
            }
            for chunk in [5, 1] {
                let got = run(&dev, &prompt, chunk, 10);
                assert!(got.notice.is_none() && got.on_device, "{name}: {:?}", got.notice);
                let err = max_abs_diff(&got.rows, &want.rows);
                eprintln!(
                    "{name} warm {warm} chunk {chunk}: max |tier on two devices - cpu| = {err:.3e} (bound {:.3e})",
                    1e-4 * max
                );
                assert!(err <= 1e-4 * max, "{name} warm {warm} chunk {chunk}: {err}");
                assert_eq!(got.toks, want.toks, "{name} warm {warm} chunk {chunk}: greedy tokens differ");
            }
            let per = tier_devices(&dev);
            for p in &per {
                assert!(p.pairs > 0, "{name} warm {warm}: d{} served no pair ({per:?})", p.device);
            }
            let stats = d.with_tier(|t| t.stats().clone()).unwrap();
            assert_eq!(
                per.iter().map(|p| p.pairs).sum::<u64>(),
                stats.device,
                "{name}: every device pair counted on one device"
            );
            evictions += stats.evictions;
            let summary = d.tier_summary().unwrap();
            assert!(summary.contains("d1: "), "{summary}");
        }
    }
    assert!(evictions > 0, "a few slots a device evict");
}

#[test]
fn the_second_device_lost_mid_decode_turns_both_off_and_the_cpu_finishes() {
    for name in ["olmoe", "qwen3_next"] {
        let dir = fixture_dir(name);
        let oracle = read_json(&dir.join("oracle.json"));
        let prompt = ids(&oracle["prompt_ids"]);
        let cpu = load_model(&dir);
        let want = run(&cpu, &prompt, prompt.len(), 12);
        // The second device's submissions in the prompt and in the whole run, on a clean run.
        let clean = load_two(&dir, 3, true, None);
        let d1 = &clean.device().unwrap().devices()[1].ctx;
        let base = d1.submits();
        let mut s = Session::on_device(clean.model(), clean.device().unwrap(), CONTEXT).unwrap();
        s.forward(&prompt, LogitRows::All).unwrap();
        let prompt_submits = d1.submits() - base;
        drop(s);
        let before = d1.submits();
        let r = run(&clean, &prompt, prompt.len(), 12);
        assert!(r.on_device && r.notice.is_none());
        let total = d1.submits() - before;
        assert!(
            total > prompt_submits,
            "{name}: the second device's batches run in the decode ({prompt_submits} of {total})"
        );
        let at = base + prompt_submits + (total - prompt_submits) / 2;
        let dev = load_two(&dir, 3, true, Some(at));
        let got = run(&dev, &prompt, prompt.len(), 12);
        assert!(
            got.notice.as_deref().is_some_and(|n| n.contains("continue on the CPU")),
            "{name}: the fallback says so ({:?})",
            got.notice
        );
        assert!(!got.on_device, "{name}: both devices off after the loss");
        assert!(dev.device().unwrap().devices()[1].ctx.is_lost(), "{name}: d1 was the one lost");
        assert_eq!(got.toks, want.toks, "{name}: the CPU finishes the run with the same tokens");
    }
}
