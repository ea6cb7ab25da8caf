//! Speed of the Vulkan path on the device this machine has. Prints the device line first, so
//! a run that fell back to another device is visible.
//!
//! - `vk_bench [kernels] [device name]`: throughput of the matrix kernels at the OLMoE-1B-7B
//!   geometry (hidden 2048, expert FFN 1024, a 8192-row projection): the decode GEMV (weight
//!   bytes read per second) and the tiled GEMM (GFLOP/s) for a few weight formats, back to
//!   back in one frame (not a model benchmark: one matrix, no host steps).
//! - `vk_bench model DIR [-p N] [-n N] [-r N] [--quantize i8|i4] [--profile]`: a checkpoint
//!   run through its plan on the device as `coli bench` runs it (prompt of `-p` tokens in one
//!   forward, `-n` decode steps; medians of `-r` repetitions), with what one decode token
//!   costs: dispatches, barriers, submits, host time recording and waiting; `--profile` adds
//!   the device time per kernel (timestamp queries) of one prompt and of the decode steps.
//! - `vk_bench random DIR [LAYERS]`: writes a random bf16 checkpoint of the SmolLM2-135M
//!   geometry (30 layers unless given) to DIR, for the above where torch is missing.
//!
//! Usage: `cargo run --release -p coli-runtime --example vk_bench -- model /tmp/smollm2 --profile`.

use coli_compiler::{compile, Options, Spec};
use coli_runtime::exec::chain::Chain;
use coli_runtime::exec::probe::profile_of;
use coli_runtime::exec::{LogitRows, Model, Session};
use coli_runtime::format::{fp16, quantize, WeightFormat};
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::vk::{Context, VkOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("model") => model(&args[1..]),
        Some("random") => random(&args[1..]),
        Some("kernels") => kernels(args.get(1).cloned()),
        _ => kernels(args.first().cloned()),
    }
}

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Loaded {
    model: Model,
    dev: Chain,
    ctx: Context,
}

fn load(
    dir: &Path,
    quant: Option<WeightFormat>,
    context: usize,
    chunk: usize,
    profile: bool,
) -> Result<Loaded, Box<dyn std::error::Error>> {
    let ckpt = Checkpoint::open(dir, &LoadOptions { quantize: quant, ..Default::default() })?;
    let bindings = ckpt.bindings();
    let arch = bindings.architecture().ok_or("the checkpoint names no architecture")?.to_string();
    let graphs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs");
    let graphs = if graphs.is_dir() { graphs } else { PathBuf::from("graphs") };
    let spec_path = coli_compiler::spec::spec_for_architecture(&graphs, &arch)
        .ok_or(format!("no spec under graphs/ serves {arch}"))?;
    let spec = Spec::load(&spec_path).map_err(|d| d.to_string())?;
    let ctx = Context::new(&VkOptions { profile, ..Default::default() })?;
    let plan = compile(
        &spec,
        &bindings,
        &profile_of(&ctx, None),
        &Options { context, chunk_rows: chunk, ..Options::default() },
    )
    .map_err(|d| d.to_string())?;
    let model = Model::load(&ckpt, plan.program.clone(), &mut |_, _| {})?;
    let dev = Chain::load(vec![ctx.clone()], &plan, &model, &Default::default(), &mut |_, _, _| {})?;
    Ok(Loaded { model, dev, ctx })
}

fn model(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.first().ok_or("vk_bench model DIR")?);
    let (p, n, reps) = (flag(args, "-p", 512), flag(args, "-n", 64), flag(args, "-r", 3).max(1));
    let quant = match args.iter().position(|a| a == "--quantize").and_then(|i| args.get(i + 1)).map(String::as_str) {
        Some("i8") => Some(WeightFormat::I8Row),
        Some("i4") => Some(WeightFormat::I4G64),
        _ => None,
    };
    let profile = args.iter().any(|a| a == "--profile");
    let ctx_len = p + n + 8;
    let l = load(&dir, quant, ctx_len, p.max(1), false)?;
    println!("device: {}", l.ctx.describe());
    let prog = &l.model.program;
    println!(
        "model {} ({}, {} layers, hidden {}, vocab {}), {:.0} MB of weights on the device",
        dir.display(),
        prog.family,
        prog.dims.layers,
        prog.dims.hidden,
        prog.dims.vocab,
        l.dev.weight_bytes() as f64 / 1e6
    );
    let vocab = prog.dims.vocab as u32;
    let ids: Vec<u32> = (0..p.max(1) as u32).map(|i| 10 + (i * 7919) % (vocab - 10)).collect();
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    let mut per_token = None;
    let mut prompt_host = (0.0, 0.0, 0.0);
    for _ in 0..reps {
        let mut s = Session::on_device(&l.model, &l.dev, ctx_len + 1)?;
        let h0 = l.ctx.host_times();
        let t = Instant::now();
        s.forward(&ids, LogitRows::Last)?;
        let dt = t.elapsed().as_secs_f64();
        let h1 = l.ctx.host_times();
        prompt_host = (dt * 1e3, (h1.0 - h0.0) * 1e3, (h1.1 - h0.1) * 1e3);
        pp.push(ids.len() as f64 / dt);
        let mut s = Session::on_device(&l.model, &l.dev, ctx_len + 1)?;
        s.forward(&ids[..1], LogitRows::Last)?;
        let (d0, s0, h0) = (l.ctx.dispatches(), l.ctx.submits(), l.ctx.host_times());
        let t = Instant::now();
        for i in 0..n {
            s.forward(&[ids[(i + 1) % ids.len()]], LogitRows::Last)?;
        }
        let dt = t.elapsed().as_secs_f64();
        tg.push(n as f64 / dt);
        let h1 = l.ctx.host_times();
        let k = n.max(1) as f64;
        per_token = Some((
            (l.ctx.dispatches() - d0) as f64 / k,
            (l.ctx.submits() - s0) as f64 / k,
            (h1.0 - h0.0) / k * 1e6,
            (h1.1 - h0.1) / k * 1e6,
            dt / k * 1e6,
        ));
        if s.take_notice().is_some() {
            return Err("the device failed during the run".into());
        }
    }
    println!("pp{p}: {:.1} tok/s, tg{n}: {:.1} tok/s (medians of {reps})", median(pp), median(tg));
    println!(
        "prompt forward: {:.1} ms, of which host {:.1} ms recording + {:.1} ms waiting",
        prompt_host.0, prompt_host.1, prompt_host.2
    );
    if let Some((d, sub, rec, wait, all)) = per_token {
        println!("per decode token: {d:.0} dispatches, {sub:.1} submits, host {rec:.0} us recording + {wait:.0} us waiting of {all:.0} us");
    }
    if profile {
        drop(l);
        let l = load(&dir, quant, ctx_len, p.max(1), true)?;
        let mut s = Session::on_device(&l.model, &l.dev, ctx_len + 1)?;
        s.forward(&ids[..1], LogitRows::Last)?;
        l.ctx.take_profile();
        let mut s2 = Session::on_device(&l.model, &l.dev, ctx_len + 1)?;
        s2.forward(&ids, LogitRows::Last)?;
        report(&format!("prompt of {p} (one forward)"), &l.ctx.take_profile(), 1.0);
        for i in 0..n {
            s2.forward(&[ids[(i + 1) % ids.len()]], LogitRows::Last)?;
        }
        report(&format!("decode (per token, mean of {n})"), &l.ctx.take_profile(), n.max(1) as f64);
        drop(s);
    }
    Ok(())
}

fn report(what: &str, prof: &[(String, u64, f64)], per: f64) {
    let total: f64 = prof.iter().map(|p| p.2).sum();
    println!("device time, {what}: {:.1} us", total / per * 1e6);
    for (k, cnt, t) in prof.iter().take(14) {
        println!(
            "  {k:28} {:6.1} x {:8.2} us = {:8.1} us ({:4.1}%)",
            *cnt as f64 / per,
            t / *cnt as f64 * 1e6,
            t / per * 1e6,
            100.0 * t / total
        );
    }
}

/// A random bf16 checkpoint of SmolLM2-135M's geometry (values of about 0.01; norms 1).
fn random(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.first().ok_or("vk_bench random DIR [LAYERS]")?);
    let layers: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(30);
    let (hidden, ffn, heads, kv_heads, vocab) = (576usize, 1536usize, 9usize, 3usize, 49152usize);
    let hd = hidden / heads;
    let mut tensors: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![vocab, hidden]), ("model.norm.weight".into(), vec![hidden])];
    for i in 0..layers {
        let l = format!("model.layers.{i}");
        tensors.push((format!("{l}.input_layernorm.weight"), vec![hidden]));
        tensors.push((format!("{l}.post_attention_layernorm.weight"), vec![hidden]));
        tensors.push((format!("{l}.self_attn.q_proj.weight"), vec![heads * hd, hidden]));
        tensors.push((format!("{l}.self_attn.k_proj.weight"), vec![kv_heads * hd, hidden]));
        tensors.push((format!("{l}.self_attn.v_proj.weight"), vec![kv_heads * hd, hidden]));
        tensors.push((format!("{l}.self_attn.o_proj.weight"), vec![hidden, heads * hd]));
        tensors.push((format!("{l}.mlp.gate_proj.weight"), vec![ffn, hidden]));
        tensors.push((format!("{l}.mlp.up_proj.weight"), vec![ffn, hidden]));
        tensors.push((format!("{l}.mlp.down_proj.weight"), vec![hidden, ffn]));
    }
    let mut header = String::from("{");
    let mut off = 0usize;
    for (i, (name, shape)) in tensors.iter().enumerate() {
        let bytes = shape.iter().product::<usize>() * 2;
        let sep = if i == 0 { "" } else { "," };
        header += &format!(
            "{sep}\"{name}\":{{\"dtype\":\"BF16\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}",
            off + bytes
        );
        off += bytes;
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    std::fs::create_dir_all(&dir)?;
    let mut out = Vec::with_capacity(8 + header.len() + off);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for (name, shape) in &tensors {
        let count: usize = shape.iter().product();
        let one = half::bf16::from_f32(1.0).to_bits();
        for _ in 0..count {
            let v = if shape.len() == 1 {
                one
            } else {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                half::bf16::from_f32(((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04).to_bits()
            };
            out.extend_from_slice(&v.to_le_bytes());
        }
        let _ = name;
    }
    std::fs::write(dir.join("model.safetensors"), out)?;
    let config = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": {hidden}, "intermediate_size": {ffn},
 "num_hidden_layers": {layers}, "num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}, "vocab_size": {vocab},
 "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": true, "torch_dtype": "bfloat16"}}"#
    );
    std::fs::write(dir.join("config.json"), config)?;
    println!("wrote {} ({layers} layers, {:.0} MB)", dir.display(), off as f64 / 1e6);
    Ok(())
}

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
            let (size, at): (usize, &[usize]) =
                if format == WeightFormat::Q4_K { (144, &[0, 2]) } else { (210, &[208]) };
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

fn kernels(name: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
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
                println!(
                    "{format:6} GEMV {rows}x{cols}: {:8.1} us/op, {gbs:7.1} GB/s of weights",
                    s / reps as f64 * 1e6
                );
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
                    println!(
                        "{format:6} GEMM {rows}x{cols} n={n:3}: {:8.1} us/op, {gflops:7.1} GFLOP/s",
                        s / reps as f64 * 1e6
                    );
                }
            }
        }
    }
    println!("dispatches: {}", ctx.dispatches());
    Ok(())
}
