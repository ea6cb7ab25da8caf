//! A batched decode step's attention: one row of each of several sequences, each over its own
//! K/V mirror at its own position, in one dispatch (`attn_seqs.comp`) where the device reaches
//! buffers by address: workgroup row y is sequence y, whose mirror, read-back rows and position
//! the kernel finds in a table of addresses. Without addresses (or for views the table cannot
//! describe) each sequence takes a kernel of its own (`Frame::attention_decode_each`). Both
//! compute what `attention_decode` computes for each row, bit for bit.
//!
//! Must not: take a q/k norm or 8-bit output (the batched step applies the norms on all rows
//! before; the product after reads f32 rows).

use super::attention::{decode_checks, decode_words, AttnShape, DecodeArgs, KvMirror, Pos, MAX_SPLITS};
use super::u32_arg;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::AttnPush;
use crate::vk::shaders::Kernel;
use std::sync::Arc;

/// Sequences one dispatch takes (a bigger step takes several, one after another).
pub const MAX_SEQS: usize = 64;
/// `attn_split.glsl`'s table: words before the sequences' entries, and words an entry.
const SEQ_BASE: usize = 16;
const SEQ_WORDS: usize = 16;

const OP: &str = "attention_decode_rows";

impl<'a> Frame<'a> {
    /// `attention_decode` for one row of each of several sequences (a batched decode step),
    /// each over its own mirror at its own position, without a q/k norm or 8-bit output: one
    /// kernel for up to `MAX_SEQS` of them where `seq_table` can describe them, else one a
    /// sequence.
    pub fn attention_decode_rows(&mut self, s: AttnShape, seqs: &[DecodeArgs<'a>]) -> Result<()> {
        if seqs.iter().any(|a| a.norm.is_some() || a.q8) {
            return Err(VkError::BadArgument { op: OP, msg: "a q/k norm or 8-bit output per sequence".into() });
        }
        if seqs.len() < 2 || !self.ctx.caps().buffer_device_address {
            return self.attention_decode_each(s, seqs);
        }
        for a in seqs {
            decode_checks(OP, s, a)?;
        }
        let tables = seqs.chunks(MAX_SEQS).map(|c| seq_table(s, c)).collect::<Result<Option<Vec<_>>>>()?;
        let Some(tables) = tables else { return self.attention_decode_each(s, seqs) };
        for (chunk, table) in seqs.chunks(MAX_SEQS).zip(tables) {
            self.decode_seqs(s, chunk, &table)?;
        }
        Ok(())
    }

    /// One `attn_seqs.comp` dispatch over `seqs` (at most `MAX_SEQS`) with their `table`.
    fn decode_seqs(&mut self, s: AttnShape, seqs: &[DecodeArgs<'a>], table: &[u32]) -> Result<()> {
        let a = seqs[0];
        let cst = self.constants(table)?;
        let n = seqs.len();
        let slots = n * s.heads * MAX_SPLITS;
        let (ml, o) = self.partials(slots * 2, slots * s.v_head_dim)?;
        let counters = self.counters(n * s.heads)?;
        let sinks = a.sinks.map_or(Bind::UNUSED, |v| Bind::buf(v.buf));
        let freq = a.rope.map_or(Bind::UNUSED, |r| Bind::buf(r.freq.buf));
        let mut binds = [Bind::UNUSED; 22];
        binds[0] = Bind::buf(a.q.buf);
        binds[3] = sinks;
        binds[4] = ml;
        binds[5] = o;
        binds[6] = Bind::buf(a.out.buf);
        binds[8] = counters;
        binds[9] = Bind::buf(a.k.buf);
        binds[10] = Bind::buf(a.v.buf);
        binds[11] = freq;
        binds[14] = cst;
        // What the kernel reaches by address: each sequence's mirror and read-back rows
        // (written), and its position where it is read on the device.
        let mut reached = Vec::with_capacity(5 * n);
        for q in seqs {
            let KvMirror { k, v, k_back, v_back } = q.mirror;
            reached.extend([k, v, k_back, v_back].map(|m| (Bind::buf(m.buf), true)));
            if let Pos::Dynamic(p) = q.pos {
                reached.push((Bind::buf(p.buf), false));
            }
        }
        let push = AttnPush {
            n: u32_arg(OP, "sequences", n)?,
            heads: s.heads as u32,
            kv_heads: s.kv_heads as u32,
            head_dim: s.head_dim as u32,
            v_head_dim: s.v_head_dim as u32,
            pos0: 0,
            window: u32_arg(OP, "window", s.window.unwrap_or(0))?,
            flags: a.sinks.is_some() as u32 | 1 << 1,
            scale: s.scale,
            q_off: 0,
            k_off: 0,
            v_off: 0,
            o_off: 0,
            splits: MAX_SPLITS as u32,
            chunk: 0,
            value_scale: s.value_scale,
            ring: u32_arg(OP, "ring", s.ring.unwrap_or(0))?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let groups = [s.heads as u32, n as u32, MAX_SPLITS as u32];
        self.dispatch_reaching(s.kv.kernel(Kernel::AttnSeqs), None, &binds, &reached, &push, groups)
    }
}

/// The table of `attn_seqs.comp` for `seqs`: the rope's words, then per sequence its q, output,
/// k and v element offsets, its position (fixed, or read at an address), and the addresses of
/// its mirror's keys and values and of its read-back rows. `None` where one dispatch cannot
/// take them: rows in different buffers, another rotation or sinks, a buffer without an
/// address, a mirror's keys not 16-byte aligned (the kernel's vector loads).
fn seq_table(s: AttnShape, seqs: &[DecodeArgs]) -> Result<Option<Vec<u32>>> {
    let a = &seqs[0];
    let same = |x: &crate::vk::View, y: &crate::vk::View| Arc::ptr_eq(&x.buf.inner, &y.buf.inner);
    let alike = seqs.iter().all(|b| {
        same(&a.q, &b.q)
            && same(&a.k, &b.k)
            && same(&a.v, &b.v)
            && same(&a.out, &b.out)
            && a.rope.map(|r| (r.freq.buf.binding(), r.style, r.mscale.to_bits()))
                == b.rope.map(|r| (r.freq.buf.binding(), r.style, r.mscale.to_bits()))
            && a.sinks.map(|v| v.buf.binding()) == b.sinks.map(|v| v.buf.binding())
    });
    if !alike {
        return Ok(None);
    }
    let mut table = vec![0u32; SEQ_BASE + SEQ_WORDS * seqs.len()];
    table[..3].copy_from_slice(&decode_words(OP, a)?[..3]);
    let (kw, vw) = (s.kv_heads * s.head_dim, s.kv_heads * s.v_head_dim);
    for (i, q) in seqs.iter().enumerate() {
        q.q.check(OP, "q", s.heads * s.head_dim)?;
        q.out.check(OP, "out", s.heads * s.v_head_dim)?;
        let KvMirror { k, v, k_back, v_back } = q.mirror;
        if k.offset != 0 || v.offset != 0 {
            return Err(VkError::BadArgument { op: OP, msg: "mirror views must start at element 0".into() });
        }
        let (fixed, dynamic) = match q.pos {
            Pos::Fixed(p) => {
                // The rows the position sees (a ring's: all of it).
                let rows = s.ring.unwrap_or(p + 1);
                k.check(OP, "keys", s.kv.words(rows * kw))?;
                v.check(OP, "values", s.kv.words(rows * vw))?;
                (u32_arg(OP, "position", p)?, None)
            }
            Pos::Dynamic(view) => {
                q.pos.parts(OP)?;
                (0, Some(view))
            }
        };
        let addr = |view: &crate::vk::View| view.buf.address();
        let (Some(ka), Some(va), Some(ska), Some(sva)) = (addr(&k), addr(&v), addr(&k_back), addr(&v_back)) else {
            return Ok(None);
        };
        let pa = match dynamic {
            Some(view) => match addr(&view) {
                Some(x) => x,
                None => return Ok(None),
            },
            None => 0,
        };
        if ka % 16 != 0 {
            return Ok(None);
        }
        let e = &mut table[SEQ_BASE + SEQ_WORDS * i..SEQ_BASE + SEQ_WORDS * (i + 1)];
        e[0] = u32_arg(OP, "q offset", q.q.offset)?;
        e[1] = u32_arg(OP, "out offset", q.out.offset)?;
        e[2] = u32_arg(OP, "k offset", q.k.offset)?;
        e[3] = u32_arg(OP, "v offset", q.v.offset)?;
        e[4] = fixed;
        e[5] = dynamic.is_some() as u32;
        for (j, x) in [ka, va, ska, sva, pa].into_iter().enumerate() {
            e[6 + 2 * j] = x as u32;
            e[7 + 2 * j] = (x >> 32) as u32;
        }
    }
    Ok(Some(table))
}
