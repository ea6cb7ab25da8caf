//! DeepSeek V4's KV compressor in a device frame (`Op::KvCompress` without an indexer;
//! reference `cpu::compress::kv_compress`): per sequence, the block's `kv` and `gate`
//! projections straight into the layer's projection mirrors at its positions and into
//! read-back rows, then `compress_pool` closes the windows the block completes into the
//! layer's entry mirror (the one its attention reads, `device::compressed`) and read-back rows.
//!
//! The host's `LayerKv::compress[0]` stays canonical: before a frame the projection rows a
//! mirror lacks go up (`Compressors::upload`, behind a watermark of positions; the entries by
//! `CompressedEntries::upload`), and after it the block's projections and new entries are
//! appended to the host's copy (`Compressors::take`), so a device lost mid-forward leaves the
//! host where the forward began and the CPU re-runs it from there. Its positions are fixed
//! when recorded (a frame with a compressor is not replayed).
//!
//! Must not: hold rows or entries the host does not, or record anything but the op it is given.

use super::compressed::CompressedEntries;
use super::{DeviceModel, DeviceState, Rec};
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::exec::kv::KvCache;
use crate::store::kv::CompressRows;
use crate::vk::{Context, DeviceBuffer, Frame as VkFrame, MatmulPath, MemoryUse, PoolArgs, PoolShape, Pos, VkError};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ir::{CompressSpec, LayerId, Op, Program, RopeScaling, ValueId};

const OP: &str = "kv_compress";

fn shape_of(spec: &CompressSpec) -> Option<PoolShape> {
    PoolShape::of(spec)
}

/// The RoPE frequencies a compressor's entries need uploaded (none for a rope part of 0).
pub(super) fn freqs_of(op: &Op) -> Option<(usize, f32, RopeScaling)> {
    match op {
        Op::KvCompress { spec, .. } if spec.rope_dim > 0 => Some((spec.rope_dim, spec.rope_theta, spec.rope_scaling)),
        _ => None,
    }
}

/// The compressor layers of a frame; found once a frame.
pub(super) fn layers_of(p: &Program, frame: &Frame) -> Vec<usize> {
    frame
        .ops
        .iter()
        .filter_map(|&id| match op_of(p, id) {
            Op::KvCompress { layer, .. } => Some(layer.0 as usize),
            _ => None,
        })
        .collect()
}

/// A frame's layers with compressed entries (whose attention reads them or whose compressor
/// it runs) and those whose compressor it runs; found once a frame.
pub(super) struct Layers {
    entries: Vec<usize>,
    compressors: Vec<usize>,
}

impl Layers {
    pub(super) fn of(p: &Program, frame: &Frame) -> Layers {
        Layers { entries: super::compressed::layers_of(p, frame), compressors: layers_of(p, frame) }
    }
}

/// Before a forward from `pos0`: the watermarks of a session's entry and projection mirrors.
pub(super) fn begin_forward(st: &mut DeviceState, kv: &KvCache, pos0: usize) {
    if let Some(c) = st.compressed.as_mut() {
        c.begin_forward(kv, pos0);
    }
    if let Some(c) = st.compressors.as_mut() {
        c.begin_forward(kv, pos0);
    }
}

/// Before a frame at `pos0`: what a session's mirrors of the frame's layers lack.
pub(super) fn upload(
    ctx: &Context,
    st: &mut DeviceState,
    ls: &Layers,
    kv: &KvCache,
    pos0: usize,
) -> Result<(), VkError> {
    if let Some(c) = st.compressed.as_mut() {
        c.upload(ctx, &ls.entries, kv, pos0)?;
    }
    if let Some(c) = st.compressors.as_mut() {
        c.upload(ctx, &ls.compressors, kv, pos0)?;
    }
    Ok(())
}

/// After a frame: the block's projections and entries of the frame's compressors into the
/// host's copy.
pub(super) fn take(
    ctx: &Context,
    st: &mut DeviceState,
    ls: &Layers,
    kv: &mut KvCache,
    block: (usize, usize),
) -> Result<(), VkError> {
    match st.compressors.as_mut() {
        Some(c) => c.take(ctx, st.compressed.as_mut(), &ls.compressors, kv, block),
        None => Ok(()),
    }
}

/// One layer's projection mirrors (`context` rows of `half`) and a block's read-back rows.
struct RowMirror {
    shape: PoolShape,
    kv: DeviceBuffer,
    gate: DeviceBuffer,
    kv_back: DeviceBuffer,
    gate_back: DeviceBuffer,
    entries_back: DeviceBuffer,
}

/// A session's compressors on one device: a mirror and a watermark (positions) per layer.
pub(super) struct Compressors {
    mirrors: Vec<Option<RowMirror>>,
    marks: Vec<usize>,
}

impl Compressors {
    /// The mirrors of the compressors of `frames` (`None`: they have none), for blocks of at
    /// most `rows` rows and `context` positions.
    pub(super) fn new(
        ctx: &Context,
        p: &Program,
        frames: &[Frame],
        rows: usize,
        context: usize,
    ) -> Result<Option<Compressors>, VkError> {
        let mut mirrors: Vec<Option<RowMirror>> = (0..p.layers.len()).map(|_| None).collect();
        for &id in frames.iter().flat_map(|f| &f.ops) {
            let Op::KvCompress { layer, spec, .. } = op_of(p, id) else { continue };
            let shape = shape_of(spec).ok_or_else(|| VkError::BadArgument { op: OP, msg: format!("{spec:?}") })?;
            let (half, d) = (shape.half(), shape.head_dim);
            let back = |floats: usize| ctx.buffer(MemoryUse::Readback, floats.max(1) * 4);
            mirrors[layer.0 as usize] = Some(RowMirror {
                shape,
                kv: ctx.f32_buffer((context * half).max(1))?,
                gate: ctx.f32_buffer((context * half).max(1))?,
                kv_back: back(rows * half)?,
                gate_back: back(rows * half)?,
                entries_back: back((rows / shape.rate + 1) * d)?,
            });
        }
        if mirrors.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(Compressors { marks: vec![0; mirrors.len()], mirrors }))
    }

    /// Before a forward from `pos0`: a host write below a mirror's rows lowers its watermark.
    pub(super) fn begin_forward(&mut self, kv: &KvCache, pos0: usize) {
        for (l, mark) in self.marks.iter_mut().enumerate() {
            let host = kv.layers.get(l).and_then(|c| c.compress.first()).map_or(0, CompressRows::len);
            *mark = (*mark).min(host).min(pos0);
        }
    }

    /// Before a frame at `pos0`: the host's projection rows its compressors' mirrors (`layers`)
    /// lack, split into the `kv` and `gate` mirrors.
    pub(super) fn upload(&mut self, ctx: &Context, layers: &[usize], kv: &KvCache, pos0: usize) -> Result<(), VkError> {
        for &l in layers {
            let (mark, m) = (&mut self.marks[l], self.mirrors[l].as_ref().expect("compressor mirror allocated"));
            if *mark >= pos0 {
                continue;
            }
            let half = m.shape.half();
            let host = kv.layers.get(l).and_then(|c| c.compress.first());
            let held = host.map_or(0, CompressRows::len);
            if held < pos0 || host.is_some_and(|h| h.width != 2 * half) {
                let msg =
                    format!("layer {l}: the host holds {held} positions' projections, the block starts at {pos0}");
                return Err(VkError::BadArgument { op: OP, msg });
            }
            let rows = &host.expect("held above 0").rows[*mark * 2 * half..pos0 * 2 * half];
            let (mut k, mut g) = (Vec::with_capacity(rows.len() / 2), Vec::with_capacity(rows.len() / 2));
            for r in rows.chunks_exact(2 * half) {
                k.extend_from_slice(&r[..half]);
                g.extend_from_slice(&r[half..]);
            }
            ctx.write(&m.kv, *mark * half * 4, as_bytes(&k))?;
            ctx.write(&m.gate, *mark * half * 4, as_bytes(&g))?;
            *mark = pos0;
        }
        Ok(())
    }

    /// After a frame: the block's `n` projections from `pos0` and the entries it closed, of
    /// each of its compressors (`layers`), into the host's copy; the mirrors' watermarks past
    /// them.
    pub(super) fn take(
        &mut self,
        ctx: &Context,
        entries: Option<&mut CompressedEntries>,
        layers: &[usize],
        kv: &mut KvCache,
        (pos0, n): (usize, usize),
    ) -> Result<(), VkError> {
        let mut entries = entries;
        for &l in layers {
            let m = self.mirrors[l].as_ref().expect("compressor mirror allocated");
            let (half, d, rate) = (m.shape.half(), m.shape.head_dim, m.shape.rate);
            let c = &mut kv.layers[l];
            if c.compress.is_empty() {
                c.compress.push(CompressRows::default());
            }
            let h = &mut c.compress[0];
            (h.width, h.rate, h.entry_width) = (2 * half, rate, d);
            h.truncate(pos0);
            let (mut k, mut g) = (vec![0f32; n * half], vec![0f32; n * half]);
            ctx.read(&m.kv_back, 0, as_bytes_mut(&mut k))?;
            ctx.read(&m.gate_back, 0, as_bytes_mut(&mut g))?;
            for (kr, gr) in k.chunks_exact(half).zip(g.chunks_exact(half)) {
                h.rows.extend_from_slice(kr);
                h.rows.extend_from_slice(gr);
            }
            let closed = (pos0 + n) / rate - pos0 / rate;
            let at = h.entries.len();
            h.entries.resize(at + closed * d, 0.0);
            ctx.read(&m.entries_back, 0, as_bytes_mut(&mut h.entries[at..]))?;
            self.marks[l] = pos0 + n;
            if let Some(e) = entries.as_deref_mut() {
                e.mark_closed(l, (pos0 + n) / rate);
            }
        }
        Ok(())
    }
}

impl DeviceModel {
    /// Records a compressor: per sequence, its projections into the mirrors and the read-back
    /// rows, and the windows its block closes.
    pub(super) fn record_compressor<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        (x, layer, spec): (ValueId, LayerId, &CompressSpec),
    ) -> Result<(), VkError> {
        let Rec { st, widths, n, pos, precision, .. } = *rec;
        let w = widths[x.0 as usize];
        let shape = shape_of(spec).ok_or_else(|| VkError::BadArgument { op: OP, msg: "an indexer's".into() })?;
        let find = |r: &str| spec.weights.iter().find(|(role, _)| role == r).map(|(_, w)| w.name.as_str());
        let missing = |r: &str| VkError::BadArgument { op: OP, msg: format!("no {r} weight") };
        let mat = |r: &str| find(r).and_then(|n| self.mats.get(n)).ok_or_else(|| missing(r));
        let vec = |r: &str| find(r).and_then(|n| self.vecs.get(n)).ok_or_else(|| missing(r));
        let (kv_w, gate_w, ape, norm) = (mat("kv")?, mat("gate")?, vec("ape")?, vec("norm")?);
        let (freq, mscale) = match spec.rope_dim {
            0 => (ape.view(0, 0), 1.0),
            rd => {
                let (b, m) = self.freq(rd, spec.rope_theta, spec.rope_scaling);
                (b.all(), m)
            }
        };
        let (l, half, d, rate) = (layer.0 as usize, shape.half(), shape.head_dim, shape.rate);
        let batched = rec.seqs.len() > 1;
        for s in rec.seqs {
            let (r0, rows) = if batched { (s.rows.start, s.rows.len()) } else { (0, n) };
            let pos0 = match (batched, pos) {
                (true, _) => s.pos0,
                (false, Pos::Fixed(p)) => p,
                (false, Pos::Dynamic(_)) => {
                    let msg = "a position read on the device (a compressor's frame is not replayed)".into();
                    return Err(VkError::BadArgument { op: OP, msg });
                }
            };
            let m = s.st.compressors.as_ref().and_then(|c| c.mirrors[l].as_ref());
            let m = m.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no compressor mirror".into() })?;
            let entries = s.st.compressed.as_ref().and_then(|c| c.entries(l));
            let entries = entries.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no entry mirror".into() })?;
            let xs = st.values[x.0 as usize].view(r0 * w, rows * w);
            let (kv_rows, gate_rows) = (m.kv.view(pos0 * half, rows * half), m.gate.view(pos0 * half, rows * half));
            f.matmul_with(kv_w, xs, rows, kv_rows, MatmulPath::Auto, precision)?;
            f.matmul_with(gate_w, xs, rows, gate_rows, MatmulPath::Auto, precision)?;
            f.copy(kv_rows, m.kv_back.view(0, rows * half))?;
            f.copy(gate_rows, m.gate_back.view(0, rows * half))?;
            let (e0, e1) = (pos0 / rate, (pos0 + rows) / rate);
            let args = PoolArgs {
                kv: m.kv.all(),
                gate: m.gate.all(),
                ape: ape.all(),
                norm: norm.all(),
                freq,
                mscale,
                entries,
                back: m.entries_back.view(0, (e1 - e0) * d),
            };
            f.compress_pool(shape, args, e0, e1 - e0)?;
        }
        Ok(())
    }
}
