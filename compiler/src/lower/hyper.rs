//! Lowering of the ops of a multi-stream residual (DeepSeek V4's hyper-connections: `HyperPre`,
//! `HyperPost`) and of the block-diagonal `GroupedLinear`: widths of the streams, the mixing
//! coefficients and the weights checked against each other.
//!
//! This module must not know a family: it checks what the spec says against the checkpoint.

use super::program::Lowerer;
use crate::diag::Span;
use crate::ir::*;
use crate::limits;
use crate::spec::OpItem;

impl Lowerer<'_> {
    /// `op` is an `OpItem::GroupedLinear`, `HyperPre` or `HyperPost`.
    pub(super) fn hyper(&mut self, op: &OpItem, span: Span) -> Option<Op> {
        match op {
            OpItem::GroupedLinear { x, out, weight, groups } => {
                let (xv, ov, w, g) =
                    (self.val(x), self.val(out), self.weight(weight), self.sized(groups, limits::HEADS));
                let (xv, ov, weight, groups) = (xv?, ov?, w?, g?);
                let [rows, cols] = weight.shape[..] else {
                    self.err(
                        span,
                        format!(
                            "a GroupedLinear weight is [groups x out, in / groups]; it has shape {:?}",
                            weight.shape
                        ),
                    );
                    return None;
                };
                if groups == 0 || !rows.is_multiple_of(groups) {
                    self.err(span, format!("{groups} groups do not divide the {rows} rows of the weight"));
                    return None;
                }
                let why = format!("{groups} groups of weight {:?}", weight.shape);
                self.expect_width(x, xv, groups * cols, &why);
                self.expect_width(out, ov, rows, &why);
                Some(Op::GroupedLinear { x: xv, out: ov, weight, groups })
            }
            OpItem::HyperPre { x, out, mix, streams, fn_weight, base, scale, sinkhorn_iters, eps, norm_eps } => {
                let (streams_text, mix_text) = (streams, mix);
                let (xv, ov, s) = (self.val(x), self.val(out), self.sized(streams, limits::STREAMS));
                let (fw, bw, sw) = (self.weight(fn_weight), self.weight(base), self.weight(scale));
                let (e, ne) = (
                    self.positive(eps, "the hyper-connections' epsilon"),
                    self.positive(norm_eps, "RmsNorm's epsilon"),
                );
                let mix = match mix {
                    Some(m) => Some(self.val(m)?),
                    None => None,
                };
                // 0 iterations are one column normalisation, as 1 (the reference's loop runs
                // `iters - 1` rounds after it).
                let iters = match sinkhorn_iters {
                    Some(t) => Some(self.sized(t, limits::ITERATIONS)?),
                    None => None,
                };
                let (xv, ov, streams, fn_weight, base, scale, eps, norm_eps) = (xv?, ov?, s?, fw?, bw?, sw?, e?, ne?);
                if streams == 0 {
                    self.err(streams_text.span, "a residual has at least one stream");
                    return None;
                }
                let hidden = self.width(ov);
                self.expect_width(x, xv, streams * hidden, "the streams of the output's width");
                let (rows, scales) = match mix {
                    Some(m) => {
                        if let Some(t) = mix_text {
                            self.expect_width(t, m, streams * (streams + 1), "post and comb of the streams");
                        }
                        if iters.is_none() {
                            self.err(span, "a layer's hyper-connection (with `mix`) needs `sinkhorn_iters`");
                        }
                        ((2 + streams) * streams, 3)
                    }
                    None => (streams, 1),
                };
                let want = [(&fn_weight, vec![rows, streams * hidden]), (&base, vec![rows]), (&scale, vec![scales])];
                for (w, shape) in want {
                    if w.shape != shape {
                        self.err(
                            span,
                            format!(
                                "`{}` has shape {:?}, hyper-connections of {streams} streams need {shape:?}",
                                w.name, w.shape
                            ),
                        );
                    }
                }
                let spec =
                    HyperSpec { streams, fn_weight, base, scale, sinkhorn_iters: iters.unwrap_or(0), eps, norm_eps };
                Some(Op::HyperPre { x: xv, out: ov, mix, spec })
            }
            OpItem::HyperPost { x, out, residual, mix, streams } => {
                let (xv, ov, s) = (self.val(x), self.val(out), self.sized(streams, limits::STREAMS));
                let (xv, ov, streams) = (xv?, ov?, s?);
                let hidden = self.width(xv);
                self.expect_width(out, ov, streams * hidden, "the streams of the input's width");
                let (residual, mix) = match (residual, mix) {
                    (Some(r), Some(m)) => {
                        let (rv, mv) = (self.val(r)?, self.val(m)?);
                        self.expect_width(r, rv, streams * hidden, "the streams of the input's width");
                        self.expect_width(m, mv, streams * (streams + 1), "post and comb of the streams");
                        (Some(rv), Some(mv))
                    }
                    (None, None) => (None, None),
                    _ => {
                        self.err(
                            span,
                            "HyperPost takes both `residual` and `mix`, or neither (the input into every stream)",
                        );
                        return None;
                    }
                };
                Some(Op::HyperPost { x: xv, residual, mix, out: ov, streams })
            }
            _ => None,
        }
    }
}
