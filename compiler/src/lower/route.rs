//! Lowering of `Route`: the router's options checked against the logits' width (top-k, groups,
//! the correction bias, shared experts, a weight-held scale, a hash table of expert ids).
//!
//! This module must not know a family: it checks what the spec says against the checkpoint.

use super::program::Lowerer;
use crate::diag::Span;
use crate::ir::*;
use crate::limits;
use crate::spec::OpItem;

impl Lowerer<'_> {
    /// `op` is an `OpItem::Route`.
    pub(super) fn route(&mut self, op: &OpItem, span: Span) -> Option<Op> {
        let OpItem::Route {
            logits,
            out,
            scoring,
            top_k,
            renormalize,
            correction_bias,
            groups,
            group_score,
            scale,
            shared,
            scale_by,
            hash,
        } = op
        else {
            return None;
        };
        let top_k_span = top_k.span;
        let shared = match shared {
            Some(s) => self.sized(s, limits::EXPERTS)?,
            None => 0,
        };
        let scale_by = match scale_by {
            Some(b) => Some(self.weight(b)?),
            None => None,
        };
        if let Some(b) = &scale_by {
            if b.shape != [1] {
                self.err(span, format!("the router's `scale_by` has shape {:?}, not [1]", b.shape));
            }
        }
        let (lv, ov, k, rn, sc) = (
            self.val(logits),
            self.val(out),
            self.sized(top_k, limits::TOP_K),
            self.boolean(renormalize),
            self.scale_or(scale, 1.0),
        );
        let (lv, ov, top_k, renormalize, scale) = (lv?, ov?, k?, rn?, sc?);
        let Some(experts) = self.width(lv).checked_sub(shared).filter(|&e| e > 0) else {
            self.err(span, format!("{shared} shared experts leave no routed ones among {} logits", self.width(lv)));
            return None;
        };
        let correction_bias = match correction_bias {
            Some(b) => Some(self.weight(b)?),
            None => None,
        };
        let groups = match groups {
            Some((g, t)) => Some((self.sized(g, limits::EXPERTS)?, self.sized(t, limits::EXPERTS)?)),
            None => None,
        };
        if top_k == 0 || top_k > experts {
            self.err(top_k_span, format!("top_k {top_k} must be between 1 and the {experts} experts"));
        }
        self.expect_width(
            out,
            ov,
            2 * (top_k + shared),
            "routing (index, weight) pairs for top_k and the shared experts",
        );
        if let Some(b) = &correction_bias {
            if b.shape != [experts] {
                self.err(span, format!("the correction bias has shape {:?}, the router needs [{experts}]", b.shape));
            }
        }
        if let Some((g, t)) = groups {
            if g == 0 || !experts.is_multiple_of(g) || t == 0 || t > g {
                self.err(
                    span,
                    format!("groups ({g}, {t}): {g} groups must divide {experts} experts and 1 <= {t} <= {g}"),
                );
            }
        }
        let hash = match hash {
            Some(h) => Some(self.weight(h)?),
            None => None,
        };
        if let Some(h) = &hash {
            if h.shape.len() != 2 || h.shape[1] != top_k {
                self.err(span, format!("the hash table has shape {:?}, the router needs [vocab, {top_k}]", h.shape));
            }
            if shared > 0 || groups.is_some() {
                self.err(span, "a hash routing chooses no top-k: it takes neither groups nor shared experts");
            }
        }
        Some(Op::Route {
            logits: lv,
            out: ov,
            scoring: *scoring,
            top_k,
            renormalize,
            correction_bias,
            groups,
            group_score: *group_score,
            scale,
            shared,
            scale_by,
            hash,
        })
    }
}
