//! DeepSeek V4's hyper-connections over a residual of several streams and its block-diagonal
//! output projection. `hyper_pre` (`hyper_pre.comp`: a workgroup per row and mixing logit into
//! frame scratch, then one per row for the coefficients) and `hyper_post`
//! (`hyper_post.comp`, an invocation per column of a row) follow `cpu::hyper::hyper_pre` and
//! `hyper_post` in their order of operations, the mixing weights in f32 (the CPU's
//! `Precision::Exact` product); `grouped_linear` lays the input's column groups out group after
//! group (`group_cols.comp`) and runs one product per group on the matrix kernels (any weight
//! format, the caller's precision, as `cpu::hyper::grouped_linear`), each storing its columns
//! of the output rows.
//!
//! Must not: take more streams than the kernels hold (`MAX_STREAMS`), or write a residual that
//! partly overlaps the output (only the output itself, in place).

use super::{groups_for, u32_arg};
use crate::cpu::Precision;
use crate::vk::context::View;
use crate::vk::error::{Result, VkError};
use crate::vk::frame::{Bind, Frame};
use crate::vk::layout::DeviceMatrix;
use crate::vk::push::{GroupColsPush, HyperPostPush, HyperPrePush};
use crate::vk::shaders::Kernel;

/// The most streams the kernels take: a layer's site has `(2 + S) * S` mixing logits, at most
/// the 64 `hyper_pre.comp` holds.
pub const MAX_STREAMS: usize = 6;
const MAX_ROWS: usize = 65535;

/// A `hyper_pre`'s sizes and constants (`ir::HyperSpec`'s, for `n` rows of `streams * hidden`).
#[derive(Clone, Copy, Debug)]
pub struct HyperShape {
    pub n: usize,
    pub streams: usize,
    pub hidden: usize,
    pub sinkhorn_iters: usize,
    pub eps: f32,
    pub norm_eps: f32,
}

/// A `hyper_pre` site's weights on the device, all f32: `fn_weight` (`[rows, S * hidden]`),
/// `base` (`[rows]`), `scale` (`[3]`, or `[1]` at the head).
#[derive(Clone, Copy, Debug)]
pub struct HyperMix<'a> {
    pub fn_weight: View<'a>,
    pub base: View<'a>,
    pub scale: View<'a>,
}

fn bad(op: &'static str, msg: String) -> VkError {
    VkError::BadArgument { op, msg }
}

impl<'a> Frame<'a> {
    /// The mix into a sublayer: `out` (`n x hidden`) the streams of `x` weighed by `pre`; with
    /// `mix` (`n x S (S + 1)`), `[post, comb]` per row too. Reference `cpu::hyper::hyper_pre`.
    pub fn hyper_pre(
        &mut self,
        x: View<'a>,
        w: HyperMix<'a>,
        out: View<'a>,
        mix: Option<View<'a>>,
        sh: HyperShape,
    ) -> Result<()> {
        const OP: &str = "hyper_pre";
        let (s, h) = (sh.streams, sh.hidden);
        if s == 0 || s > MAX_STREAMS || sh.n > MAX_ROWS {
            return Err(bad(OP, format!("{s} streams (1 to {MAX_STREAMS}) over {} rows", sh.n)));
        }
        let rows = if mix.is_some() { (2 + s) * s } else { s };
        x.check(OP, "x (n x streams * hidden)", sh.n * s * h)?;
        w.fn_weight.check(OP, "fn (rows x streams * hidden)", rows * s * h)?;
        w.base.check(OP, "base", rows)?;
        w.scale.check(OP, "scale", if mix.is_some() { 3 } else { 1 })?;
        out.check(OP, "out (n x hidden)", sh.n * h)?;
        if let Some(m) = mix {
            m.check(OP, "mix (n x streams * (streams + 1))", sh.n * s * (s + 1))?;
        }
        // The weights are bound from their views' starts.
        if w.fn_weight.offset != 0 || w.base.offset != 0 || w.scale.offset != 0 {
            return Err(bad(OP, "weight views must start at element 0".into()));
        }
        let logits = self.scratch(sh.n * rows)?;
        let mut push = HyperPrePush {
            streams: s as u32,
            hidden: u32_arg(OP, "hidden", h)?,
            rows: rows as u32,
            mix_on: mix.is_some() as u32,
            iters: u32_arg(OP, "sinkhorn iterations", sh.sinkhorn_iters)?,
            eps: sh.eps,
            norm_eps: sh.norm_eps,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            mix_off: u32_arg(OP, "mix offset", mix.map_or(0, |m| m.offset))?,
            phase: 0,
            pad1: 0,
        };
        let lb = self.scratch_bind(logits);
        let (xb, fb) = (Bind::buf(x.buf), Bind::buf(w.fn_weight.buf));
        let (u, n) = (Bind::UNUSED, sh.n as u32);
        self.dispatch(Kernel::HyperPre, None, &[xb, fb, u, u, u, u, lb], &push, [n, rows as u32, 1])?;
        push.phase = 1;
        let (bb, sb, ob) = (Bind::buf(w.base.buf), Bind::buf(w.scale.buf), Bind::buf(out.buf));
        let mb = mix.map_or(Bind::UNUSED, |m| Bind::buf(m.buf));
        self.dispatch(Kernel::HyperPre, None, &[xb, u, bb, sb, ob, mb, lb], &push, [n, 1, 1])
    }

    /// The mix out of a sublayer over `n` rows: with `mix = Some((residual, mix))`, `out[k] =
    /// post[k] * x + sum_j comb[j][k] * residual[j]` (`residual` may be `out` itself, exactly);
    /// without, `x` into every one of `streams` streams. Reference `cpu::hyper::hyper_post`.
    pub fn hyper_post(
        &mut self,
        x: View<'a>,
        mix: Option<(View<'a>, View<'a>)>,
        out: View<'a>,
        (n, streams, hidden): (usize, usize, usize),
    ) -> Result<()> {
        const OP: &str = "hyper_post";
        if streams == 0 || streams > MAX_STREAMS {
            return Err(bad(OP, format!("{streams} streams (1 to {MAX_STREAMS})")));
        }
        let width = streams * hidden;
        x.check(OP, "x (n x hidden)", n * hidden)?;
        out.check(OP, "out (n x streams * hidden)", n * width)?;
        let mut in_place = false;
        if let Some((res, m)) = mix {
            res.check(OP, "residual (n x streams * hidden)", n * width)?;
            m.check(OP, "mix (n x streams * (streams + 1))", n * streams * (streams + 1))?;
            let overlaps = std::ptr::eq(res.buf, out.buf)
                && res.offset < out.offset + n * width
                && out.offset < res.offset + n * width;
            if overlaps && res.offset != out.offset {
                return Err(bad(OP, "the residual overlaps the output without being it".into()));
            }
            in_place = overlaps;
            if [x, m].iter().any(|v| std::ptr::eq(v.buf, out.buf)) {
                let hit = |v: &View| v.offset < out.offset + n * width && out.offset < v.offset + v.len;
                if hit(&x) || hit(&m) {
                    return Err(bad(OP, "x or the mix overlaps the output".into()));
                }
            }
        }
        let count = n * hidden;
        let push = HyperPostPush {
            n: u32_arg(OP, "n", n)?,
            streams: streams as u32,
            hidden: u32_arg(OP, "hidden", hidden)?,
            mix_on: mix.is_some() as u32,
            in_place: in_place as u32,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            res_off: u32_arg(OP, "residual offset", mix.map_or(0, |(r, _)| r.offset))?,
            mix_off: u32_arg(OP, "mix offset", mix.map_or(0, |(_, m)| m.offset))?,
            out_off: u32_arg(OP, "out offset", out.offset)?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let res = match mix {
            Some((r, _)) if !in_place => Bind::buf(r.buf),
            _ => Bind::UNUSED,
        };
        let binds = [Bind::buf(x.buf), res, mix.map_or(Bind::UNUSED, |(_, m)| Bind::buf(m.buf)), Bind::buf(out.buf)];
        let groups = groups_for(count, 64);
        if groups > MAX_ROWS as u32 {
            return Err(bad(OP, format!("{count} columns exceed one dispatch")));
        }
        self.dispatch(Kernel::HyperPost, None, &binds, &push, [groups, 1, 1])
    }

    /// `out = x W^T` block-diagonally over `n` rows: `x`'s columns in `groups.len()` equal
    /// groups, group `g` times `groups[g]` (the weight's rows `g * r ..+ r`, uploaded apart),
    /// its `r` columns of each output row; `scratch` holds `n x in` floats (the input's groups
    /// laid out one after another). Reference `cpu::hyper::grouped_linear`.
    pub fn grouped_linear(
        &mut self,
        groups: &'a [DeviceMatrix],
        x: View<'a>,
        scratch: View<'a>,
        out: View<'a>,
        n: usize,
        precision: Precision,
    ) -> Result<()> {
        const OP: &str = "grouped_linear";
        let Some(first) = groups.first() else { return Err(bad(OP, "no groups".into())) };
        let (r, c, g) = (first.rows, first.cols, groups.len());
        if groups.iter().any(|m| m.rows != r || m.cols != c) {
            return Err(bad(OP, "the groups' matrices differ in shape".into()));
        }
        x.check(OP, "x (n x groups * cols)", n * g * c)?;
        scratch.check(OP, "scratch (n x groups * cols)", n * g * c)?;
        out.check(OP, "out (n x groups * rows)", n * g * r)?;
        if std::ptr::eq(scratch.buf, x.buf) || std::ptr::eq(scratch.buf, out.buf) {
            return Err(bad(OP, "the scratch must be a buffer of its own".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let count = n * g * c;
        let groups_n = groups_for(count, 64);
        if groups_n > MAX_ROWS as u32 {
            return Err(bad(OP, format!("{count} inputs exceed one dispatch")));
        }
        let push = GroupColsPush {
            n: u32_arg(OP, "n", n)?,
            groups: u32_arg(OP, "groups", g)?,
            cols: u32_arg(OP, "cols", c)?,
            x_off: u32_arg(OP, "x offset", x.offset)?,
            out_off: u32_arg(OP, "scratch offset", scratch.offset)?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        self.dispatch(Kernel::GroupCols, None, &[Bind::buf(x.buf), Bind::buf(scratch.buf)], &push, [groups_n, 1, 1])?;
        for (i, m) in groups.iter().enumerate() {
            let xs = View { buf: scratch.buf, offset: scratch.offset + i * n * c, len: n * c };
            let os = View { buf: out.buf, offset: out.offset + i * r, len: (n - 1) * g * r + r };
            self.matmul_strided(m, xs, n, (os, g * r), precision)?;
        }
        Ok(())
    }
}
