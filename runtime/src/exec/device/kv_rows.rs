//! A session's K/V mirrors (allocated with its device state: each attention or MLA layer's keys
//! and values, a split layer's as a ring) and a device frame's K/V rows between the host's
//! cache and them: before the frame, the rows a sequence's mirrors lack (a host write lowered
//! their watermark, or a KV split's ring moved on); after it, each sequence's read-back rows
//! straight into the cache's new rows, and the mirrors' watermarks up to them (the host's copy
//! stays canonical, so a device lost mid-forward re-runs it on the CPU). An attention layer's
//! mirrors and read-back rows may be f16 (`Context::kv_mirror`): the rows go up rounded and
//! come back widened, so the host's cache holds the values the device attends over.

use super::{DeviceModel, DeviceState, KvMirror, PARALLEL_KV_ROWS};
use crate::exec::kv::{KvCache, LayerKv};
use crate::exec::kv_split::{fill_ring, ring_stepped, RingUpload};
use crate::vk::{Context, KvType, MemoryUse, VkError};
use coli_compiler::frames::op_of;
use coli_compiler::ir::{LayerId, Op, Program};
use coli_compiler::place::kv_split::window_rows;
use rayon::prelude::*;

/// A sliding window's mirror as a ring of `rows` rows (`kv_split::window_rows`: the window and
/// a chunk, where that is shorter than the context): a step from `pos0` reads positions from
/// `pos0 + 1 - window` on, each in row `p % rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowRing {
    pub rows: usize,
    pub window: usize,
}

/// A session's K/V mirrors (`None` for layers no frame attends in) and the window rings among
/// them.
pub(super) type Mirrors = (Vec<Option<KvMirror>>, Vec<Option<WindowRing>>);

impl DeviceState {
    /// Bytes of the session's K/V mirrors (keys and values, not their read-back rows).
    pub(crate) fn kv_mirror_bytes(&self) -> u64 {
        self.mirrors.iter().flatten().map(|(k, v, _, _)| (k.len_bytes() + v.len_bytes()) as u64).sum()
    }
}

/// Each layer's K/V mirror type (per program layer): the context's (`Context::kv_mirror`) for
/// the attention layers the frames run, f32 for the rest (MLA's latents, DeepSeek V4's layers
/// over compressed entries, whose kernels read f32) and for rows of odd widths.
pub(super) fn mirror_types(ctx: &Context, p: &Program, frames: &[coli_compiler::frames::Frame]) -> Vec<KvType> {
    let mut types = vec![KvType::F32; p.layers.len()];
    for f in frames {
        for &id in &f.ops {
            if let Op::Attention { layer, spec, .. } = op_of(p, id) {
                let even = (spec.kv_heads * spec.head_dim) % 2 == 0 && (spec.kv_heads * spec.v_head_dim) % 2 == 0;
                if spec.compressed.is_none() && even {
                    types[layer.0 as usize] = ctx.kv_mirror();
                }
            }
        }
    }
    types
}

impl DeviceModel {
    /// Each attention or MLA layer's K/V mirrors (keys, values; an MLA layer's latents and rope
    /// keys, `exec::mla_mirror`) of `context` rows (a split layer's: its ring; a sliding
    /// window's: a ring of the window and a chunk) and their read-back rows for a block; `None`
    /// for the layers no frame of this device attends in.
    pub(super) fn kv_mirrors(&self, p: &Program, context: usize) -> Result<Mirrors, VkError> {
        let ctx = &self.ctx;
        let mut mirrors: Vec<Option<_>> = (0..p.layers.len()).map(|_| None).collect();
        let mut rings = vec![None; p.layers.len()];
        for f in &self.frames {
            for &id in &f.ops {
                // An MLA layer's mirror holds its latents and rope keys (`exec::mla_mirror`).
                let (layer, (kw, vw), window) = match op_of(p, id) {
                    Op::Attention { layer, spec, .. } => {
                        (layer, (spec.kv_heads * spec.head_dim, spec.kv_heads * spec.v_head_dim), spec.window)
                    }
                    Op::Mla { layer, spec, .. } => (layer, crate::exec::mla_mirror::mirror_widths(spec), None),
                    _ => continue,
                };
                let l = layer.0 as usize;
                // A split layer's mirror is a ring of its newest positions (the plan's, which
                // the kernels index modulo, whatever the session's context); a sliding window's
                // a ring of the window and a chunk, where that is shorter than the context.
                let ring = window.map(|w| WindowRing { rows: window_rows(w, self.cap_rows, context), window: w });
                let rows = match (&self.kv_split, ring) {
                    (Some(s), _) if s.splits(*layer) => s.plan.ring,
                    (_, Some(r)) if r.rows < context => {
                        rings[l] = Some(r);
                        r.rows
                    }
                    _ => context,
                };
                if mirrors[l].is_none() {
                    let b = self.kv_types[l].bytes();
                    mirrors[l] = Some((
                        ctx.buffer(MemoryUse::Device, rows * kw * b)?,
                        ctx.buffer(MemoryUse::Device, rows * vw * b)?,
                        ctx.buffer(MemoryUse::Readback, self.cap_rows * kw * b)?,
                        ctx.buffer(MemoryUse::Readback, self.cap_rows * vw * b)?,
                    ));
                }
            }
        }
        Ok((mirrors, rings))
    }

    /// Before a frame from `pos0`: the host's rows below `pos0` that a sequence's mirrors of
    /// `attn_layers` lack go up (a split layer's ring: its newest positions).
    pub(super) fn upload_kv_rows(
        &self,
        st: &mut DeviceState,
        kv: &KvCache,
        attn_layers: &[(usize, LayerId)],
        pos0: usize,
    ) -> Result<(), VkError> {
        let ctx = &self.ctx;
        for &(l, layer) in attn_layers {
            let (mk, mv, _, _) = st.mirrors[l].as_ref().expect("mirror allocated");
            let c = &kv.layers[l];
            let t = self.kv_types[l];
            let split = self.kv_split.as_ref().filter(|s| s.splits(layer));
            if let (Some(sp), Some(ss)) = (split, st.split.as_mut()) {
                let up = RingUpload { layer: l, k: mk, v: mv, kv: t, host: c, mark: &mut st.watermark[l] };
                sp.upload(ctx, ss, up, pos0)?;
                continue;
            }
            if let Some(r) = st.rings[l] {
                let up = RingUpload { layer: l, k: mk, v: mv, kv: t, host: c, mark: &mut st.watermark[l] };
                let need = (pos0 + 1).saturating_sub(r.window).min(pos0);
                fill_ring(ctx, up, r.rows, need, pos0, &mut st.ring_lo[l])?;
                continue;
            }
            let mark = st.watermark[l];
            if mark < pos0 {
                ctx.write_kv(mk, mark * c.k_width * t.bytes(), &c.k[mark * c.k_width..pos0 * c.k_width], t)?;
                ctx.write_kv(mv, mark * c.v_width * t.bytes(), &c.v[mark * c.v_width..pos0 * c.v_width], t)?;
                st.watermark[l] = pos0;
            }
        }
        Ok(())
    }

    /// A sequence's `n` new K/V rows (its frame's read-back buffers) into its host cache, read
    /// straight into the cache's new rows (what `append` of the rows would leave), and its
    /// mirrors' watermarks up to them. A prompt chunk's are megabytes a layer (the prompt's
    /// largest host cost on the H200: 134 MB for 512 rows of OLMoE-1B-7B): every layer's K and
    /// V are copied at once then.
    pub(super) fn take_kv_rows(
        &self,
        st: &mut DeviceState,
        kv: &mut KvCache,
        attn_layers: &[usize],
        pos0: usize,
        n: usize,
    ) -> Result<(), VkError> {
        let ctx = &self.ctx;
        let mirrors = &st.mirrors;
        let copy = |l: usize, c: &mut LayerKv| -> Result<(), VkError> {
            let (_, _, sk, sv) = mirrors[l].as_ref().expect("mirror allocated");
            let t = self.kv_types[l];
            // The K/V rows from pos0 on are the device's; what the host wrote beside them in
            // this step (an indexer's keys, DeepSeek Sparse Attention) stays.
            let (kw, vw) = (c.k_width, c.v_width);
            c.k.truncate(pos0 * kw);
            c.v.truncate(pos0 * vw);
            let (k, v) = (&mut c.k, &mut c.v);
            let (rk, rv) = if n >= PARALLEL_KV_ROWS {
                rayon::join(|| ctx.read_append_kv(sk, 0, n * kw, t, k), || ctx.read_append_kv(sv, 0, n * vw, t, v))
            } else {
                (ctx.read_append_kv(sk, 0, n * kw, t, k), ctx.read_append_kv(sv, 0, n * vw, t, v))
            };
            rk.and(rv)
        };
        let mut layers: Vec<(usize, &mut LayerKv)> =
            kv.layers.iter_mut().enumerate().filter(|(l, _)| attn_layers.contains(l)).collect();
        // A few rows (decode): room for them first, every layer at once when one must grow
        // (new pages in one parallel burst). A chunk's copies below run in parallel and take
        // their pages as they go.
        let short = |c: &LayerKv| c.k.capacity() < (pos0 + n) * c.k_width || c.v.capacity() < (pos0 + n) * c.v_width;
        if n < PARALLEL_KV_ROWS && layers.iter().any(|(_, c)| short(c)) {
            layers.par_iter_mut().for_each(|(_, c)| c.prepare_rows(pos0, n));
        }
        if n >= PARALLEL_KV_ROWS {
            layers.par_iter_mut().try_for_each(|(l, c)| copy(*l, c))?;
        } else {
            layers.iter_mut().try_for_each(|(l, c)| copy(*l, c))?;
        }
        for &l in attn_layers {
            st.watermark[l] = pos0 + n;
            if let Some(r) = st.rings[l] {
                ring_stepped(&mut st.ring_lo[l], r.rows, pos0, n);
            }
            if let (Some(sp), Some(ss)) = (self.kv_split.as_ref(), st.split.as_mut()) {
                sp.stepped(ss, l, pos0, n);
            }
        }
        Ok(())
    }
}
