//! The KV split end to end on whatever Vulkan device there is (Lavapipe in CI): a split forced
//! to a few blocks (`--kv-device-positions`) over contexts several times longer, against the
//! same device without the split: every prompt row's logits and the greedy tokens, the prompt
//! in steps of 1, 2 and 3 rows and in whole chunks, then decode. The split must have run
//! (the plan has it, steps had a host part, and no device failure sent the run to the CPU).
//! A rewind (truncating the session, then a new continuation) refills the rings from the
//! host's cache. A sliding window's mirror is a ring too (the window and a chunk), split or not.
//! Both sides with f16 mirrors too (the host's cache then holds the values read back).
//!
//! Tolerance: logits within 1e-4 of the largest |logit| of the unsplit run (f32 weights: the
//! two differ in the order of float operations only; f16 mirrors 5e-4, below); greedy tokens
//! identical.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::vk::{KvType, VkOptions};
use common::*;
use std::path::Path;

const CONTEXT: usize = 256;
const CHUNK: usize = 8;

fn load_split(dir: &Path, positions: Option<usize>, block: usize) -> Engine {
    load_split_kv(dir, positions, block, KvType::F32)
}

/// `load_split` with the device's K/V mirrors (and the split's rings) of `kv`.
fn load_split_kv(dir: &Path, positions: Option<usize>, block: usize, kv: KvType) -> Engine {
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions { kv_mirror: kv, ..VkOptions::default() }),
        compile: Options {
            context: CONTEXT,
            chunk_rows: CHUNK,
            kv_device_positions: positions,
            kv_block: block,
            kv_split: positions.is_some(),
            ..Options::default()
        },
        ..EngineOptions::default()
    };
    Engine::load(dir, &req).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Logits of every prompt row (`step` rows a forward; 0: whole chunks) and `decode` greedy
/// tokens with their logits.
fn run(l: &Engine, prompt: &[u32], step: usize, decode: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let d = l.device().expect("on the device");
    let mut s = Session::on_device(l.model(), d, CONTEXT).unwrap();
    let vocab = l.plan().program.dims.vocab;
    let mut rows = Vec::new();
    let step = if step == 0 { prompt.len() } else { step };
    for c in prompt.chunks(step) {
        rows.extend(s.forward(c, LogitRows::All).unwrap().chunks_exact(vocab).map(|r| r.to_vec()));
    }
    let mut toks = Vec::new();
    for _ in 0..decode {
        let id = argmax(rows.last().unwrap());
        toks.push(id);
        rows.push(s.forward(&[id], LogitRows::Last).unwrap());
    }
    assert!(s.take_notice().is_none(), "the device failed; the CPU finished the run");
    assert!(s.on_a_device());
    (rows, toks)
}

fn check(name: &str, positions: usize, block: usize, prompt_len: usize, decode: usize) {
    check_kv(name, (positions, block), prompt_len, decode, KvType::F32)
}

/// `check` with mirrors of `kv` on both sides.
fn check_kv(name: &str, (positions, block): (usize, usize), prompt_len: usize, decode: usize, kv: KvType) {
    let dir = fixture_dir(name);
    let vocab = read_json(&dir.join("config.json"))["vocab_size"].as_u64().unwrap() as u32;
    // Deterministic ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| 3 + (i * 7919 + 13) % (vocab - 3)).collect();
    let whole = load_split_kv(&dir, None, block, kv);
    assert!(whole.plan().placement.kv_split.is_none(), "{name}: the reference must not split");
    let (want, want_toks) = run(&whole, &prompt, 0, decode);
    let max = want.iter().flatten().fold(0f32, |a, b| a.max(b.abs()));
    let split = load_split_kv(&dir, Some(positions), block, kv);
    let plan = split.plan().placement.kv_split.as_ref().unwrap_or_else(|| panic!("{name}: no split in the plan"));
    assert_eq!((plan.positions, plan.block, plan.ring), (positions, block, positions + CHUNK), "{name}: {plan}");
    assert!(!plan.layers.is_empty());
    let dev = split.device().unwrap();
    for step in [1, 2, 3, 0] {
        let before = dev.kv_split_stats().unwrap();
        let (got, toks) = run(&split, &prompt, step, decode);
        let after = dev.kv_split_stats().unwrap();
        let err = max_abs_diff(&got, &want);
        eprintln!(
            "{name} step {step}: max |split - whole| = {err:.3e} (max |logit| {max:.3}); {} layer steps, {} with a host part",
            after.steps - before.steps,
            after.host_steps - before.host_steps
        );
        let bound = if kv == KvType::F16 { 5e-4 } else { 1e-4 } * max;
        assert!(err <= bound, "{name} step {step}: max |split - whole| = {err}, bound {bound}");
        assert_eq!(toks, want_toks, "{name} step {step}: greedy tokens differ");
        assert!(after.host_steps > before.host_steps, "{name} step {step}: no step had a host part");
    }
}

/// Llama (GQA, RoPE): 16 positions in blocks of 8 on the device, 120 positions in all.
#[test]
fn llama_split_matches_the_whole_mirrors() {
    check("llama", 16, 8, 96, 24);
}

/// The same split with f16 mirrors and rings on both sides: the host's part reads the host's
/// cache, which holds the f16 values the device read back, so the split and the whole mirrors
/// attend over the same keys and values but where a decode row's key, rotated by another kernel
/// on each side (`rope_kv` for the split, the one-row attention kernel for the whole), rounds to
/// a neighbouring f16 value. Bound 5e-4 of the largest |logit| (seen 4.3e-5 on Lavapipe).
#[test]
fn llama_split_in_f16_matches_the_whole_f16_mirrors() {
    check_kv("llama", (16, 8), 96, 24, KvType::F16);
}

/// gpt-oss (sinks on every layer, sliding layers whose window of 4 stays whole, biases): the
/// split full layers hold 8 positions in blocks of 4, the sinks on the host's side.
#[test]
fn gpt_oss_split_matches_the_whole_mirrors() {
    check("gpt_oss", 8, 4, 60, 16);
}

/// A rewind below the rings' positions, then another continuation: the rings follow the
/// host's cache (what a step's shares lack comes up again), as the unsplit mirrors do.
#[test]
fn a_rewind_refills_the_rings() {
    let dir = fixture_dir("llama");
    let prompt: Vec<u32> = (0..90u32).map(|i| 3 + (i * 7919 + 13) % 317).collect();
    let other: Vec<u32> = (0..40u32).map(|i| 5 + (i * 104729 + 7) % 311).collect();
    let logits = |l: &Engine| {
        let mut s = Session::on_device(l.model(), l.device().unwrap(), CONTEXT).unwrap();
        for c in prompt.chunks(5) {
            s.forward(c, LogitRows::All).unwrap();
        }
        let mut rows = Vec::new();
        for cut in [70, 12] {
            s.truncate(cut);
            for c in other.chunks(3) {
                rows.push(s.forward(c, LogitRows::Last).unwrap());
            }
        }
        assert!(s.take_notice().is_none());
        rows
    };
    let want = logits(&load_split(&dir, None, 8));
    let got = logits(&load_split(&dir, Some(16), 8));
    let max = want.iter().flatten().fold(0f32, |a, b| a.max(b.abs()));
    let err = max_abs_diff(&got, &want);
    assert!(err <= 1e-4 * max, "max |split - whole| after rewinds = {err}");
}

/// A session holding fewer positions than the plan's ring: the ring keeps the plan's size (the
/// kernels index it modulo the plan's ring), and the run matches the unsplit one.
#[test]
fn a_short_session_keeps_the_plans_ring() {
    let dir = fixture_dir("llama");
    let prompt: Vec<u32> = (0..20u32).map(|i| 3 + (i * 7919 + 13) % 317).collect();
    let logits = |l: &Engine| {
        let mut s = Session::on_device(l.model(), l.device().unwrap(), 20).unwrap();
        let rows: Vec<Vec<f32>> = prompt.chunks(3).map(|c| s.forward(c, LogitRows::Last).unwrap()).collect();
        assert!(s.take_notice().is_none());
        rows
    };
    let want = logits(&load_split(&dir, None, 8));
    let got = logits(&load_split(&dir, Some(16), 8));
    let max = want.iter().flatten().fold(0f32, |a, b| a.max(b.abs()));
    assert!(max_abs_diff(&got, &want) <= 1e-4 * max);
}

/// A split session that adopts a context filled by the same model without the split
/// (`Session::adopt_context`, what `coli bench --fill-unsplit` does) continues as the split
/// session that filled its own context: the rings come from the host's cache at the next
/// forward. Decode logits within the tolerance above; greedy tokens identical. A session with
/// positions of its own refuses.
#[test]
fn a_split_session_continues_an_adopted_context() {
    let dir = fixture_dir("llama");
    let prompt: Vec<u32> = (0..40u32).map(|i| 3 + (i * 7919 + 13) % 300).collect();
    let (whole, split) = (load_split(&dir, None, 4), load_split(&dir, Some(8), 4));
    assert!(split.plan().placement.kv_split.is_some());
    let (want, want_toks) = run(&split, &prompt, 0, 6);
    let mut filler = Session::on_device(whole.model(), whole.device().unwrap(), CONTEXT).unwrap();
    filler.forward(&prompt, LogitRows::Last).unwrap();
    let mut s = Session::on_device(split.model(), split.device().unwrap(), CONTEXT).unwrap();
    s.adopt_context(&filler).unwrap();
    assert_eq!(s.pos(), prompt.len());
    let max = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    // Fed the reference's tokens, so the rows line up.
    for (i, &id) in want_toks.iter().enumerate() {
        let got = s.forward(&[id], LogitRows::Last).unwrap();
        let w = &want[prompt.len() + i];
        let err = w.iter().zip(&got).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-4 * max, "step {i}: {err} (max |logit| {max})");
        assert_eq!(argmax(&got), argmax(w), "step {i}");
    }
    assert!(s.take_notice().is_none());
    assert!(s.adopt_context(&filler).is_err(), "a session with positions refuses another's context");
}

/// A sliding window's mirror is a ring of the window and a chunk (gpt-oss's fixture: two of its
/// three layers slide over 4 positions, so 4 + 8 rows where the full layer keeps 256), and it
/// follows the host's cache through rewinds below its positions: prompt in steps of 5, then
/// truncations to 70 and 12, each continued in steps of 3, against the CPU's run of the same
/// steps: logits within 1e-4 of the largest |logit|.
#[test]
fn sliding_window_rings_follow_rewinds() {
    let dir = fixture_dir("gpt_oss");
    let l = load_split(&dir, None, 8);
    let prompt: Vec<u32> = (0..90u32).map(|i| 3 + (i * 7919 + 13) % 190).collect();
    let other: Vec<u32> = (0..40u32).map(|i| 5 + (i * 104729 + 7) % 180).collect();
    let logits = |mut s: Session| {
        let mut rows: Vec<Vec<f32>> = prompt.chunks(5).map(|c| s.forward(c, LogitRows::All).unwrap()).collect();
        for cut in [70, 12] {
            s.truncate(cut);
            rows.extend(other.chunks(3).map(|c| s.forward(c, LogitRows::All).unwrap()));
        }
        assert!(s.take_notice().is_none(), "the device failed; the CPU finished the run");
        rows
    };
    let dev = Session::on_device(l.model(), l.device().unwrap(), CONTEXT).unwrap();
    let spec = l.plan().program.layers.iter().flat_map(|x| &x.ops).find_map(|op| match op {
        coli_compiler::ir::Op::Attention { spec, .. } => Some(spec),
        _ => None,
    });
    let spec = spec.expect("an attention layer");
    let row_bytes = (spec.kv_heads * (spec.head_dim + spec.v_head_dim) * 4) as u64;
    let want_bytes = row_bytes * (CONTEXT + 2 * (4 + CHUNK)) as u64;
    assert_eq!(dev.device_kv_bytes(), Some(want_bytes), "one full layer of {CONTEXT} rows, two rings of 12");
    let got = logits(dev);
    let want = logits(Session::new(l.model(), CONTEXT));
    let max = want.iter().flatten().fold(0f32, |a, b| a.max(b.abs()));
    let err = max_abs_diff(&got, &want);
    assert!(err <= 1e-4 * max, "max |device - cpu| after rewinds = {err} (max |logit| {max})");
}
