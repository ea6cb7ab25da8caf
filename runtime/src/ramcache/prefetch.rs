//! The guess behind the RAM cache's prefetch: while a MoE layer runs on the CPU, the next MoE
//! layer's router applied to this layer's MoE input names the experts the next layer will
//! likely route to, and the cache starts reading those it does not hold (`RamCache::run`).
//!
//! The next layer routes its own MoE input: its RMSNorm of a residual stream that this layer's
//! experts and the next layer's attention have still to add to. Two stand-ins were measured on
//! pymoe-22m (docs/BENCHMARKS.md): this layer's MoE input `x` as it is, and the residual
//! entering this layer's MoE renormed by the next layer's norm (`x / w * w'` with the two norm
//! weights, exact for an RMSNorm up to its epsilon): the same precision (85.5% and 85.4%), so
//! the guess reads `x` as it is, the simpler (no norm weights, any norm kind). The layer's
//! input before attention lacks this layer's attention, which `x` has.
//!
//! Must not: change a value the forward computes (the guess works on copies), or decide what
//! is read or kept (the cache does).

use super::{Inflight, RamCache};
use crate::cpu::experts::Routed;
use crate::cpu::route::{route_row, RouteSpec};
use crate::cpu::{linear, Precision};
use crate::store::weights::WeightStore;
use coli_compiler::ir::{op_io, GroupScore, Op, RouterScoring, ValueId};

/// What the prefetch did, for the per-run line and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefetchStats {
    /// Experts guessed for the next layer (its router's top-k over the step's rows, applied
    /// early), of them those held already, and those read early.
    pub guessed: u64,
    pub held: u64,
    pub read: u64,
    /// Of the guessed, those the next layer routed to.
    pub used: u64,
    /// The next layer's misses (experts it routed to that were not held) on the steps with a
    /// guess, and of them those an early read served.
    pub misses: u64,
    pub covered: u64,
    /// Early reads the next layer did not route to (kept where the budget had room to spare,
    /// else dropped), and early reads that failed (read again when the layer needed them).
    pub unused: u64,
    pub failed: u64,
}

/// The next MoE layer's router, as the guess applies it to a layer's MoE input.
pub(super) struct NextRouter {
    /// The cache layer guessed for.
    pub target: usize,
    router: String,
    bias: Option<String>,
    scoring: RouterScoring,
    top_k: usize,
    renormalize: bool,
    correction_bias: Option<String>,
    groups: Option<(usize, usize)>,
    group_score: GroupScore,
}

/// The op of `ops` writing `v`.
fn writer(ops: &[Op], v: ValueId) -> Option<&Op> {
    ops.iter().rev().find(|op| op_io(op).1.contains(&v))
}

impl NextRouter {
    /// The guess for layer `next` (cache layer `target`) from layer `this`'s MoE input (ops
    /// of the program's layers); `None` when the next layer's routing is not a `Route` of a
    /// `Linear` of its MoE input.
    pub(super) fn new(this: &[Op], next: &[Op], target: usize) -> Option<NextRouter> {
        let moe = |ops: &[Op]| {
            ops.iter().find_map(|op| match op {
                Op::RoutedExperts { x, routing, .. } => Some((*x, *routing)),
                _ => None,
            })
        };
        moe(this)?;
        let (x_next, routing) = moe(next)?;
        let Op::Route { logits, scoring, top_k, renormalize, correction_bias, groups, group_score, .. } =
            writer(next, routing)?
        else {
            return None;
        };
        let Op::Linear { x, weight, bias, .. } = writer(next, *logits)? else { return None };
        if *x != x_next || weight.rows.is_some() {
            return None;
        }
        Some(NextRouter {
            target,
            router: weight.name.clone(),
            bias: bias.as_ref().map(|b| b.name.clone()),
            scoring: *scoring,
            top_k: *top_k,
            renormalize: *renormalize,
            correction_bias: correction_bias.as_ref().map(|b| b.name.clone()),
            groups: *groups,
            group_score: *group_score,
        })
    }

    /// The experts the next layer's router picks for the `n` rows of `x` (`hidden` wide), with
    /// how many rows pick each: most picked first, ties toward the lower expert.
    pub(super) fn guess(
        &self,
        ws: &WeightStore,
        x: &[f32],
        n: usize,
        hidden: usize,
        precision: Precision,
    ) -> Vec<(usize, usize)> {
        let input = &x[..n * hidden];
        let m = ws.matrix(&self.router);
        let experts = m.rows;
        if m.cols != hidden {
            return Vec::new();
        }
        let mut logits = vec![0.0; n * experts];
        linear::linear(&m, input, n, &mut logits, precision);
        if let Some(b) = &self.bias {
            let b = ws.vector(b);
            for row in logits.chunks_exact_mut(experts) {
                row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
            }
        }
        let spec = RouteSpec {
            scoring: self.scoring,
            top_k: self.top_k,
            renormalize: self.renormalize,
            correction_bias: self.correction_bias.as_ref().map(|b| ws.vector(b)),
            groups: self.groups,
            group_score: self.group_score,
            scale: 1.0,
        };
        let mut votes = vec![0usize; experts];
        let mut out = vec![0.0; 2 * self.top_k];
        for row in logits.chunks_exact(experts) {
            route_row(&spec, row, &mut out);
            for k in 0..self.top_k {
                if let Some(v) = votes.get_mut(out[2 * k] as usize) {
                    *v += 1;
                }
            }
        }
        let mut picked: Vec<(usize, usize)> = votes.into_iter().enumerate().filter(|v| v.1 > 0).collect();
        picked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        picked
    }

    /// Top-k of the next layer's router.
    pub(super) fn top_k(&self) -> usize {
        self.top_k
    }
}

impl RamCache {
    /// Starts the early reads for the MoE layer after cache layer `t`, guessed from this
    /// step's `rows` (module doc); a read that cannot start is left to the layer's own step.
    pub(super) fn prefetch_next(&self, t: usize, ws: &WeightStore, rows: &Routed, precision: Precision) {
        let Some(nr) = self.next.get(t).and_then(Option::as_ref) else { return };
        let u = nr.target;
        let picked = nr.guess(ws, rows.x, rows.n, rows.hidden, precision);
        let cap = self.fit.max(nr.top_k());
        let guessed: Vec<usize> =
            picked.iter().map(|p| p.0).filter(|&e| e < self.layers[u].spans.len()).take(cap).collect();
        let read: Vec<usize> = {
            let b = self.books();
            guessed.iter().copied().filter(|&e| b.entries[u * self.experts + e].is_none()).collect()
        };
        // The pool gone: no guess; the layer's own step reports the error.
        let Ok(pending) = self.pool.submit(&self.requests(u, &read)) else { return };
        let mut b = self.books();
        let p = &mut b.stats.prefetch;
        p.guessed += guessed.len() as u64;
        p.held += (guessed.len() - read.len()) as u64;
        p.read += read.len() as u64;
        self.count_reads(&mut b, u, &read);
        if let Some(old) = b.inflight[u].replace(Inflight { guessed, read, pending }) {
            b.stats.prefetch.unused += old.read.len() as u64;
        }
    }
}
