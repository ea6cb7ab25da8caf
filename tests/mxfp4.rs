//! MXFP4 checkpoints end to end: a tiny gpt-oss laid out as the published MXFP4 checkpoints are
//! (tests/fixtures/mxfp4_gpt_oss/, `tools/make_mxfp4.py`: the routed experts as U8
//! `gate_up_proj_blocks` [E, 2F, H/32, 16] with `_scales` [E, 2F, H/32] and `down_proj_blocks`
//! [E, H, F/32, 16] with `_scales`, out-major, everything else BF16), against the logits of a
//! numpy float64 gpt-oss forward over the dequantized weights (a forward that reproduces
//! transformers on tests/fixtures/gpt_oss first).
//!
//! Tolerance, relative to the largest |logit|: 1e-4 on the CPU at exact precision (MXFP4 rows
//! decoded and multiplied in f32 against f32 activations: the oracle's values exactly, only the
//! rounding of the sums differs; the fixture's smallest greedy margin is 8e-2 and its smallest
//! router gap 6e-3), in one chunk and in chunks of 1 and 5, greedy ids identical. Fast
//! precision (8-bit activations against the blocks) is no match for a float oracle here: the
//! fixture's experts are sensitive (clamped SwiGLU over large gate values), 8-bit activations
//! move its logits by 1e-1 and flip a routing decision at one position; it is held to the CPU's
//! on the device. The Vulkan device (Lavapipe in CI) within 1e-4 of the CPU, at both
//! precisions, with the experts resident and through the expert tier; with the experts on the
//! device only, their host copies are released and come back bit for bit (made again from the
//! blocks and scales in the maps). `coli exec` prints the oracle's greedy ids.

mod common;

use coli_compiler::cost::Format;
use coli_compiler::Options;
use coli_runtime::cpu::Precision;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions, HostCopies};
use coli_runtime::exec::weights::device_only_matrices;
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::format::WeightFormat;
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::tier::TierOptions;
use coli_runtime::vk::VkOptions;
use common::*;

fn model() -> std::path::PathBuf {
    fixture_dir("mxfp4_gpt_oss")
}

/// The fixture's oracle.
struct Oracle {
    prompt: Vec<u32>,
    /// Every prompt row's logits.
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
    /// The logits each greedy id was chosen from.
    greedy_logits: Vec<Vec<f32>>,
    max: f32,
}

fn oracle() -> Oracle {
    let o = read_json(&model().join("oracle.json"));
    Oracle {
        prompt: ids(&o["prompt_ids"]),
        logits: matrix(&o["logits"]),
        greedy: ids(&o["greedy"]),
        greedy_logits: matrix(&o["greedy_logits"]),
        max: o["max_abs_logit"].as_f64().unwrap() as f32,
    }
}

#[test]
fn mxfp4_experts_are_bound_out_major_at_their_repacked_size() {
    let ck = Checkpoint::open(&model(), &LoadOptions::default()).unwrap();
    let tensors = ck.bindings().tensors.unwrap();
    let o = read_json(&model().join("oracle.json"));
    let blocks = o["mxfp4_tensors"].as_array().unwrap();
    assert_eq!(blocks.len(), 6, "two per layer");
    for b in blocks {
        let name = b.as_str().unwrap().strip_suffix("_blocks").unwrap();
        let info = &tensors[name];
        assert_eq!(info.dtype, "MXFP4", "{name}");
        let (e, rows, cols) = (info.shape[0] as u64, info.shape[1] as u64, info.shape[2] as u64);
        let want = if name.ends_with("gate_up_proj") { [6, 128, 64] } else { [6, 64, 64] };
        assert_eq!([e, rows, cols], want, "{name}: [experts, out, in]");
        assert_eq!(info.bytes, e * rows * cols / 32 * 17, "{name}");
        assert_eq!(Format::from_dtype(&info.dtype).map(|f| e * f.bytes(rows, cols)), Some(info.bytes), "{name}");
    }
    assert_eq!(tensors["model.layers.0.mlp.router.weight"].dtype, "BF16", "routers stay BF16");
}

#[test]
fn mxfp4_checkpoint_matches_the_numpy_oracle() {
    let Oracle { prompt, logits: want, greedy, greedy_logits, max } = oracle();
    let engine = load_model(&model());
    let tol = 1e-4 * max;
    for chunk in [prompt.len(), 1, 5] {
        let mut s = Session::new(engine.model(), 64);
        s.set_precision(Precision::Exact);
        let got = logit_rows(&mut s, &prompt, chunk);
        let err = max_abs_diff(&got, &want);
        eprintln!("mxfp4_gpt_oss chunk {chunk}: max |logit - oracle| = {err:.3e} (max |logit| {max})");
        assert!(err <= tol, "chunk {chunk}: max |logit - oracle| = {err} > {tol}");
    }
    // The greedy continuation, each step's logits against the oracle's.
    let mut s = Session::new(engine.model(), 64);
    s.set_precision(Precision::Exact);
    let mut last = s.forward(&prompt, LogitRows::Last).unwrap();
    let (mut got, mut worst) = (Vec::new(), 0f32);
    for (i, row) in greedy_logits.iter().enumerate() {
        let err = max_abs_diff(&[last.clone()], std::slice::from_ref(row));
        assert!(err <= tol, "greedy step {i}: max |logit - oracle| = {err} > {tol}");
        worst = worst.max(err);
        got.push(argmax(&last));
        last = s.forward(&[got[i]], LogitRows::Last).unwrap();
    }
    eprintln!("mxfp4_gpt_oss greedy: max |logit - oracle| = {worst:.3e} over {} steps", got.len());
    assert_eq!(got, greedy, "greedy ids differ from the oracle's");
}

#[test]
fn mxfp4_checkpoint_on_the_device_matches_the_cpu() {
    let prompt = oracle().prompt;
    let cases = [(Precision::Exact, 4, 1e-4), (Precision::Fast, 4, 1e-4), (Precision::Fast, 1, 1e-4)];
    device_matches_cpu(&model(), "mxfp4_gpt_oss", &prompt, &cases);
}

#[test]
fn mxfp4_experts_through_the_expert_tier_match_the_cpu() {
    let Oracle { prompt, max, .. } = oracle();
    let cpu = load_model(&model());
    let want = run_greedy(&cpu, &prompt, 5, 8, 64, true);
    for slots in [Some(3), None] {
        let req = EngineOptions {
            device: DeviceRequest::Vulkan(VkOptions::default()),
            compile: Options { context: 64, chunk_rows: 8, resident_experts: false, ..Options::default() },
            tier: TierOptions { max_experts: slots, deterministic: true, ..TierOptions::default() },
            ..EngineOptions::default()
        };
        let dev = Engine::load(&model(), &req).unwrap();
        let Some(d) = dev.device() else {
            eprintln!("no Vulkan device: {}", dev.device_note());
            return;
        };
        let got = run_greedy(&dev, &prompt, 5, 8, 64, true);
        assert!(got.on_device, "the run stayed on the device: {:?}", got.notice);
        let err = max_abs_diff(&got.rows, &want.rows);
        eprintln!("mxfp4_gpt_oss tier {slots:?}: max |tier - cpu| = {err:.3e} (max |logit| {max})");
        assert!(err <= 1e-4 * max, "tier {slots:?}: max |tier - cpu| = {err} > {}", 1e-4 * max);
        assert_eq!(got.toks, want.toks, "tier {slots:?}: greedy tokens differ");
        let s = d.with_tier(|t| t.stats().clone()).expect("a tier");
        assert!(s.device > 0, "tier {slots:?}: the device served no routed pair ({s:?})");
    }
}

#[test]
fn mxfp4_checkpoint_runs_in_coli_exec() {
    let Oracle { prompt, greedy, .. } = oracle();
    let prompt = prompt.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let n = greedy.len().to_string();
    let dir = model();
    let args =
        ["exec", "--device", "cpu", "--exact", "--model", dir.to_str().unwrap(), "--prompt-ids", &prompt, "-n", &n];
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_coli")).args(args).output().expect("coli runs");
    assert!(o.status.success(), "coli exec failed: {}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let printed: Vec<u32> =
        out.split(|c: char| !c.is_ascii_digit()).filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect();
    assert_eq!(printed, greedy, "coli exec printed {out:?}");
}

#[test]
fn released_mxfp4_experts_come_back_bit_for_bit() {
    let load = |host_copies| load_on_vulkan(&model(), host_copies);
    let (kept, freed) = (load(HostCopies::Keep), load(HostCopies::Release));
    if freed.device().is_none() {
        eprintln!("no Vulkan device: {}", freed.device_note());
        return;
    }
    let names = device_only_matrices(freed.plan(), &freed.model().program);
    let released: Vec<&String> = names.iter().filter(|n| freed.model().weights.is_released(n)).collect();
    let mxfp4 = released.iter().filter(|n| kept.model().weights.tensor(n).format == WeightFormat::MXFP4).count();
    assert_eq!(mxfp4, 9, "every layer's gate, up and down experts go\n{}", freed.device_note());
    for n in &released {
        let (want, got) = (kept.model().weights.tensor(n), freed.model().weights.tensor(n));
        assert_eq!((got.format, &got.shape), (want.format, &want.shape), "{n}");
        assert!(got.bytes() == want.bytes(), "{n} comes back bit for bit");
    }
    assert_eq!(freed.model().weights.remade(), released.len());
}
