//! DeepSeek V4's attention over a layer's cached rows and its KV compressor's entries on the
//! device (`attn_compressed.comp`; reference `cpu::compress::attend`): each query row sees the
//! cached rows of its sliding window and the entries of the windows closed at or before it
//! (`e < (p + 1) / rate`), or only those its selection names, with the heads' sinks in the
//! denominator. Scores and sums are the CPU's up to the order of float operations.
//!
//! Must not: keep state, or decide what the mirrors hold (the caller appends the block's rows
//! before and keeps the entries the host closed).

use super::attention::Pos;
use super::u32_arg;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::AttnCompressedPush;
use crate::vk::shaders::Kernel;
use crate::vk::View;

/// The widest head the kernel takes (`MAX_D` in `attn_compressed.comp`).
pub const MAX_HEAD_DIM: usize = 512;

/// The geometry of one compressed attention: one KV head, values as wide as keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompressedShape {
    pub heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// Positions a compressed entry closes.
    pub rate: usize,
    /// The cached rows' mirror as a ring of this many rows (position `p` in row `p % ring`):
    /// a sliding window's, which holds the window and a block; `None`: row `p` holds `p`.
    pub ring: Option<usize>,
}

impl CompressedShape {
    /// The shape of an attention with compressed entries, or `None` for one without.
    pub fn of(spec: &coli_compiler::ir::AttentionSpec) -> Option<CompressedShape> {
        let c = spec.compressed.as_ref()?;
        Some(CompressedShape {
            heads: spec.heads,
            head_dim: spec.head_dim,
            scale: spec.scale,
            window: spec.window,
            rate: c.rate,
            ring: None,
        })
    }

    /// Whether the kernel takes the spec (one KV head, values as wide as keys, a head of at
    /// most `MAX_HEAD_DIM`, no relative logits or value scale).
    pub fn supported(spec: &coli_compiler::ir::AttentionSpec) -> bool {
        spec.compressed.is_some_and(|c| c.rate > 0)
            && spec.kv_heads == 1
            && spec.heads > 0
            && spec.head_dim > 0
            && spec.head_dim <= MAX_HEAD_DIM
            && spec.v_head_dim == spec.head_dim
            && spec.rel.is_none()
            && spec.value_scale == 1.0
    }
}

/// What one call reads and writes for `n` rows: the queries `q` (`n x heads x head_dim`), the
/// layer's key and value mirrors (from element 0, every position the rows see, the block's
/// appended), its compressed entries (from element 0, at least the entries the last row sees:
/// `entries` of them where the position is read on the device), the heads' sinks, a selection
/// (`n x topk`, entries ascending, `-1` padded) and the output (`n x heads x head_dim`).
#[derive(Clone, Copy)]
pub struct CompressedArgs<'a> {
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    pub entries: View<'a>,
    pub sinks: Option<View<'a>>,
    pub select: Option<(View<'a>, usize)>,
    pub out: View<'a>,
    pub n: usize,
}

impl<'a> Frame<'a> {
    /// Attention of `n` rows at `pos` over the cached rows and the compressed entries.
    pub fn attention_compressed(&mut self, s: CompressedShape, a: CompressedArgs<'a>, pos: Pos<'a>) -> Result<()> {
        const OP: &str = "attention_compressed";
        let CompressedArgs { q, k, v, entries, sinks, select, out, n } = a;
        let (pos0, dyn_, params) = pos.parts(OP)?;
        if s.heads == 0 || s.head_dim == 0 || s.head_dim > MAX_HEAD_DIM || s.rate == 0 || s.window == Some(0) {
            return Err(VkError::BadArgument { op: OP, msg: format!("{s:?}") });
        }
        let d = s.head_dim;
        q.check(OP, "q", n * s.heads * d)?;
        out.check(OP, "out", n * s.heads * d)?;
        // A fixed position: the rows and entries the last row sees; one read on the device: the
        // block's own rows at least (the mirrors are the session's, whole).
        let last = pos0 as usize + n;
        let rows = match s.ring {
            // A ring holds every row a query sees: its window and the block's rows before it.
            Some(r) => super::check_ring(OP, r, s.window, n)?,
            None if dyn_ != 0 => n,
            None => last,
        };
        k.check(OP, "k", rows * d)?;
        v.check(OP, "v", rows * d)?;
        if dyn_ == 0 {
            entries.check(OP, "entries", (last / s.rate) * d)?;
        }
        if let Some(sk) = sinks {
            sk.check(OP, "sinks", s.heads)?;
        }
        if let Some((sel, topk)) = select {
            if topk == 0 {
                return Err(VkError::BadArgument { op: OP, msg: "a selection of no entries".into() });
            }
            sel.check(OP, "select", n * topk)?;
        }
        let starts = [k.offset, v.offset, entries.offset, sinks.map_or(0, |x| x.offset)];
        if starts.iter().any(|&o| o != 0) {
            return Err(VkError::BadArgument { op: OP, msg: "mirror, entry and sink views must start at 0".into() });
        }
        if n == 0 {
            return Ok(());
        }
        let push = AttnCompressedPush {
            n: u32_arg(OP, "n", n)?,
            heads: u32_arg(OP, "heads", s.heads)?,
            dim: d as u32,
            pos0,
            window: u32_arg(OP, "window", s.window.unwrap_or(0))?,
            rate: u32_arg(OP, "rate", s.rate)?,
            scale: s.scale,
            q_off: u32_arg(OP, "q offset", q.offset)?,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            r#dyn: dyn_,
            topk: u32_arg(OP, "topk", select.map_or(0, |(_, t)| t))?,
            s_off: u32_arg(OP, "select offset", select.map_or(0, |(v, _)| v.offset))?,
            has_sinks: sinks.is_some() as u32,
            ring: u32_arg(OP, "ring", s.ring.unwrap_or(0))?,
            pad1: 0,
            pad2: 0,
        };
        let opt = |x: Option<View<'a>>| x.map_or(Bind::UNUSED, |v| Bind::buf(v.buf));
        let binds = [
            Bind::buf(q.buf),
            Bind::buf(k.buf),
            Bind::buf(v.buf),
            Bind::buf(entries.buf),
            opt(sinks),
            opt(select.map(|(v, _)| v)),
            Bind::buf(out.buf),
            params,
        ];
        self.dispatch(Kernel::AttnCompressed, None, &binds, &push, [push.heads, push.n, 1])
    }
}
