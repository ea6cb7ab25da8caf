//! The verifier: invariants of a plan, checked after lowering, before a plan is handed out.
//! A failure is a compiler bug, reported as such.
//!
//! Invariants:
//! 1. Frames are numbered `f0, f1, ...` in order and cover every op of the program exactly
//!    once, in program order.
//! 2. A frame runs in one place; host steps (`Route`, `RoutedExperts`) only on the host, or on
//!    the device that holds every routed expert of their layer; an op in a device frame is one
//!    that device runs, in formats it reads.
//! 3. Every value a frame reads is there when it runs: written by an earlier op (none is read
//!    before one writes it), and written earlier in the frame, uploaded before it (device
//!    frames), or already held there; a value is uploaded only when the
//!    host holds its newest copy; the host reads only what it wrote or a device downloaded.
//!    The logits end up on the host.
//! 4. A frame not waited for directly follows the host frame it runs beside, reads nothing
//!    that frame writes (values, or layer state: `frames::reads_host_state`), and writes
//!    nothing it reads or writes.
//! 5. Device layers form consecutive chains in device order, then the host's layers; the head
//!    is on a device only with every layer on devices, on the device of the last layer.
//! 6. Bytes placed on a device never exceed its usable bytes; its layer count matches the
//!    placement; its resident experts and their scratch fit its tier budget.
//! 7. A KV split: exactly the device attention ops of its layers end frames as split ones
//!    (`Frame::kv_split`), each frame downloading its queries; their outputs are the host's
//!    after the frame (step 3 counts them so); its positions are whole blocks, its ring holds a
//!    share and a chunk, and its layers are device layers.
//!
//! This module must not change a plan.

use crate::frames::op_of;
use crate::ids::{OpId, Part, Place};
use crate::ir::{op_io, ValueId};
use crate::place::resident::runs_resident;
use crate::place::runs_on;
use crate::place::size::Sizer;
use crate::plan::Plan;
use std::collections::{BTreeMap, BTreeSet};

/// Every broken invariant of `plan`, as messages naming the frame, layer or device.
pub fn verify(plan: &Plan, sizer: &Sizer) -> Vec<String> {
    let mut errs = Vec::new();
    let p = &plan.program;
    // 1. Coverage and order.
    let mut expected: Vec<OpId> =
        (0..p.prologue.len()).map(|i| OpId { part: Part::Prologue, index: i as u32 }).collect();
    for l in &p.layers {
        expected.extend((0..l.ops.len()).map(|i| OpId { part: Part::Layer(l.id), index: i as u32 }));
    }
    expected.extend((0..p.epilogue.len()).map(|i| OpId { part: Part::Epilogue, index: i as u32 }));
    let got: Vec<OpId> = plan.frames.iter().flat_map(|f| f.ops.iter().copied()).collect();
    if got != expected {
        errs.push(format!(
            "the frames hold {} ops, the program {}, or not in program order",
            got.len(),
            expected.len()
        ));
    }
    for (i, f) in plan.frames.iter().enumerate() {
        if f.id.0 as usize != i {
            errs.push(format!("frame {} is numbered {}", i, f.id));
        }
        if f.ops.is_empty() {
            errs.push(format!("{} is empty", f.id));
        }
    }
    // 2. Places of ops.
    for f in &plan.frames {
        for id in &f.ops {
            let op = op_of(p, *id);
            let resident = match id.part {
                Part::Layer(l) => {
                    plan.placement.resident.layers.get(l.0 as usize).copied().flatten().map(Place::Device)
                        == Some(f.place)
                }
                _ => false,
            };
            match f.place {
                Place::Host => {}
                Place::Device(d) => match plan.profile.devices.get(d.0 as usize) {
                    None => errs.push(format!("{} runs on {d}, which the profile lacks", f.id)),
                    Some(dev) if resident && runs_resident(dev, op, sizer) => {}
                    Some(dev) if !runs_on(dev, op, sizer) => {
                        errs.push(format!("{} runs {id} ({}) on {d}, which cannot run it", f.id, op.kind()))
                    }
                    Some(_) => {}
                },
            }
            if op.kind().info().host_step && f.place != Place::Host && !resident {
                errs.push(format!("{}: host step {id} ({}) on {}", f.id, op.kind(), f.place));
            }
        }
    }
    // 3. Data availability.
    let mut holders: BTreeMap<ValueId, BTreeSet<Place>> = BTreeMap::new();
    for f in &plan.frames {
        for v in &f.uploads {
            if f.place == Place::Host {
                errs.push(format!("host frame {} has uploads", f.id));
            }
            let h = holders.entry(*v).or_insert_with(|| BTreeSet::from([Place::Host]));
            if !h.contains(&Place::Host) {
                errs.push(format!("{} uploads {v}, whose newest copy the host does not hold", f.id));
            }
            h.insert(f.place);
        }
        for id in &f.ops {
            let (reads, writes) = op_io(op_of(p, *id));
            for v in reads {
                if !holders.contains_key(&v) {
                    errs.push(format!("{}: {id} reads {v} ({}) before any op writes it", f.id, p.value(v).name));
                }
                let h = holders.entry(v).or_insert_with(|| BTreeSet::from([Place::Host]));
                if !h.contains(&f.place) {
                    errs.push(format!(
                        "{}: {id} reads {v} ({}), which {} does not hold",
                        f.id,
                        p.value(v).name,
                        f.place
                    ));
                }
            }
            // 7. A split attention's output is the host's (after the frame).
            let at = if f.kv_split == Some(*id) { Place::Host } else { f.place };
            for v in writes {
                holders.insert(v, BTreeSet::from([at]));
            }
        }
        for v in &f.downloads {
            holders.entry(*v).or_default().insert(Place::Host);
        }
    }
    if !holders.get(&p.logits).is_some_and(|h| h.contains(&Place::Host)) {
        errs.push("the logits do not reach the host".into());
    }
    // 4. Frames not waited for.
    for (i, f) in plan.frames.iter().enumerate() {
        let Some(b) = f.beside else { continue };
        if i == 0 || plan.frames[i - 1].id != b || plan.frames[i - 1].place != Place::Host || f.place == Place::Host {
            errs.push(format!("{} runs beside {b}, which is not the host frame just before it", f.id));
            continue;
        }
        let host = &plan.frames[i - 1];
        let (mut hr, mut hw) = (BTreeSet::new(), BTreeSet::new());
        for id in &host.ops {
            let (r, w) = op_io(op_of(p, *id));
            hr.extend(r);
            hw.extend(w);
        }
        for id in &f.ops {
            let (r, w) = op_io(op_of(p, *id));
            if let Some(v) = r.iter().find(|v| hw.contains(*v)) {
                errs.push(format!("{} (beside {b}) reads {v}, which {b} writes", f.id));
            }
            if crate::frames::reads_host_state(p, &host.ops, *id) {
                errs.push(format!("{} (beside {b}) reads the layer state {b} writes", f.id));
            }
            if let Some(v) = w.iter().find(|v| hr.contains(*v) || hw.contains(*v)) {
                errs.push(format!("{} (beside {b}) writes {v}, which {b} uses", f.id));
            }
        }
    }
    // 7. The KV split.
    let pl = &plan.placement;
    let want: BTreeSet<OpId> = match &pl.kv_split {
        Some(k) => {
            if k.block == 0
                || k.positions == 0
                || k.positions % k.block != 0
                || k.ring < k.positions.min(plan.options.context)
            {
                errs.push(format!(
                    "kv split: {} positions in blocks of {}, a ring of {}",
                    k.positions, k.block, k.ring
                ));
            }
            for l in &k.layers {
                if pl.layers.get(l.0 as usize).is_none_or(|p| *p == Place::Host) {
                    errs.push(format!("kv split: {l} is not a device layer"));
                }
            }
            plan.frames
                .iter()
                .filter(|f| f.place != Place::Host)
                .flat_map(|f| f.ops.iter().copied())
                .filter(|id| {
                    matches!(id.part, Part::Layer(l) if k.layers.contains(&l))
                        && matches!(op_of(p, *id), crate::ir::Op::Attention { .. })
                })
                .collect()
        }
        None => BTreeSet::new(),
    };
    let got: BTreeSet<OpId> = plan.frames.iter().filter_map(|f| f.kv_split).collect();
    if got != want {
        errs.push(format!(
            "kv split: {} frames end in a split attention, {} device attention ops of split layers",
            got.len(),
            want.len()
        ));
    }
    for f in &plan.frames {
        let Some(id) = f.kv_split else { continue };
        if f.ops.last() != Some(&id) || f.place == Place::Host {
            errs.push(format!("{}: split attention {id} does not end a device frame", f.id));
        }
        if let Some(q) = crate::frames::split_query(p, id) {
            if !f.downloads.contains(&q) {
                errs.push(format!("{}: split attention {id} does not download its queries {q}", f.id));
            }
        }
    }
    // 5. Chains.
    let rank = |pl: Place| match pl {
        Place::Device(d) => d.0 as u64,
        Place::Host => u64::MAX,
    };
    for w in pl.layers.windows(2) {
        if rank(w[0]) > rank(w[1]) {
            errs.push(format!("layers are not in device order: {} before {}", w[0], w[1]));
        }
    }
    if let Place::Device(d) = pl.head {
        if pl.layers.last().is_some_and(|l| *l != Place::Device(d)) {
            errs.push(format!("the head is on {d} but the last layer is not"));
        }
    }
    // 6. Budgets.
    for (k, f) in pl.fits.iter().enumerate() {
        if f.bytes > f.usable {
            errs.push(format!("{}: {} bytes placed, {} usable", f.device, f.bytes, f.usable));
        }
        let (experts, scratch) = pl.resident.bytes.get(k).copied().unwrap_or((0, 0));
        if experts.saturating_add(scratch) > f.tier {
            errs.push(format!(
                "{}: resident experts need {} bytes, the tier holds {}",
                f.device,
                experts.saturating_add(scratch),
                f.tier
            ));
        }
        let n = pl.layers.iter().filter(|l| **l == Place::Device(f.device)).count();
        if n != f.layers {
            errs.push(format!("{}: the fit took {} layers, the placement gives it {n}", f.device, f.layers));
        }
    }
    errs
}
