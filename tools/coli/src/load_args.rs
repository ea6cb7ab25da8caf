//! Every flag that says how a model is loaded (which checkpoint, which devices, the expert
//! tier, the RAM expert cache, the KV split, the context and prompt chunk), gathered for the subcommands that load
//! one model and run it (`exec`, `serve`, `chat`), and the load itself with its progress bars and
//! its lines about where the model runs. This file maps flags to `EngineOptions` and prints;
//! loading is `Engine::load_with_progress`.

use crate::checks;
use crate::dense_args::DenseArgs;
use crate::device2_args::SecondDeviceArgs;
use crate::engine_args::{heading, message, DeviceArgs, ModelArgs, DEFAULT_CHUNK};
use crate::kv_args::KvSplitArgs;
use crate::progress::Progress;
use crate::ram_args::RamArgs;
use crate::tier_args::TierArgs;
use clap::Args;
use coli_compiler::Options;
use coli_runtime::engine::{Engine, EngineOptions, Stage};
use coli_runtime::model::LoadOptions;
use std::path::PathBuf;
use std::time::Instant;

/// The context compiled for without `--ctx`; sessions take the model's own when shorter.
pub const DEFAULT_CONTEXT: usize = 8192;

#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context length (default: the checkpoint's, at most 8192; per conversation in serve
    /// and chat).
    #[arg(long, value_parser = checks::context, help_heading = heading::GENERATION)]
    pub ctx: Option<usize>,
    /// Prompt rows per forward.
    #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = checks::rows, help_heading = heading::GENERATION)]
    pub chunk: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub second: SecondDeviceArgs,
    #[command(flatten)]
    pub dense: DenseArgs,
    #[command(flatten)]
    pub tier: TierArgs,
    #[command(flatten)]
    pub kv: KvSplitArgs,
    #[command(flatten)]
    pub ram: RamArgs,
}

impl LoadArgs {
    /// Resolves the model's path (fetching the default model when none is given) and loads it,
    /// with progress bars on a terminal and the load's lines on stderr.
    pub fn load(&self) -> Result<(Engine, PathBuf), String> {
        self.load_for(false)
    }

    /// `load`, with the checkpoint's draft model beside the model when `draft` (speculation
    /// by multi-token prediction layers).
    pub fn load_for(&self, draft: bool) -> Result<(Engine, PathBuf), String> {
        let path = self.model.resolve()?;
        let t0 = Instant::now();
        let reading = Progress::new("tensors");
        reading.step("loading");
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
        let vk = self.device.vk_options();
        let opts = EngineOptions {
            spec: self.model.spec.clone(),
            load: LoadOptions {
                quantize: self.model.quantize.map(|q| q.format()),
                progress: self.model.quantize.is_some().then(|| quantizing.hook()),
            },
            compile: self.second.apply(self.kv.apply(Options {
                context: self.ctx.unwrap_or(DEFAULT_CONTEXT),
                chunk_rows: self.chunk,
                device_layers: self.device.device_layers,
                resident_experts: !self.tier.sized(),
                ..Options::default()
            })),
            second_device: self.second.options(&vk),
            device: self.device.request(vk),
            tier: self.tier.options(&path, true),
            host_copies: self.dense.host_copies(),
            ram: self.ram.options(),
            draft,
            ..EngineOptions::default()
        };
        let engine = Engine::load_with_progress(&path, &opts, &mut progress).map_err(message)?;
        tracing::info!("{}", engine.device_note());
        if let Some(k) = engine.kv_split() {
            tracing::info!("{k}");
        }
        if let Some(t) = engine.tier_line() {
            tracing::info!("{t}");
        }
        if let Some(r) = engine.ram_line() {
            tracing::info!("{r}");
        }
        tracing::info!("{} ({}) loaded in {:.2}s", path.display(), engine.summary(), t0.elapsed().as_secs_f64());
        Ok((engine, path))
    }

    /// The context each conversation gets on `engine`.
    pub fn context(&self, engine: &Engine) -> usize {
        self.ctx.unwrap_or_else(|| engine.default_context())
    }
}
