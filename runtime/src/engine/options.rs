//! What `Engine::load` is asked to do: where to run (`DeviceRequest`), the spec, the compile
//! and checkpoint options, the expert tier's options, the RAM expert cache's budget, what becomes of the host copies of the
//! weights the devices hold (`HostCopies`), and the stages progress is reported for.
//!
//! Must not: read flags or environment variables; this is plain data a caller fills in.

use coli_compiler::{DeviceProfile, Options};
use std::path::PathBuf;

use crate::model::LoadOptions;
use crate::ramcache::RamOptions;
use crate::tier::TierOptions;
use crate::vk::VkOptions;

/// Where to run.
#[derive(Clone, Debug, Default)]
pub enum DeviceRequest {
    /// The CPU only.
    #[default]
    Cpu,
    /// A Vulkan device, or an error.
    Vulkan(VkOptions),
    /// A Vulkan GPU when there is one, else the CPU (a CPU Vulkan device such as Lavapipe is
    /// slower than the CPU op library, so `Auto` does not take it).
    Auto(VkOptions),
}

impl DeviceRequest {
    /// The primary device's options, unless the CPU was asked for.
    pub fn vulkan_options(&self) -> Option<&VkOptions> {
        match self {
            DeviceRequest::Cpu => None,
            DeviceRequest::Vulkan(o) | DeviceRequest::Auto(o) => Some(o),
        }
    }

    /// Whether a device must run the model (a load without one is an error).
    pub fn required(&self) -> bool {
        matches!(self, DeviceRequest::Vulkan(_))
    }
}

/// What becomes of the host copies of the dense matrices only the devices read, once uploaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostCopies {
    /// Released when every device opened shares the CPU's RAM (an integrated GPU or a CPU
    /// device), kept on a discrete GPU.
    #[default]
    ByDevice,
    /// Released: the weight store makes a matrix again from the checkpoint if the CPU needs it
    /// (after a device is lost).
    Release,
    /// Kept.
    Keep,
}

/// A stage of a load that reports progress as `(stage, done, total)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Resolving the program's weights from the checkpoint (tensors).
    ReadWeights,
    /// Uploading what the devices' frames read (tensors, per device; again after a retry with
    /// one layer fewer).
    Upload,
    /// The expert tier's warm start writing experts into its device slots (experts).
    WarmStart,
}

/// How to load a model. `EngineOptions::default()`: the checkpoint's built-in spec, the
/// compiler's default options, the CPU only.
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// An architecture spec file; `None`: the built-in spec serving the checkpoint's
    /// architecture (`engine::specs`).
    pub spec: Option<PathBuf>,
    /// How the checkpoint is opened (quantization at load and its progress).
    pub load: LoadOptions,
    /// What the plan is compiled with (context, prompt chunk rows, forced layer counts, KV
    /// split).
    pub compile: Options,
    /// The device profile to compile for; `None`: probed from the devices opened (CPU only
    /// without one).
    pub profile: Option<DeviceProfile>,
    /// Where to run.
    pub device: DeviceRequest,
    /// A second Vulkan device beside the primary one: its options (its role is set to the
    /// second's by the load). Ignored when running on the CPU.
    pub second_device: Option<VkOptions>,
    /// The expert tier's options (on a device with routed experts through host steps).
    pub tier: TierOptions,
    /// The RAM expert cache (`RamBudget::Auto`, the default: one only when the routed experts
    /// do not fit in the free memory; else the CPU reads them from the checkpoint's map).
    pub ram: RamOptions,
    /// What becomes of the host copies of what the devices hold.
    pub host_copies: HostCopies,
    /// The fewest positions the model's own context must hold, checked on the plan before any
    /// weight is read (`EngineError::ContextTooSmall`); `None`: no check.
    pub min_model_context: Option<usize>,
    /// Load the checkpoint's draft model (the spec's `draft`: multi-token prediction layers)
    /// beside the model, attached to every session (`Session::attach_draft`); its plan's device
    /// frames go on the model's devices when the model runs there and the draft fits beside it,
    /// else it runs on the CPU. Refused where the spec or the checkpoint has none.
    pub draft: bool,
    /// The Hugging Face cache a hub id (`org/name`, `model::hub`) is looked for in; `None`:
    /// where the hub's own variables put it (`HF_HUB_CACHE`, `HF_HOME`, `~/.cache/huggingface/hub`).
    pub hub_cache: Option<PathBuf>,
}
