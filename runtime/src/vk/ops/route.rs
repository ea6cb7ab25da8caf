//! Router: each row's logits to its top-k `(expert, weight)` pairs, by rank. Reference:
//! `cpu::route::route_row` (same scoring, bias, group limit, tie order, renormalization, scale),
//! and `cpu::route::route_row_hash` for a hash table's experts (DeepSeek V4).
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

/// A hash routing's operands (`Op::Route::hash`): the rows' token ids (u32) and the
/// `[vocab, top_k]` table of expert ids (as f32), both on the device.
#[derive(Clone, Copy, Debug)]
pub struct RouteHash<'a> {
    pub tokens: View<'a>,
    pub table: View<'a>,
    pub vocab: usize,
}

/// Shared experts a routing weighs after the routed ones (Inkling's sink, `Op::Route::shared`):
/// their count, their logits following the routed ones' in each row, and the one-entry tensor
/// that scales every weight too (`scale_by`), on the device.
#[derive(Clone, Copy, Debug)]
pub struct RouteSink<'a> {
    pub shared: usize,
    pub scale_by: Option<View<'a>>,
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
        self.route_rows(logits, bias, (None, None), out, (n, experts), p)
    }

    /// `route` over rows of `experts` routed logits then `sink.shared` shared ones, into `out`
    /// (`n x 2 * (top_k + shared)`); reference `cpu::route::route_row_shared`.
    pub fn route_shared(
        &mut self,
        logits: View<'a>,
        bias: Option<View<'a>>,
        sink: RouteSink<'a>,
        out: View<'a>,
        (n, experts): (usize, usize),
        p: RouteParams,
    ) -> Result<()> {
        self.route_rows(logits, bias, (None, Some(sink)), out, (n, experts), p)
    }

    /// `route` with the experts of each row's token in `hash`'s table instead of a top-k
    /// (DeepSeek V4's hash routing; no bias, no groups).
    pub fn route_hash(
        &mut self,
        logits: View<'a>,
        hash: RouteHash<'a>,
        out: View<'a>,
        (n, experts): (usize, usize),
        p: RouteParams,
    ) -> Result<()> {
        if p.groups.is_some() {
            return Err(VkError::BadArgument { op: "route", msg: "hash routing takes no groups".into() });
        }
        self.route_rows(logits, None, (Some(hash), None), out, (n, experts), p)
    }

    fn route_rows(
        &mut self,
        logits: View<'a>,
        bias: Option<View<'a>>,
        (hash, sink): (Option<RouteHash<'a>>, Option<RouteSink<'a>>),
        out: View<'a>,
        (n, experts): (usize, usize),
        p: RouteParams,
    ) -> Result<()> {
        const OP: &str = "route";
        let shared = sink.map_or(0, |s| s.shared);
        if shared > MAX_K || (shared > 0 && hash.is_some()) {
            return Err(VkError::BadArgument {
                op: OP,
                msg: format!("{shared} shared experts (at most {MAX_K}, no hash)"),
            });
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
        logits.check(OP, "logits", n * (experts + shared))?;
        out.check(OP, "out", n * 2 * (p.top_k + shared))?;
        let scale_by = sink.and_then(|s| s.scale_by);
        if let Some(v) = scale_by {
            v.check(OP, "scale_by", 1)?;
            if v.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "scale_by views must start at element 0".into() });
            }
        }
        if let Some(b) = bias {
            b.check(OP, "correction bias", experts)?;
            if b.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "bias views must start at element 0".into() });
            }
        }
        if let Some(h) = &hash {
            h.tokens.check(OP, "tokens", n)?;
            h.table.check(OP, "hash table", h.vocab * p.top_k)?;
            if h.table.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "hash table views must start at element 0".into() });
            }
        }
        let push = RoutePush {
            n: experts as u32,
            top_k: p.top_k as u32,
            scoring: match p.scoring {
                RouterScoring::Softmax => 0,
                RouterScoring::Sigmoid => 1,
                RouterScoring::SqrtSoftplus => 2,
            },
            renormalize: p.renormalize as u32,
            has_bias: bias.is_some() as u32,
            n_group: ng as u32,
            topk_group: tg as u32,
            scale: p.scale,
            l_off: u32_arg(OP, "logits offset", logits.offset)?,
            o_off: u32_arg(OP, "out offset", out.offset)?,
            group_max: (p.group_score == GroupScore::Max) as u32,
            hash: hash.is_some() as u32,
            vocab: hash.map_or(Ok(0), |h| u32_arg(OP, "vocabulary", h.vocab))?,
            t_off: hash.map_or(Ok(0), |h| u32_arg(OP, "tokens offset", h.tokens.offset))?,
            shared_: u32_arg(OP, "shared experts", shared)?,
            has_scale_by: scale_by.is_some() as u32,
        };
        let opt = |v: Option<View<'a>>| v.map_or(Bind::UNUSED, |v| Bind::buf(v.buf));
        let binds = [
            Bind::buf(logits.buf),
            opt(bias),
            Bind::buf(out.buf),
            opt(hash.map(|h| h.tokens)),
            opt(hash.map(|h| h.table)),
            opt(scale_by),
        ];
        self.dispatch(Kernel::Route, None, &binds, &push, [u32_arg(OP, "n", n)?, 1, 1])
    }
}
