//! DeepSeek Sparse Attention's lightning indexer in a device frame (`Op::Indexer`; reference
//! `cpu::indexer`): its three products over the step's rows (index queries from the MLA's query
//! latent, the key and the head weights from the layer's input), the key's LayerNorm, then per
//! sequence the rotation of queries and key with the key's append to the layer's index-key
//! mirror (`rope_kv` with no value heads) and the selection over the mirror (`dsa_select`).
//!
//! The mirrors are kept as the KV mirrors are: the host's `LayerKv::index` stays canonical,
//! rows a mirror lacks go up before a frame (`Indexers::upload`, behind a watermark), the frame
//! appends the block's keys to the mirror and to read-back rows, and the host appends those to
//! its copy after the frame (`Indexers::take_rows`); so a device lost mid-forward re-runs it on
//! the CPU with the same keys.
//!
//! Must not: hold index keys the host does not, or record anything but the op it is given.

use super::{DeviceModel, Rec};
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::exec::kv::KvCache;
use crate::vk::{
    Context, DeviceBuffer, DsaSelectArgs, DsaShape, Frame as VkFrame, KvMirror, KvShape, KvType, MatmulPath, MemoryUse,
    Pos, RopeArgs, RopeKvArgs, VkError,
};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ir::{IndexerSpec, LayerId, Op, Program, ValueId};
use coli_compiler::place::size::INDEX_SCORES;

/// One layer's index-key mirror (`context` rows) and the block's read-back rows.
struct IndexMirror {
    keys: DeviceBuffer,
    back: DeviceBuffer,
}

/// A session's indexers on one device: a mirror and a watermark per indexer layer, and the
/// scratch every indexer of the device shares (they run one after another).
pub(super) struct Indexers {
    mirrors: Vec<Option<IndexMirror>>,
    /// Rows of each layer's mirror that equal the host's keys.
    marks: Vec<usize>,
    q: DeviceBuffer,
    k: DeviceBuffer,
    w: DeviceBuffer,
    /// Each row's score of every position, `stride` (the context) apart, for `pass` rows at a
    /// time (a long context's prompt chunk selects in several passes).
    scores: DeviceBuffer,
    stride: usize,
    pass: usize,
}

/// Rows whose scores one selection pass holds: a block's, at most `INDEX_SCORES` floats of them
/// (the compiler's size counts as many), one at least.
fn score_rows(rows: usize, context: usize) -> usize {
    rows.min(INDEX_SCORES / context.max(1)).max(1)
}

/// The indexer ops of a frame: (layer index, key width); found once a frame, for every
/// sequence's `upload` and `take_rows`.
pub(super) fn layers_of(p: &Program, frame: &Frame) -> Vec<(usize, usize)> {
    frame
        .ops
        .iter()
        .filter_map(|&id| match op_of(p, id) {
            Op::Indexer { layer, spec, .. } => Some((layer.0 as usize, spec.head_dim)),
            _ => None,
        })
        .collect()
}

impl Indexers {
    /// The mirrors and scratch of the indexers of `frames` (`None`: they have none), for
    /// blocks of at most `rows` rows and `context` positions.
    pub(super) fn new(
        ctx: &Context,
        p: &Program,
        frames: &[Frame],
        rows: usize,
        context: usize,
    ) -> Result<Option<Indexers>, VkError> {
        let specs: Vec<(LayerId, &IndexerSpec)> = frames
            .iter()
            .flat_map(|f| f.ops.iter())
            .filter_map(|&id| match op_of(p, id) {
                Op::Indexer { layer, spec, .. } => Some((*layer, spec)),
                _ => None,
            })
            .collect();
        if specs.is_empty() {
            return Ok(None);
        }
        let most = |f: &dyn Fn(&IndexerSpec) -> usize| specs.iter().map(|(_, s)| f(s)).max().unwrap_or(0).max(1);
        let mut mirrors: Vec<Option<IndexMirror>> = (0..p.layers.len()).map(|_| None).collect();
        for (layer, s) in &specs {
            let d = s.head_dim;
            mirrors[layer.0 as usize] = Some(IndexMirror {
                keys: ctx.f32_buffer((context * d).max(1))?,
                back: ctx.buffer(MemoryUse::Readback, (rows * d).max(1) * 4)?,
            });
        }
        let (stride, pass) = (context.max(1), score_rows(rows, context));
        Ok(Some(Indexers {
            marks: vec![0; mirrors.len()],
            mirrors,
            q: ctx.f32_buffer(rows * most(&|s| s.heads * s.head_dim))?,
            k: ctx.f32_buffer(rows * most(&|s| s.head_dim))?,
            w: ctx.f32_buffer(rows * most(&|s| s.heads))?,
            scores: ctx.f32_buffer(DsaShape::scores_len(pass, stride))?,
            stride,
            pass,
        }))
    }

    /// Before a forward from `pos0`: a host write below a mirror's rows lowers its watermark.
    pub(super) fn begin_forward(&mut self, kv: &KvCache, pos0: usize) {
        for (l, mark) in self.marks.iter_mut().enumerate() {
            let host = kv.layers.get(l).map_or(0, |c| c.index.len() / c.index_width.max(1));
            *mark = (*mark).min(host).min(pos0);
        }
    }

    /// Before a frame at `pos0`: the host's keys its indexers' mirrors (`layers`, `layers_of`
    /// the frame) lack.
    pub(super) fn upload(
        &mut self,
        ctx: &Context,
        layers: &[(usize, usize)],
        kv: &KvCache,
        pos0: usize,
    ) -> Result<(), VkError> {
        for &(l, d) in layers {
            let (mark, m) = (&mut self.marks[l], self.mirrors[l].as_ref().expect("mirror allocated"));
            if *mark >= pos0 {
                continue;
            }
            let host = &kv.layers[l].index;
            if host.len() < pos0 * d {
                return Err(VkError::BadArgument {
                    op: "indexer",
                    msg: format!("layer {l}: the host holds {} index keys, the block starts at {pos0}", host.len() / d),
                });
            }
            ctx.write(&m.keys, *mark * d * 4, as_bytes(&host[*mark * d..pos0 * d]))?;
            *mark = pos0;
        }
        Ok(())
    }

    /// After a frame: the block's `n` keys of each of its indexers (`layers`) into the host's
    /// copy.
    pub(super) fn take_rows(
        &mut self,
        ctx: &Context,
        layers: &[(usize, usize)],
        kv: &mut KvCache,
        pos0: usize,
        n: usize,
    ) -> Result<(), VkError> {
        for &(l, d) in layers {
            let m = self.mirrors[l].as_ref().expect("mirror allocated");
            let c = &mut kv.layers[l];
            c.index_width = d;
            c.index.truncate(pos0 * d);
            c.index.resize((pos0 + n) * d, 0.0);
            ctx.read(&m.back, 0, as_bytes_mut(&mut c.index[pos0 * d..]))?;
            self.marks[l] = pos0 + n;
        }
        Ok(())
    }
}

impl DeviceModel {
    /// Records an indexer op: the products on all the step's rows, then per sequence the RoPE
    /// and key append over its own mirror and its rows' selection, at its own positions.
    pub(super) fn record_indexer<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        (x, q, out, layer, spec): (ValueId, ValueId, ValueId, LayerId, &IndexerSpec),
    ) -> Result<(), VkError> {
        const OP: &str = "indexer";
        let Rec { st, widths, n, precision, seqs, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let view = |v: ValueId| st.values[v.0 as usize].view(0, n * w(v));
        let missing = |what: &str| VkError::BadArgument { op: OP, msg: format!("{what} is not on the device") };
        let ix = st.indexers.as_ref().ok_or_else(|| missing("the session's indexer scratch"))?;
        let name = |role: &str| spec.weights.iter().find(|(r, _)| r == role).map(|(_, w)| w.name.as_str());
        let mat = |role: &str| name(role).and_then(|n| self.mats.get(n)).ok_or_else(|| missing(role));
        let vec = |role: &str| name(role).and_then(|n| self.vecs.get(n)).map(|b| b.all()).ok_or_else(|| missing(role));
        let (h, d) = (spec.heads, spec.head_dim);
        let (qs, k, hw) = (ix.q.view(0, n * h * d), ix.k.view(0, n * d), ix.w.view(0, n * h));
        f.matmul_with(mat("q_b")?, view(q), n, qs, MatmulPath::Auto, precision)?;
        f.matmul_with(mat("k")?, view(x), n, k, MatmulPath::Auto, precision)?;
        f.layer_norm(k, vec("k_norm")?, Some(vec("k_norm_bias")?), k, n, spec.eps)?;
        f.matmul_with(mat("w")?, view(x), n, hw, MatmulPath::Auto, precision)?;
        let rope = (spec.rope_dim > 0).then(|| {
            let (freq, mscale) = self.freq(spec.rope_dim, spec.rope_theta, spec.rope_scaling);
            RopeArgs { freq: freq.all(), style: spec.rope_style, mscale }
        });
        for s in seqs {
            let (r0, rn) = (s.rows.start, s.rows.len());
            let at = s.pos;
            let m = s.st.indexers.as_ref().and_then(|i| i.mirrors[layer.0 as usize].as_ref());
            let m = m.ok_or_else(|| missing("the layer's index-key mirror"))?;
            // The scores in the sequence's own scratch: their stride is its context's.
            let sx = s.st.indexers.as_ref().ok_or_else(|| missing("the sequence's indexer scratch"))?;
            let (qv, kv) = (ix.q.view(r0 * h * d, rn * h * d), ix.k.view(r0 * d, rn * d));
            let none = m.back.view(0, 0);
            f.rope_kv(RopeKvArgs {
                rope,
                q: qv,
                k: kv,
                v: none,
                shape: KvShape { n: rn, heads: h, kv_heads: 1, head_dim: d, v_head_dim: 0, kv: KvType::F32 },
                mirror: KvMirror { k: m.keys.all(), v: none, k_back: m.back.all(), v_back: none },
                pos: at,
            })?;
            // The rows' selections, `pass` rows at a time (a position read on the device: one
            // row).
            for p0 in (0..rn).step_by(sx.pass) {
                let (a, pn) = (r0 + p0, sx.pass.min(rn - p0));
                let at = match at {
                    Pos::Fixed(p) => Pos::Fixed(p + p0),
                    dynamic => dynamic,
                };
                let args = DsaSelectArgs {
                    q: ix.q.view(a * h * d, pn * h * d),
                    keys: m.keys.all(),
                    w: ix.w.view(a * h, pn * h),
                    w_scale: (h as f32).powf(-0.5),
                    scores: sx.scores.all(),
                    stride: sx.stride,
                    out: st.values[out.0 as usize].view(a * spec.topk, pn * spec.topk),
                    n: pn,
                };
                f.dsa_select(DsaShape::of(spec), args, at)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_context_selects_in_passes_within_the_score_budget() {
        assert_eq!(score_rows(512, 8192), 512);
        assert_eq!(score_rows(512, 131_072), 128);
        assert!(score_rows(512, 131_072) * 131_072 <= INDEX_SCORES);
        assert_eq!(score_rows(512, 1 << 30), 1, "one row at least");
        assert_eq!(score_rows(1, 0), 1);
    }
}
