//! `coli exec`: load a model, run a prompt, stream the generated text to stdout, and report
//! prompt and decode tokens/s on stderr. Only the generated text goes to stdout.

use crate::checks::{self, OutputFile};
use crate::default_model;
use crate::load::{load, DeviceRequest, LoadRequest};
use crate::progress::Progress;
use crate::tier_args::TierArgs;
use clap::{Args, ValueEnum};
use coli_compiler::Options;
use coli_runtime::cpu::Precision;
use coli_runtime::exec::Session;
use coli_runtime::format::WeightFormat;
use coli_runtime::generate::{generate, GenerateOptions, StopReason};
use coli_runtime::model::LoadOptions;
use coli_runtime::sample::{SampleError, Sampler, SamplerConfig};
use coli_runtime::text::ChatMessage;
use coli_runtime::vk::{FaultInjection, VkOptions};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    Cpu,
    Vulkan,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuantChoice {
    /// int8 rows, one scale per row
    I8,
    /// int4 in groups of 64
    I4,
}

impl QuantChoice {
    /// The load-time format the choice names.
    pub fn format(self) -> WeightFormat {
        match self {
            QuantChoice::I8 => WeightFormat::I8Row,
            QuantChoice::I4 => WeightFormat::I4G64,
        }
    }
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// A model directory (safetensors + config.json) or a .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The architecture spec; default: the built-in spec serving the checkpoint's architecture.
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma separated (no tokenizer involved).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// Wrap the prompt in the checkpoint's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Where to run: the CPU, a Vulkan GPU, or a GPU when there is one.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Write the logits of every prompt position and generated step as JSON.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Context length (default: the checkpoint's, at most 8192).
    #[arg(long, value_parser = checks::context)]
    pub ctx: Option<usize>,
    /// Prompt rows per forward.
    #[arg(long, default_value_t = 64, value_parser = checks::rows)]
    pub chunk: usize,
    /// Quantize f32/f16/bf16 matrices at load.
    #[arg(long, value_enum)]
    pub quantize: Option<QuantChoice>,
    /// Use at most this many MiB of device memory (a big device behaves like a small one).
    #[arg(long, value_parser = checks::device_mib)]
    pub device_mem_mib: Option<u64>,
    /// Pick the Vulkan device whose name contains this.
    #[arg(long)]
    pub device_name: Option<String>,
    /// Keep this many layers on the device (instead of the most that fit).
    #[arg(long)]
    pub device_layers: Option<usize>,
    #[command(flatten)]
    pub kv: crate::kv_args::KvSplitArgs,
    #[command(flatten)]
    pub second: crate::device2_args::SecondDeviceArgs,
    #[command(flatten)]
    pub dense: crate::dense_args::DenseArgs,
    /// Fault injection for tests: the device fails at its n-th submit.
    #[arg(long, hide = true)]
    pub fail_submit: Option<u64>,
    /// Multiply quantized weights with f32 activations (slower; matches dequantized references).
    #[arg(long)]
    pub exact: bool,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub tier: TierArgs,
}

pub fn run(a: ExecArgs) -> Result<(), String> {
    // 0. What can be checked before anything loads: the prompt, the sampler's settings, the
    //    logits file (opened now, written at the end), the model's path.
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        return Err("give a prompt: --prompt \"...\" or --prompt-ids 1,2,3".into());
    }
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repeat_penalty,
        seed: a.seed,
    })
    .map_err(|e| {
        let flag = match e {
            SampleError::Temperature(_) => "--temperature",
            SampleError::TopP(_) => "--top-p",
            SampleError::MinP(_) => "--min-p",
            SampleError::RepetitionPenalty(_) => "--repeat-penalty",
            SampleError::Empty => "sampling",
        };
        format!("{flag}: {e}")
    })?;
    let logits_out = a.logits_out.as_deref().map(|p| OutputFile::open(p, "--logits-out")).transpose()?;
    if let Some(s) = &a.spec {
        checks::spec_path(s, "--spec")?;
    }
    let model_path = match &a.model {
        Some(p) => {
            checks::model_path(p)?;
            p.clone()
        }
        None => default_model::ensure()?,
    };

    // 1. Load, with a progress bar on a terminal.
    let t0 = Instant::now();
    let bar = Progress::new("tensors");
    bar.step("loading");
    let mut progress = |done: usize, total: usize| bar.update(done, total);
    let quantizing = Progress::bytes("quantizing");
    let load_opts = LoadOptions {
        quantize: a.quantize.map(QuantChoice::format),
        progress: a.quantize.is_some().then(|| quantizing.hook()),
    };
    let vk = VkOptions {
        device_name: a.device_name.clone(),
        memory_cap: a.device_mem_mib.map(|m| m << 20),
        fault: a.fail_submit.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None }),
        ..Default::default()
    };
    let second_device = a.second.options(&vk);
    let device = match a.device {
        DeviceChoice::Cpu => DeviceRequest::Cpu,
        DeviceChoice::Vulkan => DeviceRequest::Vulkan(vk),
        DeviceChoice::Auto => DeviceRequest::Auto(vk),
    };
    let ctx_len = a.ctx.unwrap_or(8192);
    let compile = a.second.apply(a.kv.apply(Options {
        context: ctx_len,
        chunk_rows: a.chunk,
        device_layers: a.device_layers,
        resident_experts: !a.tier.sized(),
        ..Options::default()
    }));
    let loaded = load(LoadRequest {
        model: &model_path,
        spec: a.spec.as_deref(),
        load: load_opts,
        compile,
        profile: None,
        device,
        second_device,
        tier: a.tier.options(&model_path, true),
        dense_device_only: a.dense.choice(),
        progress: Some(&mut progress),
        check_plan: None,
    })?;
    tracing::info!("{}", loaded.device_note);
    if let (Some(_), Some(k)) = (&loaded.device, &loaded.plan.placement.kv_split) {
        tracing::info!("{k}");
    }
    if let Some(t) = loaded.device.as_ref().and_then(|d| d.tier_line()) {
        tracing::info!("{t}");
    }
    let p = &loaded.plan.program;
    tracing::info!(
        "{} ({}, {} layers, hidden {}, vocab {}) loaded in {:.2}s",
        model_path.display(),
        p.family,
        p.dims.layers,
        p.dims.hidden,
        p.dims.vocab,
        t0.elapsed().as_secs_f64()
    );

    // 2. The prompt's ids.
    let tok = loaded.tokenizer.as_ref();
    let ids: Vec<u32> = if let Some(ids) = &a.prompt_ids {
        ids.clone()
    } else {
        let text = a.prompt.clone().unwrap_or_default();
        let t = tok.ok_or_else(|| {
            format!(
                "--prompt needs a tokenizer: {}; use --prompt-ids",
                loaded.tokenizer_note.clone().unwrap_or_default()
            )
        })?;
        let text = if a.chat {
            let tmpl = t.chat_template().map_err(|e| format!("--chat: {e}"))?;
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(ChatMessage::system(s.clone()));
            }
            msgs.push(ChatMessage::user(text));
            tmpl.render(&msgs, true).map_err(|e| format!("--chat: {e}"))?
        } else {
            text
        };
        // A chat template writes its own BOS; plain prompts get one when the tokenizer adds it.
        t.encode(&text, !a.chat).map_err(|e| e.to_string())?
    };
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= p.dims.vocab) {
        return Err(format!("token id {bad} is outside the vocabulary of {}", p.dims.vocab));
    }

    // 3. Generate.
    let ctx = a.ctx.unwrap_or_else(|| p.dims.max_context.min(ctx_len)).max(1);
    let mut session = match &loaded.device {
        Some(d) => Session::on_device(&loaded.model, d, ctx).map_err(|e| format!("device: {e}"))?,
        None => Session::new(&loaded.model, ctx),
    };
    if a.exact {
        session.set_precision(Precision::Exact);
    }
    let opts = GenerateOptions {
        max_new_tokens: a.max_tokens,
        chunk_rows: a.chunk,
        stop_strings: a.stop.clone(),
        record_logits: logits_out.is_some(),
        stop_at_eos: !a.ignore_eos,
        ..Default::default()
    };
    let stdout = std::io::stdout();
    let mut on_text = |s: &str| {
        let mut o = stdout.lock();
        let _ = o.write_all(s.as_bytes());
        let _ = o.flush();
        crate::log::note_stdout(s);
    };
    let g = generate(&mut session, tok, &mut sampler, &ids, &opts, &mut on_text).map_err(|e| e.to_string())?;
    if tok.is_some() {
        println!();
        crate::log::note_stdout("\n");
    }
    if let Some(n) = session.take_notice() {
        tracing::warn!("{n}");
    }
    if tok.is_none() {
        println!("{}", g.generated.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    }
    if let Some(d) = &loaded.device {
        if let Some(line) = d.tier_summary() {
            tracing::info!("{line}");
        }
        match d.save_tier_history() {
            Ok(_) => {}
            Err(e) => tracing::warn!("the routing history was not saved: {e}"),
        }
    }
    if g.stop == StopReason::ContextFull {
        tracing::warn!("stopped: the context of {ctx} positions is full (raise it with --ctx)");
    }
    tracing::info!(
        "prompt {} tokens, {:.1} tok/s; decode {} tokens, {:.1} tok/s",
        g.prompt_ids.len(),
        g.prompt_tokens_per_sec(),
        g.generated.len(),
        g.decode_tokens_per_sec()
    );

    // 4. Logits for other tools.
    if let Some(out) = logits_out {
        let json = serde_json::json!({ "prompt_ids": g.prompt_ids, "logits": g.logits, "generated": g.generated });
        out.write(&serde_json::to_vec(&json).map_err(|e| e.to_string())?)?;
    }
    Ok(())
}
