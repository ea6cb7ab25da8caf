//! Throughput of the CPU's GQA attention (`cpu::attention::attend`) on SmolLM2-135M's shape:
//! a 128-row prefill block and one-row decode at two context lengths; and of a KV split's host
//! part (`cpu::attn_part::attend_part`: 64 rows over ~3,500 older positions, and a decode row
//! over 28,672: a 32K context over a 4K ring). Prints the best
//! of many repetitions (robust to other load on the machine).
//!
//! Run: `cargo run --release -p coli-runtime --example bench_attention`
//! Must not: be used by tests; it only prints.

use coli_runtime::cpu::attention::{attend, AttnShape};
use coli_runtime::cpu::attn_part::attend_part;
use std::time::Instant;

fn main() {
    let s = AttnShape { heads: 9, kv_heads: 3, head_dim: 64, v_head_dim: 64, scale: 0.125, window: None };
    for (pos0, n) in [(0usize, 128usize), (127, 1), (1000, 1)] {
        let len = pos0 + n;
        let q: Vec<f32> = (0..n * 576).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
        let k: Vec<f32> = (0..len * 192).map(|i| ((i * 104729 % 1000) as f32 - 500.0) / 500.0).collect();
        let v = k.clone();
        let mut out = vec![0f32; n * 576];
        let mut best = f64::MAX;
        for _ in 0..200 {
            let t = Instant::now();
            attend(s, &q, &k, &v, pos0, None, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let pairs: usize = (0..n).map(|i| pos0 + i + 1).sum::<usize>() * 9;
        println!(
            "attention n={n} pos0={pos0}: {:.1} us, {:.2} ns per (row, head, key)",
            best * 1e6,
            best * 1e9 / pairs as f64
        );
    }
    let (n, len) = (64usize, 4096usize);
    let q: Vec<f32> = (0..n * 576).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
    let k: Vec<f32> = (0..len * 192).map(|i| ((i * 104729 % 1000) as f32 - 500.0) / 500.0).collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        std::hint::black_box(attend_part(&s, &q, &k, &k, n, &|i| (0, 3500 + i), None));
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("KV split host part, {n} rows over ~3,500 positions: {:.2} ms", best * 1e3);
    // A decode row of a split at 32K over a 4K ring: 28,672 older positions.
    let len = 28_672usize;
    let q1: Vec<f32> = (0..576).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
    let k: Vec<f32> = (0..len * 192).map(|i| ((i * 104729 % 1000) as f32 - 500.0) / 500.0).collect();
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        std::hint::black_box(attend_part(&s, &q1, &k, &k, 1, &|_| (0, len), None));
        best = best.min(t.elapsed().as_secs_f64());
    }
    let gb = (len * 192 * 2 * 4) as f64 / best / 1e9;
    println!("KV split host part, a decode row over {len} positions: {:.2} ms ({gb:.1} GB/s of K and V)", best * 1e3);
}
