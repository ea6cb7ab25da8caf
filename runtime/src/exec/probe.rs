//! The device profile of an opened Vulkan device, in the compiler's terms: its kind, the memory
//! a plan may use (the memory-budget extension's free bytes of the largest heap, or the cap the
//! user set), and the op kinds the Vulkan op library runs (routing and routed experts too: in
//! a frame where the plan makes a layer's experts resident). `coli probe` prints it; `coli exec`
//! compiles its plan with it, so the fit printed by `coli compile --profile` is the fit run.

use crate::vk::{Context, DeviceKind as VkKind};
use coli_compiler::ops::OpKind;
use coli_compiler::profile::{Device, DeviceKind, DeviceProfile, Features};

/// Bytes left for the driver and other programs out of a device's free memory.
pub fn reserve_for(free: u64) -> u64 {
    (free / 20).clamp(64 << 20, 1 << 30).min(free / 4)
}

/// The profile of `ctx`; `memory_cap` (when set) bounds the budget.
pub fn profile_of(ctx: &Context, memory_cap: Option<u64>) -> DeviceProfile {
    let caps = ctx.caps();
    let kind = match caps.kind {
        VkKind::Discrete => DeviceKind::Discrete,
        VkKind::Integrated | VkKind::Virtual | VkKind::Other => DeviceKind::Integrated,
        VkKind::Cpu => DeviceKind::Cpu,
    };
    let free = ctx
        .memory_budget()
        .and_then(|heaps| heaps.iter().map(|(budget, used)| budget.saturating_sub(*used)).max())
        .unwrap_or(caps.max_allocation_size.max(1 << 30));
    let budget = memory_cap.map_or(free, |c| c.min(free));
    let reserve = if memory_cap.is_some() { 0 } else { reserve_for(budget) };
    // Route and RoutedExperts run in a frame where the plan makes a layer's experts resident.
    let ops = vec![
        OpKind::Embed,
        OpKind::RmsNorm,
        OpKind::Linear,
        OpKind::Rope,
        OpKind::Attention,
        OpKind::Act,
        OpKind::Glu,
        OpKind::Add,
        OpKind::Mul,
        OpKind::Route,
        OpKind::RoutedExperts,
    ];
    DeviceProfile {
        name: format!("probed {}", caps.name),
        devices: vec![Device {
            name: caps.name.clone(),
            kind,
            memory_budget: budget,
            reserve,
            features: Features { ops: Some(ops), formats: None, subgroup_size: caps.subgroup_size, coopmat: caps.cooperative_matrix },
        }],
    }
}
