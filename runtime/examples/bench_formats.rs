//! Throughput of the weight-format kernels, without a benchmark framework: single-thread
//! `dot_row` (f32 activations) and q8 dot products per format, parallel `matmul` for decode
//! (n = 1) and prefill shapes, and, when the SmolLM2-135M Q4_1 GGUF is present, the time of all
//! of one decode token's matmuls (30 layers x 7 Linear + the tied output) on its real tensors;
//! `--dram`: decode from matrices past the caches; `--prompt`: prompt-shaped matmuls on one thread.
//!
//! Run: `cargo run --release -p coli-runtime --example bench_formats [-- [--model-only] [--dram] [--prompt] [model.gguf]]`
//! Must not: be used by tests; it only prints.

mod support;

use coli_runtime::format::{
    dot_row, dot_row_q8, kernel_level, matmul, matmul_q, pool, quantize, Matrix, QuantizedActs, WeightFormat,
};
use coli_runtime::model::{Checkpoint, LoadOptions};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;
use support::{time, values};

/// Stored rows of a format: encoded where coli can, random blocks (f16 scales 0.01) otherwise.
fn rows_of(format: WeightFormat, rows: usize, cols: usize) -> Vec<u8> {
    // MXFP4's scale is its E8M0 byte (set below: 2^-7).
    let scales = format.f16_fields();
    if scales.is_empty() && format != WeightFormat::MXFP4 {
        return quantize(format, &values(rows * cols, 7), cols).unwrap();
    }
    let mut b: Vec<u8> = (0..rows * format.row_bytes(cols).unwrap())
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3])
        .collect();
    for blk in b.chunks_exact_mut(format.block_bytes()) {
        if format == WeightFormat::MXFP4 {
            blk[0] = 121;
        }
        for &at in scales {
            format.set_f16_field(blk, at, half::f16::from_f32(0.01).to_bits());
        }
    }
    b
}

fn gbs(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let threads = rayon::current_num_threads();
    println!("kernel level: {}, rayon threads: {threads}", kernel_level());
    let formats = [
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_K,
        WeightFormat::Q6_K,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q5_K,
        WeightFormat::IQ4_NL,
        WeightFormat::IQ4_XS,
        WeightFormat::IQ2_XXS,
        WeightFormat::IQ2_XS,
        WeightFormat::IQ2_S,
        WeightFormat::IQ3_XXS,
        WeightFormat::IQ3_S,
        WeightFormat::IQ1_S,
        WeightFormat::IQ1_M,
        WeightFormat::MXFP4,
        WeightFormat::I8Row,
        WeightFormat::I4G64,
        WeightFormat::BF16,
        WeightFormat::F32,
    ];
    let short = Duration::from_millis(60);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model_only = args.iter().any(|a| a == "--model-only");
    let path_arg = args.iter().find(|a| !a.starts_with("--")).map(PathBuf::from);
    if !model_only {
        synthetic(&formats, short);
    }
    if args.iter().any(|a| a == "--dram") {
        dram();
    }
    if args.iter().any(|a| a == "--prompt") {
        prompt();
    }
    model_budget(path_arg);
}

/// Prompt-shaped q8 matmuls on one thread (the tiles' path on an AMX CPU): a power-of-two
/// height (OLMoE's expert, whose output rows are 4 KiB apart) and SmolLM2's MLP.
fn prompt() {
    println!("\n## one thread, prompt rows (GMAC/s)");
    for (rows, cols) in [(1024usize, 2048usize), (1536, 576)] {
        for f in [WeightFormat::Q8_0, WeightFormat::I8Row, WeightFormat::Q4_0, WeightFormat::Q4_1] {
            let bytes = quantize(f, &values(rows * cols, 7), cols).unwrap();
            let m = Matrix::new(f, rows, cols, &bytes).unwrap();
            for n in [64usize, 512] {
                let x = values(n * cols, 9);
                let mut out = vec![0f32; n * rows];
                // `inline`: the kernels' own thread team stays out of it too.
                let t = time(Duration::from_millis(200), || pool::inline(|| matmul(&m, black_box(&x), n, &mut out)));
                let gmac = (n * rows * cols) as f64 / t.as_secs_f64() / 1e9;
                println!("{:<6} {rows}x{cols} n={n:<4} {gmac:7.1}", f.name());
            }
        }
    }
}

/// Matrices larger than the last-level cache: decode matmul from DRAM.
fn dram() {
    println!("\n## decode from DRAM: one matrix of 64 MB and more, n = 1 (GB/s of weight bytes)");
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for (f, cols) in [
        (WeightFormat::Q4_1, 576usize),
        (WeightFormat::Q8_0, 576),
        (WeightFormat::Q4_1, 2048),
        (WeightFormat::I8Row, 576),
    ] {
        let rows = (64usize << 20) / f.row_bytes(cols).unwrap();
        let bytes = rows_of(f, rows, cols);
        let m = Matrix::new(f, rows, cols, &bytes).unwrap();
        let x = values(cols, 1);
        let mut out = vec![0f32; rows];
        let t1 = one.install(|| time(Duration::from_millis(300), || matmul(&m, black_box(&x), 1, &mut out)));
        let t2 = time(Duration::from_millis(300), || matmul(&m, black_box(&x), 1, &mut out));
        println!(
            "{:<6} {rows}x{cols}: 1 thread {:.1} GB/s, all threads {:.1} GB/s",
            f.name(),
            gbs(bytes.len(), t1),
            gbs(bytes.len(), t2)
        );
    }
}

fn synthetic(formats: &[WeightFormat], short: Duration) {
    println!("\n## single thread, one 576 x 1536 matrix (GB/s of weight bytes, ns per row)");
    println!("{:<6} {:>16} {:>16} {:>16}", "format", "dot_row f32", "dot_row_q8", "matmul 1 thread");
    let (rows, cols) = (576, 1536);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for &f in formats {
        let bytes = rows_of(f, rows, cols);
        let m = Matrix::new(f, rows, cols, &bytes).unwrap();
        let x = values(cols, 3);
        let acts = QuantizedActs::new(&x, 1, cols).unwrap();
        let tf = time(short, || {
            for r in 0..rows {
                black_box(dot_row(f, m.row(r), black_box(&x)));
            }
        });
        let tq = time(short, || {
            for r in 0..rows {
                black_box(dot_row_q8(f, m.row(r), black_box(acts.row(0))));
            }
        });
        let mut out = vec![0f32; rows];
        let tm = one.install(|| time(short, || matmul(&m, black_box(&x), 1, &mut out)));
        let per = |t: Duration| t.as_nanos() as f64 / rows as f64;
        println!(
            "{:<6} {:>7.2} {:>6.0}ns {:>7.2} {:>6.0}ns {:>7.2} {:>6.0}ns",
            f.name(),
            gbs(bytes.len(), tf),
            per(tf),
            gbs(bytes.len(), tq),
            per(tq),
            gbs(bytes.len(), tm),
            per(tm)
        );
    }

    println!("\n## matmul (all threads): microseconds per call, GB/s of weight bytes");
    println!("{:<6} {:>12} {:>18} {:>18} {:>18}", "format", "shape", "n=1", "n=8", "n=64");
    for f in [
        WeightFormat::Q4_1,
        WeightFormat::Q8_0,
        WeightFormat::I8Row,
        WeightFormat::I4G64,
        WeightFormat::Q4_K,
        WeightFormat::BF16,
    ] {
        for &(rows, cols) in &[(576usize, 576usize), (1536, 576), (576, 1536), (8192, 576)] {
            if f.row_bytes(cols).is_err() {
                continue;
            }
            let bytes = rows_of(f, rows, cols);
            let m = Matrix::new(f, rows, cols, &bytes).unwrap();
            let mut line = format!("{:<6} {:>12}", f.name(), format!("{rows}x{cols}"));
            for n in [1usize, 8, 64] {
                let x = values(n * cols, 5);
                let mut out = vec![0f32; n * rows];
                let t = time(short, || matmul(&m, black_box(&x), n, &mut out));
                line += &format!(" {:>9.1}us {:>5.1}GB/s", t.as_secs_f64() * 1e6, gbs(bytes.len(), t));
            }
            println!("{line}");
        }
    }
}

fn model_budget(path_arg: Option<PathBuf>) {
    let path = path_arg.or_else(|| {
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    let Some(ck) = path.filter(|p| p.is_file()).and_then(|p| Checkpoint::open(&p, &LoadOptions::default()).ok()) else {
        println!("\n(SmolLM2 GGUF absent: skipping the real-model decode budget)");
        return;
    };
    let meta = ck.gguf_metadata().unwrap();
    let layers = meta.get_u64("llama.block_count").unwrap_or(0) as usize;
    let mut mats = Vec::new();
    for l in 0..layers {
        for role in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
            mats.push(ck.tensor(&format!("blk.{l}.{role}.weight")).unwrap());
        }
    }
    let out_name = if ck.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    mats.push(ck.tensor(out_name).unwrap());
    let total_bytes: usize = mats.iter().map(|t| t.bytes().len()).sum();
    let mut counts = std::collections::BTreeMap::new();
    for t in &mats {
        *counts.entry(t.format.name()).or_insert(0usize) += 1;
    }
    println!(
        "\n## {}: one decode token's {} matmuls ({:.1} MB of weights; formats {counts:?})",
        ck.path().display(),
        mats.len(),
        total_bytes as f64 / 1e6
    );
    for n in [1usize, 16] {
        let xs: Vec<Vec<f32>> = mats.iter().map(|t| values(n * t.as_matrix().cols, 9)).collect();
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|t| vec![0f32; n * t.as_matrix().rows]).collect();
        let t = time(Duration::from_millis(300), || {
            for ((m, x), o) in mats.iter().zip(&xs).zip(outs.iter_mut()) {
                matmul(&m.as_matrix(), x, n, o);
            }
        });
        println!(
            "n={n:<3} {:>8.3} ms per forward = {:>7.1} forwards/s ({:>6.1} tokens/s), {:.1} GB/s of weights",
            t.as_secs_f64() * 1e3,
            1.0 / t.as_secs_f64(),
            n as f64 / t.as_secs_f64(),
            gbs(total_bytes, t)
        );
    }
    // Quantize once, share across matrices with the same input width (what an executor can do).
    let x = values(576, 11);
    let acts = QuantizedActs::new(&x, 1, 576).unwrap();
    let t = time(Duration::from_millis(200), || {
        for m in mats.iter().filter(|t| t.as_matrix().cols == 576) {
            let mm = m.as_matrix();
            let mut o = vec![0f32; mm.rows];
            matmul_q(&mm, &acts, &mut o);
            black_box(&o);
        }
    });
    println!(
        "matmul_q over the {} 576-column matrices with shared activations: {:.3} ms",
        mats.iter().filter(|t| t.as_matrix().cols == 576).count(),
        t.as_secs_f64() * 1e3
    );
}
