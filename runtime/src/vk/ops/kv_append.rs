//! The KV append of an attention call: `rope_kv` rotates the block's q and k rows and writes
//! its k and v rows into the layer's mirror (row `p` for position `p`, or `p % ring` in a ring:
//! a KV split's device share, a sliding window's mirror) and into the host's read-back rows, in
//! one dispatch (`rope_kv.comp`); a block of many rows at a fixed position gets its read-back
//! rows by copy commands from the mirror instead (`mirror_back`). References:
//! `cpu::rope::apply_row` and the CPU's cache append.
//!
//! Must not: attend, or decide what a ring holds (the executor keeps every row a query sees in
//! it).

use super::attention::{KvMirror, KvType, RopeKvArgs};
use super::u32_arg;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::RopeKvPush;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::RopeStyle;

/// A block of at least this many rows at a fixed position gets its read-back rows by copy
/// commands from the mirror (`Frame::mirror_back`) instead of the kernel's own writes to host
/// memory: on a discrete GPU those are 4-byte writes over the bus (a 512-row prompt chunk of the
/// Llama geometry spent 1.09 ms a layer in `rope_kv` so). Fewer rows (decode) keep the writes.
pub(crate) const BACK_BY_COPY_ROWS: usize = 8;

impl<'a> Frame<'a> {
    /// Rows `pos..pos + n` of a mirror (`width` elements of `kv` a row; in a ring of `ring`
    /// rows position `p` is row `p % ring`) copied into rows `0..n` of `back`: one or two copy
    /// commands. `n` must not exceed the ring.
    pub(crate) fn mirror_back(
        &mut self,
        (mirror, back): (View<'a>, View<'a>),
        width: usize,
        kv: KvType,
        (pos, n, ring): (usize, usize, Option<usize>),
    ) -> Result<()> {
        let (start, first) = match ring {
            Some(r) if n > r => {
                return Err(VkError::BadArgument { op: "mirror_back", msg: format!("{n} rows over a ring of {r}") })
            }
            Some(r) => (pos % r, n.min(r - pos % r)),
            None => (pos, n),
        };
        let bytes = |rows: usize| rows * width * kv.bytes();
        let (src, dst) = (mirror.offset * 4 + bytes(start), back.offset * 4);
        if first > 0 && width > 0 {
            self.copy_bytes(mirror.buf, src, back.buf, dst, bytes(first))?;
        }
        if n > first && width > 0 {
            self.copy_bytes(mirror.buf, mirror.offset * 4, back.buf, dst + bytes(first), bytes(n - first))?;
        }
        Ok(())
    }
}

impl<'a> Frame<'a> {
    /// RoPE of the block's `q` and `k` rows in place (as `rope`; `rope: None` rotates
    /// nothing), then its `k` and `v` rows appended: written to rows `pos..pos + n` of the
    /// mirror's keys and values (`len x kv_heads * head_dim`, `len x kv_heads * v_head_dim`,
    /// from element 0) and to rows `0..n` of its read-back rows, both of `shape.kv`. One dispatch
    /// (`rope_kv.comp`); references `cpu::rope::apply_row` and the CPU's cache append.
    pub fn rope_kv(&mut self, a: RopeKvArgs<'a>) -> Result<()> {
        self.append_kv("rope_kv", a, None)
    }

    /// `rope_kv` into a ring of `ring` rows: position `p` goes to row `p % ring` of the
    /// mirror's keys and values (`ring` rows, from element 0).
    pub fn rope_kv_ring(&mut self, a: RopeKvArgs<'a>, ring: usize) -> Result<()> {
        self.append_kv("rope_kv_ring", a, Some(ring))
    }

    fn append_kv(&mut self, op: &'static str, a: RopeKvArgs<'a>, ring: Option<usize>) -> Result<()> {
        let RopeKvArgs { rope, q, k, v, shape: s, mirror, pos } = a;
        let KvMirror { k: mk, v: mv, k_back: sk, v_back: sv } = mirror;
        let (pos0, dyn_, params) = pos.parts(op)?;
        let half = rope.map_or(0, |r| r.freq.len);
        if s.kv_heads == 0 || 2 * half > s.head_dim || ring == Some(0) {
            return Err(VkError::BadArgument {
                op,
                msg: format!(
                    "rotary dim {} over head_dim {} ({} kv heads), a ring of {ring:?}",
                    2 * half,
                    s.head_dim,
                    s.kv_heads
                ),
            });
        }
        let (kw, vw) = (s.kv_heads * s.head_dim, s.kv_heads * s.v_head_dim);
        s.kv.check_widths(op, &[kw, vw])?;
        q.check(op, "q", s.n * s.heads * s.head_dim)?;
        k.check(op, "k", s.n * kw)?;
        v.check(op, "v", s.n * vw)?;
        sk.check(op, "k read-back", s.kv.words(s.n * kw))?;
        sv.check(op, "v read-back", s.kv.words(s.n * vw))?;
        let rows = match ring {
            Some(r) => r,
            None if dyn_ != 0 => s.n,
            None => pos0 as usize + s.n,
        };
        mk.check(op, "k mirror", s.kv.words(rows * kw))?;
        mv.check(op, "v mirror", s.kv.words(rows * vw))?;
        super::at_element_0(op, &[(mk, "k mirror"), (mv, "v mirror"), (sk, "k read-back"), (sv, "v read-back")])?;
        if let Some(r) = rope {
            r.freq.check(op, "frequencies", half)?;
            if r.freq.offset != 0 {
                return Err(VkError::BadArgument { op, msg: "frequency views must start at element 0".into() });
            }
        }
        let per_row = s.heads * half + s.kv_heads * half + s.kv_heads * (s.head_dim - 2 * half) + vw;
        let by_copy = dyn_ == 0 && s.n >= BACK_BY_COPY_ROWS && ring.is_none_or(|r| s.n <= r);
        let push = RopeKvPush {
            n: u32_arg(op, "n", s.n)?,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.head_dim as u32,
            v_head_dim: s.v_head_dim as u32,
            half_: half as u32,
            interleaved: rope.is_some_and(|r| r.style == RopeStyle::Interleaved) as u32,
            pos0,
            mscale: rope.map_or(1.0f32, |r| r.mscale),
            q_off: u32_arg(op, "q offset", q.offset)?,
            k_off: u32_arg(op, "k offset", k.offset)?,
            v_off: u32_arg(op, "v offset", v.offset)?,
            r#dyn: dyn_,
            has_q: 1,
            ring: u32_arg(op, "ring", ring.unwrap_or(0))?,
            no_back: by_copy as u32,
        };
        let binds = [
            Bind::buf(q.buf),
            Bind::buf(k.buf),
            Bind::buf(v.buf),
            rope.map_or(Bind::UNUSED, |r| Bind::buf(r.freq.buf)),
            Bind::buf(mk.buf),
            Bind::buf(mv.buf),
            Bind::buf(sk.buf),
            Bind::buf(sv.buf),
            params,
        ];
        let count = u32_arg(op, "items", s.n * per_row)?;
        self.dispatch(s.kv.kernel(Kernel::RopeKv), None, &binds, &push, [count.div_ceil(64), 1, 1])?;
        if by_copy {
            self.mirror_back((mk, sk), kw, s.kv, (pos0 as usize, s.n, ring))?;
            self.mirror_back((mv, sv), vw, s.kv, (pos0 as usize, s.n, ring))?;
        }
        Ok(())
    }
}
