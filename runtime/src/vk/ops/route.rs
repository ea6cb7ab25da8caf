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
        check_groups(OP, experts, &p)?;
        logits.check(OP, "logits", n * (experts + shared))?;
        out.check(OP, "out", n * 2 * (p.top_k + shared))?;
        let scale_by = sink.and_then(|s| s.scale_by);
        if let Some(v) = scale_by {
            v.check(OP, "scale_by", 1)?;
            if v.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "scale_by views must start at element 0".into() });
            }
        }
        check_bias(OP, bias, experts)?;
        if let Some(h) = &hash {
            h.tokens.check(OP, "tokens", n)?;
            h.table.check(OP, "hash table", h.vocab * p.top_k)?;
            if h.table.offset != 0 {
                return Err(VkError::BadArgument { op: OP, msg: "hash table views must start at element 0".into() });
            }
        }
        let (ng, tg) = p.groups.unwrap_or((0, 0));
        let push = RoutePush {
            n: experts as u32,
            top_k: p.top_k as u32,
            scoring: scoring_code(p.scoring),
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

/// The shaders' code of a scoring.
fn scoring_code(s: RouterScoring) -> u32 {
    match s {
        RouterScoring::Softmax => 0,
        RouterScoring::Sigmoid => 1,
        RouterScoring::SqrtSoftplus => 2,
    }
}

/// The group limit's numbers: groups that divide the experts, at most `MAX_G`, keeping at least
/// one and at most all.
fn check_groups(op: &'static str, experts: usize, p: &RouteParams) -> Result<()> {
    let (ng, tg) = p.groups.unwrap_or((0, 0));
    if p.groups.is_some() && (ng == 0 || ng > MAX_G || !experts.is_multiple_of(ng) || tg == 0 || tg > ng) {
        return Err(VkError::BadArgument { op, msg: format!("{ng} groups (keep {tg}) over {experts} experts") });
    }
    Ok(())
}

/// A correction bias: a view of `experts` elements from element 0.
fn check_bias(op: &'static str, bias: Option<View<'_>>, experts: usize) -> Result<()> {
    if let Some(b) = bias {
        b.check(op, "correction bias", experts)?;
        if b.offset != 0 {
            return Err(VkError::BadArgument { op, msg: "bias views must start at element 0".into() });
        }
    }
    Ok(())
}

/// The most experts the routed experts' first kernel routes itself (`moe_matvec.comp`'s
/// `RT_MAX_E`).
pub(super) const MAX_E_IN_EXPERTS: usize = 256;

/// What `moe_matvec.comp`'s mode 0 takes to route `n` rows of `experts` logits itself: the
/// push's `route` bits, the logits' offset and the scale, after the checks `Frame::route`
/// makes (`op` names the caller in errors).
pub(super) fn route_bits(
    op: &'static str,
    logits: View<'_>,
    bias: Option<View<'_>>,
    (n, experts): (usize, usize),
    p: &RouteParams,
) -> Result<(u32, u32, f32)> {
    if experts > MAX_E_IN_EXPERTS || p.top_k > MAX_K || p.top_k > experts || p.top_k == 0 {
        return Err(VkError::BadArgument {
            op,
            msg: format!("{experts} experts, top {} (at most {MAX_E_IN_EXPERTS}, {MAX_K})", p.top_k),
        });
    }
    check_groups(op, experts, p)?;
    check_bias(op, bias, experts)?;
    logits.check(op, "logits", n * experts)?;
    let (ng, tg) = p.groups.unwrap_or((0, 0));
    let bits = 1
        | scoring_code(p.scoring) << 1
        | (p.renormalize as u32) << 3
        | (bias.is_some() as u32) << 4
        | ((p.group_score == GroupScore::Max) as u32) << 5
        | (ng as u32) << 8
        | (tg as u32) << 16;
    Ok((bits, u32_arg(op, "logits offset", logits.offset)?, p.scale))
}
