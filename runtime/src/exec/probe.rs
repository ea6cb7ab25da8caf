//! The device profile of an opened Vulkan device, in the compiler's terms: its kind, the memory
//! a plan may use (the memory-budget extension's free bytes of the heap device buffers come from,
//! not the largest heap, which on a discrete GPU is the host's RAM; or the cap the
//! user set), and the op kinds the Vulkan op library runs (routing and routed experts too: in
//! a frame where the plan makes a layer's experts resident; Gated DeltaNet, Kimi Delta Attention
//! and MLA mixers). `coli probe` prints it; `coli exec`
//! compiles its plan with it, so the fit printed by `coli compile --profile` is the fit run.
//! Several opened devices make one profile, the primary first; two logical devices of one
//! physical device share its free memory, half each unless capped.

use crate::vk::{Context, DeviceKind as VkKind, KvType};
use coli_compiler::ops::OpKind;
use coli_compiler::profile::{Device, DeviceKind, DeviceProfile, Features, KvElement};

/// Bytes left for the driver and other programs out of a device's free memory.
pub fn reserve_for(free: u64) -> u64 {
    (free / 20).clamp(64 << 20, 1 << 30).min(free / 4)
}

/// The profile of several opened devices, the primary first, each with its own cap (when
/// set). A device that shares its physical device with an earlier one gets half of what the
/// earlier one was given when uncapped (and the earlier one keeps the other half).
pub fn profile_of_devices(devices: &[(&Context, Option<u64>)]) -> DeviceProfile {
    let mut profile = DeviceProfile { name: String::new(), devices: Vec::new() };
    let mut names = Vec::new();
    for (i, (ctx, cap)) in devices.iter().enumerate() {
        let mut p = profile_of(ctx, *cap);
        let shared = devices[..i].iter().position(|(c, _)| c.physical_index() == ctx.physical_index());
        if let (Some(j), Some(d)) = (shared, p.devices.first_mut()) {
            if cap.is_none() {
                d.memory_budget /= 2;
                d.reserve = reserve_for(d.memory_budget);
            }
            if devices[j].1.is_none() {
                let e = &mut profile.devices[j];
                e.memory_budget /= 2;
                e.reserve = reserve_for(e.memory_budget);
            }
        }
        names.push(ctx.caps().name.clone());
        profile.devices.append(&mut p.devices);
    }
    profile.name = format!("probed {}", names.join(" + "));
    profile
}

/// The profile of `ctx`; `memory_cap` (when set) bounds the budget.
pub fn profile_of(ctx: &Context, memory_cap: Option<u64>) -> DeviceProfile {
    let caps = ctx.caps();
    let kind = match caps.kind {
        VkKind::Discrete => DeviceKind::Discrete,
        VkKind::Integrated | VkKind::Virtual | VkKind::Other => DeviceKind::Integrated,
        VkKind::Cpu => DeviceKind::Cpu,
    };
    let free = ctx.device_heap_free().unwrap_or(caps.max_allocation_size.max(1 << 30));
    let budget = memory_cap.map_or(free, |c| c.min(free));
    let reserve = if memory_cap.is_some() { 0 } else { reserve_for(budget) };
    // Route and RoutedExperts run in a frame where the plan makes a layer's experts resident.
    let ops = vec![
        OpKind::Embed,
        OpKind::RmsNorm,
        OpKind::RmsNormScaled,
        OpKind::RmsNormUnweighted,
        OpKind::Linear,
        OpKind::Rope,
        OpKind::RopeTail,
        OpKind::Attention,
        OpKind::AttentionRel,
        OpKind::AttentionCompressed,
        OpKind::KvCompress,
        OpKind::KvCompressIndexed,
        OpKind::Act,
        OpKind::Glu,
        OpKind::GluLimited,
        OpKind::Add,
        OpKind::Mul,
        OpKind::Route,
        OpKind::RouteSqrtSoftplus,
        OpKind::RouteHash,
        OpKind::RoutedExperts,
        OpKind::RoutedExpertsLimited,
        OpKind::RouteShared,
        OpKind::RoutedExpertsShared,
        OpKind::LinearAttention,
        OpKind::LinearAttentionApart,
        OpKind::Kda,
        OpKind::ShortConv,
        OpKind::Mla,
        OpKind::MlaSparse,
        OpKind::Indexer,
        OpKind::Concat,
        OpKind::GroupedLinear,
        OpKind::HyperPre,
        OpKind::HyperPost,
    ];
    DeviceProfile {
        name: format!("probed {}", caps.name),
        devices: vec![Device {
            name: caps.name.clone(),
            kind,
            memory_budget: budget,
            reserve,
            features: Features {
                ops: Some(ops),
                formats: None,
                subgroup_size: caps.subgroup_size,
                coopmat: caps.cooperative_matrix,
                kv: match ctx.kv_mirror() {
                    KvType::F32 => KvElement::F32,
                    KvType::F16 => KvElement::F16,
                },
            },
        }],
    }
}
