//! Two devices against the CPU path, end to end: the machine's Vulkan device opened twice (two
//! logical devices; Lavapipe in CI) stands in for two GPUs. Every fixture with its layers split
//! across d0 and d1 (the plan's frames on both checked), chains of d0, d1 and the CPU at every
//! split, a split forced by a memory cap on the primary, the second device (and the primary)
//! lost mid-run with the CPU finishing, and work on both devices.
//!
//! Tolerance: logits within 1e-4 of the largest |logit| (f32 weights: the devices and the CPU
//! differ only in the order of float operations); greedy tokens identical.

mod common;

use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::vk::{FaultInjection, VkOptions};
use common::*;
use std::path::Path;

const FIXTURES: &[&str] = &[
    "llama",
    "llama_tied",
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "mimo_v2_flash",
    "qwen3_next",
    "kimi_linear",
    "deepseek_v4",
];

/// How the layers are placed: forced counts, or memory caps on each device.
#[derive(Clone, Copy, Default)]
struct Split {
    d0: Option<usize>,
    d1: Option<usize>,
    cap0: Option<u64>,
    fault0: Option<u64>,
    fault1: Option<u64>,
}

fn load_on_two(dir: &Path, s: Split) -> Engine {
    let fault = |n: Option<u64>| n.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None });
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions { memory_cap: s.cap0, fault: fault(s.fault0), ..Default::default() }),
        second_device: Some(VkOptions { fault: fault(s.fault1), ..Default::default() }),
        compile: Options {
            context: 256,
            chunk_rows: 8,
            device_layers: s.d0,
            second_device_layers: s.d1,
            ..Options::default()
        },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Layers the plan puts on device `d`.
fn on(l: &Engine, d: u32) -> usize {
    l.plan().placement.layers.iter().filter(|p| **p == Place::Device(DeviceId(d))).count()
}

fn frames_on(l: &Engine, d: u32) -> bool {
    l.plan().frames.iter().any(|f| f.place == Place::Device(DeviceId(d)))
}

/// Logits of every prompt row (in chunks of `chunk`) and `steps` greedy tokens.
fn run(l: &Engine, prompt: &[u32], chunk: usize, steps: usize) -> Run {
    run_greedy(l, prompt, chunk, steps, 256, false)
}

struct Oracle {
    prompt: Vec<u32>,
    max: f32,
    layers: usize,
}

/// The fixture's prompt and largest |logit|, its layer count, and its CPU model.
fn oracle(dir: &Path) -> (Oracle, Engine) {
    let o = read_json(&dir.join("oracle.json"));
    let cpu = load_model(dir);
    let layers = cpu.plan().program.dims.layers;
    (Oracle { prompt: ids(&o["prompt_ids"]), max: o["max_abs_logit"].as_f64().unwrap() as f32, layers }, cpu)
}

fn check(name: &str, got: &Run, want: &Run, max: f32) {
    assert!(got.notice.is_none(), "{name}: {:?}", got.notice);
    let err = max_abs_diff(&got.rows, &want.rows);
    eprintln!("{name}: max |devices - cpu| = {err:.3e} (bound {:.3e})", 1e-4 * max);
    assert!(err <= 1e-4 * max, "{name}: max |devices - cpu| = {err}");
    assert_eq!(got.toks, want.toks, "{name}: greedy tokens differ");
}

#[test]
fn every_fixture_split_across_two_devices_matches_the_cpu() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let (o, cpu) = oracle(&dir);
        let want = run(&cpu, &o.prompt, o.prompt.len(), 12);
        // The first half on d0, the rest on d1 by its own fit (the head too, where it fits).
        let d0 = (o.layers / 2).max(1);
        let dev = load_on_two(&dir, Split { d0: Some(d0), ..Default::default() });
        assert!(dev.device().is_some(), "{name}: {}", dev.device_note());
        assert_eq!((on(&dev, 0), on(&dev, 1)), (d0, o.layers - d0), "{name}: {}", dev.plan());
        assert!(frames_on(&dev, 0) && frames_on(&dev, 1), "{name}: frames on both devices\n{}", dev.plan());
        assert_eq!(dev.device().unwrap().devices().len(), 2);
        for chunk in [o.prompt.len(), 1, 3] {
            let got = run(&dev, &o.prompt, chunk, 12);
            check(&format!("{name} d0 {d0} chunk {chunk}"), &got, &want, o.max);
        }
    }
}

#[test]
fn chains_of_two_devices_and_the_cpu_match_the_cpu_at_every_split() {
    for name in ["llama", "olmoe"] {
        let dir = fixture_dir(name);
        let (o, cpu) = oracle(&dir);
        let want = run(&cpu, &o.prompt, 5, 8);
        for d0 in 1..o.layers {
            for d1 in 1..=o.layers - d0 {
                let dev = load_on_two(&dir, Split { d0: Some(d0), d1: Some(d1), ..Default::default() });
                assert_eq!((on(&dev, 0), on(&dev, 1)), (d0, d1), "{name}: {}", dev.plan());
                let got = run(&dev, &o.prompt, 5, 8);
                check(&format!("{name} d0 {d0} d1 {d1}"), &got, &want, o.max);
            }
        }
    }
}

#[test]
fn a_memory_cap_on_the_primary_sends_the_rest_to_the_second_device() {
    let dir = fixture_dir("llama");
    let (o, cpu) = oracle(&dir);
    let want = run(&cpu, &o.prompt, 4, 6);
    // The sizes the compiler counts, from a plan with room for everything.
    let full = load_on_two(&dir, Split::default());
    let pl = &full.plan().placement;
    assert_eq!(on(&full, 0), o.layers, "{}", full.plan());
    for k in 1..o.layers {
        let per_layer: u64 = pl.costs[..k].iter().map(|c| c.total()).sum();
        // Room for k layers and a little more, but not for layer k or the head.
        let cap = pl.fixed + per_layer + pl.costs[k].total() * 9 / 10;
        let dev = load_on_two(&dir, Split { cap0: Some(cap), ..Default::default() });
        // As on one device, the allocator's blocks may refuse part of layer k-1 at setup; the
        // primary then holds one fewer and the second device the rest.
        let (n0, n1) = (on(&dev, 0), on(&dev, 1));
        assert!(n0 == k || n0 + 1 == k, "cap {cap}: d0 holds {n0}, the fit counted {k}");
        assert_eq!(n0 + n1, o.layers, "k={k}: the second device takes the rest\n{}", dev.plan());
        let got = run(&dev, &o.prompt, 4, 6);
        assert_eq!(got.toks, want.toks, "k={k}: tokens differ from the CPU");
        assert!(max_abs_diff(&got.rows, &want.rows) <= 1e-4 * o.max, "k={k}");
    }
}

#[test]
fn a_device_lost_mid_decode_turns_both_off_and_the_cpu_finishes() {
    for name in ["olmoe", "llama", "qwen3_next", "kimi_linear"] {
        let dir = fixture_dir(name);
        let (o, cpu) = oracle(&dir);
        let want = run(&cpu, &o.prompt, o.prompt.len(), 12);
        let split = Split { d0: Some((o.layers / 2).max(1)), ..Default::default() };
        // Submissions per device in the prompt and in the whole run, counted on a clean run.
        let clean = load_on_two(&dir, split);
        let devs = clean.device().unwrap().devices();
        let mut s = Session::on_device(clean.model(), clean.device().unwrap(), 256).unwrap();
        s.forward(&o.prompt, LogitRows::All).unwrap();
        let prompt_submits: Vec<u64> = devs.iter().map(|d| d.ctx.submits()).collect();
        drop(s);
        let total: Vec<u64> = {
            let r = run(&clean, &o.prompt, o.prompt.len(), 12);
            assert!(r.on_device);
            devs.iter().zip(&prompt_submits).map(|(d, p)| d.ctx.submits() - p).collect()
        };
        for lost in [1, 0] {
            // A submission in the middle of the decode of the device that is lost.
            let at = prompt_submits[lost] + (total[lost] - prompt_submits[lost]) / 2;
            let split =
                if lost == 1 { Split { fault1: Some(at), ..split } } else { Split { fault0: Some(at), ..split } };
            let dev = load_on_two(&dir, split);
            let got = run(&dev, &o.prompt, o.prompt.len(), 12);
            assert!(
                got.notice.as_deref().is_some_and(|n| n.contains("continue on the CPU")),
                "{name} d{lost}: the fallback says so"
            );
            assert!(!got.on_device, "{name} d{lost}: both devices are off after the loss");
            assert!(dev.device().unwrap().devices()[lost].ctx.is_lost(), "{name}: d{lost} was the one lost");
            assert_eq!(got.toks, want.toks, "{name} d{lost}: the CPU finishes the run with the same tokens");
        }
    }
}

#[test]
fn both_devices_run_dispatches() {
    let dir = fixture_dir("llama");
    let dev = load_on_two(&dir, Split { d0: Some(1), ..Default::default() });
    let devs = dev.device().expect("devices").devices();
    let before: Vec<u64> = devs.iter().map(|d| d.ctx.dispatches()).collect();
    let r = run(&dev, &[1, 2, 3], 3, 2);
    assert!(r.notice.is_none() && r.on_device);
    for (d, b) in devs.iter().zip(before) {
        assert!(d.ctx.dispatches() > b, "{}: no dispatch ran", d.device);
    }
    assert!(dev.device_note().contains("a second logical device of the same physical device"), "{}", dev.device_note());
}

#[test]
fn coli_exec_on_two_devices_prints_the_cpus_tokens() {
    let dir = fixture_dir("olmoe");
    let (o, _) = oracle(&dir);
    let prompt: Vec<String> = o.prompt.iter().map(u32::to_string).collect();
    let exec = |extra: &[&str]| {
        let mut args = vec!["exec", "--model", dir.to_str().unwrap(), "--prompt-ids"];
        let joined = prompt.join(",");
        args.push(&joined);
        args.extend(["-n", "8", "--chunk", "3", "--no-tier-history"]);
        args.extend(extra);
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_coli")).args(&args).current_dir(root()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {err}");
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), err)
    };
    let (want, _) = exec(&["--device", "cpu"]);
    let (got, err) = exec(&["--device", "vulkan", "--devices", "2", "--device-layers", "1", "--device2-layers", "1"]);
    assert!(err.contains("1 on d0, 1 on d1"), "{err}");
    assert_eq!(got, want, "{err}");
    // The second device lost at its 5th submission (in the prompt): the CPU finishes.
    let (got, err) = exec(&["--device", "vulkan", "--devices", "2", "--device-layers", "1", "--fail-submit2", "5"]);
    assert!(err.contains("continue on the CPU"), "{err}");
    assert_eq!(got, want, "{err}");
}
