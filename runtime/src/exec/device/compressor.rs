//! DeepSeek V4's KV compressor in a device frame (`Op::KvCompress`; reference
//! `cpu::compress::kv_compress`): per sequence and part (the compressor, then its lightning
//! indexer's), the block's `kv` and `gate` projections straight into the part's projection
//! mirrors at its positions and into read-back rows, then `compress_pool` closes the windows
//! the block completes into the part's entry mirror (the compressor's is the one its attention
//! reads, `device::compressed`; the indexer's its own) and read-back rows. With the indexer,
//! the rows' queries (`index_q_b`, RoPE'd on their last columns at their positions) and head
//! weights (`index_w`, times `heads^-1/2`) score the indexer's entries each row sees, and
//! `dsa_select_rate` writes its `topk` best, ascending, `-1` padded, to the op's output.
//!
//! The host's `LayerKv::compress` stays canonical: before a frame the projection rows and
//! entries a mirror lacks go up (`Compressors::upload`, behind watermarks; the compressor's
//! entries by `CompressedEntries::upload`), and after it the block's projections and new
//! entries are appended to the host's copy (`Compressors::take`), so a device lost mid-forward
//! leaves the host where the forward began and the CPU re-runs it from there. Its positions are
//! fixed when recorded (a frame with a compressor is not replayed).
//!
//! Must not: hold rows or entries the host does not, or record anything but the op it is given.

use super::compressed::CompressedEntries;
use super::{DeviceModel, DeviceState, Rec};
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::exec::kv::KvCache;
use crate::store::kv::CompressRows;
use crate::vk::{
    Context, DeviceBuffer, DsaSelectArgs, DsaShape, Frame as VkFrame, MatmulPath, MemoryUse, PoolArgs, PoolShape, Pos,
    RopePart, RopeShape, View, VkError,
};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ir::{CompressSpec, LayerId, Op, Program, RopeScaling, RopeStyle, ValueId};
use coli_compiler::place::size::INDEX_SCORES;

const OP: &str = "kv_compress";

fn parts_of(spec: &CompressSpec) -> Result<Vec<PoolShape>, VkError> {
    PoolShape::parts_of(spec).ok_or_else(|| VkError::BadArgument { op: OP, msg: format!("{spec:?}") })
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

/// One part's projection mirrors (`context` rows of `half`), a block's read-back rows, the
/// positions the mirrors hold as the host does, and (the indexer's part) its entry mirror and
/// the entries it holds as the host does.
struct RowMirror {
    shape: PoolShape,
    kv: DeviceBuffer,
    gate: DeviceBuffer,
    kv_back: DeviceBuffer,
    gate_back: DeviceBuffer,
    entries_back: DeviceBuffer,
    mark: usize,
    entries: Option<(DeviceBuffer, usize)>,
}

/// What the indexers' scores work in (every indexer of the device, one after another): queries,
/// head weights, and each row's score of every entry, `stride` apart, `pass` rows at a time.
struct IndexScratch {
    q: DeviceBuffer,
    w: DeviceBuffer,
    scores: DeviceBuffer,
    stride: usize,
    pass: usize,
}

/// A session's compressors on one device: the parts' mirrors per layer, and the indexers'
/// scratch.
pub(super) struct Compressors {
    mirrors: Vec<Vec<RowMirror>>,
    scratch: Option<IndexScratch>,
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
        let mut mirrors: Vec<Vec<RowMirror>> = (0..p.layers.len()).map(|_| Vec::new()).collect();
        let (mut qw, mut hw, mut stride) = (0, 0, 0);
        for &id in frames.iter().flat_map(|f| &f.ops) {
            let Op::KvCompress { layer, spec, .. } = op_of(p, id) else { continue };
            let back = |floats: usize| ctx.buffer(MemoryUse::Readback, floats.max(1) * 4);
            let mut parts = Vec::new();
            for (k, shape) in parts_of(spec)?.into_iter().enumerate() {
                let (half, d) = (shape.half(), shape.head_dim);
                let entries = match k {
                    0 => None,
                    _ => Some((ctx.f32_buffer((context / shape.rate * d).max(1))?, 0)),
                };
                parts.push(RowMirror {
                    shape,
                    kv: ctx.f32_buffer((context * half).max(1))?,
                    gate: ctx.f32_buffer((context * half).max(1))?,
                    kv_back: back(rows * half)?,
                    gate_back: back(rows * half)?,
                    entries_back: back((rows / shape.rate + 1) * d)?,
                    mark: 0,
                    entries,
                });
            }
            if let Some(i) = spec.index {
                (qw, hw, stride) = (qw.max(i.heads * i.head_dim), hw.max(i.heads), stride.max(context / spec.rate));
            }
            mirrors[layer.0 as usize] = parts;
        }
        if mirrors.iter().all(Vec::is_empty) {
            return Ok(None);
        }
        let scratch = match qw {
            0 => None,
            _ => {
                let (stride, pass) = (stride.max(1), rows.min(INDEX_SCORES / stride.max(1)).max(1));
                Some(IndexScratch {
                    q: ctx.f32_buffer(rows * qw)?,
                    w: ctx.f32_buffer(rows * hw)?,
                    scores: ctx.f32_buffer(DsaShape::scores_len(pass, stride))?,
                    stride,
                    pass,
                })
            }
        };
        Ok(Some(Compressors { mirrors, scratch }))
    }

    /// Before a forward from `pos0`: a host write below a mirror's rows or entries lowers its
    /// watermark.
    pub(super) fn begin_forward(&mut self, kv: &KvCache, pos0: usize) {
        for (l, parts) in self.mirrors.iter_mut().enumerate() {
            for (k, m) in parts.iter_mut().enumerate() {
                let host = kv.layers.get(l).and_then(|c| c.compress.get(k));
                m.mark = m.mark.min(host.map_or(0, CompressRows::len)).min(pos0);
                if let Some((_, e)) = m.entries.as_mut() {
                    *e = (*e).min(host.map_or(0, CompressRows::entry_count)).min(pos0 / m.shape.rate);
                }
            }
        }
    }

    /// Before a frame at `pos0`: the host's projection rows its compressors' mirrors (`layers`)
    /// lack, split into the `kv` and `gate` mirrors, and the indexers' entries before the block.
    pub(super) fn upload(&mut self, ctx: &Context, layers: &[usize], kv: &KvCache, pos0: usize) -> Result<(), VkError> {
        for &l in layers {
            for (k, m) in self.mirrors[l].iter_mut().enumerate() {
                let half = m.shape.half();
                let host = kv.layers.get(l).and_then(|c| c.compress.get(k));
                let held = host.map_or(0, CompressRows::len);
                if m.mark < pos0 {
                    if held < pos0 || host.is_some_and(|h| h.width != 2 * half) {
                        let msg = format!(
                            "layer {l}: the host holds {held} positions' projections, the block starts at {pos0}"
                        );
                        return Err(VkError::BadArgument { op: OP, msg });
                    }
                    let rows = &host.expect("held above 0").rows[m.mark * 2 * half..pos0 * 2 * half];
                    let (mut kr, mut gr) = (Vec::with_capacity(rows.len() / 2), Vec::with_capacity(rows.len() / 2));
                    for r in rows.chunks_exact(2 * half) {
                        kr.extend_from_slice(&r[..half]);
                        gr.extend_from_slice(&r[half..]);
                    }
                    ctx.write(&m.kv, m.mark * half * 4, as_bytes(&kr))?;
                    ctx.write(&m.gate, m.mark * half * 4, as_bytes(&gr))?;
                    m.mark = pos0;
                }
                let (d, want) = (m.shape.head_dim, pos0 / m.shape.rate);
                if let (Some((buf, mark)), Some(h)) = (m.entries.as_mut(), host) {
                    if *mark < want {
                        if h.entry_count() < want || h.entry_width != d {
                            let msg =
                                format!("layer {l}: the host holds {} index entries, want {want}", h.entry_count());
                            return Err(VkError::BadArgument { op: OP, msg });
                        }
                        ctx.write(buf, *mark * d * 4, as_bytes(&h.entries[*mark * d..want * d]))?;
                        *mark = want;
                    }
                }
            }
        }
        Ok(())
    }

    /// After a frame: the block's `n` projections from `pos0` and the entries it closed, of
    /// each part of its compressors (`layers`), into the host's copy; the mirrors' watermarks
    /// past them.
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
            let c = &mut kv.layers[l];
            c.compress.resize_with(self.mirrors[l].len().max(c.compress.len()), CompressRows::default);
            for (m, h) in self.mirrors[l].iter_mut().zip(c.compress.iter_mut()) {
                let (half, d, rate) = (m.shape.half(), m.shape.head_dim, m.shape.rate);
                (h.width, h.rate, h.entry_width) = (2 * half, rate, d);
                h.truncate(pos0);
                let (mut kr, mut gr) = (vec![0f32; n * half], vec![0f32; n * half]);
                ctx.read(&m.kv_back, 0, as_bytes_mut(&mut kr))?;
                ctx.read(&m.gate_back, 0, as_bytes_mut(&mut gr))?;
                for (a, b) in kr.chunks_exact(half).zip(gr.chunks_exact(half)) {
                    h.rows.extend_from_slice(a);
                    h.rows.extend_from_slice(b);
                }
                let closed = (pos0 + n) / rate - pos0 / rate;
                let at = h.entries.len();
                h.entries.resize(at + closed * d, 0.0);
                ctx.read(&m.entries_back, 0, as_bytes_mut(&mut h.entries[at..]))?;
                m.mark = pos0 + n;
                match m.entries.as_mut() {
                    Some((_, mark)) => *mark = (pos0 + n) / rate,
                    None => {
                        if let Some(e) = entries.as_deref_mut() {
                            e.mark_closed(l, (pos0 + n) / rate);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl DeviceModel {
    /// Records a compressor: per sequence and part, its projections into the mirrors and the
    /// read-back rows, and the windows its block closes; with an indexer, the rows' selections.
    pub(super) fn record_compressor<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        (x, q, out, layer, spec): (ValueId, Option<ValueId>, Option<ValueId>, LayerId, &CompressSpec),
    ) -> Result<(), VkError> {
        let Rec { st, widths, n, precision, .. } = *rec;
        let wd = |v: ValueId| widths[v.0 as usize];
        let find = |r: &str| spec.weights.iter().find(|(role, _)| role == r).map(|(_, w)| w.name.as_str());
        let missing = |r: &str| VkError::BadArgument { op: OP, msg: format!("no {r} weight") };
        let mat = |r: &str| find(r).and_then(|n| self.mats.get(n)).ok_or_else(|| missing(r));
        let vec = |r: &str| find(r).and_then(|n| self.vecs.get(n)).ok_or_else(|| missing(r));
        let (freq, mscale) = match spec.rope_dim {
            0 => (vec("norm")?.view(0, 0), 1.0),
            rd => {
                let (b, m) = self.freq(rd, spec.rope_theta, spec.rope_scaling);
                (b.all(), m)
            }
        };
        let (l, rate) = (layer.0 as usize, spec.rate);
        let batched = rec.seqs.len() > 1;
        for s in rec.seqs {
            let (r0, rows) = if batched { (s.rows.start, s.rows.len()) } else { (0, n) };
            let pos0 = match s.pos {
                Pos::Fixed(p) => p,
                Pos::Dynamic(_) => {
                    let msg = "a position read on the device (a compressor's frame is not replayed)".into();
                    return Err(VkError::BadArgument { op: OP, msg });
                }
            };
            let view = |v: ValueId| st.values[v.0 as usize].view(r0 * wd(v), rows * wd(v));
            let parts = s.st.compressors.as_ref().map(|c| &c.mirrors[l][..]).unwrap_or_default();
            if parts.is_empty() {
                return Err(VkError::BadArgument { op: OP, msg: "no compressor mirror".into() });
            }
            let (e0, e1) = (pos0 / rate, (pos0 + rows) / rate);
            for (k, m) in parts.iter().enumerate() {
                let pre = if k == 0 { "" } else { "index_" };
                let (half, d) = (m.shape.half(), m.shape.head_dim);
                let entries = match &m.entries {
                    Some((b, _)) => Some(b.all()),
                    None => s.st.compressed.as_ref().and_then(|c| c.entries(l)),
                };
                let entries = entries.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no entry mirror".into() })?;
                let (kv_rows, gate_rows) = (m.kv.view(pos0 * half, rows * half), m.gate.view(pos0 * half, rows * half));
                f.matmul_with(mat(&format!("{pre}kv"))?, view(x), rows, kv_rows, MatmulPath::Auto, precision)?;
                f.matmul_with(mat(&format!("{pre}gate"))?, view(x), rows, gate_rows, MatmulPath::Auto, precision)?;
                f.copy(kv_rows, m.kv_back.view(0, rows * half))?;
                f.copy(gate_rows, m.gate_back.view(0, rows * half))?;
                let args = PoolArgs {
                    kv: m.kv.all(),
                    gate: m.gate.all(),
                    ape: vec(&format!("{pre}ape"))?.all(),
                    norm: vec(&format!("{pre}norm"))?.all(),
                    freq,
                    mscale,
                    entries,
                    back: m.entries_back.view(0, (e1 - e0) * d),
                };
                f.compress_pool(m.shape, args, e0, e1 - e0)?;
            }
            if let (Some(i), Some(q), Some(out), Some(keys)) = (spec.index, q, out, parts.get(1)) {
                // The sequence's own scratch: its scores' stride is its context's.
                let sc = s.st.compressors.as_ref().and_then(|c| c.scratch.as_ref());
                let sc = sc.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no indexer scratch".into() })?;
                let keys = keys.entries.as_ref().map(|(b, _)| b.all()).expect("the indexer's entries");
                let (h, d) = (i.heads, i.head_dim);
                let (qs, hw) = (sc.q.view(0, rows * h * d), sc.w.view(0, rows * h));
                f.matmul_with(mat("index_q_b")?, view(q), rows, qs, MatmulPath::Auto, precision)?;
                f.matmul_with(mat("index_w")?, view(x), rows, hw, MatmulPath::Auto, precision)?;
                if spec.rope_dim > 0 {
                    let part = RopePart { skip: d - spec.rope_dim, inverse: false };
                    let style = RopeStyle::Interleaved;
                    let shape = RopeShape { n: rows, width: h * d, heads: h, head_dim: d, style, pos0, mscale, part };
                    f.rope_at(qs, freq, shape, Pos::Fixed(pos0))?;
                }
                let select = view(out);
                self.select_rows(
                    f,
                    sc,
                    (DsaShape { heads: h, head_dim: d, topk: i.topk }, rate),
                    (qs, hw, keys, select),
                    (pos0, rows),
                )?;
            }
        }
        Ok(())
    }

    /// The indexer's selections of `rows` rows from `pos0`, `pass` rows at a time.
    fn select_rows<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        sc: &'a IndexScratch,
        (s, rate): (DsaShape, usize),
        (q, w, keys, out): (View<'a>, View<'a>, View<'a>, View<'a>),
        (pos0, rows): (usize, usize),
    ) -> Result<(), VkError> {
        let w_scale = (s.heads as f32).powf(-0.5);
        for p0 in (0..rows).step_by(sc.pass) {
            let pn = sc.pass.min(rows - p0);
            let (hd, h, k) = (s.heads * s.head_dim, s.heads, s.topk);
            let args = DsaSelectArgs {
                q: q.buf.view(q.offset + p0 * hd, pn * hd),
                keys,
                w: w.buf.view(w.offset + p0 * h, pn * h),
                w_scale,
                scores: sc.scores.view(0, DsaShape::scores_len(pn, sc.stride)),
                stride: sc.stride,
                out: out.buf.view(out.offset + p0 * k, pn * k),
                n: pn,
            };
            f.dsa_select_rate(s, args, Pos::Fixed(pos0 + p0), rate)?;
        }
        Ok(())
    }
}
