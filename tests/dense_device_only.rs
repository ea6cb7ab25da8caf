//! The dense weights on the device only, end to end on whatever Vulkan device the machine has
//! (Lavapipe in CI): once the device layers' matrices are uploaded, their host copies are
//! released (quantized at load, re-laid, rows selected; a view of the mapped file has its pages
//! advised away), and the weight store makes a released matrix again from the checkpoint when
//! the CPU first reads it. Checked:
//! - every released matrix comes back bit for bit what a load that kept its copies holds
//!   (int8 quantized at load, gpt-oss's re-laid experts and selected rows, Qwen3-Next's
//!   selected query and gate rows);
//! - a device lost mid-decode with the copies released: the CPU finishes the run with the
//!   tokens of the CPU's own run of the same int8 checkpoint, reading the matrices back.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions, HostCopies};
use coli_runtime::exec::weights::device_only_matrices;
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::format::WeightFormat;
use coli_runtime::model::LoadOptions;
use coli_runtime::vk::{FaultInjection, VkOptions};
use common::*;
use std::path::Path;

const CONTEXT: usize = 256;

fn load_with(
    dir: &Path,
    quantize: Option<WeightFormat>,
    device: bool,
    dense_device_only: bool,
    fail_submit: Option<u64>,
) -> Engine {
    let device = match device {
        true => DeviceRequest::Vulkan(VkOptions {
            fault: fail_submit.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None }),
            ..Default::default()
        }),
        false => DeviceRequest::Cpu,
    };
    let req = EngineOptions {
        load: LoadOptions { quantize, ..Default::default() },
        device,
        compile: Options { context: CONTEXT, chunk_rows: 8, ..Options::default() },
        host_copies: if dense_device_only { HostCopies::Release } else { HostCopies::Keep },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Greedy tokens after the prompt (one forward), and the session's notice.
fn run(l: &Engine, prompt: &[u32], steps: usize) -> (Vec<u32>, Option<String>, bool) {
    let mut s = match l.device() {
        Some(d) => Session::on_device(l.model(), d, CONTEXT).unwrap(),
        None => Session::new(l.model(), CONTEXT),
    };
    let mut last = s.forward(prompt, LogitRows::Last).unwrap();
    let mut toks = Vec::new();
    for _ in 0..steps {
        let id = argmax(&last);
        toks.push(id);
        last = s.forward(&[id], LogitRows::Last).unwrap();
    }
    (toks, s.take_notice(), s.on_a_device())
}

#[test]
fn a_released_matrix_comes_back_bit_for_bit() {
    for (name, quantize) in [
        ("olmoe", Some(WeightFormat::I8Row)),
        ("llama", Some(WeightFormat::I4G64)),
        ("gpt_oss", None),
        ("qwen3_next", None),
    ] {
        let dir = fixture_dir(name);
        let kept = load_with(&dir, quantize, true, false, None);
        let freed = load_with(&dir, quantize, true, true, None);
        assert!(freed.device_note().contains("dense weights on the device only"), "{name}: {}", freed.device_note());
        let names = device_only_matrices(freed.plan(), &freed.model().program);
        let released: Vec<&String> = names.iter().filter(|n| freed.model().weights.is_released(n)).collect();
        assert!(!released.is_empty(), "{name}: some host copy released\n{}", freed.device_note());
        assert!(
            released.iter().all(|n| !kept.model().weights.is_released(n)),
            "{name}: a load that keeps its copies releases none"
        );
        for n in &released {
            let want = kept.model().weights.tensor(n);
            let got = freed.model().weights.tensor(n);
            assert!(!freed.model().weights.is_released(n), "{name}: {n} made again");
            assert_eq!((got.format, &got.shape), (want.format, &want.shape), "{name}: {n}");
            assert!(got.bytes() == want.bytes(), "{name}: {n} comes back bit for bit");
        }
        assert_eq!(freed.model().weights.remade(), released.len(), "{name}");
        eprintln!("{name}: {} released matrices made again bit for bit", released.len());
    }
}

#[test]
fn a_lost_device_with_released_copies_is_finished_by_the_cpu_with_the_same_tokens() {
    for name in ["olmoe", "llama", "qwen3_next"] {
        let dir = fixture_dir(name);
        let prompt = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
        let q = Some(WeightFormat::I8Row);
        let (want, _, _) = run(&load_with(&dir, q, false, false, None), &prompt, 12);
        // The device's submissions in the prompt and in the whole run, on a clean run.
        let clean = load_with(&dir, q, true, true, None);
        let ctx = clean.device().unwrap().ctx.clone();
        let base = ctx.submits();
        let (_, notice, on) = run(&clean, &prompt, 0);
        assert!(on && notice.is_none(), "{name}: {notice:?}");
        let prompt_submits = ctx.submits() - base;
        let before = ctx.submits();
        let (toks, _, _) = run(&clean, &prompt, 12);
        let decode = ctx.submits() - before - prompt_submits;
        assert!(decode > 0, "{name}: the decode runs on the device");
        assert_eq!(toks, want, "{name}: the device's tokens are the CPU's");
        assert_eq!(clean.model().weights.remade(), 0, "{name}: the device run reads no released matrix");
        // A submission in the middle of the decode fails.
        let at = base + prompt_submits + decode / 2;
        let dev = load_with(&dir, q, true, true, Some(at));
        let (got, notice, on) = run(&dev, &prompt, 12);
        assert!(
            notice.as_deref().is_some_and(|n| n.contains("continue on the CPU")),
            "{name}: the fallback says so ({notice:?})"
        );
        assert!(!on, "{name}: the device is off after the loss");
        assert!(dev.model().weights.remade() > 0, "{name}: the CPU read released matrices back");
        assert_eq!(got, want, "{name}: the CPU finishes the run with the CPU's tokens");
    }
}
