//! Resident experts, the first slice of the expert tier: where what the dense fit left on a
//! device (its tier budget) holds every routed expert of a layer that device runs, the layer's
//! routing (`Route`) and experts (`RoutedExperts`) run inside the device's frame instead of as
//! host steps, so a decode step's layers need no round trip to the host.
//!
//! The rule: per device, every MoE layer it runs, when the total of their experts, plus the
//! experts' scratch for one prompt chunk (counted once per device: the kernels reuse it layer
//! after layer), fits the tier budget, the device lists the two op kinds and reads the
//! experts' formats. All or nothing: when one layer does not qualify, none is resident, and the
//! runtime's adaptive cache spreads the whole budget over every layer by heat instead (a
//! prefix of whole layers would leave it nothing, and serves a skewed routing worse).
//!
//! Must not: change the dense fit (this runs after it, on what it left) or cut frames.

use super::size::{Sizer, F32};
use super::DeviceFit;
use crate::cost::Format;
use crate::ids::{DeviceId, Place};
use crate::ir::{ExpertTensor, Op, Program, WeightRef};
use crate::ops::OpKind;
use crate::profile::{Device, DeviceProfile, Options};

/// The format an expert tensor goes up to a device in.
pub fn expert_format(t: &ExpertTensor, sizer: &Sizer) -> Format {
    let w = WeightRef { name: t.name_of(0).0, shape: t.matrix_shape().to_vec(), rows: None };
    sizer.upload_format(&w)
}

/// Whether `device` can run `op` inside a frame when its layer's experts are resident: the
/// device lists the kind (or lists no kinds) and reads the experts' formats. Only `Route` and
/// `RoutedExperts` qualify (DeepSeek V4's sqrt-softplus and hash routers and experts with
/// their limited SwiGLU too).
pub fn runs_resident(device: &Device, op: &Op, sizer: &Sizer) -> bool {
    let listed = |k: OpKind| device.features.lists(k);
    match op {
        Op::Route { .. } => listed(op.kind()),
        // Shared experts beside the routed ones (Inkling) are resident with them.
        Op::RoutedExperts { weights, .. } => {
            let shared = weights.shared.iter().flat_map(|s| [&s.gate, &s.up, &s.down]);
            listed(op.kind())
                && [&weights.gate, &weights.up, &weights.down]
                    .into_iter()
                    .chain(shared)
                    .all(|t| device.features.reads(expert_format(t, sizer)))
        }
        _ => false,
    }
}

/// Device bytes of a chunk's expert scratch for one `RoutedExperts` op: the quantized input
/// rows, per (row, rank) pair the gated hidden rows (f32, then quantized) and the expert
/// outputs (f32), and the pairs grouped by expert.
pub fn expert_scratch(program: &Program, op: &Op, chunk_rows: usize) -> u64 {
    let Op::RoutedExperts { x, routing, experts, ffn, weights, .. } = op else { return 0 };
    let experts = experts + weights.shared.as_ref().map_or(0, |s| s.count);
    let (rows, hidden, ffn) = (chunk_rows as u64, program.value(*x).width as u64, *ffn as u64);
    let pairs = rows.saturating_mul(program.value(*routing).width as u64 / 2);
    // q8 blocks: 32 bytes of values and 8 of scales per 32 elements.
    let q8 = |elems: u64| elems.div_ceil(32).saturating_mul(40);
    let per_pair = (ffn + hidden).saturating_mul(F32);
    q8(rows.saturating_mul(hidden))
        .saturating_add(pairs.saturating_mul(per_pair))
        .saturating_add(q8(pairs.saturating_mul(ffn)))
        .saturating_add((experts as u64 + 1).saturating_add(pairs).saturating_mul(4))
}

/// What the rule decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Residency {
    /// Per layer: the device that holds all of its routed experts and runs its routing and
    /// experts in frame, or `None` (host steps).
    pub layers: Vec<Option<DeviceId>>,
    /// Per device of the fit: bytes of its resident experts, and of their scratch.
    pub bytes: Vec<(u64, u64)>,
}

/// Applies the rule to the devices of `fits` (after the dense fit and the tier's budgets).
pub fn resident_layers(
    program: &Program,
    profile: &DeviceProfile,
    options: &Options,
    layers: &[Place],
    fits: &[DeviceFit],
    sizer: &Sizer,
) -> Residency {
    let mut r = Residency { layers: vec![None; program.layers.len()], bytes: vec![(0, 0); fits.len()] };
    if !options.expert_tier || !options.resident_experts {
        return r;
    }
    for (k, fit) in fits.iter().enumerate() {
        let Some(dev) = profile.devices.get(k) else { continue };
        let (mut experts_bytes, mut scratch) = (0u64, 0u64);
        let mut all = true;
        let mut taken = Vec::new();
        for (l, layer) in program.layers.iter().enumerate() {
            if layers[l] != Place::Device(fit.device) {
                continue;
            }
            let Some(moe) = layer.ops.iter().find(|op| matches!(op, Op::RoutedExperts { .. })) else { continue };
            let Op::RoutedExperts { experts, weights, .. } = moe else { continue };
            let experts = experts + weights.shared.as_ref().map_or(0, |s| s.count);
            let route_ok =
                layer.ops.iter().filter(|op| matches!(op, Op::Route { .. })).all(|op| runs_resident(dev, op, sizer));
            let Some(one) = sizer.expert(moe) else {
                all = false;
                break;
            };
            let need = experts_bytes.saturating_add(one.saturating_mul(experts as u64));
            let need_scratch = scratch.max(expert_scratch(program, moe, options.chunk_rows));
            if !route_ok || !runs_resident(dev, moe, sizer) || need.saturating_add(need_scratch) > fit.tier {
                all = false;
                break;
            }
            experts_bytes = need;
            scratch = need_scratch;
            taken.push(l);
        }
        if all {
            for l in taken {
                r.layers[l] = Some(fit.device);
            }
            r.bytes[k] = (experts_bytes, scratch);
        }
    }
    r
}
