//! FP8 checkpoints end to end: a tiny OLMoE laid out as the published FP8 checkpoints are
//! (tests/fixtures/fp8_olmoe/, `tools/make_fp8.py`: every linear weight of the layers
//! `F8_E4M3` with 128 x 128 `weight_scale_inv`, F32 in layer 0 and BF16 in layer 1, per-expert
//! tensors; embeddings, norms, router and head BF16), against the logits of a numpy float64
//! forward over the dequantized weights (`e4m3(q) * scale`).
//!
//! Tolerance, relative to the largest |logit|: 1e-4 on the CPU at both precisions (FP8 rows
//! are multiplied in f32 against f32 activations, block by block: the oracle's values exactly,
//! only the rounding of the sums differs; the fixture's top-2 logit gap is 1e-2), in one chunk
//! and in chunks of 1 and 5; the Vulkan device (Lavapipe in CI) within 1e-4 of the CPU. With
//! the dense weights on the device only, the FP8 matrices' host copies are released and come
//! back bit for bit when the CPU reads them.

mod common;

use coli_compiler::cost::Format;
use coli_runtime::cpu::Precision;
use coli_runtime::engine::HostCopies;
use coli_runtime::exec::weights::device_only_matrices;
use coli_runtime::exec::Session;
use coli_runtime::format::WeightFormat;
use coli_runtime::model::{Checkpoint, LoadOptions};
use common::*;

fn model() -> std::path::PathBuf {
    fixture_dir("fp8_olmoe")
}

fn oracle() -> (Vec<u32>, Vec<Vec<f32>>, f32) {
    oracle_logits(&model().join("oracle.json"))
}

#[test]
fn fp8_weights_are_bound_at_their_repacked_size() {
    let ck = Checkpoint::open(&model(), &LoadOptions::default()).unwrap();
    let tensors = ck.bindings().tensors.unwrap();
    let mut fp8 = 0;
    for (name, info) in &tensors {
        if name.ends_with("_scale_inv") || !name.starts_with("model.layers.") || !name.ends_with("proj.weight") {
            continue;
        }
        assert_eq!(info.dtype, "FP8_E4M3", "{name}");
        let (rows, cols) = (info.shape[0] as u64, info.shape[1] as u64);
        assert_eq!(info.bytes, rows * cols / 128 * 132, "{name}");
        assert_eq!(Format::from_dtype(&info.dtype).map(|f| f.bytes(rows, cols)), Some(info.bytes), "{name}");
        fp8 += 1;
    }
    let o = read_json(&model().join("oracle.json"));
    assert_eq!(fp8, o["weight_tensors_fp8"].as_u64().unwrap() as usize);
    assert_eq!(tensors["model.layers.0.mlp.gate.weight"].dtype, "BF16", "routers stay BF16");
}

#[test]
fn fp8_checkpoint_matches_the_numpy_oracle() {
    let (prompt, want, max) = oracle();
    let engine = load_model(&model());
    for precision in [Precision::Exact, Precision::Fast] {
        for chunk in [prompt.len(), 1, 5] {
            let mut s = Session::new(engine.model(), 64);
            s.set_precision(precision);
            let got = logit_rows(&mut s, &prompt, chunk);
            let err = max_abs_diff(&got, &want);
            eprintln!("fp8_olmoe {precision:?} chunk {chunk}: max |logit - oracle| = {err:.3e} (max |logit| {max})");
            assert!(err <= 1e-4 * max, "{precision:?} chunk {chunk}: max |logit - oracle| = {err} > {}", 1e-4 * max);
        }
    }
}

#[test]
fn fp8_checkpoint_on_the_device_matches_the_cpu() {
    let (prompt, _, _) = oracle();
    let cases = [(Precision::Exact, 4, 1e-4), (Precision::Fast, 4, 1e-4), (Precision::Fast, 1, 1e-4)];
    device_matches_cpu(&model(), "fp8_olmoe", &prompt, &cases);
}

#[test]
fn released_fp8_matrices_come_back_bit_for_bit() {
    let load = |host_copies| load_on_vulkan(&model(), host_copies);
    let (kept, freed) = (load(HostCopies::Keep), load(HostCopies::Release));
    if freed.device().is_none() {
        eprintln!("no Vulkan device: {}", freed.device_note());
        return;
    }
    let names = device_only_matrices(freed.plan(), &freed.model().program);
    let released: Vec<&String> = names.iter().filter(|n| freed.model().weights.is_released(n)).collect();
    let fp8 = released.iter().filter(|n| kept.model().weights.tensor(n).format == WeightFormat::FP8_E4M3).count();
    assert!(fp8 >= 8, "the attention matrices' copies go\n{}", freed.device_note());
    for n in &released {
        let (want, got) = (kept.model().weights.tensor(n), freed.model().weights.tensor(n));
        assert_eq!((got.format, &got.shape), (want.format, &want.shape), "{n}");
        assert!(got.bytes() == want.bytes(), "{n} comes back bit for bit");
    }
    assert_eq!(freed.model().weights.remade(), released.len());
}
