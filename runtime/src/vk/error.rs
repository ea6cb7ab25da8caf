//! The Vulkan op library's errors: typed, with their context, and sorted so the executor can
//! tell a device failure (re-run the forward on the CPU) from a caller's mistake.
//!
//! Must not: panic, or carry non-`Send` data.

use super::shaders::Kernel;
use crate::format::{FormatError, WeightFormat};
use ash::vk;

#[derive(Debug, thiserror::Error)]
pub enum VkError {
    #[error("no Vulkan loader: {0}")]
    NoLoader(String),
    #[error("no Vulkan device{}; available: {}", wanted.as_ref().map(|w| format!(" named like {w:?}")).unwrap_or_default(), if available.is_empty() { "none".to_string() } else { available.join(", ") })]
    NoDevice { wanted: Option<String>, available: Vec<String> },
    #[error("{call} failed: {result}")]
    Call { call: &'static str, result: vk::Result },
    #[error("out of device memory: {requested} bytes requested with {in_use} of {limit} in use{}", if *injected { " (injected fault)" } else { "" })]
    OutOfMemory { requested: u64, in_use: u64, limit: u64, injected: bool },
    #[error("no memory type for {0}")]
    NoMemoryType(&'static str),
    #[error("the Vulkan device was lost{}", if *injected { " (injected fault)" } else { "" })]
    DeviceLost { injected: bool },
    #[error("{op}: {what} needs {needed} elements, the buffer view holds {have}")]
    ViewTooSmall { op: &'static str, what: &'static str, needed: usize, have: usize },
    #[error("{op}: {msg}")]
    BadArgument { op: &'static str, msg: String },
    #[error("{op} does not take weights in {format}")]
    UnsupportedFormat { op: &'static str, format: WeightFormat },
    #[error("no SPIR-V for {kernel:?} (build table and runtime disagree)")]
    MissingShader { kernel: Kernel },
    #[error("a buffer of {size} bytes exceeds the device's storage-buffer range of {max}")]
    TooLarge { size: u64, max: u64 },
    #[error("the Vulkan validation layer (VK_LAYER_KHRONOS_validation with VK_EXT_debug_utils) is not installed: install `vulkan-validationlayers` (Debian, Ubuntu), or run without validation")]
    NoValidationLayer,
    #[error("{var}={value:?}: expected 1 (on) or 0 (off)")]
    BadEnvironment { var: &'static str, value: String },
    #[error("Vulkan validation: {errors} error(s) before this submission completed; the first: {first}")]
    Validation { errors: u64, first: String },
    #[error(transparent)]
    Format(#[from] FormatError),
}

impl VkError {
    /// Whether the device failed (lost, out of memory, a failed submit): the executor re-runs
    /// the forward on the CPU. Other errors are the caller's mistakes.
    pub fn is_device_failure(&self) -> bool {
        matches!(self, VkError::DeviceLost { .. } | VkError::OutOfMemory { .. } | VkError::Call { .. })
    }

    /// Maps a raw result of `call` to the typed error (device loss and memory exhaustion are
    /// their own variants).
    pub(crate) fn from_vk(call: &'static str, result: vk::Result) -> VkError {
        match result {
            vk::Result::ERROR_DEVICE_LOST => VkError::DeviceLost { injected: false },
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                VkError::OutOfMemory { requested: 0, in_use: 0, limit: 0, injected: false }
            }
            r => VkError::Call { call, result: r },
        }
    }
}

pub type Result<T, E = VkError> = std::result::Result<T, E>;

/// `map_err` helper for raw ash calls.
pub(crate) trait VkResultExt<T> {
    fn ctx(self, call: &'static str) -> Result<T>;
}

impl<T> VkResultExt<T> for std::result::Result<T, vk::Result> {
    fn ctx(self, call: &'static str) -> Result<T> {
        self.map_err(|r| VkError::from_vk(call, r))
    }
}
