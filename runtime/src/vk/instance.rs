//! The Vulkan loader, opened at run time (`libvulkan.so.1` through ash's `loaded` feature; no
//! link-time dependency), and the instance. A machine without Vulkan gets `VkError::NoLoader`
//! here, which the caller reports in one line before running on the CPU.
//!
//! With `Validation::On` the instance enables `VK_LAYER_KHRONOS_validation` with synchronization
//! validation and a `VK_EXT_debug_utils` messenger into a `validation::Log` (also chained at
//! creation, so the instance's own creation and destruction are checked).
//!
//! Must not: pick a device (device.rs) or create anything device-level.

use super::error::{Result, VkError, VkResultExt};
use super::options::Validation;
use super::validation::{messenger_info, Log};
use ash::vk;
use std::ffi::CStr;
use std::sync::Arc;

const VALIDATION: &CStr = c"VK_LAYER_KHRONOS_validation";
const DEBUG_UTILS: &CStr = c"VK_EXT_debug_utils";
const VALIDATION_FEATURES: &CStr = c"VK_EXT_validation_features";

/// The validation messenger of an instance and the log it writes.
struct Messenger {
    loader: ash::ext::debug_utils::Instance,
    raw: vk::DebugUtilsMessengerEXT,
}

/// The loader and an instance; destroyed on drop (after everything made from it).
pub(crate) struct Instance {
    /// Keeps the loader library loaded for as long as the instance's function pointers live.
    #[allow(dead_code)]
    pub entry: ash::Entry,
    pub raw: ash::Instance,
    pub api_version: u32,
    messenger: Option<Messenger>,
    /// The messenger's user data: dropped after the instance is destroyed.
    pub log: Option<Arc<Log>>,
}

impl Instance {
    /// Opens the loader and creates an instance asking for Vulkan 1.3 (1.2 where the loader
    /// is older). `Validation::On` adds the Khronos layer, or fails with
    /// `VkError::NoValidationLayer` where it is not installed.
    pub fn new(validation: &Validation) -> Result<Instance> {
        let validation = match validation {
            Validation::Off => false,
            Validation::On => true,
            Validation::BadEnv(v) => {
                return Err(VkError::BadEnvironment { var: super::options::VALIDATION_ENV, value: v.clone() })
            }
        };
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
        let mut exts = Vec::new();
        if validation {
            // SAFETY: global-level queries.
            let available = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
            if !available.iter().any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION)) {
                return Err(VkError::NoValidationLayer);
            }
            layers.push(VALIDATION.as_ptr());
            // SAFETY: as above; the layer is installed.
            let listed = |layer: Option<&CStr>| unsafe { entry.enumerate_instance_extension_properties(layer) };
            let has = |list: &[vk::ExtensionProperties], name: &CStr| {
                list.iter().any(|e| e.extension_name_as_c_str().ok() == Some(name))
            };
            let loader_exts = listed(None).unwrap_or_default();
            let layer_exts = listed(Some(VALIDATION)).unwrap_or_default();
            if !has(&loader_exts, DEBUG_UTILS) && !has(&layer_exts, DEBUG_UTILS) {
                return Err(VkError::NoValidationLayer);
            }
            exts.push(DEBUG_UTILS.as_ptr());
            if has(&layer_exts, VALIDATION_FEATURES) {
                exts.push(VALIDATION_FEATURES.as_ptr());
            }
        }
        let log = validation.then(|| Arc::new(Log::new()));
        let mut chained = log.as_deref().map(messenger_info);
        let enables = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut features = vk::ValidationFeaturesEXT::default().enabled_validation_features(&enables);
        let mut ci = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&exts);
        if let Some(m) = chained.as_mut() {
            ci = ci.push_next(m);
            if exts.contains(&VALIDATION_FEATURES.as_ptr()) {
                ci = ci.push_next(&mut features);
            }
        }
        // SAFETY: `ci` and what it points to (the log among them) live across the call.
        let raw = unsafe { entry.create_instance(&ci, None) }.ctx("vkCreateInstance")?;
        let messenger = match &log {
            None => None,
            Some(log) => {
                let loader = ash::ext::debug_utils::Instance::new(&entry, &raw);
                // SAFETY: the extension is enabled; the log outlives the messenger (dropped
                // after it and the instance, in `drop`).
                match unsafe { loader.create_debug_utils_messenger(&messenger_info(log), None) } {
                    Ok(m) => Some(Messenger { loader, raw: m }),
                    Err(r) => {
                        // SAFETY: nothing was made from the instance yet.
                        unsafe { raw.destroy_instance(None) };
                        return Err(VkError::from_vk("vkCreateDebugUtilsMessengerEXT", r));
                    }
                }
            }
        };
        Ok(Instance { entry, raw, api_version, messenger, log })
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: the owner (`Shared`) drops the device and every child object first; the
        // messenger goes before the instance, the log (a field) after both.
        unsafe {
            if let Some(m) = self.messenger.take() {
                m.loader.destroy_debug_utils_messenger(m.raw, None);
            }
            self.raw.destroy_instance(None)
        };
    }
}
