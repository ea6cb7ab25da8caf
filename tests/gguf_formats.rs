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
//! llama.cpp does); the Vulkan device (Lavapipe in CI) within 1e-4 of the CPU at `Exact` and
//! 1e-3 at `Fast` (a last-bit difference before an 8-bit quantization can move it one step).
//!
//! The grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) have a fixture of their own
//! (tests/fixtures/gguf_grids/, `make_gguf_formats.py --set grids`), held to the same bounds on
//! the CPU; the shaders do not decode them, so a required Vulkan device refuses that model.

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
    // Fast: both sides quantize activations to 8 bits the same way; a last-bit difference
    // before a quantization can move one step, hence the looser bound there.
    let cases = [(Precision::Exact, 4, 1e-4), (Precision::Fast, 4, 1e-3)];
    device_matches_cpu(&model(), "gguf_formats", &prompt, &cases);
}

fn grids() -> std::path::PathBuf {
    fixture_dir("gguf_grids").join("model.gguf")
}

#[test]
fn every_grid_type_matches_the_numpy_oracle() {
    // tests/fixtures/gguf_grids: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S among Q4_K, Q6_K, Q8_0.
    matches_the_oracle("gguf_grids", &grids());
}

#[test]
fn a_device_without_grid_kernels_refuses_the_grid_model() {
    // The Vulkan shaders do not decode the grid formats: the device refuses the weights at
    // upload (a typed error), so a required device is an error naming the format (`Auto`
    // would run the model on the CPU with that note), never a device computing them.
    use coli_runtime::engine::{DeviceRequest, Engine, EngineError, EngineOptions};
    let req = EngineOptions {
        device: DeviceRequest::Vulkan(coli_runtime::vk::VkOptions::default()),
        ..EngineOptions::default()
    };
    match Engine::load(&grids(), &req) {
        Err(EngineError::DeviceUnused(note)) => {
            assert!(note.contains("does not take weights in IQ"), "{note}");
        }
        Err(e) if e.to_string().contains("Vulkan") => eprintln!("no Vulkan device: {e}"),
        Err(e) => panic!("{e}"),
        Ok(engine) => panic!("the device took the grid model: {}", engine.device_note()),
    }
}
