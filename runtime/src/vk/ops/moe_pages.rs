//! A layer's resident experts in pages. One stack of a layer's experts may not fit one storage
//! buffer (the device's range, 4 GiB on most drivers: GLM-5's 256 experts of 6,144 x 2,048
//! take 6 GiB of int8 gate and up rows), so the experts go up as consecutive runs, each a
//! `DeviceExperts` of its own (`Context::upload_expert_pages`, `VkOptions::expert_page_bytes`).
//!
//! A call over several pages (`Frame::moe_paged`): per page the routing as that page sees it
//! (`moe_page.comp`: ids outside the page invalid, the others less the page's first expert),
//! the pairs' outputs of the page's experts into the scratch's pair rows (`moe_with`, as the
//! expert tier's batches), then one rank-ordered sum of every pair (`moe_sum.comp`) with the
//! residual folded into its store: the CPU's order, as one stack gives it. One page is exactly
//! `Frame::moe_fused`.
//!
//! Must not: reorder the sum, or leave a pair to no page.

use super::matmul::MatIn;
use super::moe::{DeviceExperts, MoeCall, MoeRoute};
use super::{groups_for, u32_arg};
use crate::cpu::experts::ExpertMats;
use crate::vk::context::{Context, View};
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::pack;
use crate::vk::push::MoePagePush;
use crate::vk::shaders::Kernel;

/// One layer's resident experts: runs of consecutive experts, each within a buffer's bytes.
#[derive(Debug)]
pub struct ExpertPages {
    pages: Vec<DeviceExperts>,
}

impl ExpertPages {
    /// The runs, in expert order (never empty).
    pub fn pages(&self) -> &[DeviceExperts] {
        &self.pages
    }

    /// The layer's experts.
    pub fn experts(&self) -> usize {
        self.pages.iter().map(|p| p.experts).sum()
    }

    /// The most experts a page holds (what a call's scratch must group).
    pub fn page_experts(&self) -> usize {
        self.pages.iter().map(|p| p.experts).max().unwrap_or(0)
    }

    pub fn ffn(&self) -> usize {
        self.pages[0].ffn
    }

    pub fn hidden(&self) -> usize {
        self.pages[0].hidden
    }

    /// Device bytes of every page.
    pub fn device_bytes(&self) -> usize {
        self.pages.iter().map(DeviceExperts::device_bytes).sum()
    }
}

impl Context {
    /// The bytes one expert shaped like `like` adds to the largest buffer of a stack (gate and
    /// up values, their scales, down values, scales, biases: each its own buffer).
    pub fn expert_stack_bytes(like: &ExpertMats) -> Result<usize> {
        let g = pack(like.gate.format, like.gate.rows, like.gate.cols, like.gate.bytes())?;
        let d = pack(like.down.format, like.down.rows, like.down.cols, like.down.bytes())?;
        let biased = like.gate_bias.is_some() || like.up_bias.is_some() || like.down_bias.is_some();
        let bias = if biased { (2 * like.gate.rows + like.down.rows) * 4 } else { 0 };
        Ok([2 * g.q.len(), 2 * g.s.len(), d.q.len(), d.s.len(), bias].into_iter().max().unwrap_or(1).max(1))
    }

    /// How many experts shaped like `like` one page holds within `expert_page_bytes` a buffer.
    pub fn experts_per_page(&self, like: &ExpertMats) -> Result<usize> {
        let largest = Self::expert_stack_bytes(like)? as u64;
        Ok(((self.expert_page_bytes() / largest) as usize).clamp(1, super::moe::MAX_EXPERTS))
    }

    /// Uploads a layer's `experts` experts (`expert(e)`, as the CPU reads them) in pages of
    /// `experts_per_page` consecutive experts; every expert must be shaped and formatted as
    /// expert 0 (typed error otherwise).
    pub fn upload_expert_pages<'m>(
        &self,
        experts: usize,
        expert: &dyn Fn(usize) -> ExpertMats<'m>,
    ) -> Result<ExpertPages> {
        if experts == 0 || experts > super::moe::MAX_EXPERTS {
            return Err(VkError::BadArgument {
                op: "upload_expert_pages",
                msg: format!("{experts} experts (at most {})", super::moe::MAX_EXPERTS),
            });
        }
        let per = self.experts_per_page(&expert(0))?;
        let mut pages: Vec<DeviceExperts> = Vec::with_capacity(experts.div_ceil(per));
        for base in (0..experts).step_by(per) {
            let count = per.min(experts - base);
            if let Some(first) = pages.first() {
                if !first.holds(&expert(base)) {
                    return Err(VkError::BadArgument {
                        op: "upload_expert_pages",
                        msg: format!("expert {base}: its shape, format or biases differ from expert 0's"),
                    });
                }
            }
            pages.push(self.upload_experts(count, &|e| expert(base + e))?);
        }
        Ok(ExpertPages { pages })
    }
}

impl<'a> Frame<'a> {
    /// `route` of `route.logits` into `routing`, then `moe_paged`; where the call allows
    /// (`routes_in_experts`: one page, a GEMV per pair) the routing is made inside the experts'
    /// first kernel instead (route.glsl, the same arithmetic as `route`), one dispatch fewer.
    /// Reference: `cpu::route::route_row`, then `cpu::experts::routed_experts`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_paged_routed(
        &mut self,
        pages: &'a ExpertPages,
        c: MoeCall<'a>,
        input: MatIn<'a>,
        residual: Option<View<'a>>,
        route: MoeRoute<'a>,
        routing: View<'a>,
        out: View<'a>,
    ) -> Result<()> {
        if self.routes_in_experts(pages.pages(), &c, &route) {
            let c = MoeCall { experts: &pages.pages()[0], ..c };
            return self.moe_with(c, input, residual, (routing, Some(route)), out, true);
        }
        self.route(route.logits, route.bias, routing, c.n, pages.experts(), route.params)?;
        self.moe_paged(pages, c, input, residual, routing, out)
    }

    /// `moe_fused` over a layer's pages: `out = [residual +] sum_k w[r,k] * expert_{e[r,k]}(x[r])`
    /// with `c.experts` ignored (each page in turn). Reference `cpu::experts::routed_experts`.
    pub fn moe_paged(
        &mut self,
        pages: &'a ExpertPages,
        c: MoeCall<'a>,
        input: MatIn<'a>,
        residual: Option<View<'a>>,
        routing: View<'a>,
        out: View<'a>,
    ) -> Result<()> {
        const OP: &str = "moe_paged";
        if let [one] = pages.pages() {
            return self.moe_fused(MoeCall { experts: one, ..c }, input, residual, routing, out);
        }
        let (s, n, top_k, hidden) = (c.scratch, c.n, c.top_k, pages.hidden());
        let pairs = n * top_k;
        if n > s.rows || top_k > s.top_k || hidden > s.hidden {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{n} rows, top {top_k}, hidden {hidden} exceed the scratch"),
            });
        }
        if top_k == 0 || top_k > pages.experts() {
            return Err(VkError::BadArgument { op: OP, msg: format!("top {top_k} of {} experts", pages.experts()) });
        }
        routing.check(OP, "routing (n x 2 top_k)", pairs * 2)?;
        out.check(OP, "out (n x hidden)", n * hidden)?;
        if let Some(r) = residual {
            r.check(OP, "residual (n x hidden)", n * hidden)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (y, seen) = (s.y.view(0, pairs * hidden), s.page_routing.view(0, pairs * 2));
        let mut base = 0;
        for page in pages.pages() {
            let push = MoePagePush {
                pairs: u32_arg(OP, "pairs", pairs)?,
                r_off: u32_arg(OP, "routing offset", routing.offset)?,
                base: u32_arg(OP, "base", base)?,
                count: u32_arg(OP, "count", page.experts)?,
            };
            let binds = [Bind::buf(routing.buf), Bind::buf(seen.buf)];
            self.dispatch(Kernel::MoePage, None, &binds, &push, [groups_for(pairs, 64), 1, 1])?;
            self.moe_with(MoeCall { experts: page, ..c }, input, None, (seen, None), y, false)?;
            base += page.experts;
        }
        self.moe_sum(s, (n, hidden, top_k, pages.experts()), routing, residual, out)
    }
}
