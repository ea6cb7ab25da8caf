//! Multi-head latent attention (DeepSeek-V2/V3's `Mla` op) on the device, as the CPU runs it
//! (`cpu::mla::mla`, the reference), in the absorbed form for every row count (the same math
//! as the CPU's expanded form for prompt blocks, up to the order of float operations):
//! the query (`q_a`, its RMSNorm fused into `q_b`'s product, or `q` alone) and `kv_a` as
//! products (`matmul`); `mla_kv.comp`: the latent's RMSNorm and the rotated shared rope key
//! into the layer's cache mirrors and read-back rows, and RoPE on the queries' rope parts;
//! `mla_absorb.comp`: each head's no-position query through `kv_b`'s key rows into latent
//! space; `mla_attn.comp`: scores against the cached latents plus the rope keys, the softmax,
//! the weighted latent; `mla_value.comp`: `kv_b`'s value rows on it; `o` as a product.
//!
//! The cache mirrors are the caller's (the executor's, behind its watermark): per position the
//! normalized latent (`kv_lora_rank` floats) and the rotated rope key (`qk_rope_head_dim`),
//! the layout of the host's `LayerKv` for an MLA layer. `kv_b` is read as uploaded, in any
//! weight format (decoded as `dequant_row`; the value rows in the format's GEMV arithmetic).
//!
//! With a selection (`MlaCall::select`: DeepSeek Sparse Attention, an indexer's output on the
//! device) `mla_attn_sparse.comp` attends over each row's selected positions instead.
//!
//! Must not: keep state of its own, decide what the cache holds before the block (the caller
//! uploads what the mirror lacks), or take a latent wider than `MAX_LATENT` or a rope part
//! wider than `MAX_ROPE`.

use super::kv_append::BACK_BY_COPY_ROWS;
use super::{groups_for, u32_arg, KvType, MatIn, MatmulPath, Pos, RopeArgs};
use crate::cpu::Precision;
use crate::vk::context::{Context, DeviceBuffer, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::DeviceMatrix;
use crate::vk::ops::elementwise::Broadcast;
use crate::vk::push::{MlaAbsorbPush, MlaAttnPush, MlaKvPush, MlaValuePush};
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{MlaSpec, RopeStyle};

/// The widest latent the attention kernel holds (`MAX_C` in `mla_attn.comp`).
pub const MAX_LATENT: usize = 1024;
/// The widest rope part (`MAX_R` in `mla_attn.comp`).
pub const MAX_ROPE: usize = 128;
/// The most heads an attention workgroup takes (`GMAX` in `mla_attn.glsl`).
const GROUP_MAX: usize = 8;
/// The query floats an attention workgroup holds (`QCAP` in `mla_attn.glsl`).
const GROUP_FLOATS: usize = 4096;
/// Positions an attention tile (`TP` in `mla_attn.glsl`): a split covers at least one.
const TILE: usize = 32;
/// The workgroups an attention dispatch aims for before it splits rows' positions.
const SPLIT_TARGET: usize = 256;
/// The most splits of a row's positions.
const MAX_SPLITS: usize = 32;

/// The geometry of one MLA op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaShape {
    pub heads: usize,
    /// The query LoRA's rank (`None`: one `q` projection).
    pub q_lora: Option<usize>,
    /// `kv_lora_rank`: the latent's width.
    pub latent: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    /// The two latent RMSNorms' epsilon.
    pub eps: f32,
}

impl MlaShape {
    pub fn of(spec: &MlaSpec) -> MlaShape {
        MlaShape {
            heads: spec.heads,
            q_lora: spec.q_lora_rank,
            latent: spec.kv_lora_rank,
            nope: spec.qk_nope_head_dim,
            rope: spec.qk_rope_head_dim,
            v_head_dim: spec.v_head_dim,
            scale: spec.scale,
            eps: spec.norm_eps,
        }
    }

    /// Whether the kernels run this geometry (the op library's claim).
    pub fn supported(spec: &MlaSpec) -> bool {
        MlaShape::of(spec).check().is_ok()
    }

    /// Floats of one row's queries (every head's no-position and rope parts).
    pub fn q_width(&self) -> usize {
        self.heads * (self.nope + self.rope)
    }

    /// Floats of one row of `kv_a`'s output (the latent, then the rope key).
    pub fn kv_width(&self) -> usize {
        self.latent + self.rope
    }

    /// Floats of one row of the heads' output (`o`'s input).
    pub fn out_heads(&self) -> usize {
        self.heads * self.v_head_dim
    }

    fn check(&self) -> Result<()> {
        let (h, c, dn, dr, dv) = (self.heads, self.latent, self.nope, self.rope, self.v_head_dim);
        if h == 0
            || c == 0
            || c > MAX_LATENT
            || dr == 0
            || dr % 2 != 0
            || dr > MAX_ROPE
            || dn == 0
            || dv == 0
            || self.q_lora == Some(0)
        {
            return Err(VkError::BadArgument {
                op: "mla",
                msg: format!("{h} heads, a latent of {c}, nope {dn}, rope {dr}, values {dv}, q_lora {:?} (a latent of at most {MAX_LATENT}, an even rope part of at most {MAX_ROPE})", self.q_lora),
            });
        }
        Ok(())
    }
}

/// The query's weights on the device.
#[derive(Clone, Copy)]
pub enum MlaQuery<'a> {
    Lora { q_a: &'a DeviceMatrix, q_a_norm: View<'a>, q_b: &'a DeviceMatrix },
    Direct(&'a DeviceMatrix),
}

/// The op's weights on the device, by role.
#[derive(Clone, Copy)]
pub struct MlaMats<'a> {
    pub q: MlaQuery<'a>,
    pub q_a_bias: Option<View<'a>>,
    pub kv_a: &'a DeviceMatrix,
    pub kv_a_bias: Option<View<'a>>,
    pub kv_a_norm: View<'a>,
    pub kv_b: &'a DeviceMatrix,
    pub o: &'a DeviceMatrix,
    pub o_bias: Option<View<'a>>,
}

/// The layer's cache on the device: the mirrors (row `p` holds position `p`, from element 0)
/// and the block's read-back rows (row `i` holds the block's row `i`, from element 0).
#[derive(Clone, Copy)]
pub struct MlaCache<'a> {
    pub latent: View<'a>,
    pub rope: View<'a>,
    pub latent_back: View<'a>,
    pub rope_back: View<'a>,
}

/// One layer's op as a call records it: its geometry, its weights, `cpu::rope::inv_freq` of
/// the rope part (YaRN included) and its style, the layer's cache, the scratch its kernels
/// work in, and the precision of its products (as `matmul_with`).
#[derive(Clone, Copy)]
pub struct MlaCall<'a> {
    pub shape: MlaShape,
    pub weights: MlaMats<'a>,
    pub rope: RopeArgs<'a>,
    pub cache: MlaCache<'a>,
    pub scratch: &'a MlaScratch,
    pub precision: Precision,
    /// The block's selection (`n x topk`: positions ascending, `-1` after them) and its `topk`:
    /// each row attends over those positions only.
    pub select: Option<(View<'a>, usize)>,
}

/// One sequence of a batched MLA call (`Frame::mla_seqs`): its rows of the call's, its layer
/// cache, its first row's position and its rows' selection (as `MlaCall::select`).
#[derive(Clone)]
pub struct MlaSeq<'a> {
    pub rows: std::ops::Range<usize>,
    pub cache: MlaCache<'a>,
    pub pos: Pos<'a>,
    pub select: Option<(View<'a>, usize)>,
}

/// What `mla_kv` reads and writes for `n` rows: `kv` (`kv_a`'s output), the latent norm's
/// weight `norm`, the queries `q` (their rope parts rotated in place), the rotation `rope`
/// and the layer's `cache`.
#[derive(Clone, Copy)]
pub struct MlaKvArgs<'a> {
    pub rope: RopeArgs<'a>,
    pub kv: View<'a>,
    pub norm: View<'a>,
    pub q: View<'a>,
    pub n: usize,
    pub cache: MlaCache<'a>,
}

/// What `mla_attn` reads and writes for `n` rows: the queries `q` (for their rope parts), the
/// absorbed queries `lat` (replaced by the weighted latents), and the cache mirrors of the
/// latents and the rope keys (from element 0).
#[derive(Clone, Copy)]
pub struct MlaAttnArgs<'a> {
    pub q: View<'a>,
    pub lat: View<'a>,
    pub latent_mirror: View<'a>,
    pub rope_mirror: View<'a>,
    pub n: usize,
}

/// What the op's kernels work in, for blocks of at most `rows` rows (one per session serves
/// every MLA layer of a frame: the layers run one after another).
pub struct MlaScratch {
    rows: usize,
    shape: MlaShape,
    qa: DeviceBuffer,
    q: DeviceBuffer,
    kv: DeviceBuffer,
    /// The absorbed queries, then (in place) the weighted latents: rows x heads x latent.
    lat: DeviceBuffer,
    heads: DeviceBuffer,
}

impl MlaScratch {
    /// Buffers for blocks of at most `rows` rows of ops no larger than `shape`.
    pub fn new(ctx: &Context, rows: usize, shape: MlaShape) -> Result<MlaScratch> {
        let rows = rows.max(1);
        Ok(MlaScratch {
            rows,
            shape,
            qa: ctx.f32_buffer((rows * shape.q_lora.unwrap_or(0)).max(1))?,
            q: ctx.f32_buffer(rows * shape.q_width())?,
            kv: ctx.f32_buffer(rows * shape.kv_width())?,
            lat: ctx.f32_buffer(rows * shape.heads * shape.latent)?,
            heads: ctx.f32_buffer(rows * shape.out_heads())?,
        })
    }

    /// The shape covering both (for one scratch serving several layers).
    pub fn cover(a: MlaShape, b: MlaShape) -> MlaShape {
        let q_lora = match (a.q_lora, b.q_lora) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0).max(y.unwrap_or(0))),
        };
        MlaShape {
            heads: a.heads.max(b.heads),
            q_lora,
            latent: a.latent.max(b.latent),
            nope: a.nope.max(b.nope),
            rope: a.rope.max(b.rope),
            v_head_dim: a.v_head_dim.max(b.v_head_dim),
            ..a
        }
    }

    fn fits(&self, s: &MlaShape, n: usize) -> bool {
        let c = &self.shape;
        n <= self.rows
            && s.q_lora.unwrap_or(0) <= c.q_lora.unwrap_or(0)
            && s.q_width() <= c.q_width()
            && s.kv_width() <= c.kv_width()
            && s.heads * s.latent <= c.heads * c.latent
            && s.out_heads() <= c.out_heads()
    }
}

impl<'a> Frame<'a> {
    /// The whole MLA op over `n` rows of `x` (`n x hidden`) at positions `pos0..pos0 + n`:
    /// the block's latents and rope keys appended to `call.cache` (which must hold positions
    /// `0..pos0`), the output into `out` (`n x hidden`).
    pub fn mla(&mut self, call: MlaCall<'a>, x: View<'a>, n: usize, pos0: usize, out: View<'a>) -> Result<()> {
        self.mla_at(call, x, n, Pos::Fixed(pos0), out)
    }

    /// `mla` at a position fixed or read on the device (`Pos`: a recording replayed at every
    /// decode step reads it from a buffer; the whole mirrors are then bound).
    pub fn mla_at(&mut self, call: MlaCall<'a>, x: View<'a>, n: usize, pos: Pos<'a>, out: View<'a>) -> Result<()> {
        let seq = MlaSeq { rows: 0..n, cache: call.cache, pos, select: call.select };
        self.mla_seqs(call, x, n, out, &[seq])
    }

    /// `mla_at` over the rows of several sequences (a batched step): the products over all `n`
    /// rows at once (each weight read once), each sequence's cache rows and its attention over
    /// its own cache at its own position (`seqs`, whose caches and selections stand for the
    /// call's). Each sequence's rows compute what `mla_at` over them alone computes.
    pub fn mla_seqs(
        &mut self,
        call: MlaCall<'a>,
        x: View<'a>,
        n: usize,
        out: View<'a>,
        seqs: &[MlaSeq<'a>],
    ) -> Result<()> {
        const OP: &str = "mla";
        let MlaCall { shape: s, weights: w, rope, scratch, precision, .. } = call;
        s.check()?;
        if !scratch.fits(&s, n) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{n} rows of {s:?} do not fit a scratch of {} rows of {:?}", scratch.rows, scratch.shape),
            });
        }
        let hidden = w.kv_a.cols;
        let q_ok = match w.q {
            MlaQuery::Lora { q_a, q_b, .. } => {
                Some(q_a.rows) == s.q_lora && q_a.cols == hidden && q_b.cols == q_a.rows && q_b.rows == s.q_width()
            }
            MlaQuery::Direct(q) => s.q_lora.is_none() && q.cols == hidden && q.rows == s.q_width(),
        };
        let shapes_ok = w.kv_a.rows == s.kv_width()
            && w.kv_b.rows == s.heads * (s.nope + s.v_head_dim)
            && w.kv_b.cols == s.latent
            && w.o.cols == s.out_heads()
            && w.o.rows == hidden;
        if !q_ok || !shapes_ok {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!(
                    "kv_a {}x{}, kv_b {}x{}, o {}x{} (or the query's) for {s:?} and rows of {hidden}",
                    w.kv_a.rows, w.kv_a.cols, w.kv_b.rows, w.kv_b.cols, w.o.rows, w.o.cols
                ),
            });
        }
        x.check(OP, "x", n * hidden)?;
        out.check(OP, "out", n * hidden)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(q) = seqs.iter().find(|q| q.rows.end > n || q.rows.is_empty()) {
            return Err(VkError::BadArgument { op: OP, msg: format!("a sequence's rows {:?} of {n}", q.rows) });
        }
        let q = scratch.q.view(0, n * s.q_width());
        let kv = scratch.kv.view(0, n * s.kv_width());
        let lat = scratch.lat.view(0, n * s.heads * s.latent);
        let heads = scratch.heads.view(0, n * s.out_heads());
        // 1. The queries.
        match w.q {
            MlaQuery::Lora { q_a, q_a_norm, q_b } => {
                let qa = scratch.qa.view(0, n * q_a.rows);
                self.matmul_with(q_a, x, n, qa, MatmulPath::Auto, precision)?;
                if let Some(b) = w.q_a_bias {
                    self.add(qa, b, qa, n, q_a.rows, Broadcast::Row)?;
                }
                let normed = MatIn::Norm { x: qa, weight: q_a_norm, eps: s.eps, offset: 0.0 };
                self.matmul_fused(q_b, normed, n, q, None, MatmulPath::Auto, precision)?;
            }
            MlaQuery::Direct(wq) => self.matmul_with(wq, x, n, q, MatmulPath::Auto, precision)?,
        }
        // 2. The latents and rope keys.
        self.matmul_with(w.kv_a, x, n, kv, MatmulPath::Auto, precision)?;
        if let Some(b) = w.kv_a_bias {
            self.add(kv, b, kv, n, s.kv_width(), Broadcast::Row)?;
        }
        // A sequence's rows of a scratch of `width` a row.
        let rows =
            |v: View<'a>, q: &MlaSeq, width: usize| v.buf.view(v.offset + q.rows.start * width, q.rows.len() * width);
        // 3, 4. The latent norm, RoPE, each sequence's cache rows.
        for sq in seqs {
            let (q, kv) = (rows(q, sq, s.q_width()), rows(kv, sq, s.kv_width()));
            let args = MlaKvArgs { rope, kv, norm: w.kv_a_norm, q, n: sq.rows.len(), cache: sq.cache };
            self.mla_kv_at(s, args, sq.pos)?;
        }
        // 5. The absorbed attention, each sequence over its own cache.
        self.mla_absorb(s, w.kv_b, q, lat, n)?;
        for sq in seqs {
            let m = sq.rows.len();
            let (ml, mr) = match sq.pos {
                Pos::Fixed(pos0) => {
                    (sq.cache.latent.view_prefix((pos0 + m) * s.latent), sq.cache.rope.view_prefix((pos0 + m) * s.rope))
                }
                Pos::Dynamic(_) => (sq.cache.latent, sq.cache.rope),
            };
            let (q, lat) = (rows(q, sq, s.q_width()), rows(lat, sq, s.heads * s.latent));
            let attn = MlaAttnArgs { q, lat, latent_mirror: ml, rope_mirror: mr, n: m };
            self.mla_attn_at(s, attn, sq.pos, sq.select)?;
        }
        self.mla_value(s, w.kv_b, lat, heads, n, precision)?;
        // 6. The output projection.
        self.matmul_with(w.o, heads, n, out, MatmulPath::Auto, precision)?;
        if let Some(b) = w.o_bias {
            self.add(out, b, out, n, hidden, Broadcast::Row)?;
        }
        Ok(())
    }

    /// The latents' RMSNorm and the rotated rope keys of `n` rows of `kv` (`kv_a`'s output)
    /// into rows `pos0..` of the mirrors and rows `0..n` of the read-back rows, and RoPE on the
    /// rope part of every head of `q` in place (`mla_kv.comp`).
    pub fn mla_kv(&mut self, s: MlaShape, a: MlaKvArgs<'a>, pos0: usize) -> Result<()> {
        self.mla_kv_at(s, a, Pos::Fixed(pos0))
    }

    fn mla_kv_at(&mut self, s: MlaShape, a: MlaKvArgs<'a>, pos: Pos<'a>) -> Result<()> {
        const OP: &str = "mla_kv";
        let MlaKvArgs { rope, kv, norm, q, n, cache } = a;
        let (pos0, dyn_pos, pos_bind) = pos.parts(OP)?;
        let pos0 = pos0 as usize;
        s.check()?;
        kv.check(OP, "kv", n * s.kv_width())?;
        norm.check(OP, "latent norm", s.latent)?;
        q.check(OP, "q", n * s.q_width())?;
        rope.freq.check(OP, "frequencies", s.rope / 2)?;
        cache.latent.check(OP, "latent mirror", (pos0 + n) * s.latent)?;
        cache.rope.check(OP, "rope mirror", (pos0 + n) * s.rope)?;
        cache.latent_back.check(OP, "latent read-back", n * s.latent)?;
        cache.rope_back.check(OP, "rope read-back", n * s.rope)?;
        let starts = [
            (norm, "latent norm"),
            (rope.freq, "frequencies"),
            (cache.latent, "latent mirror"),
            (cache.rope, "rope mirror"),
            (cache.latent_back, "latent read-back"),
            (cache.rope_back, "rope read-back"),
        ];
        super::at_element_0(OP, &starts)?;
        let by_copy = dyn_pos == 0 && n >= BACK_BY_COPY_ROWS;
        let push = MlaKvPush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            dn: s.nope as u32,
            dr: s.rope as u32,
            c: s.latent as u32,
            eps: s.eps,
            interleaved: (rope.style == RopeStyle::Interleaved) as u32,
            pos0: u32_arg(OP, "pos0", pos0)?,
            mscale: rope.mscale,
            ckv_off: u32_arg(OP, "kv offset", kv.offset)?,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            dyn_pos,
            no_back: by_copy as u32,
        };
        // q as its rows only: the kernel touches no other, so the sequences of a batched call
        // need no barrier between their kernels.
        let binds = [
            Bind::buf(kv.buf),
            Bind::buf(norm.buf),
            Bind::buf(rope.freq.buf),
            Bind::view(q),
            Bind::buf(cache.latent.buf),
            Bind::buf(cache.rope.buf),
            Bind::buf(cache.latent_back.buf),
            Bind::buf(cache.rope_back.buf),
            pos_bind,
        ];
        self.dispatch(Kernel::MlaKv, None, &binds, &push, [u32_arg(OP, "n", n)?, 1, 1])?;
        if by_copy {
            self.mirror_back((cache.latent, cache.latent_back), s.latent, KvType::F32, (pos0, n, None))?;
            self.mirror_back((cache.rope, cache.rope_back), s.rope, KvType::F32, (pos0, n, None))?;
        }
        Ok(())
    }

    /// Each head's no-position query of `q` through `kv_b`'s key rows: `lat` (`n x heads x
    /// latent`) (`mla_absorb.comp`).
    pub fn mla_absorb(
        &mut self,
        s: MlaShape,
        kv_b: &'a DeviceMatrix,
        q: View<'a>,
        lat: View<'a>,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "mla_absorb";
        s.check()?;
        q.check(OP, "q", n * s.q_width())?;
        lat.check(OP, "latent queries", n * s.heads * s.latent)?;
        let push = MlaAbsorbPush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            dn: s.nope as u32,
            dr: s.rope as u32,
            dv: s.v_head_dim as u32,
            c: s.latent as u32,
            qs: u32_arg(OP, "row units", kv_b.qs)?,
            ss: u32_arg(OP, "row scales", kv_b.ss)?,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            out_off: u32_arg(OP, "latent offset", lat.offset)?,
            pad0: 0,
            pad1: 0,
        };
        let binds = [Bind::buf(&kv_b.q), Bind::buf(&kv_b.s), Bind::buf(q.buf), Bind::buf(lat.buf)];
        self.dispatch(
            Kernel::MlaAbsorb,
            Some(kv_b.variant),
            &binds,
            &push,
            [groups_for(n * s.heads * s.latent, 64), 1, 1],
        )
    }

    /// The attention core: for each row and head, the absorbed query in `lat` and the rope
    /// part of `q` against positions `0..=pos0 + row` of the mirrors; the softmax-weighted
    /// latent replaces the query in `lat` (`mla_attn.comp`).
    pub fn mla_attn(&mut self, s: MlaShape, a: MlaAttnArgs<'a>, pos0: usize) -> Result<()> {
        self.mla_attn_at(s, a, Pos::Fixed(pos0), None)
    }

    /// `select`: each row's selected positions (`n x topk`) to attend over rather than every
    /// cached one (`mla_attn_sparse.comp`).
    fn mla_attn_at(
        &mut self,
        s: MlaShape,
        a: MlaAttnArgs<'a>,
        pos: Pos<'a>,
        select: Option<(View<'a>, usize)>,
    ) -> Result<()> {
        let op: &'static str = if select.is_some() { "mla_attn_sparse" } else { "mla_attn" };
        let MlaAttnArgs { q, lat, latent_mirror: ml, rope_mirror: mr, n } = a;
        let (pos0, dyn_pos, pos_bind) = pos.parts(op)?;
        let pos0 = pos0 as usize;
        s.check()?;
        q.check(op, "q", n * s.q_width())?;
        lat.check(op, "latents", n * s.heads * s.latent)?;
        ml.check(op, "latent mirror", (pos0 + n) * s.latent)?;
        mr.check(op, "rope mirror", (pos0 + n) * s.rope)?;
        if ml.offset != 0 || mr.offset != 0 {
            return Err(VkError::BadArgument { op, msg: "mirror views must start at element 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let (kernel, sel_bind, topk, s_off) = match select {
            Some((sel, topk)) => {
                sel.check(op, "selection", n * topk)?;
                if topk == 0 {
                    return Err(VkError::BadArgument { op, msg: "a selection of 0 positions".into() });
                }
                let s_off = u32_arg(op, "selection offset", sel.offset)?;
                (Kernel::MlaAttnSparse, Bind::buf(sel.buf), u32_arg(op, "topk", topk)?, s_off)
            }
            None => (Kernel::MlaAttn, Bind::UNUSED, 0, 0),
        };
        // Heads a workgroup (they share each latent read) while the rows give the dispatch
        // enough workgroups; fewer rows take smaller groups first, then split their positions
        // (a decode row's 64 heads: a head a workgroup, 4 splits). Measured on an H100 (GLM-5's
        // width, a decode row over 2,048 selected positions): groups of 8 heads in 32 splits
        // took 324 us a layer where a workgroup a head without splits took 48 (the joining
        // workgroup summed 32 partials of 8 x 512 floats alone); prompt rows in groups of 8,
        // unsplit, 3.5x faster than a workgroup a head.
        let group = GROUP_MAX.min(s.heads).min(GROUP_FLOATS / s.latent).min((n * s.heads / SPLIT_TARGET).max(1));
        let groups = s.heads.div_ceil(group);
        let most = match select {
            Some((_, topk)) => topk,
            None if dyn_pos != 0 => usize::MAX,
            None => pos0 + n,
        };
        let splits = SPLIT_TARGET.div_ceil(n * groups).min(most.div_ceil(TILE)).clamp(1, MAX_SPLITS);
        let push = MlaAttnPush {
            n: u32_arg(op, "n", n)?,
            heads: s.heads as u32,
            dn: s.nope as u32,
            dr: s.rope as u32,
            c: s.latent as u32,
            pos0: u32_arg(op, "pos0", pos0)?,
            scale: s.scale,
            q_off: u32_arg(op, "q offset", q.offset)?,
            l_off: u32_arg(op, "latent offset", lat.offset)?,
            dyn_pos,
            topk,
            s_off,
            group: group as u32,
            splits: splits as u32,
            pad0: 0,
            pad1: 0,
        };
        let (part_ml, part_o, counters) = if splits > 1 {
            let slots = n * s.heads * splits;
            let (pml, po) = self.partials(slots * 2, slots * s.latent)?;
            (pml, po, self.counters(n * groups)?)
        } else {
            (Bind::UNUSED, Bind::UNUSED, Bind::UNUSED)
        };
        let binds = [
            Bind::buf(lat.buf),
            Bind::buf(q.buf),
            Bind::buf(ml.buf),
            Bind::buf(mr.buf),
            pos_bind,
            sel_bind,
            part_ml,
            part_o,
            counters,
        ];
        let grid = [u32_arg(op, "groups", groups)?, u32_arg(op, "n", n)?, splits as u32];
        self.dispatch(kernel, None, &binds, &push, grid)
    }

    /// `kv_b`'s value rows of each head on its weighted latent in `lat`: `heads` (`n x heads x
    /// v_head_dim`), in `precision` as the CPU's `linear` per head (`mla_value.comp`).
    pub fn mla_value(
        &mut self,
        s: MlaShape,
        kv_b: &'a DeviceMatrix,
        lat: View<'a>,
        heads: View<'a>,
        n: usize,
        precision: Precision,
    ) -> Result<()> {
        const OP: &str = "mla_value";
        s.check()?;
        lat.check(OP, "latents", n * s.heads * s.latent)?;
        heads.check(OP, "heads", n * s.out_heads())?;
        let variant = if precision == Precision::Exact { kv_b.variant.exact() } else { kv_b.variant };
        let (xq, xd) = if variant.q8_acts() {
            let q = self.quantize_acts(lat, n * s.heads, s.latent)?;
            (q.xq, q.xd)
        } else {
            (Bind::UNUSED, Bind::UNUSED)
        };
        let push = MlaValuePush {
            n: u32_arg(OP, "n", n)?,
            heads: s.heads as u32,
            dn: s.nope as u32,
            dv: s.v_head_dim as u32,
            c: s.latent as u32,
            qs: u32_arg(OP, "row units", kv_b.qs)?,
            ss: u32_arg(OP, "row scales", kv_b.ss)?,
            x_off: u32_arg(OP, "latent offset", lat.offset)?,
            out_off: u32_arg(OP, "heads offset", heads.offset)?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let binds = [Bind::buf(&kv_b.q), Bind::buf(&kv_b.s), Bind::buf(lat.buf), xq, xd, Bind::buf(heads.buf)];
        let per = (64 / self.ctx.caps().min_subgroup_size.max(1) as usize).max(1);
        let groups = groups_for(s.out_heads(), per).min(65535);
        self.dispatch(Kernel::MlaValue, Some(variant), &binds, &push, [groups, u32_arg(OP, "n", n)?, 1])
    }
}

impl<'a> View<'a> {
    /// The first `len` elements of this view (at most its length).
    fn view_prefix(self, len: usize) -> View<'a> {
        View { len: len.min(self.len), ..self }
    }
}
