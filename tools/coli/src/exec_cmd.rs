//! `coli exec`: load a model, run a prompt, stream the generated text to stdout, and report
//! prompt and decode tokens/s on stderr. Only the generated text goes to stdout. This file
//! parses flags and prints; loading and generating are `coli_runtime::engine::Engine`'s.

use crate::checks::OutputFile;
use crate::engine_args::{heading, message};
use crate::load_args::LoadArgs;
use crate::sampling_args::SamplingArgs;
use crate::speculate_args::SpeculateArgs;
use clap::Args;
use coli_runtime::cpu::Precision;
use coli_runtime::engine::Prompt;
use coli_runtime::generate::{GenerateOptions, StopReason};
use coli_runtime::sample::{Sampler, SamplerConfig};
use std::io::Write;

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub load: LoadArgs,
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
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long, help_heading = heading::GENERATION)]
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long, help_heading = heading::GENERATION)]
    pub ignore_eos: bool,
    /// Multiply quantized weights with f32 activations (slower; matches dequantized references).
    #[arg(long, help_heading = heading::GENERATION)]
    pub exact: bool,
    /// Write the logits of every prompt position and generated step as JSON.
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub logits_out: Option<std::path::PathBuf>,
}

/// coli's own sampling defaults (greedy), under the checkpoint's and the flags.
fn front_defaults() -> SamplerConfig {
    SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
}

pub fn run(a: ExecArgs) -> Result<(), String> {
    // 0. What can be checked before anything loads: the prompt, the sampler's settings, the
    //    logits file (opened now, written at the end), the model's path.
    if a.prompt.is_none() && a.prompt_ids.is_none() {
        return Err("give a prompt: --prompt \"...\" or --prompt-ids 1,2,3".into());
    }
    // The sampler is made again after the load, over the checkpoint's defaults: the flags
    // are checked now, over coli's.
    a.sampling.config(&front_defaults())?;
    let logits_out = a.logits_out.as_deref().map(|p| OutputFile::open(p, "--logits-out")).transpose()?;

    // 1. Load, with progress bars on a terminal.
    let (engine, _) = a.load.load_for(a.speculate.wants_draft())?;

    // 2. The sampler: the flags over the checkpoint's generation_config.json, over coli's
    //    defaults; the prompt's ids.
    let mut sampler = Sampler::new(a.sampling.config(&engine.generation_defaults().sampler(front_defaults()))?)
        .map_err(|e| e.to_string())?;
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
    let ctx = a.load.context(&engine);
    let mut session = engine.session_with_context(ctx).map_err(message)?;
    if a.exact {
        session.set_precision(Precision::Exact);
    }
    let gen = GenerateOptions {
        max_new_tokens: a.max_tokens,
        chunk_rows: a.load.chunk,
        stop_strings: a.stop.clone(),
        record_logits: logits_out.is_some(),
        stop_at_eos: !a.ignore_eos,
        speculation: a.speculate.speculation(),
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
    if let Some(line) = engine.ram_summary() {
        tracing::info!("{line}");
    }
    if let Some(line) = g.speculation.summary(&gen.speculation) {
        tracing::info!("{line}");
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
