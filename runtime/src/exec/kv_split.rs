//! The executor's side of a KV split (the plan's `placement.kv_split`): a split layer's device
//! mirror is a ring of the newest positions (`place::kv_split`), a step's attention runs over
//! both parts, the device's part (`vk::ops::attn_part`) in the layer's frame, the host's part
//! over the older positions from the canonical host cache after it, merged by their softmax
//! statistics (`cpu::attn_part`); the merged rows are the attention's output, which the next
//! device frame uploads as the plan says.
//!
//! The ring follows the host's cache as whole mirrors do: it holds the positions
//! `ring_lo..watermark` for sure; a step from `pos0` needs `device_from(pos0)..pos0` and gets
//! what it lacks from the host's cache before its frame.
//!
//! Must not: decide the split (the plan did), or write the host's cache (the frame's read-back
//! rows do, as for every device layer).

use super::kv::LayerKv;
use crate::bytes::as_bytes_mut;
use crate::cpu::attention::AttnShape as CpuShape;
use crate::cpu::attn_part::{attend_part, merge, Parts};
use crate::exec::weights::WeightStore;
use crate::vk::ops::attn_part::SplitShape;
use crate::vk::{Context, DeviceBuffer, KvType, MemoryUse, VkError};
use coli_compiler::ir::{AttentionSpec, LayerId, Op, Program};
use coli_compiler::place::kv_split::{device_from, KvSplit};
use std::sync::atomic::{AtomicU64, Ordering};

/// A split layer before a step (`Split::upload`): layer `layer`'s ring mirrors `k` and `v`
/// (of `kv` elements), the host's cache `host` of the layer, and the layer's watermark `mark`.
pub struct RingUpload<'a> {
    pub layer: usize,
    pub k: &'a DeviceBuffer,
    pub v: &'a DeviceBuffer,
    pub kv: KvType,
    pub host: &'a LayerKv,
    pub mark: &'a mut usize,
}

/// What the host's part of a split attention step reads (`Split::finish`): the op's spec, the
/// weights (its sinks), the step's rotated query rows `q`, the host's cache `host` of the
/// layer (which holds the step's rows by now), and the step's `n` rows from `pos0`.
pub struct HostPart<'a> {
    pub spec: &'a AttentionSpec,
    pub weights: &'a WeightStore,
    pub q: &'a [f32],
    pub host: &'a LayerKv,
    pub n: usize,
    pub pos0: usize,
}

/// A model's split: its numbers and what its steps did.
#[derive(Debug)]
pub struct Split {
    pub plan: KvSplit,
    steps: AtomicU64,
    host_steps: AtomicU64,
    host_positions: AtomicU64,
}

/// What a model's split layers did so far (over every session).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitStats {
    /// Layer steps of split layers.
    pub steps: u64,
    /// Of those, the ones with a host part (a row saw positions the device does not hold).
    pub host_steps: u64,
    /// (row, position) pairs the host attended over.
    pub host_positions: u64,
}

/// Per-session state: the rings' lower ends and the partial results' buffers.
pub struct SplitState {
    /// Per layer: the first position the ring holds for sure (with the watermark, its end).
    ring_lo: Vec<usize>,
    /// The device part of a step (`cap_rows x heads * v_head_dim`, `cap_rows x heads x 2`), and
    /// their host-cached read-back twins.
    pub acc: DeviceBuffer,
    pub ml: DeviceBuffer,
    pub acc_back: DeviceBuffer,
    pub ml_back: DeviceBuffer,
}

impl Split {
    pub fn new(plan: KvSplit) -> Split {
        Split { plan, steps: AtomicU64::new(0), host_steps: AtomicU64::new(0), host_positions: AtomicU64::new(0) }
    }

    /// Whether `layer` is split.
    pub fn splits(&self, layer: LayerId) -> bool {
        self.plan.layers.contains(&layer)
    }

    /// The device ops' numbers.
    pub fn shape(&self) -> SplitShape {
        SplitShape { positions: self.plan.positions, block: self.plan.block, ring: self.plan.ring }
    }

    pub fn stats(&self) -> SplitStats {
        SplitStats {
            steps: self.steps.load(Ordering::Relaxed),
            host_steps: self.host_steps.load(Ordering::Relaxed),
            host_positions: self.host_positions.load(Ordering::Relaxed),
        }
    }

    /// A session's state for `layers` layers, partial buffers for `cap_rows` rows of the
    /// widest split attention of `program`.
    pub fn new_state(&self, ctx: &Context, program: &Program, cap_rows: usize) -> Result<SplitState, VkError> {
        let (mut ow, mut heads) = (1, 1);
        for l in &self.plan.layers {
            for op in &program.layers[l.0 as usize].ops {
                if let Op::Attention { spec, .. } = op {
                    ow = ow.max(spec.heads * spec.v_head_dim);
                    heads = heads.max(spec.heads);
                }
            }
        }
        let rows = cap_rows.max(1);
        Ok(SplitState {
            ring_lo: vec![0; program.layers.len()],
            acc: ctx.f32_buffer(rows * ow)?,
            ml: ctx.f32_buffer(rows * heads * 2)?,
            acc_back: ctx.buffer(MemoryUse::Readback, rows * ow * 4)?,
            ml_back: ctx.buffer(MemoryUse::Readback, rows * heads * 2 * 4)?,
        })
    }

    /// Before a step of layer `u.layer` from `pos0`: the ring gets the positions of the
    /// step's shares below `pos0` that it lacks (from the host's cache); the watermark (at
    /// most `pos0`) becomes `pos0`.
    pub fn upload(&self, ctx: &Context, st: &mut SplitState, u: RingUpload, pos0: usize) -> Result<(), VkError> {
        let need = self.plan.device_from(pos0).min(pos0);
        let l = u.layer;
        fill_ring(ctx, u, self.plan.ring, need, pos0, &mut st.ring_lo[l])
    }

    /// After a step of `n` rows from `pos0` wrote its rows into layer `l`'s ring.
    pub fn stepped(&self, st: &mut SplitState, l: usize, pos0: usize, n: usize) {
        ring_stepped(&mut st.ring_lo[l], self.plan.ring, pos0, n);
    }

    /// The host's side of a split attention op after its frame: the device's part read
    /// back, the host's part over each row's older positions (and the sinks) from the host's
    /// cache, the merge into `out` (`n x heads * v_head_dim`, times the value scale).
    pub fn finish(&self, ctx: &Context, st: &SplitState, part: HostPart, out: &mut Vec<f32>) -> Result<(), VkError> {
        let HostPart { spec, weights, q, host: c, n, pos0 } = part;
        let s = CpuShape::of(spec);
        let ow = spec.heads * spec.v_head_dim;
        let mut device = Parts { acc: vec![0.0; n * ow], ml: vec![0.0; n * spec.heads * 2] };
        ctx.read(&st.acc_back, 0, as_bytes_mut(&mut device.acc))?;
        ctx.read(&st.ml_back, 0, as_bytes_mut(&mut device.ml))?;
        let lo = |p: usize| spec.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let range = |i: usize| {
            let p = pos0 + i;
            (lo(p), device_from(p, self.plan.positions, self.plan.block).max(lo(p)))
        };
        let sinks = spec.sinks.as_ref().map(|w| weights.vector(&w.name));
        let seen: u64 = (0..n).map(|i| range(i).1 - range(i).0).sum::<usize>() as u64;
        let host = attend_part(&s, &q[..n * spec.heads * spec.head_dim], &c.k, &c.v, n, &range, sinks);
        out.clear();
        out.resize(n * ow, 0.0);
        merge(&s, &device, &host, out);
        if spec.value_scale != 1.0 {
            out.iter_mut().for_each(|x| *x *= spec.value_scale);
        }
        self.steps.fetch_add(1, Ordering::Relaxed);
        if seen > 0 {
            self.host_steps.fetch_add(1, Ordering::Relaxed);
            self.host_positions.fetch_add(seen, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Before a step from `pos0` over a ring mirror of `ring` rows (a split's share, a sliding
/// window's) that holds positions `lo..mark` for sure: the positions `need..pos0` it lacks go
/// up from the host's cache (all of them when the ring moved past `need` or the host wrote
/// below it), and the watermark becomes `pos0`.
pub fn fill_ring(
    ctx: &Context,
    u: RingUpload,
    ring: usize,
    need: usize,
    pos0: usize,
    lo: &mut usize,
) -> Result<(), VkError> {
    let RingUpload { k: mk, v: mv, kv, host: c, mark, .. } = u;
    let from = if *lo > need || *mark < need {
        *lo = need;
        need
    } else {
        (*mark).max(need)
    };
    let mut j = from;
    while j < pos0 {
        // One contiguous run of ring rows at a time (the ring wraps).
        let end = pos0.min(j + ring - j % ring);
        let (kw, vw) = (c.k_width, c.v_width);
        ctx.write_kv(mk, (j % ring) * kw * kv.bytes(), &c.k[j * kw..end * kw], kv)?;
        ctx.write_kv(mv, (j % ring) * vw * kv.bytes(), &c.v[j * vw..end * vw], kv)?;
        j = end;
    }
    *mark = pos0;
    Ok(())
}

/// After a step of `n` rows from `pos0` wrote them into a ring of `ring` rows whose first sure
/// position is `lo`.
pub fn ring_stepped(lo: &mut usize, ring: usize, pos0: usize, n: usize) {
    *lo = (*lo).max((pos0 + n).saturating_sub(ring));
}
