//! The MLA layers (DeepSeek-V3's multi-head latent attention) of one device's frames: the
//! geometry of each layer's cache mirror (per position the normalized latent and the rotated
//! rope key, the host's `LayerKv` layout for the layer: `k` rows of `kv_lora_rank`, `v` rows
//! of `qk_rope_head_dim`), the session's scratch for the op's kernels (one for every MLA layer
//! of the device: they run one after another), and the recording of one op into a frame
//! (`Frame::mla`).
//!
//! The mirrors themselves are `exec::device`'s, kept as an attention layer's are: the host's
//! cache stays canonical, rows the mirror lacks go up before a frame (the watermark), the
//! frame appends the block's rows to the mirror and to read-back rows, and the host appends
//! those to its cache after the frame; so a device lost mid-forward re-runs it on the CPU.
//!
//! Must not: hold cache rows of its own, or record anything but the op it is given.

use super::OpRows;
use crate::vk::{
    Context, DeviceBuffer, DeviceMatrix, Frame, MlaCache, MlaCall, MlaMats, MlaQuery, MlaScratch, MlaSeq, MlaShape,
    Pos, RopeArgs, View, VkError,
};
use coli_compiler::frames::{op_of, Frame as PlanFrame};
use coli_compiler::ir::{MlaSpec, Op, Program, RopeStyle};
use std::collections::HashMap;

/// Widths of an MLA layer's mirror rows: (latent, rope key).
pub fn mirror_widths(spec: &MlaSpec) -> (usize, usize) {
    (spec.kv_lora_rank, spec.qk_rope_head_dim)
}

/// The scratch for the MLA ops of `frames` in blocks of at most `rows` rows (`None`: none).
pub fn scratch(
    ctx: &Context,
    program: &Program,
    frames: &[PlanFrame],
    rows: usize,
) -> Result<Option<MlaScratch>, VkError> {
    let mut cover: Option<MlaShape> = None;
    for f in frames {
        for &id in &f.ops {
            if let Op::Mla { spec, .. } = op_of(program, id) {
                let s = MlaShape::of(spec);
                cover = Some(cover.map_or(s, |c| MlaScratch::cover(c, s)));
            }
        }
    }
    cover.map(|s| MlaScratch::new(ctx, rows, s)).transpose()
}

/// The device's weights and tables one MLA op reads.
pub struct MlaInputs<'a> {
    pub mats: &'a HashMap<String, DeviceMatrix>,
    pub vecs: &'a HashMap<String, DeviceBuffer>,
    /// `cpu::rope::inv_freq` of the rope part, uploaded, and its mscale.
    pub freq: (&'a DeviceBuffer, f32),
    pub scratch: Option<&'a MlaScratch>,
}

/// One sequence of the op's rows: which rows, its layer's mirrors and read-back rows (latent,
/// rope key, latent back, rope key back), its first row's position (fixed, or read on the
/// device: a decode frame recorded once and replayed) and its rows' selection (an indexer's
/// output, DeepSeek Sparse Attention) with its width, where the spec has one.
pub struct SeqMirror<'a> {
    pub rows: std::ops::Range<usize>,
    pub mirror: &'a (DeviceBuffer, DeviceBuffer, DeviceBuffer, DeviceBuffer),
    pub pos: Pos<'a>,
    pub select: Option<(View<'a>, usize)>,
}

/// Records the op over `io`, the rows of `seqs` (several in a batched step): the products once
/// over every row, each sequence's cache rows and attention over its own mirror.
pub fn record<'a>(
    f: &mut Frame<'a>,
    inp: MlaInputs<'a>,
    spec: &MlaSpec,
    io: OpRows<'a>,
    seqs: &[SeqMirror<'a>],
) -> Result<(), VkError> {
    const OP: &str = "mla";
    let OpRows { x, out, n, precision } = io;
    let missing =
        |role: &str| VkError::BadArgument { op: OP, msg: format!("the weight of role {role} was not uploaded") };
    let name = |role: &str| spec.weights.iter().find(|(r, _)| r == role).map(|(_, w)| w.name.as_str());
    let mat = |role: &str| name(role).and_then(|n| inp.mats.get(n)).ok_or_else(|| missing(role));
    let vec = |role: &str| name(role).and_then(|n| inp.vecs.get(n)).map(|b| b.all());
    let q = match spec.q_lora_rank {
        Some(_) => MlaQuery::Lora {
            q_a: mat("q_a")?,
            q_a_norm: vec("q_a_norm").ok_or_else(|| missing("q_a_norm"))?,
            q_b: mat("q_b")?,
        },
        None => MlaQuery::Direct(mat("q")?),
    };
    let w = MlaMats {
        q,
        q_a_bias: vec("q_a_bias"),
        kv_a: mat("kv_a")?,
        kv_a_bias: vec("kv_a_bias"),
        kv_a_norm: vec("kv_a_norm").ok_or_else(|| missing("kv_a_norm"))?,
        kv_b: mat("kv_b")?,
        o: mat("o")?,
        o_bias: vec("o_bias"),
    };
    let style = if spec.rope_interleave { RopeStyle::Interleaved } else { RopeStyle::RotateHalf };
    let rope = RopeArgs { freq: inp.freq.0.all(), style, mscale: inp.freq.1 };
    let cache = |(ml, mr, sl, sr): &'a (DeviceBuffer, DeviceBuffer, DeviceBuffer, DeviceBuffer)| MlaCache {
        latent: ml.all(),
        rope: mr.all(),
        latent_back: sl.all(),
        rope_back: sr.all(),
    };
    let scratch =
        inp.scratch.ok_or_else(|| VkError::BadArgument { op: OP, msg: "no MLA scratch for this session".into() })?;
    let first = seqs.first().ok_or_else(|| VkError::BadArgument { op: OP, msg: "no sequence".into() })?;
    let call = MlaCall {
        shape: MlaShape::of(spec),
        weights: w,
        rope,
        cache: cache(first.mirror),
        scratch,
        precision,
        select: None,
    };
    let seqs: Vec<MlaSeq> = seqs
        .iter()
        .map(|q| MlaSeq { rows: q.rows.clone(), cache: cache(q.mirror), pos: q.pos, select: q.select })
        .collect();
    f.mla_seqs(call, x, n, out, &seqs)
}
