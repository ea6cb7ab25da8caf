//! Causal grouped-query attention of a block of query rows over a layer's cached keys and
//! values, with a sliding window, per-head sinks and relative-position logits (Inkling's,
//! `RelArgs`: the f32 kernels only). Reference: `cpu::attention::attend_rel`.
//! Decode (one row) splits the positions across workgroups, the last of which joins the
//! partial softmaxes (`attn_split.comp`, one dispatch); prompt chunks run the flash-style
//! blocked kernel (`attn_block.comp`). `rope_kv` rotates the block's q and k rows and appends its k and v
//! rows to the layer's KV mirror and to the host's read-back rows, in one dispatch.
//!
//! Positions (`Pos`): fixed when the frame is recorded, or read from a device buffer when the
//! kernel runs, so that one recording serves every decode step (the split count then follows
//! from the position on the device, by the same rule as here).
//!
//! Must not: write the KV cache in `attention` (`rope_kv`, or the executor, appends rows first).

use super::matmul::QuantizedActs;
use super::u32_arg;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
pub use crate::vk::kv_type::KvType;
use crate::vk::push::AttnPush;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{AttentionSpec, RopeStyle};

/// Where a kernel takes the position of the block's first row from.
#[derive(Clone, Copy, Debug)]
pub enum Pos<'a> {
    /// Fixed when recorded.
    Fixed(usize),
    /// Element 0 (u32) of this view, read when the kernel runs. Views over the KV mirror must
    /// then cover every position a run will see.
    Dynamic(View<'a>),
}

/// The geometry of one `rope_kv` call.
#[derive(Clone, Copy, Debug)]
pub struct KvShape {
    /// Rows of the block.
    pub n: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// The mirror's and the read-back rows' element type.
    pub kv: KvType,
}

/// The rotation `rope_kv` applies: the inverse frequencies (`cpu::rope::inv_freq`: rotary
/// dim / 2 of them), the pairing, and the cos/sin multiplier.
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs<'a> {
    pub freq: View<'a>,
    pub style: RopeStyle,
    pub mscale: f32,
}

/// A layer's KV mirror and the block's read-back rows: the keys `k` and values `v` (row `p`
/// holds position `p`, or `p % ring` in a ring; from element 0) and `k_back`, `v_back` (row
/// `i` holds the block's row `i`, from element 0).
#[derive(Clone, Copy, Debug)]
pub struct KvMirror<'a> {
    pub k: View<'a>,
    pub v: View<'a>,
    pub k_back: View<'a>,
    pub v_back: View<'a>,
}

/// What `rope_kv` (and `rope_kv_ring`) takes: the rotation (`None`: none), the block's
/// projected rows `q`, `k`, `v`, their geometry, the mirror the k and v rows go to, and the
/// block's position.
#[derive(Clone, Copy, Debug)]
pub struct RopeKvArgs<'a> {
    pub rope: Option<RopeArgs<'a>>,
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    pub shape: KvShape,
    pub mirror: KvMirror<'a>,
    pub pos: Pos<'a>,
}

/// The operands of one attention call: `n` query rows `q`, the cached keys `k` and values `v`
/// they attend over (`len x kv_heads * head_dim`, `len x kv_heads * v_head_dim`), one sink
/// logit per head (or none), and the output rows `out` (`n x heads * v_head_dim`).
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs<'a> {
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    pub sinks: Option<View<'a>>,
    pub out: View<'a>,
    pub n: usize,
}

/// Relative-position logits (Inkling's `AttentionSpec::rel`): `r`, the block's rows of `heads x
/// d_rel` states (`n x heads * d_rel`), and `proj` (`[d_rel, extent]`, from element 0). Row
/// `i`, head `h` and a key `d < extent` positions back get `sum_j r[i, h * d_rel + j] * proj[j,
/// d]` added to their scaled score (`cpu::attention::rel_logits`, `attend_rel`).
#[derive(Clone, Copy, Debug)]
pub struct RelArgs<'a> {
    pub r: View<'a>,
    pub proj: View<'a>,
    pub d_rel: usize,
    pub extent: usize,
}

/// What `attention_decode` takes for its one row: the rotation (`None`: none), the row's
/// projections `q`, `k`, `v`, the layer's mirror (its `k` and `v` from element 0, covering
/// every position a run sees), the sinks, the output row, the position, the absorbed q and k
/// norms (or none), and whether the output also comes back as 8-bit activations.
#[derive(Clone, Copy, Debug)]
pub struct DecodeArgs<'a> {
    pub rope: Option<RopeArgs<'a>>,
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    pub mirror: KvMirror<'a>,
    pub sinks: Option<View<'a>>,
    pub out: View<'a>,
    pub pos: Pos<'a>,
    pub norm: Option<QkNorm<'a>>,
    pub q8: bool,
}

impl<'a> Pos<'a> {
    /// (fixed position, dynamic flag, the params binding).
    pub(crate) fn parts(&self, op: &'static str) -> Result<(u32, u32, Bind<'a>)> {
        match *self {
            Pos::Fixed(p) => Ok((u32_arg(op, "pos0", p)?, 0, Bind::UNUSED)),
            Pos::Dynamic(v) => {
                v.check(op, "position", 1)?;
                if v.offset != 0 {
                    return Err(VkError::BadArgument { op, msg: "position views must start at element 0".into() });
                }
                Ok((0, 1, Bind::buf(v.buf)))
            }
        }
    }
}

/// Geometry and options of one attention call (as `cpu::attention::AttnShape`, plus the value
/// scale, which the CPU executor applies to the output after `attend`).
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// Multiplies the values, so the output (MiMo-V2-Flash's `attention_value_scale`; 1
    /// elsewhere). The mirrors keep the values as projected.
    pub value_scale: f32,
    /// The mirror as a ring of this many rows (position `p` in row `p % ring`): a sliding
    /// window's, which holds the window and a block (`None`: row `p` holds position `p`).
    pub ring: Option<usize>,
    /// The mirror's element type (and, for `attention_decode`, its read-back rows').
    pub kv: KvType,
}

impl AttnShape {
    /// The geometry and options of an attention op.
    pub fn of(spec: &AttentionSpec) -> AttnShape {
        AttnShape {
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
            v_head_dim: spec.v_head_dim,
            scale: spec.scale,
            window: spec.window,
            value_scale: spec.value_scale,
            ring: None,
            kv: KvType::F32,
        }
    }
}

/// Which kernel attention takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnPath {
    /// Split positions for one row; for more, the f16 cooperative kernel where
    /// `Frame::attention_on_coopmat` says so, else the f32 blocked one.
    #[default]
    Auto,
    Split,
    /// The f32 blocked kernel (`attn_block.comp`), whatever the device has.
    Block,
    /// The f16 cooperative kernel (`attn_coop.comp`); an error where it does not apply.
    Coop,
}

const MAX_D: usize = 256;
pub(super) const MAX_SPLITS: usize = 32;
const MIN_CHUNK: usize = 32;
const BQ: usize = 16;
/// `attn_coop.comp`'s query rows a workgroup and largest head dim; the fewest rows and the
/// narrowest window `AttnPath::Auto` takes it for (`Frame::attention_on_coopmat`).
const COOP_BQ: usize = 64;
const COOP_MAX_D: usize = 128;
pub const COOP_ATTN_ROWS: usize = 64;
pub const COOP_MIN_WINDOW: usize = 256;

impl<'a> Frame<'a> {
    /// `out[n x heads * v_head_dim]`: rows of `q` at positions `pos0..pos0 + n` over keys and
    /// values `0..pos0 + n` of `k`, `v` (`a`).
    pub fn attention(&mut self, s: AttnShape, a: AttnArgs<'a>, pos0: usize, path: AttnPath) -> Result<()> {
        self.attention_at(s, a, Pos::Fixed(pos0), path)
    }

    /// `attention` with the block's position fixed or read on the device (`Pos`).
    pub fn attention_at(&mut self, s: AttnShape, a: AttnArgs<'a>, pos: Pos<'a>, path: AttnPath) -> Result<()> {
        self.attention_inner(s, a, pos, path, None, None)
    }

    /// `attention_at` with relative-position logits (`rel`; `None`: as `attention_at`). The
    /// f16 cooperative kernel does not take them: `AttnPath::Auto` takes the f32 kernels, and
    /// `AttnPath::Coop` is an error.
    pub fn attention_rel_at(
        &mut self,
        s: AttnShape,
        a: AttnArgs<'a>,
        rel: Option<RelArgs<'a>>,
        pos: Pos<'a>,
        path: AttnPath,
    ) -> Result<()> {
        self.attention_inner(s, a, pos, path, None, rel)
    }

    /// One row's `rope_kv` and `attention_at` in one kernel (the split path): `q`, `k`, `v`
    /// are the row's projections, read and left as they are; with `norm`, q and the k row are
    /// first normalized (the layer's q and k norms); q and the k row are rotated as `rope_kv`
    /// rotates them (`rope: None`: not at all), and the k and v rows written to row `pos` of
    /// the mirror's keys and values (from element 0, covering every position a run sees) and
    /// to its read-back rows. With `q8`, the output row also comes back as 8-bit
    /// activations (blocks of 32, bit for bit `quantize_acts` of `out`) for the product after
    /// it; `v_head_dim` must then be a multiple of 32. References: `cpu::norm::rms_norm`,
    /// `cpu::rope::apply_row`, `cpu::attention::attend`.
    pub fn attention_decode(&mut self, s: AttnShape, a: DecodeArgs<'a>) -> Result<Option<QuantizedActs>> {
        self.decode_with(s, a, None, None)
    }

    /// `attention_decode` with relative-position logits (`rel`, its `r` the row's states).
    pub fn attention_decode_rel(
        &mut self,
        s: AttnShape,
        a: DecodeArgs<'a>,
        rel: Option<RelArgs<'a>>,
    ) -> Result<Option<QuantizedActs>> {
        self.decode_with(s, a, None, rel)
    }

    /// `attention_decode_rows` as a kernel a sequence (`attn_seqs::attention_decode_rows`
    /// takes one kernel for all where the device reaches buffers by address). Their constants
    /// are recorded before any of their kernels, and each kernel has counters of its own, so
    /// the kernels run side by side instead of one after another.
    pub fn attention_decode_each(&mut self, s: AttnShape, seqs: &[DecodeArgs<'a>]) -> Result<()> {
        const OP: &str = "attention_decode_rows";
        if seqs.iter().any(|a| a.norm.is_some() || a.q8) {
            return Err(VkError::BadArgument { op: OP, msg: "a q/k norm or 8-bit output per sequence".into() });
        }
        for a in seqs {
            self.constants(&decode_words(OP, a)?)?;
        }
        let runs = self.counter_runs(s.heads, seqs.len())?;
        for (a, c) in seqs.iter().zip(runs) {
            self.decode_with(s, *a, Some(c), None)?;
        }
        Ok(())
    }

    fn decode_with(
        &mut self,
        s: AttnShape,
        a: DecodeArgs<'a>,
        counters: Option<Bind<'static>>,
        rel: Option<RelArgs<'a>>,
    ) -> Result<Option<QuantizedActs>> {
        const OP: &str = "attention_decode";
        decode_checks(OP, s, &a)?;
        let DecodeArgs { rope, q, k, v, mirror, sinks, out, pos, norm, q8 } = a;
        let KvMirror { k: mk, v: mv, k_back: sk, v_back: sv } = mirror;
        let cst = self.constants(&decode_words(OP, &a)?)?;
        let acts = if q8 {
            let blocks = s.heads * s.v_head_dim / 32;
            let (xq, xd) = (self.scratch(blocks * 8)?, self.scratch(blocks * 2)?);
            Some(QuantizedActs::from_parts(self.scratch_bind(xq), self.scratch_bind(xd), 1, s.heads * s.v_head_dim))
        } else {
            None
        };
        let (qn, kn) = match norm {
            Some(nm) => (Bind::buf(nm.q_weight.buf), Bind::buf(nm.k_weight.buf)),
            None => (Bind::UNUSED, Bind::UNUSED),
        };
        let (oxq, oxd) = acts.map_or((Bind::UNUSED, Bind::UNUSED), |a| (a.xq, a.xd));
        let extra = Decode {
            k: Bind::buf(k.buf),
            v: Bind::buf(v.buf),
            freq: rope.map_or(Bind::UNUSED, |r| Bind::buf(r.freq.buf)),
            sk: Bind::buf(sk.buf),
            sv: Bind::buf(sv.buf),
            cst,
            qn,
            kn,
            oxq,
            oxd,
        };
        let attn = AttnArgs { q, k: mk, v: mv, sinks, out, n: 1 };
        self.attention_inner(s, attn, pos, AttnPath::Split, Some((extra, counters)), rel)?;
        Ok(acts)
    }

    fn attention_inner(
        &mut self,
        s: AttnShape,
        a: AttnArgs<'a>,
        pos: Pos<'a>,
        path: AttnPath,
        decode: Option<(Decode<'a>, Option<Bind<'static>>)>,
        rel: Option<RelArgs<'a>>,
    ) -> Result<()> {
        const OP: &str = "attention";
        let (decode, own_counters) = (decode.map(|d| d.0), decode.and_then(|d| d.1));
        let AttnArgs { q, k, v, sinks, out, n } = a;
        let (pos0, dyn_, params) = pos.parts(OP)?;
        let pos0 = pos0 as usize;
        if s.kv_heads == 0
            || !s.heads.is_multiple_of(s.kv_heads)
            || s.head_dim > MAX_D
            || s.v_head_dim > MAX_D
            || s.head_dim == 0
        {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "{} heads over {} kv heads, head_dim {} / {} (at most {MAX_D})",
                    s.heads, s.kv_heads, s.head_dim, s.v_head_dim
                ),
            });
        }
        if s.window == Some(0) {
            return Err(VkError::BadArgument { op: OP, msg: "a window of 0 positions".into() });
        }
        // A dynamic position is unknown here: the views need hold the block at least.
        let len = pos0 + n;
        // A ring holds every row a query sees: its window and the block's rows before it.
        let rows = match s.ring {
            Some(r) => super::check_ring(OP, r, s.window, n)?,
            None => len,
        };
        if (decode.is_some() || s.ring.is_some()) && (k.offset != 0 || v.offset != 0) {
            return Err(VkError::BadArgument { op: OP, msg: "mirror views must start at element 0".into() });
        }
        q.check(OP, "q", n * s.heads * s.head_dim)?;
        s.kv.check_widths(OP, &[s.kv_heads * s.head_dim, s.kv_heads * s.v_head_dim])?;
        k.check(OP, "keys", s.kv.words(rows * s.kv_heads * s.head_dim))?;
        v.check(OP, "values", s.kv.words(rows * s.kv_heads * s.v_head_dim))?;
        out.check(OP, "out", n * s.heads * s.v_head_dim)?;
        if let Some(sk) = sinks {
            sk.check(OP, "sinks", s.heads)?;
            if sk.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "sink views must start at element 0".into() });
            }
        }
        if let Some(r) = rel {
            r.r.check(OP, "relative states", n * s.heads * r.d_rel)?;
            r.proj.check(OP, "relative projection", r.d_rel * r.extent)?;
            if r.proj.offset != 0 {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: "relative projection views must start at element 0".into(),
                });
            }
            if path == AttnPath::Coop {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: "the f16 cooperative kernel does not take relative logits".into(),
                });
            }
        }
        if n == 0 {
            return Ok(());
        }
        // The relative logits' bindings (19-21 of both f32 kernels), or none.
        let rel_binds = match rel {
            Some(r) => {
                let words = [
                    u32_arg(OP, "relative states offset", r.r.offset)?,
                    u32_arg(OP, "d_rel", r.d_rel)?,
                    u32_arg(OP, "extent", r.extent)?,
                ];
                [Bind::buf(r.r.buf), Bind::buf(r.proj.buf), self.constants(&words)?]
            }
            None => [Bind::UNUSED; 3],
        };
        let span = s.window.map_or(len, |w| w.min(len));
        let (splits, chunk) = if dyn_ != 0 {
            (MAX_SPLITS, 0)
        } else {
            let splits = span.div_ceil(MIN_CHUNK).clamp(1, MAX_SPLITS);
            (splits, span.div_ceil(splits))
        };
        let mut push = AttnPush {
            n: n as u32,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.head_dim as u32,
            v_head_dim: s.v_head_dim as u32,
            pos0: u32_arg(OP, "pos0", pos0)?,
            window: u32_arg(OP, "window", s.window.unwrap_or(0))?,
            flags: sinks.is_some() as u32 | (decode.is_some() as u32) << 1 | dyn_ << 2 | (rel.is_some() as u32) << 3,
            scale: s.scale,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            k_off: u32_arg(OP, "k offset", s.kv.elems(k.offset))?,
            v_off: u32_arg(OP, "v offset", s.kv.elems(v.offset))?,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            splits: splits as u32,
            chunk: chunk as u32,
            value_scale: s.value_scale,
            ring: u32_arg(OP, "ring", s.ring.unwrap_or(0))?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let sink = sinks.map_or(Bind::UNUSED, |b| Bind::buf(b.buf));
        let base = [Bind::buf(q.buf), Bind::buf(k.buf), Bind::buf(v.buf), sink];
        let heads = s.heads as u32;
        let split = match path {
            AttnPath::Auto => n == 1,
            AttnPath::Split => true,
            AttnPath::Block | AttnPath::Coop => false,
        };
        let coop = match path {
            AttnPath::Coop if !self.coop_attention_fits(s) => {
                return Err(VkError::BadArgument {
                    op: OP,
                    msg: format!(
                        "no f16 cooperative attention for {n} rows of head dims {} / {} on {}",
                        s.head_dim,
                        s.v_head_dim,
                        self.ctx.caps().name
                    ),
                })
            }
            AttnPath::Coop => true,
            AttnPath::Auto => !split && rel.is_none() && self.attention_on_coopmat(s, n),
            AttnPath::Split | AttnPath::Block => false,
        };
        if split {
            let slots = n * s.heads * splits;
            // Kernels with counters of their own run side by side, each with its own partials;
            // the others share the frame's (one after another, as they share its counters).
            let (ml, o, counters) = match own_counters {
                Some(c) => {
                    let (ml, o) = (self.scratch(slots * 2)?, self.scratch(slots * s.v_head_dim)?);
                    (self.scratch_bind(ml), self.scratch_bind(o), c)
                }
                None => {
                    let (ml, o) = self.partials(slots * 2, slots * s.v_head_dim)?;
                    (ml, o, self.counters(n * s.heads)?)
                }
            };
            let d = decode.unwrap_or(Decode {
                k: Bind::UNUSED,
                v: Bind::UNUSED,
                freq: Bind::UNUSED,
                sk: Bind::UNUSED,
                sv: Bind::UNUSED,
                cst: Bind::UNUSED,
                qn: Bind::UNUSED,
                kn: Bind::UNUSED,
                oxq: Bind::UNUSED,
                oxd: Bind::UNUSED,
            });
            let binds = [
                base[0],
                base[1],
                base[2],
                base[3],
                ml,
                o,
                Bind::view(out),
                params,
                counters,
                d.k,
                d.v,
                d.freq,
                d.sk,
                d.sv,
                d.cst,
                d.qn,
                d.kn,
                d.oxq,
                d.oxd,
                rel_binds[0],
                rel_binds[1],
                rel_binds[2],
            ];
            let rows = u32_arg(OP, "n", n)?;
            self.dispatch(s.kv.kernel(Kernel::AttnSplit), None, &binds, &push, [heads, rows, splits as u32])
        } else {
            push.splits = 1;
            let mut binds = [Bind::UNUSED; 22];
            binds[..8].copy_from_slice(&[
                base[0],
                base[1],
                base[2],
                base[3],
                Bind::UNUSED,
                Bind::UNUSED,
                Bind::buf(out.buf),
                params,
            ]);
            binds[19..].copy_from_slice(&rel_binds);
            if coop {
                let binds = &binds[..8];
                let blocks = u32_arg(OP, "blocks", n.div_ceil(COOP_BQ))?;
                self.dispatch(s.kv.kernel(Kernel::AttnCoop), None, binds, &push, [heads, blocks, 1])
            } else {
                self.dispatch(
                    s.kv.kernel(Kernel::AttnBlock),
                    None,
                    &binds,
                    &push,
                    [heads, u32_arg(OP, "blocks", n.div_ceil(BQ))?, 1],
                )
            }
        }
    }

    /// Whether `attn_coop.comp` can run this attention: the device has the f16 shape
    /// (`DeviceCaps::coopmat_f16`, off with `CoopMatUse::Off`) and the head dims are multiples
    /// of 16 up to 128.
    fn coop_attention_fits(&self, s: AttnShape) -> bool {
        let fits = |d: usize| d > 0 && d <= COOP_MAX_D && d.is_multiple_of(16);
        self.ctx.caps().coopmat_f16 && fits(s.head_dim) && fits(s.v_head_dim)
    }

    /// Whether `AttnPath::Auto` takes the f16 cooperative kernel for a block of `n` rows: it
    /// fits, the block fills its 64-row tiles (`COOP_ATTN_ROWS`), and a window, if any, spans at
    /// least `COOP_MIN_WINDOW` positions. On the H200 the f32 kernel was faster below those
    /// (33 rows: 18.4 against 21.5 us; a window of 40 over 130 rows: 18.1 against 36.7 us; its
    /// 16-row tiles walk fewer keys), the cooperative one 3.2x faster on a Llama layer's 512 rows.
    pub(crate) fn attention_on_coopmat(&self, s: AttnShape, n: usize) -> bool {
        self.coop_attention_fits(s) && n >= COOP_ATTN_ROWS && s.window.is_none_or(|w| w >= COOP_MIN_WINDOW)
    }
}

/// The checks of one row's `attention_decode` that its arguments alone decide (the mirror's
/// length is `attention_inner`'s).
pub(super) fn decode_checks(op: &'static str, s: AttnShape, a: &DecodeArgs) -> Result<()> {
    let DecodeArgs { rope, k, v, mirror, norm, q8, .. } = *a;
    let KvMirror { k_back: sk, v_back: sv, .. } = mirror;
    if q8 && !s.v_head_dim.is_multiple_of(32) {
        return Err(VkError::BadArgument {
            op,
            msg: format!("8-bit output of value heads of {} (not a multiple of 32)", s.v_head_dim),
        });
    }
    if let Some(nm) = norm {
        let (qw, kw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let ok = |g: usize, w: usize| g == w || g == s.head_dim;
        if !ok(nm.q_group, qw) || !ok(nm.k_group, kw) {
            return Err(VkError::BadArgument {
                op,
                msg: format!(
                    "q/k norm groups {} / {}: a whole row or one head of {}",
                    nm.q_group, nm.k_group, s.head_dim
                ),
            });
        }
        nm.q_weight.check(op, "q norm weight", nm.q_group)?;
        nm.k_weight.check(op, "k norm weight", nm.k_group)?;
        if nm.q_weight.offset != 0 || nm.k_weight.offset != 0 {
            return Err(VkError::BadArgument { op, msg: "norm weight views must start at element 0".into() });
        }
    }
    let half = rope.map_or(0, |r| r.freq.len);
    if 2 * half > s.head_dim {
        return Err(VkError::BadArgument { op, msg: format!("rotary dim {} over head_dim {}", 2 * half, s.head_dim) });
    }
    k.check(op, "k", s.kv_heads * s.head_dim)?;
    v.check(op, "v", s.kv_heads * s.v_head_dim)?;
    s.kv.check_widths(op, &[s.kv_heads * s.head_dim, s.kv_heads * s.v_head_dim])?;
    sk.check(op, "k read-back", s.kv.words(s.kv_heads * s.head_dim))?;
    sv.check(op, "v read-back", s.kv.words(s.kv_heads * s.v_head_dim))?;
    super::at_element_0(op, &[(sk, "k read-back"), (sv, "v read-back")])?;
    if let Some(r) = rope {
        r.freq.check(op, "frequencies", half)?;
        if r.freq.offset != 0 {
            return Err(VkError::BadArgument { op, msg: "frequency views must start at element 0".into() });
        }
    }
    Ok(())
}

/// The words of `attention_decode`'s constants buffer (rope, new-row offsets, norm, 8-bit
/// output).
pub(super) fn decode_words(op: &'static str, a: &DecodeArgs) -> Result<[u32; 11]> {
    let half = a.rope.map_or(0, |r| r.freq.len);
    let style = a.rope.is_some_and(|r| r.style == RopeStyle::Interleaved) as u32;
    let mscale = a.rope.map_or(1.0f32, |r| r.mscale).to_bits();
    let (nflags, qg, kg, eps, off) = match a.norm {
        Some(nm) => (3u32, nm.q_group as u32, nm.k_group as u32, nm.eps.to_bits(), nm.offset.to_bits()),
        None => (0, 0, 0, 0, 0),
    };
    Ok([
        half as u32,
        style,
        mscale,
        u32_arg(op, "k offset", a.k.offset)?,
        u32_arg(op, "v offset", a.v.offset)?,
        nflags,
        qg,
        kg,
        eps,
        off,
        a.q8 as u32,
    ])
}

/// What `attention_decode` adds to the split kernel's bindings.
#[derive(Clone, Copy)]
struct Decode<'a> {
    k: Bind<'a>,
    v: Bind<'a>,
    freq: Bind<'a>,
    sk: Bind<'a>,
    sv: Bind<'a>,
    cst: Bind<'static>,
    qn: Bind<'a>,
    kn: Bind<'a>,
    oxq: Bind<'static>,
    oxd: Bind<'static>,
}

/// The RMSNorms of q and k that `attention_decode` applies before RoPE (a layer's q and k
/// norms, absorbed): over groups of `q_group` / `k_group` columns (the whole projected row,
/// or one head), `x / rms * (weight + offset)` as `cpu::norm::rms_norm`.
#[derive(Clone, Copy, Debug)]
pub struct QkNorm<'a> {
    pub q_weight: View<'a>,
    pub k_weight: View<'a>,
    pub q_group: usize,
    pub k_group: usize,
    pub eps: f32,
    pub offset: f32,
}
