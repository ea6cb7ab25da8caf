//! Lowering of `Attention`: head counts and widths checked against q, k, v and the output,
//! the optional window, sinks, value scale, relative-position logits (Inkling) and attention
//! over a KV compressor's entries (DeepSeek V4).
//!
//! This module must not know a family: it checks what the spec says against the checkpoint.

use super::program::Lowerer;
use crate::diag::Span;
use crate::ir::*;
use crate::limits;
use crate::spec::OpItem;

impl Lowerer<'_> {
    /// `op` is an `OpItem::Attention`.
    pub(super) fn attention(&mut self, op: &OpItem, span: Span) -> Option<Op> {
        let OpItem::Attention {
            q,
            k,
            v,
            out,
            heads,
            kv_heads,
            head_dim,
            v_head_dim,
            scale,
            window,
            sinks,
            value_scale,
            rel,
            rel_proj,
            compress_rate,
            compress_select,
        } = op
        else {
            return None;
        };

        let (qv, kv, vv, ov) = (self.val(q), self.val(k), self.val(v), self.val(out));
        let (h, kvh, hd, sc) = (
            self.sized(heads, limits::HEADS),
            self.sized(kv_heads, limits::HEADS),
            self.sized(head_dim, limits::HEAD_DIM),
            self.scale(scale),
        );
        let (qv, kv, vv, ov, heads, kv_heads, head_dim, scale) = (qv?, kv?, vv?, ov?, h?, kvh?, hd?, sc?);
        let v_head_dim = match v_head_dim {
            Some(t) => self.sized(t, limits::HEAD_DIM)?,
            None => head_dim,
        };
        // A window of 0 means none (configurations say `sliding_window: null`).
        let window = match window {
            Some(w) => Some(self.sized(w, limits::CONTEXT)?).filter(|&w| w > 0),
            None => None,
        };
        let sinks = match sinks {
            Some(s) => Some(self.weight(s)?),
            None => None,
        };
        let value_scale = self.scale_or(value_scale, 1.0)?;
        if kv_heads == 0 || heads % kv_heads != 0 {
            self.err(span, format!("{heads} query heads cannot share {kv_heads} KV heads evenly"));
        }
        self.expect_width(q, qv, heads * head_dim, "attention's heads x head_dim");
        self.expect_width(k, kv, kv_heads * head_dim, "attention's kv_heads x head_dim");
        self.expect_width(v, vv, kv_heads * v_head_dim, "attention's kv_heads x v_head_dim");
        self.expect_width(out, ov, heads * v_head_dim, "attention's heads x v_head_dim");
        if let Some(s) = &sinks {
            if s.shape != [heads] {
                self.err(span, format!("the sinks have shape {:?}, attention needs [{heads}]", s.shape));
            }
        }
        let rel = match (rel, rel_proj) {
            (None, None) => None,
            (Some(r), Some(p)) => {
                let (rv, proj) = (self.val(r)?, self.weight(p)?);
                let [d_rel, extent] = proj.shape[..] else {
                    self.err(
                        p.span,
                        format!("the relative logits' weight has shape {:?}, not [d_rel, extent]", proj.shape),
                    );
                    return None;
                };
                self.expect_width(r, rv, heads * d_rel, "attention's heads x d_rel");
                Some(RelLogits { r: rv, proj, d_rel, extent })
            }
            _ => {
                self.err(span, "relative logits need both `rel` (the states) and `rel_proj` (the weight)");
                return None;
            }
        };
        let compressed = match (compress_rate, compress_select) {
            (None, None) => None,
            (Some(r), sel) => {
                let rate = self.sized(r, limits::CONTEXT)?;
                let select = match sel {
                    Some(s) => Some(self.val(s)?),
                    None => None,
                };
                // Each entry is one head, both key and value.
                if kv_heads != 1 || v_head_dim != head_dim || rel.is_some() || value_scale != 1.0 {
                    self.err(span, "compressed entries need one KV head with values as wide as keys, and no relative logits or value scale");
                }
                Some(CompressedKv { rate, select })
            }
            (None, Some(_)) => {
                self.err(span, "a selection of compressed entries needs `compress_rate`");
                return None;
            }
        };
        let layer = self.layer_id();
        Some(Op::Attention {
            q: qv,
            k: kv,
            v: vv,
            out: ov,
            layer,
            spec: AttentionSpec {
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                scale,
                window,
                sinks,
                value_scale,
                rel,
                compressed,
            },
        })
    }
}
