//! The KV split: when the KV mirrors of a long context do not fit beside the layers, each
//! split device layer keeps only a row's newest positions on the device (a ring) and the rest
//! in host RAM, where the host's canonical cache holds every position anyway. A step's
//! attention runs over both parts, the device's on the device and the host's on the CPU,
//! merged by their softmax statistics (the runtime's `cpu::attn_part`).
//!
//! The share is the row's own: a query at position `p` attends on the device over
//! `device_from(p)..=p` and on the host over the positions below, with `device_from` a
//! function of `p` alone (block-aligned), so a row gets the same device/host cut however a
//! forward is cut into steps. A step of at most `chunk` rows then reads device positions
//! `device_from(p0)..p0 + chunk`, at most `positions + chunk - 1` of them: the ring holds
//! `positions + chunk` (at most the context).
//!
//! The decision (`choose`):
//! 1. Forced (`Options::kv_device_positions`): that many positions (down to whole blocks, at
//!    least one block) on the device, whatever the budget.
//! 2. Otherwise, with the split allowed (`Options::kv_split`) and the chain not forced
//!    (`Options::device_layers`, `second_device_layers`), only when the chain left layers to the host: with the mirrors capped at the smallest split (`MIN_BLOCKS` blocks) the
//!    chain must take more layers than whole; then the most positions (whole blocks) that
//!    keep that many layers on the devices.
//!
//! A layer splits when its mirror at the context would hold more positions than the ring (a
//! sliding window's mirror is itself a ring of the window and a chunk, `window_rows`: one no
//! longer than the split's keeps it; so does attention with
//! relative logits, whose split parts nothing computes). This module must not cut
//! frames; it decides numbers, `place` applies them.

use crate::cost::human;
use crate::ids::{OpId, Part, Place};
use crate::ir::{LayerId, Op, Program};
use crate::profile::Options;
use std::fmt;

/// The fewest blocks a split keeps on the device when the budget decides.
pub const MIN_BLOCKS: usize = 4;

/// A KV split of the device layers' mirrors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSplit {
    /// Positions of a row's device share at most (a whole number of blocks).
    pub positions: usize,
    /// Positions per block: the share starts on a block boundary.
    pub block: usize,
    /// Positions a split layer's device mirror holds (a ring): `positions + chunk`, at most
    /// the context.
    pub ring: usize,
    /// The split layers (device layers whose attention mirror would pass the ring).
    pub layers: Vec<LayerId>,
    /// Whether `Options::kv_device_positions` forced it (else the budget did).
    pub forced: bool,
    /// Bytes of those layers' mirrors on the device, whole (at the context) and split.
    pub whole_bytes: u64,
    pub split_bytes: u64,
}

impl KvSplit {
    /// The first position a query row at `p` attends over on the device (`..=p`); the host
    /// attends over the positions below it. Block-aligned and a function of `p` alone:
    /// `max(0, floor(p / block) * block + block - positions)`, so the share holds between
    /// `positions - block + 1` and `positions` positions (fewer near the start).
    pub fn device_from(&self, p: usize) -> usize {
        device_from(p, self.positions, self.block)
    }
}

/// `KvSplit::device_from` on its numbers (`block >= 1`).
pub fn device_from(p: usize, positions: usize, block: usize) -> usize {
    let b = block.max(1);
    ((p / b) * b + b).saturating_sub(positions)
}

impl fmt::Display for KvSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<u32> = self.layers.iter().map(|l| l.0).collect();
        write!(
            f,
            "kv split ({}): {} keep a row's newest {} positions on the device ({} blocks of {}; a ring of {} with the chunk), the older in host RAM: mirrors {} instead of {}",
            if self.forced { "forced" } else { "past the budget" },
            crate::print::layer_ranges(&ids),
            self.positions,
            self.positions / self.block.max(1),
            self.block,
            self.ring,
            human(self.split_bytes),
            human(self.whole_bytes)
        )
    }
}

/// Positions a sliding window's mirror holds: a ring of the window and one chunk (a step of at
/// most `chunk_rows` rows sees `window - 1` positions before its first row and its own), at
/// most the context. A split's ring is the same rule over its device share.
pub fn window_rows(window: usize, chunk_rows: usize, context: usize) -> usize {
    window.saturating_add(chunk_rows.max(1)).min(context)
}

/// Positions a layer's attention mirror holds at `context` (a window's ring at most); `None` for
/// a layer without (GQA) attention or whose attention has relative logits (Inkling's: the
/// split's parts, `cpu::attn_part` and `attn_part.comp`, do not add them, so such a layer
/// never splits and the capped sizes keep its whole mirror) or compressed entries (DeepSeek
/// V4's: the parts do not attend over them either).
pub fn mirror_positions(program: &Program, layer: LayerId, context: usize, chunk_rows: usize) -> Option<usize> {
    program.layers.get(layer.0 as usize)?.ops.iter().find_map(|op| match op {
        Op::Attention { spec, .. } if spec.rel.is_none() && spec.compressed.is_none() => {
            Some(spec.window.map_or(context, |w| window_rows(w, chunk_rows, context)))
        }
        _ => None,
    })
}

/// The ring of a split with `positions` on the device.
pub fn ring(positions: usize, options: &Options, context: usize) -> usize {
    window_rows(positions, options.chunk_rows, context)
}

/// The positions a forced split keeps: whole blocks, at least one.
pub fn forced_positions(options: &Options) -> Option<usize> {
    let b = options.kv_block.max(1);
    options.kv_device_positions.map(|d| (d / b).max(1) * b)
}

/// The split layers of a placement: device layers whose mirror would pass the ring.
pub fn split_layers(
    program: &Program,
    layers: &[Place],
    ring: usize,
    context: usize,
    chunk_rows: usize,
) -> Vec<LayerId> {
    let passes = |l: LayerId| mirror_positions(program, l, context, chunk_rows).is_some_and(|p| p > ring);
    (0..layers.len()).map(|i| LayerId(i as u32)).filter(|&l| layers[l.0 as usize] != Place::Host && passes(l)).collect()
}

/// The attention ops of a placement's split layers that run on a device.
pub fn split_ops(program: &Program, placement: &super::Placement, placed: &[(OpId, Place)]) -> Vec<OpId> {
    let Some(split) = &placement.kv_split else { return Vec::new() };
    placed
        .iter()
        .filter(|(id, place)| {
            *place != Place::Host
                && matches!(id.part, Part::Layer(l) if split.layers.contains(&l))
                && matches!(crate::frames::op_of(program, *id), Op::Attention { .. })
        })
        .map(|(id, _)| *id)
        .collect()
}

/// Chooses the split's positions, given `layers_at(cap)`: how many layers the chain takes
/// with every mirror capped at `cap` positions (`None`: whole). Steps 1 and 2 of the module
/// doc; `None`: no split.
pub fn choose(options: &Options, context: usize, layers_at: &mut dyn FnMut(Option<usize>) -> usize) -> Option<usize> {
    let b = options.kv_block.max(1);
    if let Some(d) = forced_positions(options) {
        return Some(d);
    }
    if !options.kv_split
        || !options.dense_on_device
        || options.device_layers.is_some()
        || options.second_device_layers.is_some()
    {
        return None;
    }
    let min = MIN_BLOCKS * b;
    if ring(min, options, context) >= context {
        return None;
    }
    let whole = layers_at(None);
    let best = layers_at(Some(ring(min, options, context)));
    if best <= whole {
        return None;
    }
    // The most blocks that keep `best` layers (the count only falls as the ring grows).
    let (mut lo, mut hi) = (MIN_BLOCKS, context.div_ceil(b));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if layers_at(Some(ring(mid * b, options, context))) >= best {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo * b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_share_is_block_aligned_and_bounded() {
        for p in 0..200 {
            let s = device_from(p, 24, 8);
            assert_eq!(s % 8, 0);
            assert!(s <= p && p + 1 - s <= 24, "p {p}: from {s}");
            if p >= 24 {
                assert!(p + 1 - s > 24 - 8, "p {p}: from {s}");
            }
        }
        assert_eq!(device_from(0, 24, 8), 0);
        assert_eq!(device_from(23, 24, 8), 0);
        assert_eq!(device_from(24, 24, 8), 8);
    }

    #[test]
    fn the_budget_takes_the_most_positions_that_keep_the_most_layers() {
        let o = Options { kv_block: 16, chunk_rows: 16, ..Options::default() };
        // Layers taken: 4 at the whole context, 6 up to a ring of 160 positions, 5 beyond.
        let mut at = |cap: Option<usize>| match cap {
            None => 4,
            Some(c) if c <= 160 => 6,
            Some(_) => 5,
        };
        assert_eq!(choose(&o, 4096, &mut at), Some(144));
        // Nothing gained: no split.
        assert_eq!(choose(&o, 4096, &mut |_| 4), None);
        // Forced.
        let f = Options { kv_device_positions: Some(40), ..o.clone() };
        assert_eq!(choose(&f, 4096, &mut |_| 4), Some(32));
        let off = Options { kv_split: false, ..o };
        assert_eq!(choose(&off, 4096, &mut at), None);
    }
}
