//! Physical-device choice and capabilities, and the logical device with its queues.
//! Choice: the device the user names, else discrete > integrated > virtual > CPU (Lavapipe);
//! a second device beside it: another GPU, else the same physical device opened again.
//! Capabilities queried: subgroup size (and size control), 16-bit storage, integer dot
//! product, cooperative matrices, VK_EXT_memory_budget, push descriptors, timestamps, buffer
//! device address, a transfer-only queue family and a second compute queue. The op layer reads `DeviceCaps`; it never queries
//! Vulkan itself.
//!
//! Must not: allocate memory or create pipelines.

use super::error::{Result, VkError, VkResultExt};
use super::instance::Instance;
use ash::vk;
use std::ffi::CStr;

/// What kind of device, in the order we prefer them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    Cpu,
    Other,
}

impl DeviceKind {
    fn from_vk(t: vk::PhysicalDeviceType) -> DeviceKind {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
            _ => DeviceKind::Other,
        }
    }
}

/// A device as the chooser sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub kind: DeviceKind,
    pub api_version: u32,
}

/// Index of the device to open: the first whose name contains `wanted` (case-insensitive),
/// else the best kind (ties: the first enumerated). Devices below Vulkan 1.2 are passed over.
pub fn choose_device(candidates: &[Candidate], wanted: Option<&str>) -> Result<usize> {
    let usable = |c: &Candidate| c.api_version >= vk::API_VERSION_1_2;
    let found = match wanted {
        Some(w) => {
            let w = w.to_lowercase();
            candidates.iter().position(|c| usable(c) && c.name.to_lowercase().contains(&w))
        }
        None => candidates.iter().enumerate().filter(|(_, c)| usable(c)).min_by_key(|(i, c)| (c.kind, *i)).map(|(i, _)| i),
    };
    found.ok_or_else(|| VkError::NoDevice {
        wanted: wanted.map(str::to_string),
        available: candidates.iter().map(|c| c.name.clone()).collect(),
    })
}

/// Index of a second device beside the primary (`primary`, an index from `choose_device`):
/// the first other device whose name contains `wanted` (else the primary itself when its name
/// does); with no name, the best GPU other than the primary (discrete, integrated, virtual;
/// ties: the first enumerated), else the primary itself, opened again as a second logical
/// device. A CPU device is never a second device of another one.
pub fn choose_second(candidates: &[Candidate], primary: usize, wanted: Option<&str>) -> Result<usize> {
    let usable = |c: &Candidate| c.api_version >= vk::API_VERSION_1_2;
    let others = || candidates.iter().enumerate().filter(|(i, c)| *i != primary && usable(c));
    let found = match wanted {
        Some(w) => {
            let w = w.to_lowercase();
            let named = |c: &Candidate| c.name.to_lowercase().contains(&w);
            others().find(|(_, c)| named(c)).map(|(i, _)| i).or_else(|| candidates.get(primary).filter(|c| named(c)).map(|_| primary))
        }
        None => {
            let gpu = |c: &Candidate| matches!(c.kind, DeviceKind::Discrete | DeviceKind::Integrated | DeviceKind::Virtual);
            others().filter(|(_, c)| gpu(c)).min_by_key(|(i, c)| (c.kind, *i)).map(|(i, _)| i).or((primary < candidates.len()).then_some(primary))
        }
    };
    found.ok_or_else(|| VkError::NoDevice {
        wanted: Some(format!("a second device{}", wanted.map(|w| format!(" named like {w:?}")).unwrap_or_default())),
        available: candidates.iter().map(|c| c.name.clone()).collect(),
    })
}

/// What the chosen device offers, as the op layer needs it.
#[derive(Clone, Debug)]
pub struct DeviceCaps {
    pub name: String,
    pub kind: DeviceKind,
    pub api_version: u32,
    pub subgroup_size: u32,
    pub min_subgroup_size: u32,
    pub max_subgroup_size: u32,
    /// `VK_EXT_subgroup_size_control` (or 1.3) with full subgroups in compute.
    pub subgroup_size_control: bool,
    pub storage_16bit: bool,
    pub integer_dot_product: bool,
    pub cooperative_matrix: bool,
    pub memory_budget: bool,
    /// `VK_KHR_push_descriptor`: frames push each dispatch's bindings into the command buffer
    /// instead of allocating and writing a descriptor set.
    pub push_descriptor: bool,
    /// The compute queue writes timestamps (profiling).
    pub timestamps: bool,
    pub buffer_device_address: bool,
    pub max_shared_memory: u32,
    pub max_workgroup_invocations: u32,
    pub min_storage_offset_alignment: u64,
    pub max_storage_buffer_range: u64,
    pub max_allocation_size: u64,
    pub non_coherent_atom_size: u64,
    pub timestamp_period_ns: f32,
    pub compute_family: u32,
    /// A queue family with transfer but neither graphics nor compute (a copy engine).
    pub transfer_family: Option<u32>,
    /// Whether the compute family has a second queue.
    pub second_compute_queue: bool,
}

fn has_ext(exts: &[vk::ExtensionProperties], name: &CStr) -> bool {
    exts.iter().any(|e| e.extension_name_as_c_str().ok() == Some(name))
}

/// The enumerated physical devices with their candidate descriptions.
///
/// # Safety
/// `inst` must be a live instance.
pub(crate) unsafe fn enumerate(inst: &Instance) -> Result<Vec<(vk::PhysicalDevice, Candidate)>> {
    let devs = inst.raw.enumerate_physical_devices().ctx("vkEnumeratePhysicalDevices")?;
    Ok(devs
        .into_iter()
        .map(|pd| {
            let p = inst.raw.get_physical_device_properties(pd);
            let name = p.device_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            (pd, Candidate { name, kind: DeviceKind::from_vk(p.device_type), api_version: p.api_version })
        })
        .collect())
}

/// Queries the capabilities of `pd`.
///
/// # Safety
/// `pd` must come from `inst`, which must be live.
pub(crate) unsafe fn query_caps(inst: &Instance, pd: vk::PhysicalDevice, cand: &Candidate) -> Result<DeviceCaps> {
    let exts = inst.raw.enumerate_device_extension_properties(pd).ctx("vkEnumerateDeviceExtensionProperties")?;
    let api = cand.api_version.min(inst.api_version);
    let mut sg = vk::PhysicalDeviceSubgroupProperties::default();
    let mut sgc = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sg).push_next(&mut m3);
    let size_control_ext = api >= vk::API_VERSION_1_3 || has_ext(&exts, c"VK_EXT_subgroup_size_control");
    if size_control_ext {
        props2 = props2.push_next(&mut sgc);
    }
    inst.raw.get_physical_device_properties2(pd, &mut props2);
    let p = props2.properties;
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut feats = vk::PhysicalDeviceFeatures2::default().push_next(&mut f11).push_next(&mut f12);
    if api >= vk::API_VERSION_1_3 {
        feats = feats.push_next(&mut f13);
    }
    inst.raw.get_physical_device_features2(pd, &mut feats);
    let families = inst.raw.get_physical_device_queue_family_properties(pd);
    let compute_family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or(VkError::NoDevice { wanted: Some(format!("{} with a compute queue", cand.name)), available: vec![] })? as u32;
    let transfer_family = families
        .iter()
        .position(|f| {
            f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f.queue_flags.intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        })
        .map(|i| i as u32);
    let (min_sg, max_sg) = if size_control_ext && sgc.min_subgroup_size > 0 {
        (sgc.min_subgroup_size, sgc.max_subgroup_size)
    } else {
        (sg.subgroup_size, sg.subgroup_size)
    };
    Ok(DeviceCaps {
        name: cand.name.clone(),
        kind: cand.kind,
        api_version: api,
        subgroup_size: sg.subgroup_size,
        min_subgroup_size: min_sg,
        max_subgroup_size: max_sg,
        subgroup_size_control: api >= vk::API_VERSION_1_3 && f13.subgroup_size_control != 0 && f13.compute_full_subgroups != 0,
        storage_16bit: f11.storage_buffer16_bit_access != 0,
        integer_dot_product: (api >= vk::API_VERSION_1_3 && f13.shader_integer_dot_product != 0)
            || has_ext(&exts, c"VK_KHR_shader_integer_dot_product"),
        cooperative_matrix: has_ext(&exts, c"VK_KHR_cooperative_matrix"),
        memory_budget: has_ext(&exts, c"VK_EXT_memory_budget"),
        push_descriptor: has_ext(&exts, c"VK_KHR_push_descriptor"),
        timestamps: families[compute_family as usize].timestamp_valid_bits > 0 && p.limits.timestamp_period > 0.0,
        buffer_device_address: f12.buffer_device_address != 0,
        max_shared_memory: p.limits.max_compute_shared_memory_size,
        max_workgroup_invocations: p.limits.max_compute_work_group_invocations,
        min_storage_offset_alignment: p.limits.min_storage_buffer_offset_alignment,
        max_storage_buffer_range: p.limits.max_storage_buffer_range as u64,
        max_allocation_size: m3.max_memory_allocation_size,
        non_coherent_atom_size: p.limits.non_coherent_atom_size,
        timestamp_period_ns: p.limits.timestamp_period,
        compute_family,
        transfer_family,
        second_compute_queue: families[compute_family as usize].queue_count > 1,
    })
}

/// The logical device and its compute queue.
pub(crate) struct Device {
    pub raw: ash::Device,
    pub queue: vk::Queue,
    /// `VK_KHR_push_descriptor`'s entry points, where the device has it.
    pub push: Option<ash::khr::push_descriptor::Device>,
}

impl Device {
    /// Creates the logical device with one compute queue, enabling the features the shaders
    /// may use where the device has them (subgroup size control, memory budget, push
    /// descriptors).
    ///
    /// # Safety
    /// `pd` must come from `inst`; the returned device must be destroyed (`destroy`) before
    /// the instance.
    pub unsafe fn new(inst: &Instance, pd: vk::PhysicalDevice, caps: &DeviceCaps) -> Result<Device> {
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(caps.compute_family).queue_priorities(&prio)];
        let mut exts = Vec::new();
        if caps.memory_budget {
            exts.push(c"VK_EXT_memory_budget".as_ptr());
        }
        if caps.push_descriptor {
            exts.push(c"VK_KHR_push_descriptor".as_ptr());
        }
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        if caps.subgroup_size_control {
            f13 = f13.subgroup_size_control(true).compute_full_subgroups(true);
        }
        let mut ci = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&exts);
        if caps.api_version >= vk::API_VERSION_1_3 {
            ci = ci.push_next(&mut f13);
        }
        let raw = inst.raw.create_device(pd, &ci, None).ctx("vkCreateDevice")?;
        let queue = raw.get_device_queue(caps.compute_family, 0);
        let push = caps.push_descriptor.then(|| ash::khr::push_descriptor::Device::new(&inst.raw, &raw));
        Ok(Device { raw, queue, push })
    }

    /// # Safety
    /// Every object made from the device must be destroyed, and no work pending.
    pub unsafe fn destroy(&self) {
        let _ = self.raw.device_wait_idle();
        self.raw.destroy_device(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, kind: DeviceKind) -> Candidate {
        Candidate { name: name.into(), kind, api_version: vk::API_VERSION_1_3 }
    }

    #[test]
    fn prefers_discrete_then_integrated_then_cpu() {
        let list = [c("llvmpipe", DeviceKind::Cpu), c("iGPU", DeviceKind::Integrated), c("H200", DeviceKind::Discrete)];
        assert_eq!(choose_device(&list, None).unwrap(), 2);
        assert_eq!(choose_device(&list[..2], None).unwrap(), 1);
        assert_eq!(choose_device(&list[..1], None).unwrap(), 0);
    }

    #[test]
    fn a_name_wins_over_kind() {
        let list = [c("NVIDIA H200", DeviceKind::Discrete), c("llvmpipe (LLVM 15)", DeviceKind::Cpu)];
        assert_eq!(choose_device(&list, Some("LLVMPIPE")).unwrap(), 1);
        let err = choose_device(&list, Some("radeon")).unwrap_err();
        assert!(err.to_string().contains("NVIDIA H200, llvmpipe"), "{err}");
    }

    #[test]
    fn a_second_device_is_another_gpu_else_the_primary_again() {
        let list = [c("H200 #0", DeviceKind::Discrete), c("llvmpipe", DeviceKind::Cpu), c("iGPU", DeviceKind::Integrated), c("H200 #1", DeviceKind::Discrete)];
        assert_eq!(choose_second(&list, 0, None).unwrap(), 3);
        assert_eq!(choose_second(&list, 3, None).unwrap(), 0);
        assert_eq!(choose_second(&list[..3], 0, None).unwrap(), 2);
        // Lavapipe alone: itself, opened again.
        assert_eq!(choose_second(&list[1..2], 0, None).unwrap(), 0);
        assert_eq!(choose_second(&list[..2], 0, None).unwrap(), 0);
        assert_eq!(choose_second(&list, 0, Some("igpu")).unwrap(), 2);
        assert_eq!(choose_second(&list, 0, Some("H200")).unwrap(), 3);
        assert_eq!(choose_second(&list[..2], 1, Some("llvm")).unwrap(), 1);
        assert!(choose_second(&list, 0, Some("radeon")).is_err());
    }

    #[test]
    fn old_devices_are_passed_over() {
        let mut old = c("old", DeviceKind::Discrete);
        old.api_version = vk::API_VERSION_1_1;
        let list = [old, c("llvmpipe", DeviceKind::Cpu)];
        assert_eq!(choose_device(&list, None).unwrap(), 1);
        assert!(choose_device(&list[..1], None).is_err());
    }
}
