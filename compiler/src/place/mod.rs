//! Placement: which device runs each layer's dense part and the head, decided by the fit.
//!
//! 1. Each layer's bytes on a device are the bytes of the ops that device runs (`size`).
//! 2. The primary device takes the most layers from layer 0 that fit its usable bytes beside
//!    the fixed bytes (`fit::fit_chain`), or exactly `Options::device_layers` when forced.
//! 3. Each further device takes, from where the previous one stopped, the layers it holds
//!    (its own fit over its own usable bytes; the second device's forced by
//!    `Options::second_device_layers`).
//! 4. The layers no device took, and the head unless the device holding the last layer has
//!    room for it too, run on the host CPU. The embedding always runs on the host.
//! 5. With the expert tier on, what each device has left is its expert cache; where that
//!    holds every routed expert of a layer (whole layers from the device's first, `resident`),
//!    the layer's routing and experts run in the device's frame.
//! 6. A KV split (`kv_split`), forced or where capping the mirrors puts more layers on the
//!    devices, sizes the device layers' mirrors as rings of a row's newest positions: steps
//!    2-5 run again on those sizes.
//!
//! Post: placed bytes never exceed a device's usable bytes; device layers form consecutive
//! chains in device order, followed by the host's. This module must not cut frames.

pub mod fit;
pub mod kv_split;
pub mod resident;
pub mod size;

use crate::cost::human;
use crate::ids::{DeviceId, OpId, Part, Place};
use crate::ir::{LayerId, Op, Program};
use crate::ops::OpKind;
use crate::profile::{Device, DeviceProfile, KvElement, Options};
use size::{op_weights, LayerCost, Sizer};

/// What one device of the profile was given.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceFit {
    pub device: DeviceId,
    pub usable: u64,
    /// Scratch bytes the device holds when it takes any layer.
    pub fixed: u64,
    /// The first layer it was offered and how many it took.
    pub first_layer: usize,
    pub layers: usize,
    /// Whether it took the head.
    pub tail: bool,
    /// Bytes placed (fixed, layers and tail).
    pub bytes: u64,
    /// Bytes left for the expert tier's cache (0 with the tier off or no routed experts).
    pub tier: u64,
}

/// Where each part of the program runs, and the numbers that decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Per layer: where its dense part runs.
    pub layers: Vec<Place>,
    /// Where the epilogue (final norm and head) runs.
    pub head: Place,
    /// Per layer: its bytes on the device it was offered to (on the primary when none).
    pub costs: Vec<LayerCost>,
    pub fixed: u64,
    pub tail: u64,
    pub fits: Vec<DeviceFit>,
    /// Bytes of one routed expert, per MoE layer.
    pub expert_bytes: Vec<(LayerId, u64, usize)>,
    /// The layers whose routed experts are all resident on a device (in-frame routing).
    pub resident: resident::Residency,
    /// The device layers whose KV mirrors keep only a row's newest positions, if any.
    pub kv_split: Option<kv_split::KvSplit>,
}

/// Whether `device` runs `op`: not a host step, an op kind it runs, matrices in formats it reads.
pub fn runs_on(device: &Device, op: &Op, sizer: &Sizer) -> bool {
    device.features.runs(op.kind())
        && op_weights(op).iter().all(|w| !size::is_matrix(w) || device.features.reads(sizer.upload_format(w)))
}

/// Places `program` on the devices of `profile`. Errors are messages about the options.
pub fn place(
    program: &Program,
    profile: &DeviceProfile,
    options: &Options,
    sizer: &Sizer,
) -> Result<Placement, String> {
    // 6. The KV split, if any: the chain again with the mirrors capped at the ring.
    let context = sizer.context();
    let on_devices = |p: &Placement| p.layers.iter().filter(|l| **l != Place::Host).count();
    let mut layers_at =
        |cap: Option<usize>| chain(program, profile, options, &sizer.with_kv_cap(cap)).map_or(0, |p| on_devices(&p));
    let Some(positions) = kv_split::choose(options, context, &mut layers_at) else {
        return chain(program, profile, options, sizer);
    };
    let ring = kv_split::ring(positions, options, context);
    let capped = sizer.with_kv_cap(Some(ring));
    let mut placement = chain(program, profile, options, &capped)?;
    let layers = kv_split::split_layers(program, &placement.layers, ring, context, options.chunk_rows);
    if layers.is_empty() {
        return chain(program, profile, options, sizer);
    }
    // Each split layer's mirror in its device's element.
    let element = |l: LayerId| match placement.layers[l.0 as usize] {
        Place::Device(d) => profile.devices[d.0 as usize].features.kv,
        Place::Host => KvElement::F32,
    };
    let kv = |s: &Sizer| {
        (layers.iter().map(|&l| s.ops_cost_on(&program.layers[l.0 as usize].ops, element(l)).kv))
            .fold(0u64, u64::saturating_add)
    };
    let (whole_bytes, split_bytes) = (kv(sizer), kv(&capped));
    let forced = options.kv_device_positions.is_some();
    placement.kv_split = Some(kv_split::KvSplit {
        positions,
        block: options.kv_block.max(1),
        ring,
        layers,
        forced,
        whole_bytes,
        split_bytes,
    });
    Ok(placement)
}

/// Steps 1-5 on the sizes `sizer` gives.
fn chain(program: &Program, profile: &DeviceProfile, options: &Options, sizer: &Sizer) -> Result<Placement, String> {
    let l = program.layers.len();
    let cost_on = |d: &Device| -> Vec<LayerCost> {
        let on = |layer: &'_ crate::ir::Layer| {
            sizer.ops_cost_on(layer.ops.iter().filter(|op| runs_on(d, op, sizer)), d.features.kv)
        };
        program.layers.iter().map(on).collect()
    };
    let fixed = sizer.fixed();
    let tail_on = |d: &Device| {
        sizer.ops_cost_on(program.epilogue.iter().filter(|op| runs_on(d, op, sizer)), d.features.kv).total()
            + sizer.tail_rows()
    };
    let mut costs = match profile.devices.first() {
        Some(d) => cost_on(d),
        None => program.layers.iter().map(|layer| sizer.layer(layer)).collect(),
    };
    let mut layers = vec![Place::Host; l];
    let mut head = Place::Host;
    let mut fits = Vec::new();
    let mut start = 0;
    // 2-3. The chain, device by device.
    for (k, dev) in profile.devices.iter().enumerate() {
        let id = DeviceId(k as u32);
        let dev_costs = cost_on(dev);
        let totals: Vec<u64> = dev_costs[start..].iter().map(LayerCost::total).collect();
        let tail = tail_on(dev);
        let fit = if !options.dense_on_device || start >= l {
            fit::ChainFit { layers: 0, tail: false, bytes: 0 }
        } else if let Some((flag, n)) = forced(k, options) {
            fit::forced_chain(fixed, &totals, tail, dev.usable(), n).ok_or_else(|| {
                let need = totals[..n.min(totals.len())].iter().fold(fixed, |a, b| a.saturating_add(*b));
                format!(
                    "{flag} {n}: the layers need {} on {id} ({}), which holds {}",
                    human(need),
                    dev.name,
                    human(dev.usable())
                )
            })?
        } else {
            fit::fit_chain(fixed, &totals, tail, dev.usable())
        };
        for (i, c) in dev_costs.iter().enumerate().skip(start).take(fit.layers) {
            layers[i] = Place::Device(id);
            costs[i] = *c;
        }
        if fit.tail {
            head = Place::Device(id);
        }
        fits.push(DeviceFit {
            device: id,
            usable: dev.usable(),
            fixed: if fit.layers > 0 { fixed } else { 0 },
            first_layer: start,
            layers: fit.layers,
            tail: fit.tail,
            bytes: fit.bytes,
            tier: 0,
        });
        start += fit.layers;
    }
    // 5. The expert tier takes what is left.
    let expert_bytes: Vec<(LayerId, u64, usize)> = program
        .layers
        .iter()
        .filter_map(|layer| {
            layer.ops.iter().find_map(|op| match op {
                // With shared ones beside them (Inkling), the tier holds those too; DeepSeek V4's
                // (their limited SwiGLU) are the tier's too.
                Op::RoutedExperts { experts, weights, .. }
                    if matches!(
                        op.kind(),
                        OpKind::RoutedExperts | OpKind::RoutedExpertsShared | OpKind::RoutedExpertsLimited
                    ) =>
                {
                    let shared = weights.shared.as_ref().map_or(0, |s| s.count);
                    sizer.expert(op).map(|b| (layer.id, b, *experts + shared))
                }
                _ => None,
            })
        })
        .collect();
    if options.expert_tier && !expert_bytes.is_empty() {
        for f in &mut fits {
            f.tier = f.usable.saturating_sub(f.bytes);
        }
    }
    let resident = resident::resident_layers(program, profile, options, &layers, &fits, sizer);
    Ok(Placement { layers, head, costs, fixed, tail: sizer.tail(), fits, expert_bytes, resident, kv_split: None })
}

/// The forced number of layers of device `k`, with the flag that forces it.
fn forced(k: usize, options: &Options) -> Option<(&'static str, usize)> {
    match k {
        0 => options.device_layers.map(|n| ("--device-layers", n)),
        1 => options.second_device_layers.map(|n| ("--device2-layers", n)),
        _ => None,
    }
}

/// Where each op runs, in program order.
pub fn op_places(
    program: &Program,
    profile: &DeviceProfile,
    placement: &Placement,
    sizer: &Sizer,
) -> Vec<(OpId, Place)> {
    let on = |place: Place, op: &Op| match place {
        Place::Device(d) if runs_on(&profile.devices[d.0 as usize], op, sizer) => place,
        _ => Place::Host,
    };
    let mut out = Vec::new();
    for (i, op) in program.prologue.iter().enumerate() {
        out.push((OpId { part: Part::Prologue, index: i as u32 }, on(Place::Host, op)));
    }
    for (l, (layer, place)) in program.layers.iter().zip(&placement.layers).enumerate() {
        let resident = placement.resident.layers.get(l).copied().flatten();
        for (i, op) in layer.ops.iter().enumerate() {
            let at = match resident {
                Some(d) if matches!(op, Op::Route { .. } | Op::RoutedExperts { .. }) => Place::Device(d),
                _ => on(*place, op),
            };
            out.push((OpId { part: Part::Layer(layer.id), index: i as u32 }, at));
        }
    }
    for (i, op) in program.epilogue.iter().enumerate() {
        out.push((OpId { part: Part::Epilogue, index: i as u32 }, on(placement.head, op)));
    }
    out
}
