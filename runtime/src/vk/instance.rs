//! The Vulkan loader, opened at run time (`libvulkan.so.1` through ash's `loaded` feature; no
//! link-time dependency), and the instance. A machine without Vulkan gets `VkError::NoLoader`
//! here, which the caller reports in one line before running on the CPU.
//!
//! Must not: pick a device (device.rs) or create anything device-level.

use super::error::{Result, VkError, VkResultExt};
use ash::vk;
use std::ffi::CStr;

const VALIDATION: &CStr = c"VK_LAYER_KHRONOS_validation";

/// The loader and an instance; destroyed on drop (after everything made from it).
pub(crate) struct Instance {
    /// Keeps the loader library loaded for as long as the instance's function pointers live.
    #[allow(dead_code)]
    pub entry: ash::Entry,
    pub raw: ash::Instance,
    pub api_version: u32,
}

impl Instance {
    /// Opens the loader and creates an instance asking for Vulkan 1.3 (1.2 where the loader
    /// is older). `validation` adds the Khronos layer when it is installed.
    pub fn new(validation: bool) -> Result<Instance> {
        // SAFETY: loading the system's Vulkan loader runs its initialization; we trust the
        // installed loader like any shared library we link.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VkError::NoLoader(e.to_string()))?;
        // SAFETY: a global-level query with no arguments.
        let loader = unsafe { entry.try_enumerate_instance_version() }.ctx("vkEnumerateInstanceVersion")?;
        let loader = loader.unwrap_or(vk::API_VERSION_1_0);
        if loader < vk::API_VERSION_1_2 {
            return Err(VkError::NoLoader(format!(
                "the loader offers Vulkan {}.{}; coli needs 1.2",
                vk::api_version_major(loader),
                vk::api_version_minor(loader)
            )));
        }
        let api_version = loader.min(vk::API_VERSION_1_3);
        let app =
            vk::ApplicationInfo::default().application_name(c"coli").engine_name(c"coli").api_version(api_version);
        let mut layers = Vec::new();
        if validation {
            // SAFETY: a global-level query.
            let available = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
            if available.iter().any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION)) {
                layers.push(VALIDATION.as_ptr());
            }
        }
        let ci = vk::InstanceCreateInfo::default().application_info(&app).enabled_layer_names(&layers);
        // SAFETY: `ci` and what it points to live across the call.
        let raw = unsafe { entry.create_instance(&ci, None) }.ctx("vkCreateInstance")?;
        Ok(Instance { entry, raw, api_version })
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: the owner (`Shared`) drops the device and every child object first.
        unsafe { self.raw.destroy_instance(None) };
    }
}
