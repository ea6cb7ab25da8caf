//! `coli exec`: load a model, run a prompt, stream the generated text to stdout, and report
//! prompt and decode tokens/s on stderr. Only the generated text goes to stdout. This file
//! parses flags and prints; loading and generating are `coli_runtime::engine::Engine`'s.

use crate::checks::{self, OutputFile};
use crate::engine_args::{heading, message, DeviceArgs, ModelArgs, DEFAULT_CHUNK};
use crate::progress::Progress;
use crate::tier_args::TierArgs;
use clap::Args;
use coli_compiler::Options;
use coli_runtime::cpu::Precision;
use coli_runtime::engine::{Engine, EngineOptions, Prompt, Stage};
use coli_runtime::generate::{GenerateOptions, StopReason};
use coli_runtime::model::LoadOptions;
use coli_runtime::sample::{SampleError, Sampler, SamplerConfig};
use std::io::Write;
use std::time::Instant;

/// The context compiled for without `--ctx`; sessions take the model's own when shorter.
const DEFAULT_CONTEXT: usize = 8192;

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(short = 'p', long, conflicts_with = "prompt_ids", help_heading = heading::GENERATION)]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma separated (no tokenizer involved).
    #[arg(long, value_delimiter = ',', help_heading = heading::GENERATION)]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128, help_heading = heading::GENERATION)]
    pub max_tokens: usize,
    /// Wrap the prompt in the checkpoint's chat template as a user message.
    #[arg(long, help_heading = heading::GENERATION)]
    pub chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat", help_heading = heading::GENERATION)]
    pub system: Option<String>,
    /// The sampler's random seed.
    #[arg(long, default_value_t = 0, help_heading = heading::GENERATION)]
    pub seed: u64,
    /// Sampling temperature; 0 = greedy. Default: the checkpoint's generation_config.json
    /// (greedy unless it says do_sample), else 0.
    #[arg(long, help_heading = heading::GENERATION)]
    pub temperature: Option<f32>,
    /// Sample among the k most likely tokens only; 0 = all. Default: the checkpoint's
    /// generation_config.json, else 40.
    #[arg(long, help_heading = heading::GENERATION)]
    pub top_k: Option<usize>,
    /// Sample among the most likely tokens whose probabilities reach this; 1 = all. Default:
    /// the checkpoint's generation_config.json, else 0.95.
    #[arg(long, help_heading = heading::GENERATION)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than this times the most likely one; 0 = none. Default: the
    /// checkpoint's generation_config.json, else 0.05.
    #[arg(long, help_heading = heading::GENERATION)]
    pub min_p: Option<f32>,
    /// Above 1, discourages repeating the recent tokens; 1 = off. Default: the checkpoint's
    /// generation_config.json, else 1.
    #[arg(long, help_heading = heading::GENERATION)]
    pub repeat_penalty: Option<f32>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long, help_heading = heading::GENERATION)]
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long, help_heading = heading::GENERATION)]
    pub ignore_eos: bool,
    /// Context length (default: the checkpoint's, at most 8192).
    #[arg(long, value_parser = checks::context, help_heading = heading::GENERATION)]
    pub ctx: Option<usize>,
    /// Prompt rows per forward.
    #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = checks::rows, help_heading = heading::GENERATION)]
    pub chunk: usize,
    /// Multiply quantized weights with f32 activations (slower; matches dequantized references).
    #[arg(long, help_heading = heading::GENERATION)]
    pub exact: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub second: crate::device2_args::SecondDeviceArgs,
    #[command(flatten)]
    pub dense: crate::dense_args::DenseArgs,
    #[command(flatten)]
    pub tier: TierArgs,
    #[command(flatten)]
    pub kv: crate::kv_args::KvSplitArgs,
    /// Write the logits of every prompt position and generated step as JSON.
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub logits_out: Option<std::path::PathBuf>,
}

/// coli's own sampling defaults (greedy), under the checkpoint's and the flags.
fn front_defaults() -> SamplerConfig {
    SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
}

impl ExecArgs {
    /// The sampler: the flags given, over `base`.
    fn sampler(&self, base: &SamplerConfig) -> Result<Sampler, String> {
        Sampler::new(SamplerConfig {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repetition_penalty: self.repeat_penalty.unwrap_or(base.repetition_penalty),
            seed: self.seed,
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
        })
    }
}

pub fn run(a: ExecArgs) -> Result<(), String> {
    // 0. What can be checked before anything loads: the prompt, the sampler's settings, the
    //    logits file (opened now, written at the end), the model's path.
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        return Err("give a prompt: --prompt \"...\" or --prompt-ids 1,2,3".into());
    }
    // The sampler is made again after the load, over the checkpoint's defaults: the flags
    // are checked now, over coli's.
    a.sampler(&front_defaults())?;
    let logits_out = a.logits_out.as_deref().map(|p| OutputFile::open(p, "--logits-out")).transpose()?;
    let model_path = a.model.resolve()?;

    // 1. Load, with progress bars on a terminal.
    let t0 = Instant::now();
    let reading = Progress::new("tensors");
    reading.step("loading");
    // One upload bar per device (and per retry with a layer fewer), each made when it starts.
    let mut uploading: Option<Progress> = None;
    let mut progress = |stage: Stage, done: usize, total: usize| match stage {
        Stage::ReadWeights => reading.update(done, total),
        Stage::Upload | Stage::WarmStart => {
            let bar = uploading.get_or_insert_with(|| {
                let (unit, step) = if stage == Stage::Upload {
                    ("tensors", "uploading")
                } else {
                    ("experts", "warming the expert tier")
                };
                let p = Progress::new(unit);
                p.step(step);
                p
            });
            bar.update(done, total);
            if done >= total {
                uploading = None;
            }
        }
    };
    let quantizing = Progress::bytes("quantizing");
    let vk = a.device.vk_options();
    let opts = EngineOptions {
        spec: a.model.spec.clone(),
        load: LoadOptions {
            quantize: a.model.quantize.map(|q| q.format()),
            progress: a.model.quantize.is_some().then(|| quantizing.hook()),
        },
        compile: a.second.apply(a.kv.apply(Options {
            context: a.ctx.unwrap_or(DEFAULT_CONTEXT),
            chunk_rows: a.chunk,
            device_layers: a.device.device_layers,
            resident_experts: !a.tier.sized(),
            ..Options::default()
        })),
        second_device: a.second.options(&vk),
        device: a.device.request(vk),
        tier: a.tier.options(&model_path, true),
        host_copies: a.dense.host_copies(),
        ..EngineOptions::default()
    };
    let engine = Engine::load_with_progress(&model_path, &opts, &mut progress).map_err(message)?;
    tracing::info!("{}", engine.device_note());
    if let Some(k) = engine.kv_split() {
        tracing::info!("{k}");
    }
    if let Some(t) = engine.tier_line() {
        tracing::info!("{t}");
    }
    tracing::info!("{} ({}) loaded in {:.2}s", model_path.display(), engine.summary(), t0.elapsed().as_secs_f64());

    // 2. The sampler: the flags over the checkpoint's generation_config.json, over coli's
    //    defaults; the prompt's ids.
    let mut sampler = a.sampler(&engine.generation_defaults().sampler(front_defaults()))?;
    if let Some(src) = &engine.generation_defaults().source {
        tracing::debug!("sampling {:?} (defaults from {})", sampler.config(), src.display());
    }
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => Prompt::Ids(ids),
        (None, Some(text)) if a.chat => Prompt::Chat { system: a.system.as_deref(), user: text },
        (None, text) => Prompt::Text(text.as_deref().unwrap_or_default()),
    };
    let ids = engine.prompt_ids(&prompt).map_err(message)?;

    // 3. Generate.
    let ctx = a.ctx.unwrap_or_else(|| engine.default_context());
    let mut session = engine.session_with_context(ctx).map_err(message)?;
    if a.exact {
        session.set_precision(Precision::Exact);
    }
    let gen = GenerateOptions {
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
    let g = engine.generate(&mut session, &mut sampler, &ids, &gen, &mut on_text).map_err(message)?;
    let has_tokenizer = engine.tokenizer().is_some();
    if has_tokenizer {
        println!();
        crate::log::note_stdout("\n");
    }
    if let Some(n) = session.take_notice() {
        tracing::warn!("{n}");
    }
    if !has_tokenizer {
        println!("{}", g.generated.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    }
    if let Some(d) = engine.device() {
        if let Some(line) = d.tier_summary() {
            tracing::info!("{line}");
        }
        if let Err(e) = d.save_tier_history() {
            tracing::warn!("the routing history was not saved: {e}");
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
