//! DeepSeek V4's attention over a KV compressor's entries in a device frame (an `Attention`
//! with `compressed`; reference `cpu::compress::attend`): per sequence, the block's K/V append
//! to the layer's mirror (`rope_kv`, as any attention) and `attention_compressed` over the
//! mirror's rows and the layer's entries.
//!
//! The entries: the host's `LayerKv::compress[0].entries` are canonical; each device layer
//! keeps a mirror of them (`context / rate` entries) behind a watermark, the entries on the
//! device that equal the host's. Where the compressor (`Op::KvCompress`) is a host step before
//! the frame, the entries the host closed since go up before the frame
//! (`CompressedEntries::upload`, the new ones only); where the device runs it
//! (`device::compressor`), it writes the block's entries into the mirror in the frame and the
//! host takes them after it, so only entries the host holds before the block go up. A forward
//! from an earlier position lowers the watermark to the windows closed before it
//! (`begin_forward`), so entries recomputed go up again. A device lost mid-forward leaves the
//! host's state as it was.
//!
//! Must not: hold entries the host does not, or record anything but the op it is given.

use super::{DeviceModel, Rec};
use crate::bytes::as_bytes;
use crate::exec::kv::KvCache;
use crate::vk::{
    CompressedArgs, CompressedShape, Context, DeviceBuffer, Frame as VkFrame, KvMirror, KvShape, KvType, RopeArgs,
    RopeKvArgs, View, VkError,
};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ir::{Op, Program, ValueId};
use coli_compiler::schedule::AttentionCall;

/// One layer's entry mirror: `cap` entries of `width` floats, the rate they close at, and
/// whether this device runs the layer's compressor.
struct EntryMirror {
    buf: DeviceBuffer,
    width: usize,
    rate: usize,
    cap: usize,
    own: bool,
}

/// A session's entry mirrors on one device, by layer, and their watermarks (entries).
pub(super) struct CompressedEntries {
    mirrors: Vec<Option<EntryMirror>>,
    marks: Vec<usize>,
}

/// The layers of a frame whose attention reads compressed entries or whose compressor it
/// runs.
pub(super) fn layers_of(p: &Program, frame: &Frame) -> Vec<usize> {
    let mut ls: Vec<usize> = frame
        .ops
        .iter()
        .filter_map(|&id| match op_of(p, id) {
            Op::Attention { layer, spec, .. } if spec.compressed.is_some() => Some(layer.0 as usize),
            Op::KvCompress { layer, .. } => Some(layer.0 as usize),
            _ => None,
        })
        .collect();
    ls.sort_unstable();
    ls.dedup();
    ls
}

impl CompressedEntries {
    /// The mirrors of the compressed attention layers of `frames` (`None`: they have none),
    /// for `context` positions.
    pub(super) fn new(
        ctx: &Context,
        p: &Program,
        frames: &[Frame],
        context: usize,
    ) -> Result<Option<CompressedEntries>, VkError> {
        let mut mirrors: Vec<Option<EntryMirror>> = (0..p.layers.len()).map(|_| None).collect();
        for &id in frames.iter().flat_map(|f| &f.ops) {
            let (layer, width, rate, own) = match op_of(p, id) {
                Op::Attention { layer, spec, .. } => match spec.compressed.filter(|c| c.rate > 0) {
                    Some(c) => (layer, spec.head_dim, c.rate, false),
                    None => continue,
                },
                Op::KvCompress { layer, spec, .. } if spec.rate > 0 => (layer, spec.head_dim, spec.rate, true),
                _ => continue,
            };
            let m = &mut mirrors[layer.0 as usize];
            match m {
                Some(m) => m.own |= own,
                None => {
                    let cap = context / rate;
                    let buf = ctx.f32_buffer((cap * width).max(1))?;
                    *m = Some(EntryMirror { buf, width, rate, cap, own });
                }
            }
        }
        if mirrors.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(CompressedEntries { marks: vec![0; mirrors.len()], mirrors }))
    }

    /// Before a forward from `pos0`: the windows it may close again, and any the host dropped,
    /// go up again.
    pub(super) fn begin_forward(&mut self, kv: &KvCache, pos0: usize) {
        for (l, (mark, m)) in self.marks.iter_mut().zip(&self.mirrors).enumerate() {
            let Some(m) = m else { continue };
            let host = kv.layers.get(l).and_then(|c| c.compress.first()).map_or(0, |c| c.entry_count());
            *mark = (*mark).min(host).min(pos0 / m.rate);
        }
    }

    /// Before a frame at `pos0`: the entries of its layers (`layers_of` the frame) the host
    /// closed and the mirrors lack (of a layer whose compressor the device runs, those before
    /// the block only).
    pub(super) fn upload(&mut self, ctx: &Context, layers: &[usize], kv: &KvCache, pos0: usize) -> Result<(), VkError> {
        const OP: &str = "attention_compressed";
        for &l in layers {
            let (mark, m) = (&mut self.marks[l], self.mirrors[l].as_ref().expect("entry mirror allocated"));
            let Some(host) = kv.layers.get(l).and_then(|c| c.compress.first()) else {
                *mark = 0;
                continue;
            };
            let count = if m.own { host.entry_count().min(pos0 / m.rate) } else { host.entry_count() };
            if count > 0 && host.entry_width != m.width {
                let msg =
                    format!("layer {l}: entries of {} floats, the attention's heads {}", host.entry_width, m.width);
                return Err(VkError::BadArgument { op: OP, msg });
            }
            if count > m.cap {
                let msg = format!("layer {l}: {count} entries, the mirror holds {}", m.cap);
                return Err(VkError::BadArgument { op: OP, msg });
            }
            *mark = (*mark).min(count);
            if *mark < count {
                let w = m.width;
                ctx.write(&m.buf, *mark * w * 4, as_bytes(&host.entries[*mark * w..count * w]))?;
                *mark = count;
            }
        }
        Ok(())
    }

    /// Layer `l`'s entry mirror, whole.
    pub(super) fn entries(&self, l: usize) -> Option<View<'_>> {
        self.mirrors.get(l)?.as_ref().map(|m| m.buf.all())
    }

    /// After a frame whose compressor closed layer `l`'s entries up to `count`: the mirror
    /// equals the host's that far.
    pub(super) fn mark_closed(&mut self, l: usize, count: usize) {
        if let Some(m) = self.marks.get_mut(l) {
            *m = count;
        }
    }
}

impl DeviceModel {
    /// Records an attention over compressed entries: per sequence, the K/V append and the
    /// attention over its mirrors (its q/k norms already applied).
    pub(super) fn record_compressed<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        a: &AttentionCall,
        rope: Option<RopeArgs<'a>>,
        sinks: Option<View<'a>>,
    ) -> Result<(), VkError> {
        const OP: &str = "attention_compressed";
        let Rec { st, widths, n, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let spec = &a.spec;
        let shape = CompressedShape::of(spec).filter(|_| CompressedShape::supported(spec));
        let shape = shape.ok_or_else(|| VkError::BadArgument { op: OP, msg: "not a supported shape".into() })?;
        let l = a.layer.0 as usize;
        let batched = rec.seqs.len() > 1;
        for s in rec.seqs {
            // A sliding window's mirror as a ring (its size follows the sequence's context).
            let ring = s.st.rings[l].map(|r| r.rows);
            let shape = CompressedShape { ring, ..shape };
            let (r0, rows) = if batched { (s.rows.start, s.rows.len()) } else { (0, n) };
            let view = |v: ValueId| st.values[v.0 as usize].view(r0 * w(v), rows * w(v));
            let at = s.pos;
            let (mk, mv, sk, sv) = s.st.mirrors[l].as_ref().expect("mirror allocated");
            let entries = s.st.compressed.as_ref().and_then(|c| c.entries(l));
            let entries = entries.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no entry mirror".into() })?;
            let kv_shape = KvShape {
                n: rows,
                heads: spec.heads,
                kv_heads: 1,
                head_dim: spec.head_dim,
                v_head_dim: spec.v_head_dim,
                // Attention over compressed entries reads an f32 window (`kv_rows::mirror_types`).
                kv: KvType::F32,
            };
            let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
            let (q, k, v) = (view(a.q), view(a.k), view(a.v));
            let append = RopeKvArgs { rope, q, k, v, shape: kv_shape, mirror, pos: at };
            match ring {
                Some(r) => f.rope_kv_ring(append, r)?,
                None => f.rope_kv(append)?,
            }
            let select = spec.compressed.and_then(|c| c.select).map(|sel| (view(sel), w(sel)));
            let args =
                CompressedArgs { q, k: mk.all(), v: mv.all(), entries, sinks, select, out: view(a.out), n: rows };
            f.attention_compressed(shape, args, at)?;
        }
        Ok(())
    }
}
