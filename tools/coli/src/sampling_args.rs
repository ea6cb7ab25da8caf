//! The sampling flags, shared by `coli exec` and `coli chat`, and what they become: each flag
//! given wins over a base (the checkpoint's `generation_config.json` over the subcommand's own
//! defaults), and a bad value is named by its flag. This file only maps flags to
//! `coli_runtime::sample::SamplerConfig`.

use crate::engine_args::heading;
use clap::Args;
use coli_runtime::sample::{SampleError, Sampler, SamplerConfig};

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// The sampler's random seed.
    #[arg(long, default_value_t = 0, help_heading = heading::GENERATION)]
    pub seed: u64,
    /// Sampling temperature; 0 = greedy. Default: the checkpoint's generation_config.json
    /// (greedy unless it says do_sample), else the subcommand's (exec: 0, chat: 0.7).
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
}

impl SamplingArgs {
    /// The flags given, over `base`, checked (the error names the flag).
    pub fn config(&self, base: &SamplerConfig) -> Result<SamplerConfig, String> {
        let c = SamplerConfig {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repetition_penalty: self.repeat_penalty.unwrap_or(base.repetition_penalty),
            seed: self.seed,
        };
        Sampler::new(c).map_err(|e| {
            let flag = match e {
                SampleError::Temperature(_) => "--temperature",
                SampleError::TopP(_) => "--top-p",
                SampleError::MinP(_) => "--min-p",
                SampleError::RepetitionPenalty(_) => "--repeat-penalty",
                SampleError::Empty => "sampling",
            };
            format!("{flag}: {e}")
        })?;
        Ok(c)
    }
}
