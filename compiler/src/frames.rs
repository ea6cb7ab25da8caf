//! Frames: the program cut into spans that run in one place, in execution order, with what
//! each moves between the host and its device.
//!
//! 1. Ops in program order are cut wherever their place changes: a device span is one frame
//!    (one submission), a host span is a host frame (`Route` and `RoutedExperts` are host
//!    steps unless placement made their layer's experts resident on the device, and so is any
//!    op its layer's device cannot run).
//! 2. A device span right after a host frame is split at its first op that reads what that
//!    host frame writes (or writes what it reads or writes; an attention over compressed
//!    entries reads what its layer's `KvCompress` closes, `reads_host_state`): the part before
//!    runs beside the host frame, not waited for (the shared expert while the host runs the
//!    routed experts).
//! 3. Each value read in a frame whose newest copy is elsewhere is uploaded before it (device
//!    frames) and downloaded by the frame that wrote it (device frames whose value the host or
//!    another device reads next). The logits are read by the host at the end.
//! 4. A KV-split layer's attention (`place::kv_split`) ends its frame (`Frame::kv_split`): the
//!    device attends over a row's newest positions, then the host reads the rotated queries
//!    (downloaded), attends over the older positions from its cache, merges, and holds the
//!    output, which the next device frame uploads.
//!
//! Pre: every op placed. Post: no frame spans two places; frames are in execution order and
//! cover every op once. This module must not place anything.

use crate::ids::{FrameId, OpId, Part, Place};
use crate::ir::{op_io, Op, Program, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Whether `op` reads layer state an op of `host` writes: an attention over compressed entries
/// reads the entries its layer's `KvCompress` closes (state, not a value, so `op_io` does not
/// show it).
pub fn reads_host_state(program: &Program, host: &[OpId], op: OpId) -> bool {
    let Op::Attention { layer, spec, .. } = op_of(program, op) else { return false };
    spec.compressed.is_some()
        && host.iter().any(|id| matches!(op_of(program, *id), Op::KvCompress { layer: l, .. } if l == layer))
}

/// One span of ops in one place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub id: FrameId,
    pub place: Place,
    pub ops: Vec<OpId>,
    /// Values the host sends to the device before the frame (device frames).
    pub uploads: Vec<ValueId>,
    /// Values the device sends to the host after the frame (device frames).
    pub downloads: Vec<ValueId>,
    /// Not waited for: the host submits it and runs host frame `beside` meanwhile.
    pub beside: Option<FrameId>,
    /// The frame's last op, the attention of a KV-split layer: the device ran its part; the
    /// host finishes it after the frame and holds its output.
    pub kv_split: Option<OpId>,
}

/// The op of the program an `OpId` names.
pub fn op_of(program: &Program, id: OpId) -> &Op {
    let i = id.index as usize;
    match id.part {
        Part::Prologue => &program.prologue[i],
        Part::Layer(l) => &program.layers[l.0 as usize].ops[i],
        Part::Epilogue => &program.epilogue[i],
    }
}

/// Cuts `placed` (every op with its place, in program order) into frames; `split`: the
/// device attention ops of KV-split layers (step 4).
pub fn split_frames(program: &Program, placed: &[(OpId, Place)], split: &[OpId]) -> Vec<Frame> {
    // 1. Runs of one place (4: a split attention ends its run).
    let mut runs: Vec<(Place, Vec<OpId>)> = Vec::new();
    let mut ended = false;
    for &(id, place) in placed {
        match runs.last_mut() {
            Some((p, ops)) if *p == place && !ended => ops.push(id),
            _ => runs.push((place, vec![id])),
        }
        ended = place != Place::Host && split.contains(&id);
    }
    // 2. The independent head of a device run after a host run goes beside it.
    let mut frames: Vec<Frame> = Vec::new();
    let new = |place, ops: Vec<OpId>, beside| {
        let kv_split = ops.last().copied().filter(|id| place != Place::Host && split.contains(id));
        Frame { id: FrameId(0), place, ops, uploads: vec![], downloads: vec![], beside, kv_split }
    };
    for (k, (place, ops)) in runs.iter().enumerate() {
        let after_host = k > 0 && runs[k - 1].0 == Place::Host && *place != Place::Host;
        if !after_host {
            frames.push(new(*place, ops.clone(), None));
            continue;
        }
        let (host_reads, host_writes) = io_of(program, &runs[k - 1].1);
        let mut tainted = host_writes.clone();
        let mut split = ops.len();
        for (i, id) in ops.iter().enumerate() {
            let (r, w) = op_io(op_of(program, *id));
            let depends = r.iter().any(|v| tainted.contains(v)) || reads_host_state(program, &runs[k - 1].1, *id);
            let clobbers = w.iter().any(|v| host_reads.contains(v) || host_writes.contains(v));
            if depends || clobbers {
                split = i;
                break;
            }
            tainted.retain(|v| !w.contains(v));
        }
        let host_frame = FrameId(frames.len() as u32 - 1);
        if split > 0 {
            frames.push(new(*place, ops[..split].to_vec(), Some(host_frame)));
        }
        if split < ops.len() {
            frames.push(new(*place, ops[split..].to_vec(), None));
        }
    }
    for (i, f) in frames.iter_mut().enumerate() {
        f.id = FrameId(i as u32);
    }
    // 3. Transfers. Downloads first (they depend on later reads only), then uploads by
    // following which places hold the newest copy of each value.
    // A split attention writes its output on the host (after the frame), not on the device.
    let ios: Vec<Vec<(Vec<ValueId>, Vec<ValueId>)>> = frames
        .iter()
        .map(|f| {
            f.ops
                .iter()
                .map(|id| {
                    if f.kv_split == Some(*id) {
                        (op_io(op_of(program, *id)).0, vec![])
                    } else {
                        op_io(op_of(program, *id))
                    }
                })
                .collect()
        })
        .collect();
    for fi in 0..frames.len() {
        if frames[fi].place != Place::Host {
            let written: BTreeSet<ValueId> = ios[fi].iter().flat_map(|(_, w)| w.iter().copied()).collect();
            let mut down: BTreeSet<ValueId> =
                written.into_iter().filter(|v| read_elsewhere_later(&frames, &ios, fi, *v, program)).collect();
            down.extend(frames[fi].kv_split.and_then(|id| split_query(program, id)));
            frames[fi].downloads = down.into_iter().collect();
        }
    }
    let mut holders: BTreeMap<ValueId, BTreeSet<Place>> = BTreeMap::new();
    for fi in 0..frames.len() {
        let place = frames[fi].place;
        let mut uploads = BTreeSet::new();
        for (reads, writes) in &ios[fi] {
            for v in reads {
                let h = holders.entry(*v).or_insert_with(|| BTreeSet::from([Place::Host]));
                // A host frame reads what a device frame downloaded (the verifier checks it).
                if !h.contains(&place) && place != Place::Host {
                    uploads.insert(*v);
                    h.insert(place);
                }
            }
            for v in writes {
                holders.insert(*v, BTreeSet::from([place]));
            }
        }
        for v in &frames[fi].downloads {
            holders.entry(*v).or_default().insert(Place::Host);
        }
        if let Some(id) = frames[fi].kv_split {
            for v in op_io(op_of(program, id)).1 {
                holders.insert(v, BTreeSet::from([Place::Host]));
            }
        }
        frames[fi].uploads = uploads.into_iter().collect();
    }
    frames
}

/// The query rows a split attention's host part reads (rotated on the device, downloaded).
pub fn split_query(program: &Program, id: OpId) -> Option<ValueId> {
    match op_of(program, id) {
        Op::Attention { q, .. } => Some(*q),
        _ => None,
    }
}

/// The values a list of ops reads before writing them, and the values it writes.
fn io_of(program: &Program, ops: &[OpId]) -> (BTreeSet<ValueId>, BTreeSet<ValueId>) {
    let (mut reads, mut writes) = (BTreeSet::new(), BTreeSet::new());
    for id in ops {
        let (r, w) = op_io(op_of(program, *id));
        reads.extend(r.into_iter().filter(|v| !writes.contains(v)));
        writes.extend(w);
    }
    (reads, writes)
}

/// Whether value `v`, written in frame `fi`, is read in another place before it is written
/// again (the logits, and the value the program exports, count as read by the host after the
/// last frame).
fn read_elsewhere_later(
    frames: &[Frame],
    ios: &[Vec<(Vec<ValueId>, Vec<ValueId>)>],
    fi: usize,
    v: ValueId,
    program: &Program,
) -> bool {
    let place = frames[fi].place;
    for (f, io) in frames.iter().zip(ios).skip(fi + 1) {
        for (reads, writes) in io {
            if reads.contains(&v) && f.place != place {
                return true;
            }
            if writes.contains(&v) {
                return false;
            }
        }
    }
    v == program.logits || program.export == Some(v)
}
