//! Row ops of a device frame that need more than one kernel call or the step's sequences:
//! RoPE (per sequence at its own positions in a batched step; on the heads' last columns and
//! inverted, DeepSeek V4's), the router (V4's hash routing reads the rows' tokens) and the
//! kinds DeepSeek V4 brought: the unweighted RMSNorm.

use super::{DeviceModel, Rec};
use crate::oplib::op_name;
use crate::vk::{Frame as VkFrame, RopePart, RopeShape, RouteHash, RouteParams, RouteSink, VkError};
use coli_compiler::ir::{Op, ValueId};

/// A `Route` op's options as the device's router takes them (`None` for another op).
pub(super) fn route_params(op: &Op) -> Option<RouteParams> {
    match op {
        Op::Route { scoring, top_k, renormalize, groups, group_score, scale, .. } => Some(RouteParams {
            scoring: *scoring,
            top_k: *top_k,
            renormalize: *renormalize,
            groups: *groups,
            group_score: *group_score,
            scale: *scale,
        }),
        _ => None,
    }
}

impl DeviceModel {
    /// Records `op` on every row of the step (`record_op`'s arms for these kinds).
    pub(super) fn record_rows<'a>(&'a self, f: &mut VkFrame<'a>, rec: &Rec<'a, '_>, op: &Op) -> Result<(), VkError> {
        let Rec { st, widths, n, pos, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let view = |v: ValueId| st.values[v.0 as usize].view(0, n * w(v));
        match op {
            // A weight of ones (DeepSeek V4's per-head query norm).
            Op::RmsNorm { x, out, weight: None, eps, group, offset, scale } => {
                f.rms_norm_unweighted(view(*x), view(*out), (n, w(*x), *group), (*eps, *offset, *scale))?;
            }
            Op::Rope { x, heads, head_dim, rotary_dim, style, theta, scaling, tail, inverse } => {
                let (fb, mscale) = self.freq(*rotary_dim, *theta, *scaling);
                let skip = if *tail { head_dim.saturating_sub(*rotary_dim) } else { 0 };
                let shape = |n| RopeShape {
                    n,
                    width: w(*x),
                    heads: *heads,
                    head_dim: *head_dim,
                    style: *style,
                    pos0: 0,
                    mscale,
                    part: RopePart { skip, inverse: *inverse },
                };
                if rec.seqs.len() > 1 {
                    for s in rec.seqs {
                        let rows = st.values[x.0 as usize].view(s.rows.start * w(*x), s.rows.len() * w(*x));
                        f.rope_at(rows, fb.all(), shape(s.rows.len()), s.pos)?;
                    }
                } else {
                    f.rope_at(view(*x), fb.all(), shape(n), pos)?;
                }
            }
            Op::Route { logits, out, correction_bias, hash, shared, scale_by, .. } => {
                let bias = correction_bias.as_ref().map(|b| self.vecs[&b.name].all());
                let params = route_params(op).expect("a route");
                match hash {
                    // DeepSeek V4's hash routing: the rows' tokens (written with the frame's).
                    Some(t) => {
                        let h = RouteHash {
                            tokens: st.tokens.view(0, n),
                            table: self.vecs[&t.name].all(),
                            vocab: t.shape[0],
                        };
                        f.route_hash(view(*logits), h, view(*out), (n, w(*logits)), params)?
                    }
                    // Inkling's: the shared experts' logits after the routed ones'.
                    None if *shared > 0 || scale_by.is_some() => {
                        let sink = RouteSink {
                            shared: *shared,
                            scale_by: scale_by.as_ref().map(|b| self.vecs[&b.name].all()),
                        };
                        f.route_shared(view(*logits), bias, sink, view(*out), (n, w(*logits) - shared), params)?
                    }
                    None => f.route(view(*logits), bias, view(*out), n, w(*logits), params)?,
                }
            }
            op => {
                return Err(VkError::BadArgument { op: op_name(op), msg: "not a row op of the device".into() });
            }
        }
        Ok(())
    }
}
