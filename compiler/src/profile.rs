//! Device profiles and compile options: the two structs that say where a plan may put work
//! and how. A profile lists devices (kind, memory budget and reserve, what they can run); the
//! host CPU is always there and runs everything, so an empty list is a CPU-only profile.
//! `coli probe` prints this machine's profile in the same RON; `graphs/profiles/*.ron` hold
//! saved ones.
//!
//! This module reads profile files (through the spec reader, for positioned errors) and
//! must not probe hardware or read environment variables.

use crate::cost::Format;
use crate::diag::{Diagnostic, Diagnostics};
use crate::ops::OpKind;
use crate::spec::{de, syntax};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// A GPU with its own memory: everything it runs must be uploaded.
    Discrete,
    /// A GPU sharing the host's memory.
    Integrated,
    /// A CPU device (a software Vulkan device such as Lavapipe).
    Cpu,
}

/// What a device can run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Features {
    /// Op kinds it runs; absent: every non-host op kind whose `OpInfo::by_default` is set.
    #[serde(default)]
    pub ops: Option<Vec<OpKind>>,
    /// Weight formats its matrix kernels read; absent: every format.
    #[serde(default)]
    pub formats: Option<Vec<Format>>,
    #[serde(default = "default_subgroup")]
    pub subgroup_size: u32,
    /// Cooperative-matrix (tensor core) support.
    #[serde(default)]
    pub coopmat: bool,
    /// The element its attention layers' K/V mirrors hold (MLA's and compressed entries' stay
    /// f32, as do rows of odd widths).
    #[serde(default)]
    pub kv: KvElement,
}

/// The element of a device's attention K/V mirror.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvElement {
    #[default]
    F32,
    F16,
}

impl KvElement {
    pub fn bytes(self) -> u64 {
        match self {
            KvElement::F32 => 4,
            KvElement::F16 => 2,
        }
    }
}

fn default_subgroup() -> u32 {
    32
}

impl Default for Features {
    fn default() -> Features {
        Features { ops: None, formats: None, subgroup_size: 32, coopmat: false, kv: KvElement::F32 }
    }
}

impl Features {
    pub fn runs(&self, op: OpKind) -> bool {
        !op.info().host_step && self.lists(op)
    }
    /// Whether the profile names `op` among its kinds, or lists none and `op` runs by default.
    pub fn lists(&self, op: OpKind) -> bool {
        match &self.ops {
            Some(ops) => ops.contains(&op),
            None => op.info().by_default,
        }
    }
    pub fn reads(&self, f: Format) -> bool {
        self.formats.as_ref().is_none_or(|fs| fs.contains(&f))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    pub kind: DeviceKind,
    /// Bytes of device memory the plan may use.
    pub memory_budget: u64,
    /// Bytes of the budget kept free (driver, fragmentation, other programs).
    #[serde(default)]
    pub reserve: u64,
    #[serde(default)]
    pub features: Features,
}

impl Device {
    /// Bytes available to the plan: the budget minus the reserve.
    pub fn usable(&self) -> u64 {
        self.memory_budget.saturating_sub(self.reserve)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Profile")]
pub struct DeviceProfile {
    pub name: String,
    /// Devices in order of preference: the first is the primary.
    #[serde(default)]
    pub devices: Vec<Device>,
}

impl DeviceProfile {
    /// No device: the whole program runs on the host CPU.
    pub fn cpu_only() -> DeviceProfile {
        DeviceProfile { name: "cpu-only".into(), devices: Vec::new() }
    }

    pub fn load(path: &Path) -> Result<DeviceProfile, Diagnostics> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Diagnostics::one(Diagnostic::whole(path, format!("cannot read the profile: {e}"))))?;
        DeviceProfile::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<DeviceProfile, Diagnostics> {
        let node = syntax::parse(text).map_err(|e| Diagnostics::one(Diagnostic::at(path, text, e.span, e.message)))?;
        let (p, errors) = de::from_node::<DeviceProfile>(&node);
        let mut d = Diagnostics::new();
        for (span, m) in errors {
            d.push(Diagnostic::at(path, text, span, m));
        }
        let Some(p) = p else { return Err(d.sorted()) };
        for dev in &p.devices {
            if dev.reserve > dev.memory_budget {
                d.push(Diagnostic::whole(
                    path,
                    format!("device `{}`: reserve {} exceeds the budget {}", dev.name, dev.reserve, dev.memory_budget),
                ));
            }
        }
        d.into_result(p)
    }
}

/// Choices of the user, passed explicitly to `compile`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// Put the dense part (attention, norms, dense FFNs, router, shared experts) on the device.
    pub dense_on_device: bool,
    /// Serve routed experts through the expert tier (a device cache); off: on the host CPU.
    pub expert_tier: bool,
    /// Where the tier's budget holds every routed expert of every MoE layer of a device, run
    /// their routing and experts inside its frames (`place::resident`); off: through host
    /// steps and the runtime's adaptive cache whatever the budget.
    #[serde(default = "yes")]
    pub resident_experts: bool,
    /// Force the number of layers on the primary device (clamped to what exists), instead of
    /// the most that fit; a second device fits the layers after them.
    pub device_layers: Option<usize>,
    /// Force the number of layers on the second device, from where the primary stopped
    /// (clamped to what is left), instead of the most that fit.
    #[serde(default)]
    pub second_device_layers: Option<usize>,
    /// Context length the KV cache is sized for.
    pub context: usize,
    /// Rows of one prompt chunk (scratch is sized for it).
    pub chunk_rows: usize,
    /// The format of tensors when the checkpoint's table is unknown (a bare config.json).
    pub assumed_format: Format,
    /// The format matrices go up to the device in; absent: as stored in the checkpoint.
    pub upload_format: Option<Format>,
    /// Force a KV split: the positions of a row's share each device layer's mirror keeps
    /// (down to whole blocks, at least one), the older ones in host RAM (`place::kv_split`).
    #[serde(default)]
    pub kv_device_positions: Option<usize>,
    /// Split the KV mirrors past the device's budget when that puts more layers on devices.
    #[serde(default = "yes")]
    pub kv_split: bool,
    /// Positions per block of a KV split (a row's device share starts on a block boundary).
    #[serde(default = "default_kv_block")]
    pub kv_block: usize,
    /// Whether the plan is of a model a draft continues from, of the draft, or neither.
    #[serde(default)]
    pub draft: DraftRole,
}

/// A plan's part in speculative decoding by a draft model the checkpoint carries (the spec's
/// `draft`: multi-token prediction layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DraftRole {
    /// No draft model.
    #[default]
    None,
    /// The model, its residual read by the host after each forward (the draft's input).
    Target,
    /// The draft model.
    Draft,
}

fn yes() -> bool {
    true
}

fn default_kv_block() -> usize {
    64
}

impl Default for Options {
    fn default() -> Options {
        Options {
            dense_on_device: true,
            expert_tier: true,
            resident_experts: true,
            device_layers: None,
            second_device_layers: None,
            context: 4096,
            chunk_rows: 512,
            assumed_format: Format::Bf16,
            upload_format: None,
            kv_device_positions: None,
            kv_split: true,
            kv_block: default_kv_block(),
            draft: DraftRole::None,
        }
    }
}
