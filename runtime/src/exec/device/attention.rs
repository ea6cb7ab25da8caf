//! The attention call of a device frame: its q/k norms, RoPE and the KV append, attention over
//! the layer's mirror (a KV split's device part, the one-row kernel of a decode step; Inkling's
//! relative logits, though not over a split; DeepSeek V4's compressed entries: `device::compressed`),
//! and, in a step of several
//! sequences, the append and attention of each sequence over its own mirror at its own
//! positions (the rows' products before and after run on all rows at once).

use super::{DeviceModel, Rec};
use crate::cpu::Precision;
use crate::vk::ops::attn_part::PartArgs;
use crate::vk::{
    AttnArgs, AttnPath, AttnShape, DecodeArgs, Frame as VkFrame, KvMirror, KvShape, NormArgs, Pos, QkNorm,
    QuantizedActs, RelArgs, RopeArgs, RopeKvArgs, View, VkError,
};
use coli_compiler::ir::{AttentionSpec, ValueId};
use coli_compiler::schedule::{AttentionCall, Kernel, MatSrc, Norm};

/// The attention sinks of a layer that has them.
fn sinks_of<'a>(d: &'a DeviceModel, spec: &AttentionSpec) -> Option<View<'a>> {
    spec.sinks.as_ref().map(|s| d.vecs[&s.name].all())
}

impl DeviceModel {
    /// Records an attention call: its q/k norms (as a pair, unless a one-row kernel applies
    /// them), RoPE and the KV append, and attention over the mirror (a split layer's part, or
    /// one kernel for one row). Returns the 8-bit blocks of its output when the product right
    /// after (`next`) takes them from the one-row kernel.
    pub(super) fn record_attention<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        a: &AttentionCall,
        next: Option<&Kernel>,
    ) -> Result<Option<QuantizedActs>, VkError> {
        let Rec { st, widths, n, pos, precision, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let view = |v: ValueId| st.values[v.0 as usize].view(0, n * w(v));
        let (q, k, v, out, spec) = (a.q, a.k, a.v, a.out, &a.spec);
        let l = a.layer.0 as usize;
        let split = self.kv_split.as_ref().filter(|s| s.splits(a.layer)).zip(st.split.as_ref());
        // The absorbed q and k norms: the one-row kernel's, else recorded here.
        let mut qk_norm = None;
        let (mut qsrc, mut ksrc) = (q, k);
        if let Some((qn, kn)) = &a.norms {
            if n == 1 && a.one_kernel && split.is_none() && spec.compressed.is_none() {
                qk_norm = Some(QkNorm {
                    q_weight: self.vecs[&qn.weight.name].all(),
                    k_weight: self.vecs[&kn.weight.name].all(),
                    q_group: qn.group,
                    k_group: kn.group,
                    eps: qn.eps,
                    offset: qn.offset,
                });
                (qsrc, ksrc) = (qn.x, kn.x);
            } else {
                let args = |m: &Norm| NormArgs {
                    x: view(m.x),
                    weight: self.vecs[&m.weight.name].all(),
                    out: view(m.out),
                    width: w(m.x),
                };
                f.rms_norm_pair(args(qn), args(kn), n, qn.eps, qn.offset)?;
            }
        }
        let (mk, mv, sk, sv) = rec.seqs[0].st.mirrors[l].as_ref().expect("mirror allocated");
        let args = a.rope.map(|r| {
            let (fb, mscale) = self.freq(r.rotary_dim, r.theta, r.scaling);
            RopeArgs { freq: fb.all(), style: r.style, mscale }
        });
        // A sliding window's mirror as a ring (every sequence's the same size).
        let ring = rec.seqs[0].st.rings[l].map(|r| r.rows);
        let kv = self.kv_types[l];
        let shape = AttnShape { ring, kv, ..AttnShape::of(spec) };
        // Inkling's relative logits: the block's states and the layer's `[d_rel, extent]` bank.
        let rel = spec.rel.as_ref().map(|r| RelArgs {
            r: view(r.r),
            proj: self.vecs[&r.proj.name].all(),
            d_rel: r.d_rel,
            extent: r.extent,
        });
        if (rel.is_some() || spec.compressed.is_some()) && split.is_some() {
            let msg = "relative logits or compressed entries over a KV split (placement never makes one)";
            return Err(VkError::BadArgument { op: "attention", msg: msg.into() });
        }
        // Over a KV compressor's entries (DeepSeek V4), each sequence over its own.
        if spec.compressed.is_some() {
            return self.record_compressed(f, rec, a, args, sinks_of(self, spec)).map(|()| None);
        }
        if rec.seqs.len() > 1 {
            return self.record_attention_per_sequence(f, rec, a, args, sinks_of(self, spec));
        }
        let kv_shape = KvShape {
            n,
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
            v_head_dim: spec.v_head_dim,
            kv,
        };
        let sinks = sinks_of(self, spec);
        let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
        let rope_kv = RopeKvArgs { rope: args, q: view(q), k: view(k), v: view(v), shape: kv_shape, mirror, pos };
        // A split layer: the append into its ring, the device's part, and the part into its
        // read-back buffers (the host finishes after the frame).
        if let Some((sp, ss)) = split {
            f.rope_kv_ring(rope_kv, sp.plan.ring)?;
            let cs = crate::cpu::attention::AttnShape::of(spec);
            let (aw, mw) = (n * spec.heads * spec.v_head_dim, n * spec.heads * 2);
            let (acc, ml) = (ss.acc.view(0, aw), ss.ml.view(0, mw));
            f.attn_part(cs, sp.shape(), PartArgs { q: view(q), k: mk.all(), v: mv.all(), acc, ml, n, pos, kv })?;
            f.copy(ss.acc.view(0, aw), ss.acc_back.view(0, aw))?;
            f.copy(ss.ml.view(0, mw), ss.ml_back.view(0, mw))?;
            return Ok(None);
        }
        // The rows a block at `pos` sees (a ring's: all of it).
        let seen = |rows: usize| match (ring, pos) {
            (None, Pos::Fixed(p0)) => {
                (mk.view(0, kv.words((p0 + rows) * w(k))), mv.view(0, kv.words((p0 + rows) * w(v))))
            }
            _ => (mk.all(), mv.all()),
        };
        if n == 1 && a.one_kernel {
            let (keys, values) = seen(1);
            // The product right after that reads the output in 8-bit blocks takes them from
            // the attention kernel (one quantization dispatch fewer).
            let q8 = precision == Precision::Fast
                && spec.v_head_dim % 32 == 0
                && matches!(next, Some(Kernel::Matmul(m))
                    if m.src == MatSrc::Plain && m.x == out && self.mats[&m.weight.name].variant.q8_acts());
            let decode = DecodeArgs {
                rope: args,
                q: view(qsrc),
                k: view(ksrc),
                v: view(v),
                mirror: KvMirror { k: keys, v: values, ..mirror },
                sinks,
                out: view(out),
                pos,
                norm: qk_norm,
                q8,
            };
            return f.attention_decode_rel(shape, decode, rel);
        }
        match ring {
            Some(r) => f.rope_kv_ring(rope_kv, r)?,
            None => f.rope_kv(rope_kv)?,
        }
        let (keys, values) = seen(n);
        f.attention_rel_at(
            shape,
            AttnArgs { q: view(q), k: keys, v: values, sinks, out: view(out), n },
            rel,
            pos,
            AttnPath::Auto,
        )?;
        Ok(None)
    }

    /// The append and attention of each sequence of a batched step over its own mirror, at its
    /// own positions (its q/k norms already applied on all rows).
    fn record_attention_per_sequence<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        a: &AttentionCall,
        rope: Option<RopeArgs<'a>>,
        sinks: Option<View<'a>>,
    ) -> Result<Option<QuantizedActs>, VkError> {
        let Rec { st, widths, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let spec = &a.spec;
        let (q, k, v, out) = (a.q, a.k, a.v, a.out);
        let l = a.layer.0 as usize;
        let kv = self.kv_types[l];
        // The one-row sequences in one call (one kernel for all where the device reaches
        // buffers by address, `vk::ops::attn_seqs`; their mirrors' rings alike), the others one
        // by one; with relative logits (Inkling) each one by one, over its rows'
        // states.
        let (mut decodes, mut ring0) = (Vec::new(), None);
        for s in rec.seqs {
            // A sliding window's mirror as a ring (its size follows the sequence's context).
            let ring = s.st.rings[l].map(|r| r.rows);
            let shape = AttnShape { ring, kv, ..AttnShape::of(spec) };
            let (r0, n) = (s.rows.start, s.rows.len());
            let rows = |v: ValueId| st.values[v.0 as usize].view(r0 * w(v), n * w(v));
            let rel = spec.rel.as_ref().map(|r| RelArgs {
                r: rows(r.r),
                proj: self.vecs[&r.proj.name].all(),
                d_rel: r.d_rel,
                extent: r.extent,
            });
            let (mk, mv, sk, sv) = s.st.mirrors[l].as_ref().expect("mirror allocated");
            // The rows the block sees (a ring's, or a position read on the device: all of it).
            let pos = s.pos;
            let (keys, values) = match (ring, pos) {
                (None, Pos::Fixed(p0)) => {
                    (mk.view(0, kv.words((p0 + n) * w(k))), mv.view(0, kv.words((p0 + n) * w(v))))
                }
                _ => (mk.all(), mv.all()),
            };
            if n == 1 && a.one_kernel {
                let decode = DecodeArgs {
                    rope,
                    q: rows(q),
                    k: rows(k),
                    v: rows(v),
                    mirror: KvMirror { k: keys, v: values, k_back: sk.all(), v_back: sv.all() },
                    sinks,
                    out: rows(out),
                    pos,
                    norm: None,
                    q8: false,
                };
                match rel {
                    None if decodes.is_empty() || ring0 == Some(ring) => {
                        ring0 = Some(ring);
                        decodes.push(decode);
                    }
                    _ => drop(f.attention_decode_rel(shape, decode, rel)?),
                }
                continue;
            }
            let kv_shape = KvShape {
                n,
                heads: spec.heads,
                kv_heads: spec.kv_heads,
                head_dim: spec.head_dim,
                v_head_dim: spec.v_head_dim,
                kv,
            };
            let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
            let append = RopeKvArgs { rope, q: rows(q), k: rows(k), v: rows(v), shape: kv_shape, mirror, pos };
            match ring {
                Some(r) => f.rope_kv_ring(append, r)?,
                None => f.rope_kv(append)?,
            }
            let args = AttnArgs { q: rows(q), k: keys, v: values, sinks, out: rows(out), n };
            f.attention_rel_at(shape, args, rel, pos, AttnPath::Auto)?;
        }
        let shape = AttnShape { ring: ring0.flatten(), kv, ..AttnShape::of(spec) };
        f.attention_decode_rows(shape, &decodes)?;
        Ok(None)
    }
}
