//! Throughput of the Vulkan matrix kernels on the device this machine has: the decode GEMV
//! (weight bytes read per second) and the tiled GEMM (GFLOP/s) for a few weight formats, at the
//! OLMoE-1B-7B geometry (hidden 2048, expert FFN 1024, a 8192-row projection). Prints the
//! device line first, so a run that fell back to another device is visible.
//!
//! Usage: `cargo run -p coli-runtime --example vk_bench [device name]`.
//! Must not: be read as a model benchmark (one matrix, back to back, no host steps).

use coli_runtime::format::{fp16, quantize, WeightFormat};
use coli_runtime::vk::{Context, VkOptions};
use std::time::Instant;

fn random_rows(format: WeightFormat, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    match format {
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            let mut b: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap()).map(|_| next() as u8).collect();
            let (size, at): (usize, &[usize]) = if format == WeightFormat::Q4_K { (144, &[0, 2]) } else { (210, &[208]) };
            for block in b.chunks_exact_mut(size) {
                for &a in at {
                    block[a..a + 2].copy_from_slice(&fp16::f32_to_f16(0.01).to_le_bytes());
                }
            }
            b
        }
        _ => {
            let x: Vec<f32> = (0..rows * cols).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
            quantize(format, &x, cols).unwrap()
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args().nth(1);
    let ctx = Context::new(&VkOptions { device_name: name, ..Default::default() })?;
    println!("device: {}", ctx.describe());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let (rows, cols) = (8192, 2048);
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_K, WeightFormat::I8Row, WeightFormat::F16, WeightFormat::F32] {
        let bytes = random_rows(format, rows, cols, &mut seed);
        let w = ctx.upload_matrix(format, rows, cols, &bytes)?;
        let x = ctx.upload_f32(&vec![0.25; 512 * cols])?;
        let y = ctx.f32_buffer(512 * rows)?;
        // GEMV: many dispatches in one frame, after a warm-up frame.
        let reps = 200;
        for pass in 0..2 {
            let mut f = ctx.frame()?;
            for _ in 0..if pass == 0 { 5 } else { reps } {
                f.matmul(&w, x.view(0, cols), 1, y.view(0, rows))?;
            }
            let t = Instant::now();
            f.run()?;
            if pass == 1 {
                let s = t.elapsed().as_secs_f64();
                let gbs = (w.device_bytes() * reps) as f64 / s / 1e9;
                println!("{format:6} GEMV {rows}x{cols}: {:8.1} us/op, {gbs:7.1} GB/s of weights", s / reps as f64 * 1e6);
            }
        }
        for n in [32usize, 512] {
            let reps = if n == 512 { 10 } else { 50 };
            for pass in 0..2 {
                let mut f = ctx.frame()?;
                for _ in 0..if pass == 0 { 1 } else { reps } {
                    f.matmul(&w, x.view(0, n * cols), n, y.view(0, n * rows))?;
                }
                let t = Instant::now();
                f.run()?;
                if pass == 1 {
                    let s = t.elapsed().as_secs_f64();
                    let gflops = 2.0 * (rows * cols * n * reps) as f64 / s / 1e9;
                    println!("{format:6} GEMM {rows}x{cols} n={n:3}: {:8.1} us/op, {gflops:7.1} GFLOP/s", s / reps as f64 * 1e6);
                }
            }
        }
    }
    println!("dispatches: {}", ctx.dispatches());
    Ok(())
}
