//! Physical-device choice and capabilities, and the logical device with its queues.
//! Choice: the device the user names, else discrete > integrated > virtual > CPU (Lavapipe);
//! a second device beside it: another GPU, else the same physical device opened again.
//! Capabilities queried: subgroup size (and size control), 16-bit storage, integer dot
//! product, cooperative matrices (the shapes `vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR`
//! lists, and the one the q8 GEMMs take: `choose_coopmat_i8`), VK_EXT_memory_budget, push descriptors, timestamps, buffer
//! device address, pipeline executable statistics, a transfer-only queue family and a second
//! compute queue. The op layer reads `DeviceCaps`; it never queries Vulkan itself. Enabled and used: subgroup size control, the packed integer dot product,
//! an int8 cooperative-matrix shape, the memory budget, push descriptors, timestamps,
//! pipeline executable statistics (only with `VkOptions::pipeline_stats`). Queried
//! and reported only: 16-bit storage (f16/bf16 weights are unpacked from 32-bit words),
//! buffer device address (descriptors serve every kernel), the transfer and second compute
//! queues (uploads go through mappings on the devices measured; staged ones share the
//! compute queue).
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
        None => {
            candidates.iter().enumerate().filter(|(_, c)| usable(c)).min_by_key(|(i, c)| (c.kind, *i)).map(|(i, _)| i)
        }
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
            others()
                .find(|(_, c)| named(c))
                .map(|(i, _)| i)
                .or_else(|| candidates.get(primary).filter(|c| named(c)).map(|_| primary))
        }
        None => {
            let gpu =
                |c: &Candidate| matches!(c.kind, DeviceKind::Discrete | DeviceKind::Integrated | DeviceKind::Virtual);
            others()
                .filter(|(_, c)| gpu(c))
                .min_by_key(|(i, c)| (c.kind, *i))
                .map(|(i, _)| i)
                .or((primary < candidates.len()).then_some(primary))
        }
    };
    found.ok_or_else(|| VkError::NoDevice {
        wanted: Some(format!("a second device{}", wanted.map(|w| format!(" named like {w:?}")).unwrap_or_default())),
        available: candidates.iter().map(|c| c.name.clone()).collect(),
    })
}

/// A component type of a cooperative matrix (`VkComponentTypeKHR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopType {
    F16,
    F32,
    F64,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    /// A type this crate does not name (bfloat16, fp8 and later additions).
    Other(i32),
}

impl CoopType {
    fn from_vk(t: vk::ComponentTypeKHR) -> CoopType {
        match t {
            vk::ComponentTypeKHR::FLOAT16 => CoopType::F16,
            vk::ComponentTypeKHR::FLOAT32 => CoopType::F32,
            vk::ComponentTypeKHR::FLOAT64 => CoopType::F64,
            vk::ComponentTypeKHR::SINT8 => CoopType::S8,
            vk::ComponentTypeKHR::SINT16 => CoopType::S16,
            vk::ComponentTypeKHR::SINT32 => CoopType::S32,
            vk::ComponentTypeKHR::SINT64 => CoopType::S64,
            vk::ComponentTypeKHR::UINT8 => CoopType::U8,
            vk::ComponentTypeKHR::UINT16 => CoopType::U16,
            vk::ComponentTypeKHR::UINT32 => CoopType::U32,
            vk::ComponentTypeKHR::UINT64 => CoopType::U64,
            other => CoopType::Other(other.as_raw()),
        }
    }
}

/// One cooperative-matrix shape the device lists: `Result (MxN) = A (MxK) * B (KxN) + C (MxN)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMatShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a: CoopType,
    pub b: CoopType,
    pub c: CoopType,
    pub result: CoopType,
    /// The shape is listed for saturating accumulation only (the kernels accumulate without).
    pub saturating: bool,
    /// Scope subgroup (the only scope the kernels use).
    pub subgroup: bool,
}

/// The shape the cooperative-matrix q8 GEMMs (`matmul_coop.comp`, `moe_matmul_coop.comp`) are
/// specialized with: sint8 A (M x K, weights) times sint8 B (K x N, q8 activations) into sint32
/// (M x N), subgroup scope. K divides 32 (a q8 activation block), M and N divide 32 (the tile
/// of one subgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMatI8 {
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

/// The int8 shape the q8 GEMMs take from the shapes a device lists: sint8 x sint8 -> sint32 at
/// subgroup scope without saturation, K dividing 32 and M, N dividing 32; of those the one with
/// K = 32 (one product per activation block), then the largest M x N, then the larger M. None when
/// the device lists no such shape.
pub fn choose_coopmat_i8(shapes: &[CoopMatShape]) -> Option<CoopMatI8> {
    let divides_32 = |v: u32| matches!(v, 8 | 16 | 32);
    shapes
        .iter()
        .filter(|s| {
            (s.a, s.b, s.c, s.result) == (CoopType::S8, CoopType::S8, CoopType::S32, CoopType::S32)
                && s.subgroup
                && !s.saturating
                && divides_32(s.m)
                && divides_32(s.n)
                && divides_32(s.k)
        })
        .max_by_key(|s| (s.k == 32, s.k, s.m * s.n, s.m))
        .map(|s| CoopMatI8 { m: s.m, n: s.n, k: s.k })
}

/// Shared memory `attn_coop.comp` declares (its key/value, score and probability tiles and the
/// rows' factors: 17,408 + 17,408 + 9,216 + 256 bytes), rounded up.
pub const ATTN_COOP_SHARED: u32 = 44 * 1024 + 512;

/// Whether the device lists f16 x f16 -> f32 (f32 result) 16 x 16 x 16 at subgroup scope, the
/// shape of the cooperative prompt attention (`attn_coop.comp`).
pub fn has_f16_shape(shapes: &[CoopMatShape]) -> bool {
    shapes.iter().any(|s| {
        (s.a, s.b, s.c, s.result) == (CoopType::F16, CoopType::F16, CoopType::F32, CoopType::F32)
            && (s.m, s.n, s.k) == (16, 16, 16)
            && s.subgroup
            && !s.saturating
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
    /// Vulkan 1.3's `shaderIntegerDotProduct` (enabled when set): the kernels with 8-bit
    /// activations take the variants built with the packed dot product (`spirv_dot`).
    pub integer_dot_product: bool,
    /// `VK_KHR_cooperative_matrix` with its `cooperativeMatrix` feature, for compute shaders.
    pub cooperative_matrix: bool,
    /// The shapes the device lists (empty without the extension).
    pub coopmat_shapes: Vec<CoopMatShape>,
    /// The int8 shape of the q8 GEMMs, where the device has the extension, one of its shapes
    /// suits (`choose_coopmat_i8`), `shaderInt8`, `vulkanMemoryModel` (the GLSL extension the
    /// kernels need for the subgroup scope makes the module use it) and a fixed subgroup size
    /// (the kernels' workgroup is four subgroups). Enabled at device creation when present.
    pub coopmat_i8: Option<CoopMatI8>,
    /// f16 x f16 -> f32 16 x 16 x 16 at subgroup scope beside `coopmat_i8`, `shaderFloat16`, a
    /// subgroup of 16 to 64 lanes (four subgroups of the prompt attention's workgroup hold its
    /// 64 rows) and `ATTN_COOP_SHARED` bytes of shared memory: `attn_coop.comp` runs prompt
    /// attention on it. Enabled at device creation.
    pub coopmat_f16: bool,
    pub memory_budget: bool,
    /// `VK_EXT_external_memory_host` (enabled when set): the alignment an imported host
    /// pointer needs (`minImportedHostPointerAlignment`); the host pool's pages are then the
    /// process's own memory.
    pub external_memory_host: Option<u64>,
    /// `VK_KHR_push_descriptor`: frames push each dispatch's bindings into the command buffer
    /// instead of allocating and writing a descriptor set.
    pub push_descriptor: bool,
    /// The compute queue writes timestamps (profiling).
    pub timestamps: bool,
    /// `VK_KHR_pipeline_executable_properties` with its `pipelineExecutableInfo` feature: the
    /// driver reports each pipeline's statistics. `Context::new` clears it unless
    /// `VkOptions::pipeline_stats` asks for them; enabled at device creation when set.
    pub pipeline_executable_info: bool,
    /// Vulkan 1.2's `bufferDeviceAddress` (enabled when set): every allocation but imported
    /// host memory can be reached from a shader through its address.
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
    let host_ext = has_ext(&exts, c"VK_EXT_external_memory_host");
    let mut emh = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    if host_ext {
        props2 = props2.push_next(&mut emh);
    }
    inst.raw.get_physical_device_properties2(pd, &mut props2);
    let p = props2.properties;
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut fcm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let has_coopmat_ext = has_ext(&exts, c"VK_KHR_cooperative_matrix");
    let mut feats = vk::PhysicalDeviceFeatures2::default().push_next(&mut f11).push_next(&mut f12);
    if api >= vk::API_VERSION_1_3 {
        feats = feats.push_next(&mut f13);
    }
    if has_coopmat_ext {
        feats = feats.push_next(&mut fcm);
    }
    let has_exec_ext = has_ext(&exts, c"VK_KHR_pipeline_executable_properties");
    let mut fpe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    if has_exec_ext {
        feats = feats.push_next(&mut fpe);
    }
    inst.raw.get_physical_device_features2(pd, &mut feats);
    let mut cm_stages = vk::ShaderStageFlags::empty();
    let coopmat_shapes = if has_coopmat_ext {
        let mut pcm = vk::PhysicalDeviceCooperativeMatrixPropertiesKHR::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut pcm);
        inst.raw.get_physical_device_properties2(pd, &mut p2);
        cm_stages = pcm.cooperative_matrix_supported_stages;
        let cm = ash::khr::cooperative_matrix::Instance::new(&inst.entry, &inst.raw);
        // A device that lists no shapes (or fails the query) has none for us.
        cm.get_physical_device_cooperative_matrix_properties(pd)
            .unwrap_or_default()
            .iter()
            .map(|p| CoopMatShape {
                m: p.m_size,
                n: p.n_size,
                k: p.k_size,
                a: CoopType::from_vk(p.a_type),
                b: CoopType::from_vk(p.b_type),
                c: CoopType::from_vk(p.c_type),
                result: CoopType::from_vk(p.result_type),
                saturating: p.saturating_accumulation != 0,
                subgroup: p.scope == vk::ScopeKHR::SUBGROUP,
            })
            .collect()
    } else {
        Vec::new()
    };
    let cooperative_matrix =
        has_coopmat_ext && fcm.cooperative_matrix != 0 && cm_stages.contains(vk::ShaderStageFlags::COMPUTE);
    let families = inst.raw.get_physical_device_queue_family_properties(pd);
    let compute_family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or(VkError::NoDevice { wanted: Some(format!("{} with a compute queue", cand.name)), available: vec![] })?
        as u32;
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
    let coopmat_i8 = if cooperative_matrix
        && f12.shader_int8 != 0
        && f12.vulkan_memory_model != 0
        && min_sg == max_sg
        && sg.subgroup_size * 4 <= p.limits.max_compute_work_group_invocations
    {
        choose_coopmat_i8(&coopmat_shapes)
    } else {
        None
    };
    let coopmat_f16 = coopmat_i8.is_some()
        && f12.shader_float16 != 0
        && (16..=64).contains(&sg.subgroup_size)
        && p.limits.max_compute_shared_memory_size >= ATTN_COOP_SHARED
        && has_f16_shape(&coopmat_shapes);
    Ok(DeviceCaps {
        name: cand.name.clone(),
        kind: cand.kind,
        api_version: api,
        subgroup_size: sg.subgroup_size,
        min_subgroup_size: min_sg,
        max_subgroup_size: max_sg,
        subgroup_size_control: api >= vk::API_VERSION_1_3
            && f13.subgroup_size_control != 0
            && f13.compute_full_subgroups != 0,
        storage_16bit: f11.storage_buffer16_bit_access != 0,
        integer_dot_product: api >= vk::API_VERSION_1_3 && f13.shader_integer_dot_product != 0,
        cooperative_matrix,
        coopmat_shapes,
        coopmat_i8,
        coopmat_f16,
        memory_budget: has_ext(&exts, c"VK_EXT_memory_budget"),
        external_memory_host: (host_ext && emh.min_imported_host_pointer_alignment > 0)
            .then_some(emh.min_imported_host_pointer_alignment),
        push_descriptor: has_ext(&exts, c"VK_KHR_push_descriptor"),
        timestamps: families[compute_family as usize].timestamp_valid_bits > 0 && p.limits.timestamp_period > 0.0,
        pipeline_executable_info: has_exec_ext && fpe.pipeline_executable_info != 0,
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
    /// `VK_KHR_pipeline_executable_properties`' entry points, where enabled
    /// (`DeviceCaps::pipeline_executable_info`).
    pub exec_props: Option<ash::khr::pipeline_executable_properties::Device>,
    /// `VK_EXT_debug_utils`' object names, under the validation layer (its messages then name
    /// the kernel and the buffer).
    names: Option<ash::ext::debug_utils::Device>,
}

impl Device {
    /// Creates the logical device with one compute queue, enabling the features the shaders
    /// may use where the device has them (subgroup size control, memory budget, push
    /// descriptors, external host memory, 16-bit storage buffers; cooperative matrices with `shaderInt8` and `vulkanMemoryModel` where
    /// `caps.coopmat_i8` is set; pipeline executable statistics where
    /// `caps.pipeline_executable_info` is set).
    ///
    /// # Safety
    /// `pd` must come from `inst`; the returned device must be destroyed (`destroy`) before
    /// the instance.
    pub unsafe fn new(inst: &Instance, pd: vk::PhysicalDevice, caps: &DeviceCaps) -> Result<Device> {
        let prio = [1.0f32];
        let queues =
            [vk::DeviceQueueCreateInfo::default().queue_family_index(caps.compute_family).queue_priorities(&prio)];
        let mut exts = Vec::new();
        if caps.memory_budget {
            exts.push(c"VK_EXT_memory_budget".as_ptr());
        }
        if caps.push_descriptor {
            exts.push(c"VK_KHR_push_descriptor".as_ptr());
        }
        if caps.external_memory_host.is_some() {
            exts.push(c"VK_EXT_external_memory_host".as_ptr());
        }
        if caps.coopmat_i8.is_some() {
            exts.push(c"VK_KHR_cooperative_matrix".as_ptr());
        }
        if caps.pipeline_executable_info {
            exts.push(c"VK_KHR_pipeline_executable_properties".as_ptr());
        }
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        if caps.subgroup_size_control {
            f13 = f13.subgroup_size_control(true).compute_full_subgroups(true);
        }
        if caps.integer_dot_product {
            f13 = f13.shader_integer_dot_product(true);
        }
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut fcm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        // 16-bit storage buffers for the f16 K/V mirrors (`VkOptions::kv_mirror`).
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
        let mut ci = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&exts);
        if caps.api_version >= vk::API_VERSION_1_3 {
            ci = ci.push_next(&mut f13);
        }
        if caps.storage_16bit {
            ci = ci.push_next(&mut f11);
        }
        // Buffer device addresses: the batched decode step's attention reaches each sequence's
        // mirror through them (`attn_seqs.comp`).
        f12 = f12.buffer_device_address(caps.buffer_device_address);
        if caps.coopmat_i8.is_some() {
            f12 = f12.shader_int8(true).vulkan_memory_model(true).shader_float16(caps.coopmat_f16);
            fcm = fcm.cooperative_matrix(true);
            ci = ci.push_next(&mut fcm);
        }
        if caps.coopmat_i8.is_some() || caps.buffer_device_address {
            ci = ci.push_next(&mut f12);
        }
        let mut fpe =
            vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        if caps.pipeline_executable_info {
            ci = ci.push_next(&mut fpe);
        }
        let raw = inst.raw.create_device(pd, &ci, None).ctx("vkCreateDevice")?;
        let queue = raw.get_device_queue(caps.compute_family, 0);
        let push = caps.push_descriptor.then(|| ash::khr::push_descriptor::Device::new(&inst.raw, &raw));
        let exec_props = caps
            .pipeline_executable_info
            .then(|| ash::khr::pipeline_executable_properties::Device::new(&inst.raw, &raw));
        let names = inst.log.is_some().then(|| ash::ext::debug_utils::Device::new(&inst.raw, &raw));
        Ok(Device { raw, queue, push, exec_props, names })
    }

    /// Names `handle` for the validation layer's messages (nothing without the layer).
    ///
    /// # Safety
    /// `handle` must be a live object of this device.
    pub unsafe fn name<H: vk::Handle>(&self, handle: H, name: impl FnOnce() -> String) {
        let Some(n) = &self.names else { return };
        let Ok(name) = std::ffi::CString::new(name()) else { return };
        let info = vk::DebugUtilsObjectNameInfoEXT::default().object_handle(handle).object_name(&name);
        // A name is a help for reading messages: failing to set one is not an error.
        let _ = n.set_debug_utils_object_name(&info);
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
        let list = [
            c("H200 #0", DeviceKind::Discrete),
            c("llvmpipe", DeviceKind::Cpu),
            c("iGPU", DeviceKind::Integrated),
            c("H200 #1", DeviceKind::Discrete),
        ];
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

    fn shape(m: u32, n: u32, k: u32, ab: CoopType, cr: CoopType) -> CoopMatShape {
        CoopMatShape { m, n, k, a: ab, b: ab, c: cr, result: cr, saturating: false, subgroup: true }
    }

    #[test]
    fn the_attention_takes_only_the_f16_shape_with_f32_sums() {
        use CoopType::*;
        let nv = [shape(16, 8, 16, F16, F16), shape(16, 16, 16, F16, F32), shape(16, 16, 32, S8, S32)];
        assert!(has_f16_shape(&nv));
        assert!(!has_f16_shape(&[nv[0], nv[2]]), "f16 sums or another shape do not serve");
        let mut wide = nv[1];
        wide.subgroup = false;
        assert!(!has_f16_shape(&[wide]), "workgroup scope");
        wide = nv[1];
        wide.saturating = true;
        assert!(!has_f16_shape(&[wide]));
        assert!(!has_f16_shape(&[]));
    }

    #[test]
    fn the_int8_shape_is_chosen_from_the_listed_ones() {
        use CoopType::*;
        // What an NVIDIA driver lists (in its order): f16 shapes, then int8 16x8x32 and 16x16x32.
        let nv = [
            shape(16, 8, 16, F16, F16),
            shape(16, 8, 8, F16, F32),
            shape(16, 16, 16, F16, F32),
            shape(16, 8, 32, S8, S32),
            shape(16, 16, 32, S8, S32),
            shape(16, 16, 32, U8, U32),
        ];
        assert_eq!(choose_coopmat_i8(&nv), Some(CoopMatI8 { m: 16, n: 16, k: 32 }));
        assert_eq!(choose_coopmat_i8(&nv[..4]), Some(CoopMatI8 { m: 16, n: 8, k: 32 }));
        // Float shapes only, unsigned only, or nothing: none.
        assert_eq!(choose_coopmat_i8(&nv[..3]), None);
        assert_eq!(choose_coopmat_i8(&nv[5..]), None);
        assert_eq!(choose_coopmat_i8(&[]), None);
        // K = 32 wins over a larger tile with K = 16; K must divide 32, M and N must divide 32.
        let k16 = shape(32, 32, 16, S8, S32);
        assert_eq!(choose_coopmat_i8(&[k16, shape(8, 8, 32, S8, S32)]), Some(CoopMatI8 { m: 8, n: 8, k: 32 }));
        assert_eq!(choose_coopmat_i8(&[k16]), Some(CoopMatI8 { m: 32, n: 32, k: 16 }));
        assert_eq!(
            choose_coopmat_i8(&[shape(16, 16, 64, S8, S32), shape(12, 16, 32, S8, S32), shape(16, 64, 32, S8, S32)]),
            None
        );
        // Saturating-only, workgroup scope, or a 16-bit result: none.
        let mut sat = shape(16, 16, 32, S8, S32);
        sat.saturating = true;
        let mut wg = shape(16, 16, 32, S8, S32);
        wg.subgroup = false;
        let mut mixed = shape(16, 16, 32, S8, S32);
        mixed.result = S16;
        assert_eq!(choose_coopmat_i8(&[sat, wg, mixed]), None);
        // A type this crate does not name is passed over.
        assert_eq!(
            choose_coopmat_i8(&[shape(16, 16, 32, Other(1000491000), S32), shape(16, 8, 32, S8, S32)]),
            Some(CoopMatI8 { m: 16, n: 8, k: 32 })
        );
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
