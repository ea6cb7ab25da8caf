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

#[test]
fn every_block_type_matches_the_numpy_oracle() {
    let (prompt, want, max) = oracle();
    let engine = load_model(&model());
    for (precision, rel) in [(Precision::Exact, 1e-4), (Precision::Fast, 5e-2)] {
        for chunk in [prompt.len(), 1, 3] {
            let mut s = Session::new(engine.model(), 64);
            s.set_precision(precision);
            let got = logit_rows(&mut s, &prompt, chunk);
            let err = max_abs_diff(&got, &want);
            eprintln!("gguf_formats {precision:?} chunk {chunk}: max |logit - oracle| = {err:.3e} (max |logit| {max})");
            assert!(err <= rel * max, "{precision:?} chunk {chunk}: max |logit - oracle| = {err} > {}", rel * max);
        }
    }
}

#[test]
fn every_block_type_on_the_device_matches_the_cpu() {
    let (prompt, _, _) = oracle();
    // Fast: both sides quantize activations to 8 bits the same way; a last-bit difference
    // before a quantization can move one step, hence the looser bound there.
    let cases = [(Precision::Exact, 4, 1e-4), (Precision::Fast, 4, 1e-3)];
    device_matches_cpu(&model(), "gguf_formats", &prompt, &cases);
}
