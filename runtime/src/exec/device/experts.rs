//! A resident MoE layer's routed experts in a device frame (`Kernel::Experts`): their input
//! norm (into the experts' 8-bit activations, or its rows first where the experts take float
//! activations), their residual store, and the `Route` the schedule absorbed into them, which
//! `moe_paged_routed` makes inside the experts' first kernel where it can.

use super::rows::route_params;
use super::{DeviceModel, Rec};
use crate::vk::{Frame as VkFrame, MatIn, MoeCall, MoePath, MoeRoute, NormArgs, VkError};
use coli_compiler::ir::{Op, ValueId};
use coli_compiler::schedule::ExpertsCall;

impl DeviceModel {
    /// Records `e` on the step's rows.
    pub(super) fn record_experts<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        rec: &Rec<'a, '_>,
        e: &ExpertsCall,
    ) -> Result<(), VkError> {
        let Rec { st, widths, n, precision, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let view = |v: ValueId| st.values[v.0 as usize].view(0, n * w(v));
        let ex = self.experts.get(&e.layer.0).ok_or_else(|| VkError::BadArgument {
            op: "routed_experts",
            msg: format!("{}: experts not uploaded", e.layer),
        })?;
        let scratch = st.moe.as_ref().expect("scratch allocated with the experts");
        let src = match &e.norm {
            Some(nm) if VkFrame::moe_takes_norm(&ex.pages()[0], precision) => {
                MatIn::Norm { x: view(nm.x), weight: self.vecs[&nm.weight.name].all(), eps: nm.eps, offset: nm.offset }
            }
            Some(nm) => {
                // Float activations: the norm's rows after all.
                let weight = self.vecs[&nm.weight.name].all();
                let args = NormArgs { x: view(nm.x), weight, out: view(e.x), width: w(e.x) };
                f.rms_norm(args, n, nm.eps, nm.offset)?;
                MatIn::Plain(view(e.x))
            }
            None => MatIn::Plain(view(e.x)),
        };
        let res = e.residual.map(|r| view(r.other));
        let call = MoeCall {
            experts: &ex.pages()[0],
            scratch,
            n,
            top_k: w(e.routing) / 2,
            glu: e.glu,
            precision,
            path: MoePath::Auto,
        };
        let (routing, out) = (view(e.routing), view(e.dest()));
        match &e.route {
            Some(op) => {
                let route = match (op, route_params(op)) {
                    (Op::Route { logits, correction_bias, .. }, Some(params)) => MoeRoute {
                        logits: view(*logits),
                        bias: correction_bias.as_ref().map(|b| self.vecs[&b.name].all()),
                        params,
                    },
                    _ => {
                        return Err(VkError::BadArgument {
                            op: "routed_experts",
                            msg: "an absorbed route that is not a Route".into(),
                        })
                    }
                };
                f.moe_paged_routed(ex, call, src, res, route, routing, out)
            }
            None => f.moe_paged(ex, call, src, res, routing, out),
        }
    }
}
