//! Every GGUF block type coli reads, end to end, against an oracle nobody here wrote: a tiny
//! Llama-architecture GGUF (tests/fixtures/gguf_formats/, `tools/make_gguf_formats.py`) whose
//! tensors are each in another type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_NL, IQ4_XS, MXFP4, F16; the embedding Q4_K, the head Q6_K), quantized by llama.cpp's
//! llama-quantize, and the logits of a prompt from a numpy forward over gguf-py's
//! dequantization of the same file.
//!
//! Tolerance, relative to the largest |logit|: `Precision::Exact` 1e-4 (each block decoded and
//! multiplied in f32 as the oracle's f64 did; only rounding differs), in one block and in chunks
//! of 1 and 3; `Precision::Fast` 5e-2 (activations quantized to 8 bits per block of 32, as
//! llama.cpp does); the Vulkan device (Lavapipe in CI) within 1e-4 of the CPU at `Exact`, and
//! at `Fast` as `device_fast_matches_cpu` states.
//!
//! Why `Fast` has no single bound against the CPU: both sides quantize the same activations
//! with the same arithmetic (runtime/tests/vk_ops.rs checks the q8 blocks bit for bit), but the
//! values they quantize come from kernels that sum in another order (attention, the matrix
//! products into the residual, the norm's sum of squares) and differ in the last bits, and a
//! value within those bits of a rounding tie (x / d = k + 1/2) takes the neighbouring code on
//! one side. One such code moves the logits of its row, and of every later row when it lies
//! before the last layer's keys and values, by 5e-3 to 1.2e-2 of the largest |logit| here.
//! Measured over 12 random prompts of 11 tokens per fixture in chunks of 1: the device past
//! 1e-3 of the CPU on 3 (portable build) to 5 (AVX-512) of 36 prompts. Two of them traced to one
//! code each, in the attention's output as the output projection of layer 0 quantizes it
//! (x / d = 118.5 at row 5, 41.500008 at row 10): a CPU forward with that code moved to the
//! device's agreed with the device within 3e-7 on every row. The CPU's own builds differ the
//! same way: portable, AVX2 and AVX-512 disagree past 1e-3 on 4 or 5 of the same 36 prompts
//! (at most 9.0e-3). The models are dense (Llama): no router amplifies it; the 8-bit rounding
//! is the discontinuity.
//!
//! The grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) have a fixture of their own
//! (tests/fixtures/gguf_grids/, `make_gguf_formats.py --set grids`), and IQ1_S and IQ1_M another
//! (tests/fixtures/gguf_iq1/, `--set iq1`), held to the same bounds on the CPU and on the device
//! (which decodes them: shaders/iq_grid.glsl).

mod common;

use coli_runtime::cpu::Precision;
use coli_runtime::exec::Session;
use common::*;

fn model() -> std::path::PathBuf {
    fixture_dir("gguf_formats").join("model.gguf")
}

fn oracle() -> (Vec<u32>, Vec<Vec<f32>>, f32) {
    oracle_logits(&fixture_dir("gguf_formats").join("oracle.json"))
}

/// The CPU's logits of `name`'s prompt, whole and in chunks of 1 and 3, against its oracle:
/// within 1e-4 of the largest |logit| with f32 activations, 5e-2 with 8-bit ones.
fn matches_the_oracle(name: &str, gguf: &std::path::Path) {
    let (prompt, want, max) = oracle_logits(&fixture_dir(name).join("oracle.json"));
    let engine = load_model(gguf);
    for (precision, rel) in [(Precision::Exact, 1e-4), (Precision::Fast, 5e-2)] {
        for chunk in [prompt.len(), 1, 3] {
            let mut s = Session::new(engine.model(), 64);
            s.set_precision(precision);
            let got = logit_rows(&mut s, &prompt, chunk);
            let err = max_abs_diff(&got, &want);
            eprintln!("{name} {precision:?} chunk {chunk}: max |logit - oracle| = {err:.3e} (max |logit| {max})");
            assert!(
                err <= rel * max,
                "{name} {precision:?} chunk {chunk}: max |logit - oracle| = {err} > {}",
                rel * max
            );
        }
    }
}

#[test]
fn every_block_type_matches_the_numpy_oracle() {
    matches_the_oracle("gguf_formats", &model());
}

#[test]
fn every_block_type_on_the_device_matches_the_cpu() {
    let (prompt, _, _) = oracle();
    device_matches_cpu(&model(), "gguf_formats", &prompt, &[(Precision::Exact, 4, 1e-4)]);
    device_fast_matches_cpu(&model(), "gguf_formats", &prompt, &[4]);
}

/// Random prompts of the oracle prompt's length besides it, for `device_fast_matches_cpu`.
const PROMPTS: usize = 12;

/// `Precision::Fast` on the device against the CPU, over the oracle's prompt and `PROMPTS - 1`
/// seeded random ones of its length, in chunks of each of `chunks`. A prompt whose 8-bit codes
/// all agree matches within 1e-3 of the largest |logit| (the f32 rounding before and after
/// the codes); one where a code at a rounding tie went the other way (the module's doc) does
/// not, and is held instead to the bound of the `Fast` path against exact arithmetic (the CPU
/// at `Precision::Exact`), 5e-2 as against the oracle. At most two thirds of the prompts may
/// be such: measured on Lavapipe, 0 to 3 of 12 per fixture and chunking (the share differs
/// with the CPU's build and the device, hence the margin), where a defect of the device's
/// `Fast` path (a kernel, a format's decoding against q8 activations) moves every prompt.
fn device_fast_matches_cpu(gguf: &std::path::Path, name: &str, oracle_prompt: &[u32], chunks: &[usize]) {
    use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(coli_runtime::vk::VkOptions::default()),
        compile: coli_compiler::Options { context: 64, chunk_rows: 16, ..coli_compiler::Options::default() },
        ..EngineOptions::default()
    };
    let dev = Engine::load(gguf, &req).unwrap();
    let Some(device) = dev.device() else {
        eprintln!("no Vulkan device: {}", dev.device_note());
        return;
    };
    let cpu = load_model(gguf);
    let vocab = dev.plan().program.dims.vocab as u64;
    let mut state = 0x5eed_0016_u64;
    let mut prompts = vec![oracle_prompt.to_vec()];
    while prompts.len() < PROMPTS {
        let p = (0..oracle_prompt.len())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % vocab) as u32
            })
            .collect();
        prompts.push(p);
    }
    let run = |s: &mut Session, precision, prompt: &[u32], chunk| {
        s.set_precision(precision);
        logit_rows(s, prompt, chunk)
    };
    for &chunk in chunks {
        let mut apart = Vec::new();
        for (i, prompt) in prompts.iter().enumerate() {
            let want = run(&mut Session::new(cpu.model(), 64), Precision::Fast, prompt, chunk);
            let got = run(&mut Session::on_device(dev.model(), device, 64).unwrap(), Precision::Fast, prompt, chunk);
            let max = max_abs(&want);
            let err = max_abs_diff(&got, &want);
            eprintln!(
                "{name} device Fast chunk {chunk} prompt {i}: max |device - cpu| = {err:.3e} (max |logit| {max})"
            );
            if err <= 1e-3 * max {
                continue;
            }
            apart.push(i);
            let exact = run(&mut Session::new(cpu.model(), 64), Precision::Exact, prompt, chunk);
            let max = max_abs(&exact);
            let err = max_abs_diff(&got, &exact);
            eprintln!("  prompt {i} {prompt:?} past 1e-3: max |device Fast - cpu Exact| = {err:.3e}");
            assert!(
                err <= 5e-2 * max,
                "{name} chunk {chunk} prompt {i}: max |device Fast - cpu Exact| = {err} > {}",
                5e-2 * max
            );
        }
        assert!(
            3 * apart.len() <= 2 * prompts.len(),
            "{name} chunk {chunk}: prompts {apart:?} of {} are past 1e-3 of the CPU's Fast logits",
            prompts.len()
        );
    }
}

fn grids() -> std::path::PathBuf {
    fixture_dir("gguf_grids").join("model.gguf")
}

#[test]
fn every_grid_type_matches_the_numpy_oracle() {
    // tests/fixtures/gguf_grids: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S among Q4_K, Q6_K, Q8_0.
    matches_the_oracle("gguf_grids", &grids());
}

/// `name`'s model on the device (shaders/iq_grid.glsl) against the CPU, the bounds of the block
/// types' model, `Fast` in chunks of 4 (the tiled GEMMs) and 1 (the decode GEMVs); then that the device
/// really computed it: every layer on the device and each of the `count` matrices in a format
/// `picked` read by the device alone (a refused upload fails a required device's load; `Auto`
/// would have run the model on the CPU).
fn on_the_device_alone(name: &str, picked: fn(coli_runtime::format::WeightFormat) -> bool, count: usize) {
    use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
    let gguf = fixture_dir(name).join("model.gguf");
    let (prompt, _, _) = oracle_logits(&fixture_dir(name).join("oracle.json"));
    device_matches_cpu(&gguf, name, &prompt, &[(Precision::Exact, 4, 1e-4)]);
    device_fast_matches_cpu(&gguf, name, &prompt, &[4, 1]);
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(coli_runtime::vk::VkOptions::default()),
        compile: coli_compiler::Options { context: 64, chunk_rows: 16, ..coli_compiler::Options::default() },
        ..EngineOptions::default()
    };
    let engine = Engine::load(&gguf, &req).unwrap();
    if engine.device().is_none() {
        eprintln!("no Vulkan device: {}", engine.device_note());
        return;
    }
    let note = engine.device_note();
    let layers = engine.plan().program.dims.layers;
    assert!(note.contains(&format!("{layers} of {layers} layers on the device")), "{note}");
    let weights = &engine.model().weights;
    let names = coli_runtime::exec::weights::device_only_matrices(engine.plan(), &engine.model().program);
    let on_device: Vec<&String> = names.iter().filter(|n| picked(weights.tensor(n).format)).collect();
    assert_eq!(on_device.len(), count, "{on_device:?}\n{note}");
}

#[test]
fn every_grid_type_on_the_device_matches_the_cpu() {
    use coli_runtime::format::WeightFormat;
    let grid = |f: WeightFormat| {
        matches!(
            f,
            WeightFormat::IQ2_XXS
                | WeightFormat::IQ2_XS
                | WeightFormat::IQ2_S
                | WeightFormat::IQ3_XXS
                | WeightFormat::IQ3_S
        )
    };
    // The fixture's 12 grid-type matrices (oracle.json's `types`), all in the two layers.
    on_the_device_alone("gguf_grids", grid, 12);
}

#[test]
fn every_iq1_type_matches_the_numpy_oracle() {
    // tests/fixtures/gguf_iq1: six IQ1_S and six IQ1_M matrices among Q4_K, Q6_K, Q8_0.
    matches_the_oracle("gguf_iq1", &fixture_dir("gguf_iq1").join("model.gguf"));
}

#[test]
fn every_iq1_type_on_the_device_matches_the_cpu() {
    use coli_runtime::format::WeightFormat;
    // The fixture's 12 IQ1 matrices (oracle.json's `types`), all in the two layers. Its seed, 8,
    // was picked when the device's Fast logits were held to 1e-3 of the CPU's on the oracle's
    // prompt alone, for a prompt that met no rounding tie (with seed 7 one code at the first
    // position moved the later logits by 3.1e-2); `device_fast_matches_cpu` needs no such pick.
    on_the_device_alone("gguf_iq1", |f| matches!(f, WeightFormat::IQ1_S | WeightFormat::IQ1_M), 12);
}
