//! The generation loop: the prompt in chunks of rows, then one token at a time, sampled,
//! streamed as text (UTF-8 safe, stop strings held back), until EOS, a stop string, the token
//! budget or the context's end. Times prompt and decode separately for the tokens/s line.
//! With a draft (`speculate`), a decode forward also runs the drafted tokens; each row is
//! sampled as a step of its own would be, the draft kept while it agrees, the cache cut back
//! to what was kept.
//!
//! Must not: know about model families, devices or files. It drives a `Session`.

use crate::exec::{ExecError, LogitRows, Session};
use crate::sample::{SampleError, Sampler};
use crate::speculate::{Pacer, SpecStats, Speculation};
use crate::text::{StopMatcher, Tokenizer};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Rows of the prompt run per forward (at least 1).
    pub chunk_rows: usize,
    pub stop_strings: Vec<String>,
    /// Keep the logits of every prompt position and every generated step.
    pub record_logits: bool,
    /// How many recent tokens the repetition penalty looks at.
    pub penalty_window: usize,
    /// Stop at the tokenizer's EOS ids and at `stop_ids`.
    pub stop_at_eos: bool,
    /// Ids that end the generation beside the tokenizer's EOS ids (a checkpoint's
    /// `generation_config.json` `eos_token_id`), with `stop_at_eos`; they work without a
    /// tokenizer too.
    pub stop_ids: Vec<u32>,
    /// Drafted tokens checked by each decode forward (`Off`: one token a forward).
    pub speculation: Speculation,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 128,
            chunk_rows: 64,
            stop_strings: Vec::new(),
            record_logits: false,
            penalty_window: 64,
            stop_at_eos: true,
            stop_ids: Vec::new(),
            speculation: Speculation::Off,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    StopString,
    MaxTokens,
    ContextFull,
}

/// What a generation produced, with its timings.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated: Vec<u32>,
    /// With `record_logits`: row `i` is the model's output at position `i` of
    /// `prompt_ids ++ generated` (so row `prompt_len - 1 + j` chose `generated[j]`).
    pub logits: Vec<Vec<f32>>,
    pub prompt_secs: f64,
    pub decode_secs: f64,
    pub stop: StopReason,
    pub speculation: SpecStats,
}

impl Generation {
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        self.prompt_ids.len() as f64 / self.prompt_secs.max(1e-9)
    }
    /// Decode speed over the tokens after the first (the first comes from the prompt's logits).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.generated.len().saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Sample(#[from] SampleError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("speculation by the checkpoint's draft model needs the draft attached to the session (load the model with its draft)")]
    NoDraft,
}

/// Generates from `prompt` after what `session` already holds. `on_text` receives the text
/// as it becomes safe to show (nothing when `tokenizer` is `None`).
pub fn generate(
    session: &mut Session,
    tokenizer: Option<&Tokenizer>,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if matches!(opts.speculation, Speculation::Mtp { .. }) && !session.has_draft() {
        return Err(GenerateError::NoDraft);
    }
    let context = session.max_context();
    if session.pos() + prompt.len() > context {
        return Err(GenerateError::PromptTooLong { prompt: session.pos() + prompt.len(), context });
    }
    let mut out = Generation {
        prompt_ids: prompt.to_vec(),
        generated: Vec::new(),
        logits: Vec::new(),
        prompt_secs: 0.0,
        decode_secs: 0.0,
        stop: StopReason::MaxTokens,
        speculation: SpecStats::default(),
    };
    let rows = if opts.record_logits { LogitRows::All } else { LogitRows::Last };

    // 1. The prompt, in chunks.
    let t0 = Instant::now();
    let mut last = Vec::new();
    for chunk in prompt.chunks(opts.chunk_rows.max(1)) {
        let l = session.forward(chunk, rows)?;
        let vocab = l.len() / if rows == LogitRows::All { chunk.len() } else { 1 };
        if opts.record_logits {
            out.logits.extend(l.chunks_exact(vocab).map(|r| r.to_vec()));
        }
        last = l[l.len() - vocab..].to_vec();
    }
    out.prompt_secs = t0.elapsed().as_secs_f64();

    // 2. Decode. `ahead.rows[k]` holds the logits after the last sampled token and `k` drafts.
    let t1 = Instant::now();
    let mut stream = tokenizer.map(|t| t.stream_decoder(true));
    let mut stops = StopMatcher::new(opts.stop_strings.iter().cloned());
    let mut history: Vec<u32> = prompt.to_vec();
    let mut pacer = Pacer::new(opts.speculation.max_draft());
    let mut ahead = Ahead { fed: Vec::new(), rows: vec![last], base: session.pos(), kept: 0 };
    while out.generated.len() < opts.max_new_tokens {
        let recent = &history[history.len().saturating_sub(opts.penalty_window)..];
        let id = sampler.sample(&ahead.rows[ahead.kept], recent)?;
        history.push(id);
        if opts.stop_at_eos && (tokenizer.is_some_and(|t| t.is_eos(id)) || opts.stop_ids.contains(&id)) {
            out.generated.push(id);
            out.stop = StopReason::Eos;
            break;
        }
        out.generated.push(id);
        if let Some(s) = stream.as_mut() {
            let step = stops.push(&s.push(id));
            if !step.text.is_empty() {
                on_text(&step.text);
            }
            if step.stopped {
                out.stop = StopReason::StopString;
                break;
            }
        }
        // The draft's next token: its row is computed already.
        if ahead.next_draft() == Some(id) {
            ahead.kept += 1;
            out.speculation.accepted += 1;
            if opts.record_logits {
                out.logits.push(ahead.rows[ahead.kept].clone());
            }
            continue;
        }
        if ahead.fed.len() > 1 {
            pacer.record(ahead.fed.len() - 1, ahead.kept);
        }
        ahead.keep(session, &mut out.speculation)?;
        let left = opts.max_new_tokens - out.generated.len();
        if left == 0 && !opts.record_logits {
            break;
        }
        if session.pos() + 1 > context {
            out.stop = StopReason::ContextFull;
            break;
        }
        // Drafts beyond the token budget or the context would be thrown away.
        let cap = left.saturating_sub(1).min(context - session.pos() - 1);
        let cap = if cap > 0 { cap.min(pacer.allowance()) } else { 0 };
        let drafts = match opts.speculation {
            Speculation::Mtp { max_draft } => session.draft_tokens(id, cap.min(max_draft))?,
            s => s.draft(&history, cap),
        };
        let fed: Vec<u32> = std::iter::once(id).chain(drafts.iter().copied()).collect();
        let l = session.forward(&fed, if drafts.is_empty() { LogitRows::Last } else { LogitRows::All })?;
        let vocab = l.len() / fed.len();
        if !drafts.is_empty() {
            out.speculation.verifies += 1;
            out.speculation.drafted += drafts.len();
        }
        let rows = l.chunks_exact(vocab).map(|r| r.to_vec()).collect();
        ahead = Ahead { base: session.pos() - fed.len(), fed, rows, kept: 0 };
        if opts.record_logits {
            out.logits.push(ahead.rows[0].clone());
        }
    }
    ahead.keep(session, &mut out.speculation)?;
    if let Some(s) = stream.as_mut() {
        if out.stop != StopReason::StopString {
            let tail = stops.push(&s.finish());
            on_text(&tail.text);
            on_text(&stops.finish());
        }
    }
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}

/// A decode forward's tokens (the last sampled one, then the drafts) from position `base`, the
/// logits of each, and how many of the drafts the samples agreed with so far.
struct Ahead {
    fed: Vec<u32>,
    rows: Vec<Vec<f32>>,
    base: usize,
    kept: usize,
}

impl Ahead {
    /// The next drafted token, if any is left.
    fn next_draft(&self) -> Option<u32> {
        self.fed.get(self.kept + 1).copied()
    }

    /// Cuts the session back to the drafts kept (`Session::keep_of_last`); the rejected ones are
    /// forgotten here too, so a second call changes nothing.
    fn keep(&mut self, session: &mut Session, stats: &mut SpecStats) -> Result<(), ExecError> {
        if !self.fed.is_empty() && session.keep_of_last(self.base, &self.fed, self.kept + 1)? {
            stats.replays += 1;
        }
        self.fed.truncate(self.kept + 1);
        Ok(())
    }
}
