//! Router: each row's logits to its top-k `(expert, weight)` pairs, by rank. Reference:
//! `cpu::route::route_row` (same scoring, bias, group limit, tie order, renormalization, scale).
//!
//! Must not: take more experts, ranks or groups than the shader holds (typed errors).

use super::u32_arg;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::push::RoutePush;
use crate::vk::shaders::Kernel;
use coli_compiler::ir::{GroupScore, RouterScoring};

/// The `Route` op's options (the bias is a view: it lives on the device).
#[derive(Clone, Copy, Debug)]
pub struct RouteParams {
    pub scoring: RouterScoring,
    pub top_k: usize,
    pub renormalize: bool,
    /// `(n_group, topk_group)`.
    pub groups: Option<(usize, usize)>,
    pub group_score: GroupScore,
    pub scale: f32,
}

const MAX_E: usize = 1024;
const MAX_K: usize = 64;
const MAX_G: usize = 64;

impl<'a> Frame<'a> {
    /// Routes `n` rows of `experts` logits into `out` (`n x 2 * top_k`).
    pub fn route(
        &mut self,
        logits: View<'a>,
        bias: Option<View<'a>>,
        out: View<'a>,
        n: usize,
        experts: usize,
        p: RouteParams,
    ) -> Result<()> {
        const OP: &str = "route";
        if p.scoring == RouterScoring::SqrtSoftplus {
            return Err(VkError::BadArgument { op: OP, msg: "no kernel for sqrt-softplus scores".into() });
        }
        if experts > MAX_E || p.top_k > MAX_K || p.top_k > experts || p.top_k == 0 {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{experts} experts, top {} (at most {MAX_E}, {MAX_K})", p.top_k),
            });
        }
        let (ng, tg) = p.groups.unwrap_or((0, 0));
        if p.groups.is_some() && (ng == 0 || ng > MAX_G || !experts.is_multiple_of(ng) || tg == 0 || tg > ng) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{ng} groups (keep {tg}) over {experts} experts"),
            });
        }
        logits.check(OP, "logits", n * experts)?;
        out.check(OP, "out", n * 2 * p.top_k)?;
        if let Some(b) = bias {
            b.check(OP, "correction bias", experts)?;
            if b.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "bias views must start at element 0".into() });
            }
        }
        let push = RoutePush {
            n: experts as u32,
            top_k: p.top_k as u32,
            sigmoid_: (p.scoring == RouterScoring::Sigmoid) as u32,
            renormalize: p.renormalize as u32,
            has_bias: bias.is_some() as u32,
            n_group: ng as u32,
            topk_group: tg as u32,
            scale: p.scale,
            l_off: u32_arg(OP, "logits offset", logits.offset)?,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            group_max: (p.group_score == GroupScore::Max) as u32,
            pad1: 0,
        };
        let binds = [Bind::buf(logits.buf), bias.map_or(Bind::UNUSED, |b| Bind::buf(b.buf)), Bind::buf(out.buf)];
        self.dispatch(Kernel::Route, None, &binds, &push, [u32_arg(OP, "n", n)?, 1, 1])
    }
}
