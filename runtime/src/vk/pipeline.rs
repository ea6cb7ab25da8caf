//! Compute pipelines: one per (kernel, format variant), made on first use from the embedded
//! SPIR-V and kept for the context's life. Every kernel's layout is one descriptor set of
//! storage buffers (`Kernel::bindings`; a push-descriptor set where the device has
//! `VK_KHR_push_descriptor`) and 64 bytes of push constants. With
//! `DeviceCaps::pipeline_executable_info` (only set under `VkOptions::pipeline_stats`) each
//! pipeline is created capturing statistics, and the driver's statistics of it are printed to
//! stderr in one line and kept (`PipelineCache::stats`); a failed query is a line too, never an
//! error.
//!
//! Must not: record or submit commands.

use super::device::{Device, DeviceCaps};
use super::error::{Result, VkError, VkResultExt};
use super::shaders::{spirv, spirv_dot, FormatVariant, Kernel};
use ash::vk;
use std::collections::HashMap;

/// Every pipeline's push-constant range (at most the 128 bytes every device has; the widest
/// block, the attention kernels', is 80).
pub const PUSH_BYTES: u32 = 80;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Pipe {
    pub pipeline: vk::Pipeline,
    pub layout: vk::PipelineLayout,
    pub set_layout: vk::DescriptorSetLayout,
    pub bindings: u32,
    /// The workgroup size the pipeline was specialized with (for sized kernels).
    pub workgroup: u32,
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    pipes: HashMap<(Kernel, Option<FormatVariant>), Pipe>,
    /// The statistics lines printed so far, in creation order.
    pub stats: Vec<String>,
}

/// A pipeline's name in debug names and statistics lines: the kernel, then its variant.
fn label(kernel: Kernel, variant: Option<FormatVariant>) -> String {
    match variant {
        Some(v) => format!("{kernel:?} {v:?}"),
        None => format!("{kernel:?}"),
    }
}

/// One statistic's value, in the four formats `VK_KHR_pipeline_executable_properties` has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum StatValue {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatValue::Bool(b) => write!(f, "{b}"),
            StatValue::Int(i) => write!(f, "{i}"),
            StatValue::Uint(u) => write!(f, "{u}"),
            StatValue::Float(x) => write!(f, "{x}"),
        }
    }
}

/// The line `VkOptions::pipeline_stats` prints: `pipeline LABEL: NAME=VALUE, NAME=VALUE, ...`.
pub(crate) fn stats_line(label: &str, stats: &[(String, StatValue)]) -> String {
    let fields: Vec<String> = stats.iter().map(|(n, v)| format!("{n}={v}")).collect();
    format!("pipeline {label}: {}", fields.join(", "))
}

/// The statistics of every executable of `pipeline`, as (name, value); where the pipeline has
/// more than one executable, each name is prefixed with its executable's (`EXECUTABLE/NAME`).
///
/// # Safety
/// `pipeline` must be a live pipeline of the device `ext` was loaded for, created with
/// `CAPTURE_STATISTICS_KHR`.
unsafe fn query_stats(
    ext: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> std::result::Result<Vec<(String, StatValue)>, vk::Result> {
    let c_name =
        |s: std::result::Result<&std::ffi::CStr, _>| s.map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
    let execs = ext.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
    let mut out = Vec::new();
    for (i, e) in execs.iter().enumerate() {
        let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i as u32);
        let prefix = if execs.len() > 1 { format!("{}/", c_name(e.name_as_c_str())) } else { String::new() };
        for st in ext.get_pipeline_executable_statistics(&info)? {
            // SAFETY: `format` names the union's member the driver wrote.
            let value = match st.format {
                vk::PipelineExecutableStatisticFormatKHR::BOOL32 => StatValue::Bool(st.value.b32 != 0),
                vk::PipelineExecutableStatisticFormatKHR::INT64 => StatValue::Int(st.value.i64),
                vk::PipelineExecutableStatisticFormatKHR::UINT64 => StatValue::Uint(st.value.u64),
                vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => StatValue::Float(st.value.f64),
                // A format added after this code: its bits as an unsigned number.
                _ => StatValue::Uint(st.value.u64),
            };
            out.push((format!("{prefix}{}", c_name(st.name_as_c_str())), value));
        }
    }
    Ok(out)
}

/// The workgroup size of device-sized kernels: four subgroups, at least 64, at most 256.
pub fn device_workgroup(caps: &DeviceCaps) -> u32 {
    (caps.subgroup_size * 4).clamp(64, 256).min(caps.max_workgroup_invocations)
}

/// The workgroup size of a norm (one workgroup a row): sixteen subgroups, at least 64, at most
/// 1024, so a 2048-wide row takes a few loads a lane instead of a chain of sixteen (on the H200
/// a row of 2048 took 12 us with 128 lanes, three times a small GEMV; the wider workgroup is
/// not yet measured there). At most 64 subgroups (the shader's join).
pub fn norm_workgroup(caps: &DeviceCaps) -> u32 {
    (caps.subgroup_size * 16).clamp(64, 1024).min(caps.max_workgroup_invocations)
}

impl PipelineCache {
    /// The pipeline of `kernel` (and `variant`), created on first use.
    ///
    /// # Safety
    /// `dev` must be the device the cache belongs to, `caps` its capabilities.
    pub unsafe fn get(
        &mut self,
        dev: &Device,
        caps: &DeviceCaps,
        kernel: Kernel,
        variant: Option<FormatVariant>,
    ) -> Result<Pipe> {
        if let Some(p) = self.pipes.get(&(kernel, variant)) {
            return Ok(*p);
        }
        let p = create(&dev.raw, caps, kernel, variant)?;
        dev.name(p.pipeline, || label(kernel, variant));
        if let Some(ext) = &dev.exec_props {
            // Printed with `eprintln!` (as validation messages are) so a test's capture keeps
            // the line with that test's output.
            match query_stats(ext, p.pipeline) {
                Ok(stats) => {
                    let line = stats_line(&label(kernel, variant), &stats);
                    eprintln!("{line}");
                    self.stats.push(line);
                }
                Err(r) => eprintln!("pipeline {}: no statistics ({r})", label(kernel, variant)),
            }
        }
        self.pipes.insert((kernel, variant), p);
        Ok(p)
    }

    /// # Safety
    /// No command buffer using these pipelines may be pending.
    pub unsafe fn destroy(&mut self, dev: &ash::Device) {
        for (_, p) in self.pipes.drain() {
            dev.destroy_pipeline(p.pipeline, None);
            dev.destroy_pipeline_layout(p.layout, None);
            dev.destroy_descriptor_set_layout(p.set_layout, None);
        }
    }
}

unsafe fn create(dev: &ash::Device, caps: &DeviceCaps, kernel: Kernel, variant: Option<FormatVariant>) -> Result<Pipe> {
    // A cooperative kernel is specialized with the device's shape; without one it has no pipeline.
    let coop = match (kernel.cooperative(), caps.coopmat_i8) {
        (false, _) => None,
        (true, Some(s)) => Some(s),
        (true, None) => return Err(VkError::MissingShader { kernel }),
    };
    if kernel.base() == Kernel::AttnCoop && !caps.coopmat_f16 {
        return Err(VkError::MissingShader { kernel });
    }
    // The 16-bit K/V twins need 16-bit storage buffers (enabled at device creation where listed).
    if kernel.base() != kernel && !caps.storage_16bit {
        return Err(VkError::MissingShader { kernel });
    }
    let dot = if caps.integer_dot_product { spirv_dot(kernel, variant) } else { None };
    let bytes = dot.or_else(|| spirv(kernel, variant)).ok_or(VkError::MissingShader { kernel })?;
    let words = ash::util::read_spv(&mut std::io::Cursor::new(bytes)).map_err(|_| VkError::MissingShader { kernel })?;
    let module = dev
        .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
        .ctx("vkCreateShaderModule")?;
    let n = kernel.bindings();
    let binds: Vec<vk::DescriptorSetLayoutBinding> = (0..n)
        .map(|b| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let flags = if caps.push_descriptor {
        vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR
    } else {
        vk::DescriptorSetLayoutCreateFlags::empty()
    };
    let set_layout = dev.create_descriptor_set_layout(
        &vk::DescriptorSetLayoutCreateInfo::default().flags(flags).bindings(&binds),
        None,
    );
    let set_layout = match set_layout {
        Ok(s) => s,
        Err(r) => {
            dev.destroy_shader_module(module, None);
            return Err(VkError::from_vk("vkCreateDescriptorSetLayout", r));
        }
    };
    let ranges =
        [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).offset(0).size(PUSH_BYTES)];
    let sets = [set_layout];
    let layout = match dev.create_pipeline_layout(
        &vk::PipelineLayoutCreateInfo::default().set_layouts(&sets).push_constant_ranges(&ranges),
        None,
    ) {
        Ok(l) => l,
        Err(r) => {
            dev.destroy_descriptor_set_layout(set_layout, None);
            dev.destroy_shader_module(module, None);
            return Err(VkError::from_vk("vkCreatePipelineLayout", r));
        }
    };
    let workgroup = match coop {
        Some(_) => caps.subgroup_size * 4,
        None if kernel == Kernel::RmsNorm => norm_workgroup(caps),
        None => device_workgroup(caps),
    };
    // Constant 0 the workgroup size; for cooperative kernels 1..3 the shape's M, N, K.
    let spec_words = match coop {
        Some(s) => [workgroup, s.m, s.n, s.k],
        None => [workgroup, 0, 0, 0],
    };
    let spec_data: Vec<u8> = spec_words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let entries: Vec<vk::SpecializationMapEntry> =
        (0..4u32).map(|i| vk::SpecializationMapEntry::default().constant_id(i).offset(4 * i).size(4)).collect();
    let spec_len = if coop.is_some() { 4 } else { 1 };
    let spec = vk::SpecializationInfo::default().map_entries(&entries[..spec_len]).data(&spec_data[..4 * spec_len]);
    let mut stage =
        vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(c"main");
    if kernel.sized_by_device() || coop.is_some() {
        stage = stage.specialization_info(&spec);
        if caps.subgroup_size_control {
            stage = stage.flags(vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS);
        }
    }
    let capture = if caps.pipeline_executable_info {
        vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
    } else {
        vk::PipelineCreateFlags::empty()
    };
    let ci = vk::ComputePipelineCreateInfo::default().flags(capture).stage(stage).layout(layout);
    let res = dev.create_compute_pipelines(vk::PipelineCache::null(), &[ci], None);
    dev.destroy_shader_module(module, None);
    match res {
        Ok(p) => Ok(Pipe { pipeline: p[0], layout, set_layout, bindings: n, workgroup }),
        Err((_, r)) => {
            dev.destroy_pipeline_layout(layout, None);
            dev.destroy_descriptor_set_layout(set_layout, None);
            Err(VkError::from_vk("vkCreateComputePipelines", r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_line_names_the_pipeline_and_every_value() {
        let stats = [
            ("Register Count".to_string(), StatValue::Uint(64)),
            ("Spilled".to_string(), StatValue::Bool(false)),
            ("Delta".to_string(), StatValue::Int(-3)),
            ("Occupancy".to_string(), StatValue::Float(0.5)),
        ];
        assert_eq!(
            stats_line(&label(Kernel::RmsNorm, None), &stats),
            "pipeline RmsNorm: Register Count=64, Spilled=false, Delta=-3, Occupancy=0.5"
        );
        assert_eq!(stats_line("RmsNorm", &[]), "pipeline RmsNorm: ");
    }
}
