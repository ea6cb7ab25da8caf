//! The flags that say which model and which devices, shared by `coli exec` and `coli bench`
//! (`ModelArgs`, `DeviceArgs`), the `--help` headings every subcommand files its flags under,
//! and the engine's errors in the flags' words (`message`). This file only maps flags to
//! `coli_runtime::engine::EngineOptions`; the loading itself is `Engine::load`.

use crate::checks;
use crate::default_model;
use clap::{Args, ValueEnum};
use coli_runtime::engine::{DeviceRequest, EngineError};
use coli_runtime::format::WeightFormat;
use coli_runtime::model::hub::{self, ModelRef};
use coli_runtime::vk::{FaultInjection, KvType, VkOptions};
use std::path::PathBuf;

/// The `--help` headings, one per concern, the same in every subcommand.
pub mod heading {
    pub const MODEL: &str = "Model";
    pub const GENERATION: &str = "Generation";
    pub const BENCHMARK: &str = "Benchmark";
    pub const DEVICES: &str = "Devices";
    pub const EXPERT_TIER: &str = "Expert tier";
    pub const KV_CACHE: &str = "KV cache";
    pub const DIAGNOSTICS: &str = "Diagnostics";
    pub const OUTPUT: &str = "Output";
    pub const SERVER: &str = "Server";
}

/// Prompt rows per forward when `--chunk` is not given (every subcommand).
pub const DEFAULT_CHUNK: usize = 512;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The CPU only.
    Cpu,
    /// A Vulkan device, or an error.
    Vulkan,
    /// A Vulkan GPU when there is one, else the CPU.
    Auto,
}

/// The element type of the device's K/V cache (its attention layers' mirrors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvChoice {
    /// 32-bit floats, as the CPU keeps them.
    F32,
    /// 16-bit floats: half the memory and half the bytes decode attention reads.
    F16,
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

/// Which checkpoint, which spec, and how its weights are read.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A model directory (safetensors + config.json), a .gguf file (any shard of a split
    /// -00001-of-0000N.gguf set), or a Hugging Face id found in the hub's cache (never
    /// downloaded): org/name, org/name@REVISION, and either with :FILE to pick a file of the
    /// snapshot (org/name:model-Q4_K_M.gguf). Default: SmolLM2-135M-Instruct (fetched on
    /// first use).
    #[arg(short = 'm', long, help_heading = heading::MODEL)]
    pub model: Option<PathBuf>,
    /// The architecture spec; default: the built-in spec serving the checkpoint's architecture.
    #[arg(long, help_heading = heading::MODEL)]
    pub spec: Option<PathBuf>,
    /// Quantize f32/f16/bf16 matrices at load.
    #[arg(long, value_enum, help_heading = heading::MODEL)]
    pub quantize: Option<QuantChoice>,
}

impl ModelArgs {
    /// Checks that the paths given exist, and gives the model's path (found in the Hugging
    /// Face cache for a hub id; the default model's, fetched when absent, without `--model`).
    pub fn resolve(&self) -> Result<PathBuf, String> {
        if let Some(s) = &self.spec {
            checks::spec_path(s, "--spec")?;
        }
        match &self.model {
            // A hub id that is not a path: the checkpoint it names in the cache.
            Some(p) if !p.exists() && p.to_str().and_then(ModelRef::parse).is_some() => {
                hub::locate(p, None).map_err(|e| format!("--model {}: {e}", p.display()))
            }
            Some(p) => {
                checks::model_path(p)?;
                Ok(p.clone())
            }
            None => default_model::ensure(),
        }
    }
}

/// Where to run and how much of the device to use.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to run: the CPU, a Vulkan device (an error without one), or a Vulkan GPU when
    /// there is one (a CPU Vulkan device such as Lavapipe is not taken).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto, help_heading = heading::DEVICES)]
    pub device: DeviceChoice,
    /// Pick the Vulkan device whose name contains this (default: the best one).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device_name: Option<String>,
    /// Use at most this many MiB of device memory (a big device behaves like a small one).
    #[arg(long, value_parser = checks::device_mib, help_heading = heading::DEVICES)]
    pub device_mem_mib: Option<u64>,
    /// Keep this many layers on the device (instead of the most that fit).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device_layers: Option<usize>,
    /// The device's K/V cache of attention layers: f32 (as the CPU) or f16 (half the memory and
    /// half the bytes decode reads over a long context; keys and values rounded to f16, the
    /// host's copy too). A device without 16-bit storage buffers keeps f32.
    #[arg(long, value_enum, default_value_t = KvChoice::F32, help_heading = heading::DEVICES)]
    pub device_kv: KvChoice,
    /// Fault injection for tests: the device fails at its n-th submit.
    #[arg(long, hide = true)]
    pub fail_submit: Option<u64>,
}

impl DeviceArgs {
    /// The primary device's options (before what a subcommand adds).
    pub fn vk_options(&self) -> VkOptions {
        VkOptions {
            device_name: self.device_name.clone(),
            memory_cap: self.device_mem_mib.map(|m| m << 20),
            kv_mirror: match self.device_kv {
                KvChoice::F32 => KvType::F32,
                KvChoice::F16 => KvType::F16,
            },
            fault: self.fail_submit.map(|n| FaultInjection { fail_submit: Some(n), fail_alloc: None }),
            ..Default::default()
        }
    }

    /// The request `--device` makes, with the primary device's options `vk`.
    pub fn request(&self, vk: VkOptions) -> DeviceRequest {
        match self.device {
            DeviceChoice::Cpu => DeviceRequest::Cpu,
            DeviceChoice::Vulkan => DeviceRequest::Vulkan(vk),
            DeviceChoice::Auto => DeviceRequest::Auto(vk),
        }
    }
}

/// An engine error in the words of the flags that lead to it.
pub fn message(e: EngineError) -> String {
    match e {
        EngineError::NoDevice(e) => format!("--device vulkan: {e}"),
        EngineError::DeviceUnused(note) => format!("--device vulkan: {note}"),
        EngineError::NoArchitecture { path } => {
            format!("{}: the checkpoint does not name its architecture; pass --spec", path.display())
        }
        EngineError::NoBuiltinSpec { path, arch, served } => {
            format!("{}: no built-in spec serves architecture {arch:?} (served: {served}); pass --spec", path.display())
        }
        EngineError::NoTokenizer(note) => format!("--prompt needs a tokenizer: {note}; use --prompt-ids"),
        EngineError::Chat(e) => format!("--chat: {e}"),
        e => e.to_string(),
    }
}
