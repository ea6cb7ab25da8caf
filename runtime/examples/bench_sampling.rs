//! Time of one greedy pick over OLMoE's vocabulary (50,304 logits): `Sampler::sample` as a
//! served request runs it (no penalty: the logits as given), with a repetition penalty (the
//! logits copied and penalized first), and the one-comparison-at-a-time scan that
//! `sample.rs`'s argmax replaced (59d1fee) for comparison. Prints the best of many repetitions.
//!
//! Run: `cargo run --release -p coli-runtime --example bench_sampling`
//! Must not: be used by tests; it only prints.

use coli_runtime::sample::{Sampler, SamplerConfig};
use std::hint::black_box;
use std::time::Instant;

const VOCAB: usize = 50_304;

/// The scan before 59d1fee: the first largest value, NaN never winning.
fn serial_argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || (v[best].is_nan() && !x.is_nan()) {
            best = i;
        }
    }
    best as u32
}

fn best_of(mut f: impl FnMut() -> u32) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..2000 {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e6
}

fn main() {
    let logits: Vec<f32> = (0..VOCAB).map(|i| ((i * 7919) % 10_007) as f32 * 1e-3 - 5.0).collect();
    let recent: Vec<u32> = (0..64).map(|i| i * 701 % VOCAB as u32).collect();
    let mut greedy = Sampler::new(SamplerConfig::greedy()).unwrap();
    let mut penalized = Sampler::new(SamplerConfig { repetition_penalty: 1.1, ..SamplerConfig::greedy() }).unwrap();
    let a = best_of(|| greedy.sample(black_box(&logits), &recent).unwrap());
    let b = best_of(|| penalized.sample(black_box(&logits), &recent).unwrap());
    let c = best_of(|| serial_argmax(black_box(&logits)));
    println!("greedy, {VOCAB} logits: {a:.2} us");
    println!("greedy with a repetition penalty over 64 ids: {b:.2} us");
    println!("the serial scan (the argmax before 59d1fee): {c:.2} us");
}
