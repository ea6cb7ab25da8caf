//! Which ops of a plan's device frames run as one kernel, decided once per plan (`fusions`,
//! per op of each device frame) and turned into the frame's calls (`device_calls`):
//! - an `RmsNorm` over whole rows whose every reader is a `Linear` of the same frame is
//!   `Absorbed`: each of those products normalizes its input as it reads it (`MatIn::Norm`);
//! - a `Glu` read only by `Linear`s of its frame likewise (`MatIn::Glu`);
//! - an `Add` right after a bias-free `Linear` that consumes the product (the residual add) is
//!   `Absorbed` into the product's store (`matmul_fused`'s residual); likewise after a
//!   `RoutedExperts` (`moe_fused`'s residual);
//! - an `RmsNorm` read by `Linear`s and `RoutedExperts` of its frame (a MoE layer's FFN norm,
//!   read by the router and the experts) is `Absorbed` too: the experts' 8-bit activations are
//!   quantized from the normalized rows (where the experts take float activations the
//!   executor records the norm after all);
//! - two `RmsNorm`s in a row that do not touch each other's output are one dispatch
//!   (`NormPair`: a layer's q and k norms);
//! - an `Attention` takes `rope_kv`: the `Rope`s of its q and k right before it are `Absorbed`
//!   into it when they agree, and the KV append (mirror and read-back rows) is always its;
//!   for one row, RoPE, the append and attention are one kernel when q and k die there, and
//!   then the q and k norms right before the ropes are the kernel's too (`norms`);
//! - a `Route` (no hash table, no shared experts) whose output only `RoutedExperts` after it
//!   read, with nothing between writing its logits, is `Absorbed` into them (`route`): an
//!   executor whose experts' first kernel can route its rows does, else records it first.
//!
//! "Read" counts every later reader of the value before its next writer, in this frame, in
//! later frames (host ones too) and by the frame's downloads; the logits are read at the end.
//! A transform's sources must not change before its last reader, and a fused product's
//! output must not be one of its inputs.
//!
//! `replayable` says whether a frame's recording depends on nothing but the row count and
//! the positions (which kernels read from a device buffer), so one recording of a decode
//! step serves every step (a Gated DeltaNet reads no position: its state is the session's).
//!
//! Must not: change what a frame computes, only how many kernels compute it.

use super::{AttentionCall, Call, ExpertsCall, Kernel, MatSrc, Matmul, Norm, Residual, RopeArgs, Rows};
use crate::frames::{op_of, Frame};
use crate::ids::{Part, Place};
use crate::ir::op_io;
use crate::ir::{Op, Program, ValueId};

/// How the executor records one op of a device frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fused {
    /// As its own kernel(s).
    Alone,
    /// Inside another op's kernel.
    Absorbed,
    /// A `Linear` whose input is the output of op `input` of the frame (an `RmsNorm` or a
    /// `Glu`, absorbed) and, with `residual`, whose store adds the other operand of the `Add`
    /// at that index and goes to that `Add`'s output.
    Linear { input: Option<usize>, residual: Option<usize> },
    /// An `Attention` recorded after `rope_kv`; `rope`: the indices of the absorbed `Rope`s
    /// of its q and of its k. `one_kernel`: nothing reads q or k after it (or no RoPE was
    /// absorbed), so a one-row forward may leave them unrotated and do RoPE, the KV append and
    /// attention in one kernel (`Frame::attention_decode`).
    /// `norms`: the indices of the `RmsNorm`s of q and of k right before (in place or not,
    /// absorbed): a one-kernel decode applies them itself; otherwise the executor records them
    /// (as a pair) before the attention.
    Attention { rope: Option<(usize, usize)>, one_kernel: bool, norms: Option<(usize, usize)> },
    /// A `RoutedExperts` whose input is the output of op `input` (an `RmsNorm`, absorbed: the
    /// experts' activation quantization normalizes as it reads), with `residual`, whose
    /// summed store adds the other operand of the `Add` at that index (absorbed), and with
    /// `route`, whose routing is made by the `Route` at that index (absorbed).
    Experts { input: Option<usize>, residual: Option<usize>, route: Option<usize> },
    /// An `RmsNorm` recorded with the `RmsNorm` at index `second` (absorbed) in one dispatch
    /// (`Frame::rms_norm_pair`): neither reads what the other writes.
    NormPair { second: usize },
}

/// Where each value is read and written, over the whole forward in execution order.
struct Flow {
    /// Per op of every frame, in order: (frame index, op index, reads, writes).
    steps: Vec<(usize, usize, Vec<ValueId>, Vec<ValueId>)>,
    /// Per frame: the index in `steps` of its first op, and its end.
    spans: Vec<(usize, usize)>,
}

impl Flow {
    fn new(program: &Program, frames: &[Frame]) -> Flow {
        let mut steps = Vec::new();
        let mut spans = Vec::new();
        for (fi, f) in frames.iter().enumerate() {
            let start = steps.len();
            for (oi, &id) in f.ops.iter().enumerate() {
                let (r, w) = op_io(op_of(program, id));
                steps.push((fi, oi, r, w));
            }
            spans.push((start, steps.len()));
        }
        Flow { steps, spans }
    }

    /// The readers of the value `v` written at step `s`, up to its next writer: step indices,
    /// or `None` when something other than an op of the forward reads it (a download, the
    /// host after the last frame).
    fn readers(&self, frames: &[Frame], program: &Program, s: usize, v: ValueId) -> Option<Vec<usize>> {
        let mut out = Vec::new();
        let mut frame = self.steps[s].0;
        for (t, (fi, _, r, w)) in self.steps.iter().enumerate().skip(s + 1) {
            if *fi != frame {
                // Leaving frame `frame`: its downloads read its last write of v.
                if frames[frame].downloads.contains(&v) {
                    return None;
                }
                frame = *fi;
            }
            if r.contains(&v) {
                out.push(t);
            }
            if w.contains(&v) {
                return Some(out);
            }
        }
        if frames[frame].downloads.contains(&v) || v == program.logits {
            return None;
        }
        Some(out)
    }

    /// Whether any step in `from..to` writes one of `vs`.
    fn written_between(&self, from: usize, to: usize, vs: &[ValueId]) -> bool {
        self.steps[from..to].iter().any(|(_, _, _, w)| w.iter().any(|v| vs.contains(v)))
    }
}

/// The recording plan of every frame (empty for host frames): `fusions(..)[f][i]` says how
/// op `i` of frame `f` is recorded.
pub(super) fn fusions(program: &Program, frames: &[Frame]) -> Vec<Vec<Fused>> {
    let flow = Flow::new(program, frames);
    let width = |v: ValueId| program.value(v).width;
    let mut plan: Vec<Vec<Fused>> =
        frames.iter().map(|f| vec![Fused::Alone; if f.place == Place::Host { 0 } else { f.ops.len() }]).collect();
    for (fi, f) in frames.iter().enumerate() {
        if f.place == Place::Host {
            continue;
        }
        let base = flow.spans[fi].0;
        let op = |i: usize| op_of(program, f.ops[i]);
        let is_linear_reading = |t: usize, v: ValueId| {
            let (tf, ti, _, _) = flow.steps[t];
            tf == fi && matches!(op(ti), Op::Linear { x, .. } if *x == v)
        };
        // Residual adds first (they look at the product's output only): a bias-free Linear's,
        // or the routed experts' summed output.
        for i in 0..f.ops.len().saturating_sub(1) {
            let (x, o, fused) = match op(i) {
                Op::Linear { x, out, bias: None, .. } => (x, out, Fused::Linear { input: None, residual: Some(i + 1) }),
                Op::RoutedExperts { x, out, .. } => {
                    (x, out, Fused::Experts { input: None, residual: Some(i + 1), route: None })
                }
                _ => continue,
            };
            let Op::Add { a, b, out } = op(i + 1) else { continue };
            let r = if a == o && b != o {
                *b
            } else if b == o && a != o {
                *a
            } else {
                continue;
            };
            if width(r) != width(*o) || out == x {
                continue;
            }
            let dead = flow.readers(frames, program, base + i, *o).is_some_and(|rs| rs == [base + i + 1]);
            if dead && plan[fi][i + 1] == Fused::Alone {
                plan[fi][i] = fused;
                plan[fi][i + 1] = Fused::Absorbed;
            }
        }
        let is_experts_reading = |t: usize, v: ValueId| {
            let (tf, ti, _, _) = flow.steps[t];
            tf == fi && matches!(op(ti), Op::RoutedExperts { x, .. } if *x == v)
        };
        // Input transforms.
        for i in 0..f.ops.len() {
            let (out, sources) = match op(i) {
                // A scaled norm (`rms_norm_scaled`) has no fused form: it stays a call of its own.
                Op::RmsNorm { x, out, group, scale, weight: Some(_), .. }
                    if *group == width(*x) && out != x && *scale == 1.0 =>
                {
                    (*out, vec![*x])
                }
                Op::Glu { gate, up, out, .. } => (*out, vec![*gate, *up]),
                _ => continue,
            };
            let Some(rs) = flow.readers(frames, program, base + i, out) else { continue };
            // The routed experts take a norm (into their 8-bit activations), not a gated unit.
            let norm = matches!(op(i), Op::RmsNorm { .. });
            if rs.is_empty() || !rs.iter().all(|&t| is_linear_reading(t, out) || (norm && is_experts_reading(t, out))) {
                continue;
            }
            let last = *rs.last().expect("not empty");
            if flow.written_between(base + i + 1, last, &sources) {
                continue;
            }
            // A product's store must not land on a source it reads (the experts read theirs
            // into their quantized activations before their store).
            let clash = rs.iter().filter(|&&t| !is_experts_reading(t, out)).any(|&t| {
                let ti = flow.steps[t].1;
                let dest = match plan[fi][ti] {
                    Fused::Linear { residual: Some(j), .. } | Fused::Experts { residual: Some(j), .. } => match op(j) {
                        Op::Add { out, .. } => *out,
                        _ => unreachable!("residuals are Adds"),
                    },
                    _ => match op(ti) {
                        Op::Linear { out, .. } | Op::RoutedExperts { out, .. } => *out,
                        _ => unreachable!("readers are Linears or routed experts"),
                    },
                };
                sources.contains(&dest)
            });
            if clash {
                continue;
            }
            plan[fi][i] = Fused::Absorbed;
            for &t in &rs {
                let ti = flow.steps[t].1;
                plan[fi][ti] = match (plan[fi][ti], op(ti)) {
                    (Fused::Linear { residual, .. }, _) => Fused::Linear { input: Some(i), residual },
                    (Fused::Experts { residual, route, .. }, _) => Fused::Experts { input: Some(i), residual, route },
                    (_, Op::RoutedExperts { .. }) => Fused::Experts { input: Some(i), residual: None, route: None },
                    _ => Fused::Linear { input: Some(i), residual: None },
                };
            }
        }
        // A routing made by the experts that read it: the Route writing their routing, read by
        // no op between (the experts' first kernel writes it for later readers and downloads),
        // its logits written by none.
        for j in 0..f.ops.len() {
            let Op::RoutedExperts { routing, .. } = op(j) else { continue };
            let Some(i) = (0..j).rev().find(|&i| op_io(op(i)).1.contains(routing)) else { continue };
            let Op::Route { logits, hash: None, shared: 0, scale_by: None, .. } = op(i) else { continue };
            let read_between = flow.steps[base + i + 1..base + j].iter().any(|(_, _, r, _)| r.contains(routing));
            if plan[fi][i] != Fused::Alone || read_between || flow.written_between(base + i + 1, base + j, &[*logits]) {
                continue;
            }
            plan[fi][i] = Fused::Absorbed;
            plan[fi][j] = match plan[fi][j] {
                Fused::Experts { input, residual, .. } => Fused::Experts { input, residual, route: Some(i) },
                _ => Fused::Experts { input: None, residual: None, route: Some(i) },
            };
        }
        // Two norms in a row that do not touch each other's output (a layer's q and k norms):
        // one dispatch. Not in the epilogue (a forward whose last row only is wanted records
        // its norm on that row).
        let mut i = 0;
        while i + 1 < f.ops.len() {
            let pairable = match (op(i), op(i + 1)) {
                (
                    Op::RmsNorm { x: xa, out: oa, eps: ea, offset: fa, scale: sa, weight: Some(_), .. },
                    Op::RmsNorm { x: xb, out: ob, eps: eb, offset: fb, scale: sb, weight: Some(_), .. },
                ) => {
                    *sa == 1.0
                        && *sb == 1.0
                        && ea == eb
                        && fa == fb
                        && xb != oa
                        && xa != ob
                        && oa != ob
                        && f.ops[i].part != Part::Epilogue
                        && f.ops[i + 1].part != Part::Epilogue
                }
                _ => false,
            };
            if pairable && plan[fi][i] == Fused::Alone && plan[fi][i + 1] == Fused::Alone {
                plan[fi][i] = Fused::NormPair { second: i + 1 };
                plan[fi][i + 1] = Fused::Absorbed;
                i += 2;
            } else {
                i += 1;
            }
        }
        // RoPE and the KV append with attention.
        for j in 0..f.ops.len() {
            let Op::Attention { q, k, spec, .. } = op(j) else { continue };
            let mut rope = None;
            if j >= 2 {
                let pair = |a: usize, b: usize| match (op(a), op(b)) {
                    (
                        Op::Rope {
                            x: xa,
                            heads: ha,
                            head_dim: da,
                            rotary_dim: ra,
                            style: sa,
                            theta: ta,
                            scaling: ca,
                            tail: false,
                            inverse: false,
                        },
                        Op::Rope {
                            x: xb,
                            heads: hb,
                            head_dim: db,
                            rotary_dim: rb,
                            style: sb,
                            theta: tb,
                            scaling: cb,
                            tail: false,
                            inverse: false,
                        },
                    ) if xa == q
                        && xb == k
                        && ha == &spec.heads
                        && hb == &spec.kv_heads
                        && da == &spec.head_dim
                        && db == da
                        && ra == rb
                        && sa == sb
                        && ta == tb
                        && ca == cb =>
                    {
                        Some((a, b))
                    }
                    _ => None,
                };
                rope = pair(j - 2, j - 1).or_else(|| pair(j - 1, j - 2));
                if rope.is_some_and(|(a, b)| plan[fi][a] != Fused::Alone || plan[fi][b] != Fused::Alone) {
                    rope = None;
                }
            }
            if let Some((a, b)) = rope {
                plan[fi][a] = Fused::Absorbed;
                plan[fi][b] = Fused::Absorbed;
            }
            let dead = |v: ValueId| flow.readers(frames, program, base + j, v).is_some_and(|r| r.is_empty());
            let one_kernel = rope.is_none() || (dead(*q) && dead(*k));
            // The q and k norms right before the ropes: a NormPair (or two lone norms) writing
            // q and k, over whole rows or heads, read by nothing but the ropes and this op.
            let mut norms = None;
            if let (Some((ra, rb)), true) = (rope, one_kernel) {
                let first = ra.min(rb);
                if first >= 2 {
                    let (x, y) = (first - 2, first - 1);
                    let norm_of = |i: usize| match op(i) {
                        Op::RmsNorm { x: nx, out, group, eps, offset, scale, weight: Some(_), .. } if *scale == 1.0 => {
                            Some((*nx, *out, *group, *eps, *offset))
                        }
                        _ => None,
                    };
                    if let (Some(a), Some(b)) = (norm_of(x), norm_of(y)) {
                        let (qi, ki, qn, kn) = if a.1 == *q && b.1 == *k {
                            (x, y, a, b)
                        } else if a.1 == *k && b.1 == *q {
                            (y, x, b, a)
                        } else {
                            (x, x, a, a)
                        };
                        let groups_ok = (qn.2 == width(*q) || qn.2 == spec.head_dim)
                            && (kn.2 == width(*k) || kn.2 == spec.head_dim);
                        let paired = matches!((plan[fi][x], plan[fi][y]), (Fused::NormPair { second }, Fused::Absorbed) if second == y)
                            || (plan[fi][x] == Fused::Alone && plan[fi][y] == Fused::Alone);
                        // Between the norms and this op, q and k are read only by the ropes.
                        let only_ropes = |v: ValueId, i: usize| {
                            flow.readers(frames, program, base + i, v)
                                .is_some_and(|rs| rs.iter().all(|&t| t == base + ra || t == base + rb || t == base + j))
                        };
                        if qi != ki
                            && groups_ok
                            && paired
                            && qn.3 == kn.3
                            && qn.4 == kn.4
                            && qn.0 != *k
                            && kn.0 != *q
                            && only_ropes(*q, qi)
                            && only_ropes(*k, ki)
                        {
                            norms = Some((qi, ki));
                        }
                    }
                }
            }
            if let Some((qi, ki)) = norms {
                plan[fi][qi] = Fused::Absorbed;
                plan[fi][ki] = Fused::Absorbed;
            }
            plan[fi][j] = Fused::Attention { rope, one_kernel, norms };
        }
    }
    plan
}

/// Whether a device frame's recording depends on nothing but the row count and the positions
/// (so one recording can be replayed at every decode step): every op is one the executor
/// records with fixed shapes. Routing and resident experts qualify: the experts a step uses
/// are read on the device from the routing buffer, never recorded.
pub(super) fn replayable(program: &Program, frame: &Frame) -> bool {
    frame.place != Place::Host
        && frame.ops.iter().all(|&id| {
            matches!(
                op_of(program, id),
                Op::Embed { .. }
                    | Op::RmsNorm { .. }
                    | Op::Linear { .. }
                    | Op::Rope { .. }
                    | Op::Attention { .. }
                    | Op::Act { .. }
                    | Op::Glu { .. }
                    | Op::Add { .. }
                    | Op::Mul { .. }
                    | Op::Route { .. }
                    | Op::RoutedExperts { .. }
                    | Op::Mla { .. }
                    | Op::Indexer { .. }
                    | Op::LinearAttention { .. }
                    | Op::HyperPre { .. }
                    | Op::HyperPost { .. }
                    | Op::GroupedLinear { .. }
            )
        })
}

/// A device frame's calls, from its ops and their fusion plan (`fusions`).
pub(super) fn device_calls(program: &Program, frame: &Frame, plan: &[Fused]) -> Vec<Call> {
    let op = |i: usize| op_of(program, frame.ops[i]);
    let norm = |i: usize| match op(i) {
        Op::RmsNorm { x, out, weight: Some(weight), eps, group, offset, .. } => {
            Some(Norm { x: *x, out: *out, weight: weight.clone(), eps: *eps, group: *group, offset: *offset })
        }
        _ => None,
    };
    let residual = |j: Option<usize>, product: ValueId| match j.map(op) {
        Some(Op::Add { a, b, out }) => Some(Residual { other: if *a == product { *b } else { *a }, sum: *out }),
        _ => None,
    };
    let mut calls = Vec::new();
    for (i, &id) in frame.ops.iter().enumerate() {
        let rows = if id.part == Part::Epilogue { Rows::Tail } else { Rows::All };
        let kernel = match (plan.get(i).copied().unwrap_or(Fused::Alone), op(i)) {
            (Fused::Absorbed, _) => continue,
            (Fused::Linear { input, residual: r }, Op::Linear { x, out, weight, bias }) => {
                let src = match input.map(op) {
                    Some(Op::RmsNorm { .. }) => MatSrc::Norm(norm(input.expect("an input")).expect("a norm")),
                    Some(Op::Glu { gate, up, kind, .. }) => MatSrc::Glu { gate: *gate, up: *up, kind: *kind },
                    _ => MatSrc::Plain,
                };
                Kernel::Matmul(Matmul {
                    x: *x,
                    src,
                    weight: weight.clone(),
                    bias: bias.clone(),
                    out: *out,
                    residual: residual(r, *out),
                })
            }
            (
                f @ (Fused::Experts { .. } | Fused::Alone),
                Op::RoutedExperts { x, routing, out, layer, experts, ffn, weights, glu },
            ) => {
                let (input, r, route) = match f {
                    Fused::Experts { input, residual, route } => (input, residual, route),
                    _ => (None, None, None),
                };
                Kernel::Experts(Box::new(ExpertsCall {
                    x: *x,
                    routing: *routing,
                    out: *out,
                    layer: *layer,
                    experts: *experts,
                    ffn: *ffn,
                    weights: weights.clone(),
                    glu: *glu,
                    norm: input.and_then(norm),
                    residual: residual(r, *out),
                    route: route.map(|i| op(i).clone()),
                }))
            }
            (Fused::NormPair { second }, Op::RmsNorm { .. }) => {
                Kernel::NormPair(norm(i).expect("a norm"), norm(second).expect("a norm pair's second op is a norm"))
            }
            (Fused::Attention { rope, one_kernel, norms }, Op::Attention { q, k, v, out, layer, spec }) => {
                let rope = match rope.map(|(a, _)| op(a)) {
                    Some(Op::Rope { rotary_dim, style, theta, scaling, .. }) => {
                        Some(RopeArgs { rotary_dim: *rotary_dim, style: *style, theta: *theta, scaling: *scaling })
                    }
                    _ => None,
                };
                let norms = norms.and_then(|(qi, ki)| Some((norm(qi)?, norm(ki)?)));
                Kernel::Attention(Box::new(AttentionCall {
                    q: *q,
                    k: *k,
                    v: *v,
                    out: *out,
                    layer: *layer,
                    spec: spec.clone(),
                    rope,
                    one_kernel,
                    norms,
                }))
            }
            (_, o) => Kernel::Op(o.clone()),
        };
        calls.push(Call { kernel, rows });
    }
    calls
}
