//! Runs a host frame's calls on the CPU op library: each `Kernel::Op` through `cpu::run_op`, a
//! `Linears` group through `cpu::run_linears` (one by one at `Precision::Exact`), and the routed
//! experts of a layer the expert tier serves through the tier, else of a layer the RAM expert
//! cache serves through the cache (`ramcache`). A call of the epilogue
//! (`Rows::Tail`) runs on the step's last row alone when only that row's logits are wanted:
//! its inputs' last rows go into a table of one-row buffers, and its outputs come back into
//! the last row of the step's buffers, so every buffer keeps the step's rows (a later device
//! frame may upload them) and the logits sit in the last row, as a device leaves them.
//!
//! A batched step (several sequences' rows, `Step::batch`) runs every call on all rows at once
//! but those that read a sequence's positions or cache (RoPE, attention, MLA, the indexer,
//! linear attention), which run on each sequence's rows in turn, the same way as the last row.
//!
//! Must not: run a fused kernel (the schedule gives host frames none) or decide placement.

use super::step::{HostRows, Step};
use super::{ExecError, LogitRows, Model};
use crate::cpu::experts::Routed;
use crate::cpu::{run_linears, run_op, Env, Precision};
use crate::tier::{ExpertTier, TierRunError, TierStep};
use coli_compiler::ir::op_io;
use coli_compiler::ir::{Op, ValueId};
use coli_compiler::schedule::{Call, Kernel, Rows};
use std::sync::Mutex;

/// The values a host call reads and writes.
fn call_io(kernel: &Kernel) -> (Vec<ValueId>, Vec<ValueId>) {
    match kernel {
        Kernel::Op(op) => op_io(op),
        Kernel::Linears { x, outs } => (vec![*x], outs.iter().map(|o| o.out).collect()),
        _ => (vec![], vec![]),
    }
}

/// Runs `calls` (a host frame's) for `step`.
pub(crate) fn run_frame(
    calls: &[Call],
    model: &Model,
    host: &mut HostRows,
    step: &Step,
    tier: Option<&Mutex<ExpertTier>>,
) -> Result<(), ExecError> {
    let n = step.tokens.len();
    for call in calls {
        if !step.batch.is_empty() && per_sequence(&call.kernel) {
            for (i, s) in step.batch.iter().enumerate() {
                run_on_rows(call, model, host, i, (s.rows.clone(), s.pos0), step, tier)?;
            }
        } else if call.rows == Rows::Tail && step.logits == LogitRows::Last && n > 1 && step.batch.is_empty() {
            run_on_rows(call, model, host, 0, (n - 1..n, step.pos0 + n - 1), step, tier)?;
        } else {
            let mut env = env(model, host.values, host.widths, host.kv, step, (step.pos0, step.tokens));
            run_call(&call.kernel, model, &mut env, tier)?;
        }
    }
    Ok(())
}

/// The CPU library's view of `rows`: the tokens at positions `pos0..` of `rows`.
fn env<'e>(
    model: &'e Model,
    values: &'e mut [Vec<f32>],
    widths: &'e [usize],
    kv: &'e mut crate::store::kv::KvCache,
    step: &Step,
    (pos0, tokens): (usize, &'e [u32]),
) -> Env<'e> {
    Env { n: tokens.len(), pos0, tokens, values, widths, kv, weights: &model.weights, precision: step.precision }
}

/// Whether a call reads a sequence's positions or cache (it runs per sequence in a batch).
fn per_sequence(kernel: &Kernel) -> bool {
    matches!(
        kernel,
        Kernel::Op(
            Op::Rope { .. }
                | Op::Attention { .. }
                | Op::Mla { .. }
                | Op::Indexer { .. }
                | Op::KvCompress { .. }
                | Op::LinearAttention { .. }
        )
    )
}

/// Runs `call` on `rows` of the step (positions `pos0..`) against the cache of sequence `seq`
/// of the step: the inputs' rows go into a table of their own, the outputs come back into
/// those rows (see the module doc).
fn run_on_rows(
    call: &Call,
    model: &Model,
    host: &mut HostRows,
    seq: usize,
    (rows, pos0): (std::ops::Range<usize>, usize),
    step: &Step,
    tier: Option<&Mutex<ExpertTier>>,
) -> Result<(), ExecError> {
    let n = step.tokens.len();
    let (reads, writes) = call_io(&call.kernel);
    let w = |v: ValueId| host.widths[v.0 as usize];
    let mut table: Vec<Vec<f32>> = vec![Vec::new(); host.values.len()];
    for &v in &reads {
        let all = &host.values[v.0 as usize];
        if all.len() >= rows.end * w(v) {
            table[v.0 as usize] = all[rows.start * w(v)..rows.end * w(v)].to_vec();
        }
    }
    let kv = if seq == 0 { &mut *host.kv } else { &mut *host.rest[seq - 1] };
    let mut env = env(model, &mut table, host.widths, kv, step, (pos0, &step.tokens[rows.clone()]));
    run_call(&call.kernel, model, &mut env, tier)?;
    for v in writes {
        let hv = &mut host.values[v.0 as usize];
        if hv.capacity() < n * w(v) {
            // A fresh zeroed allocation maps its pages lazily: the rows not computed cost nothing.
            *hv = vec![0.0; n * w(v)];
        }
        hv.resize(n * w(v), 0.0);
        hv[rows.start * w(v)..rows.end * w(v)].copy_from_slice(&table[v.0 as usize][..rows.len() * w(v)]);
    }
    Ok(())
}

/// Runs one call on `env`'s rows.
fn run_call(kernel: &Kernel, model: &Model, env: &mut Env, tier: Option<&Mutex<ExpertTier>>) -> Result<(), ExecError> {
    match kernel {
        Kernel::Linears { x, outs } => {
            if env.precision == Precision::Fast && env.n > 0 {
                run_linears(*x, outs, env);
            } else {
                for o in outs {
                    let op = Op::Linear { x: *x, out: o.out, weight: o.weight.clone(), bias: o.bias.clone() };
                    run_op(&op, env)?;
                }
            }
        }
        Kernel::Op(op @ Op::RoutedExperts { layer, x, routing, out, .. }) => {
            let l = layer.0 as usize;
            let ram = model.ram_cache();
            let mut tier = tier.map(ExpertTier::locked).filter(|t| t.serves(l));
            if tier.is_none() && !ram.is_some_and(|r| r.serves(l)) {
                run_op(op, env)?;
                return Ok(());
            }
            let (n, widths) = (env.n, env.widths);
            let v = &mut *env.values;
            let xs = v[x.0 as usize][..n * widths[x.0 as usize]].to_vec();
            let rt = v[routing.0 as usize][..n * widths[routing.0 as usize]].to_vec();
            let o = &mut v[out.0 as usize];
            o.resize(n * widths[out.0 as usize], 0.0);
            let o = &mut o[..n * widths[out.0 as usize]];
            match (tier.as_mut(), ram) {
                (Some(t), _) => {
                    let step = TierStep { op, x: &xs, routing: &rt, n, precision: env.precision };
                    t.run(&model.weights, ram, step, o).map_err(|e| match e {
                        TierRunError::Device(e) => ExecError::Device(e),
                        TierRunError::Ram(e) => ExecError::RamCache(e),
                    })?;
                }
                (None, Some(r)) => {
                    let top_k = widths[routing.0 as usize] / 2;
                    let rows = Routed { x: &xs, n, hidden: widths[x.0 as usize], routing: &rt, top_k };
                    r.run(&model.weights, op, rows, o, env.precision)?;
                }
                (None, None) => {}
            }
        }
        Kernel::Op(op) => run_op(op, env)?,
        other => {
            return Err(ExecError::Unsupported {
                lib: "cpu".into(),
                op: match other {
                    Kernel::Matmul(_) => "matmul (fused)",
                    Kernel::NormPair(..) => "rms_norm_pair",
                    Kernel::Attention(_) => "attention (fused)",
                    _ => "experts (fused)",
                },
                layer: "a host frame".into(),
            })
        }
    }
    Ok(())
}
