//! Throughput of the CPU's routed experts for prompt chunks (`cpu::experts::routed_experts`) on
//! the OLMoE-1B-7B layer geometry (hidden 2048, 64 experts of FFN 1024, top-8), Q8_0 weights
//! and a random routing (uniform, or with `skew` a few hot experts), without a benchmark framework: milliseconds a layer and
//! GMAC/s for a few row counts, against one expert's matmul on cache-resident weights.
//!
//! Run: `cargo run --release -p coli-runtime --example bench_experts [-- rows... [skew]]`
//! Must not: be used by tests; it only prints.

mod support;

use coli_compiler::ir::GluKind;
use coli_runtime::cpu::experts::{routed_experts, ExpertMats, Routed};
use coli_runtime::cpu::linear::Precision;
use coli_runtime::format::{kernel_level, matmul, quantize, Matrix, WeightFormat};
use std::time::Duration;
use support::{time, values};

const HIDDEN: usize = 2048;
const FFN: usize = 1024;
const EXPERTS: usize = 64;
const TOP_K: usize = 8;

fn main() {
    // `skew`: expert e drawn with weight 1 / (e + 1) (a few hot experts, as trained routers have).
    let skew = std::env::args().any(|a| a == "skew");
    let rows: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = if rows.is_empty() { vec![16, 128, 512] } else { rows };
    let f = WeightFormat::Q8_0;
    let mk = |r: usize, c: usize, seed: u32| quantize(f, &values(r * c, seed), c).unwrap();
    let gate: Vec<Vec<u8>> = (0..EXPERTS).map(|e| mk(FFN, HIDDEN, 3 * e as u32)).collect();
    let up: Vec<Vec<u8>> = (0..EXPERTS).map(|e| mk(FFN, HIDDEN, 3 * e as u32 + 1)).collect();
    let down: Vec<Vec<u8>> = (0..EXPERTS).map(|e| mk(HIDDEN, FFN, 3 * e as u32 + 2)).collect();
    let expert = |e: usize| ExpertMats {
        gate: Matrix::new(f, FFN, HIDDEN, &gate[e]).unwrap(),
        up: Matrix::new(f, FFN, HIDDEN, &up[e]).unwrap(),
        down: Matrix::new(f, HIDDEN, FFN, &down[e]).unwrap(),
        gate_bias: None,
        up_bias: None,
        down_bias: None,
    };
    println!(
        "kernels {}, {} threads, routing {}",
        kernel_level(),
        coli_runtime::format::pool::threads(),
        if skew { "skewed" } else { "uniform" }
    );
    // One expert's gate matrix, hot in cache, 16 rows: the tile's own speed.
    let x16 = values(16 * HIDDEN, 99);
    let mut o16 = vec![0f32; 16 * FFN];
    let m = Matrix::new(f, FFN, HIDDEN, &gate[0]).unwrap();
    let t = time(Duration::from_millis(300), || matmul(&m, &x16, 16, &mut o16));
    println!(
        "one 1024x2048 matrix, 16 rows, hot: {:.3} ms, {:.1} GMAC/s",
        t.as_secs_f64() * 1e3,
        16.0 * (FFN * HIDDEN) as f64 / t.as_secs_f64() / 1e9
    );
    // One expert's FFN, 16 rows, on one thread: the same expert again (hot) and the 64 in turn (cold).
    {
        use coli_runtime::cpu::experts::expert_ffn;
        let x = values(16 * HIDDEN, 5);
        let idx: Vec<usize> = (0..16).collect();
        let mut outs = vec![0f32; 16 * HIDDEN];
        let t = time(Duration::from_millis(300), || {
            expert_ffn(&expert(0), GluKind::SwiGlu, Precision::Fast, &x, HIDDEN, &idx, &mut outs)
        });
        let macs = (16 * 3 * FFN * HIDDEN) as f64;
        println!(
            "one expert, 16 rows, hot: {:.3} ms, {:.1} GMAC/s",
            t.as_secs_f64() * 1e3,
            macs / t.as_secs_f64() / 1e9
        );
        let mut e = 0;
        let t = time(Duration::from_millis(300), || {
            e = (e + 1) % EXPERTS;
            expert_ffn(&expert(e), GluKind::SwiGlu, Precision::Fast, &x, HIDDEN, &idx, &mut outs)
        });
        println!(
            "one expert, 16 rows, cold: {:.3} ms, {:.1} GMAC/s",
            t.as_secs_f64() * 1e3,
            macs / t.as_secs_f64() / 1e9
        );
    }
    for n in rows {
        let x = values(n * HIDDEN, 5);
        let mut routing = vec![0f32; n * 2 * TOP_K];
        let mut s = 12345u32;
        for r in 0..n {
            let mut chosen = Vec::new();
            while chosen.len() < TOP_K {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                let u = (s >> 8) as f64 / (1u64 << 24) as f64;
                let e = if skew {
                    // Inverse of the CDF of weights 1 / (e + 1): e = exp(u * ln(E + 1)) - 1.
                    (((u * ((EXPERTS + 1) as f64).ln()).exp() - 1.0) as usize).min(EXPERTS - 1)
                } else {
                    (s >> 16) as usize % EXPERTS
                };
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            for (k, &e) in chosen.iter().enumerate() {
                routing[r * 2 * TOP_K + 2 * k] = e as f32;
                routing[r * 2 * TOP_K + 2 * k + 1] = 1.0 / TOP_K as f32;
            }
        }
        let mut out = vec![0f32; n * HIDDEN];
        let rows = Routed { x: &x, n, hidden: HIDDEN, routing: &routing, top_k: TOP_K };
        let t = time(Duration::from_millis(1000), || {
            routed_experts(rows, GluKind::SwiGlu, Precision::Fast, &expert, &mut out)
        });
        let macs = (n * TOP_K * 3 * FFN * HIDDEN) as f64;
        println!("{n:>4} rows: {:8.2} ms a layer, {:5.1} GMAC/s", t.as_secs_f64() * 1e3, macs / t.as_secs_f64() / 1e9);
    }
}
