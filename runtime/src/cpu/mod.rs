//! The CPU op library: every op of the program IR over f32 rows, weights in their checkpoint
//! format (the format module multiplies in block form). Parallel on the format module's
//! thread team where it pays (matmuls, attention, SwiGLU, activation quantization).
//! This library is the reference every device path is checked against: it favours plain,
//! obviously-correct code over cleverness, except in the matmul kernels.

pub mod attention;
pub mod attn_part;
pub mod compress;
pub mod deltanet;
pub mod elementwise;
pub mod experts;
pub mod hyper;
pub mod indexer;
pub mod kda;
pub mod linear;
pub mod mla;
pub mod norm;
pub mod rope;
pub mod route;
pub mod short_conv;

use crate::format::{dequant_row, matmul_multi, Matrix, QuantizedActs, WeightFormat};
use crate::oplib::{op_name, OpLib};
use crate::store::kv::KvCache;
use crate::store::weights::WeightStore;
use coli_compiler::ir::{LinearAttentionKind, Op, ValueId};
use coli_compiler::schedule::LinearOut;
pub use linear::Precision;
use std::cell::RefCell;

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOps;

impl OpLib for CpuOps {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn supports(&self, _op: &Op, _format: Option<WeightFormat>) -> bool {
        true
    }
}

/// What an op runs against: `n` rows at positions `pos0..pos0+n`, the program's row buffers,
/// the KV cache and the weights.
pub struct Env<'a> {
    pub n: usize,
    pub pos0: usize,
    pub tokens: &'a [u32],
    pub values: &'a mut [Vec<f32>],
    pub widths: &'a [usize],
    pub kv: &'a mut KvCache,
    pub weights: &'a WeightStore,
    pub precision: Precision,
}

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("the CPU op library cannot run {0} yet")]
    Unsupported(&'static str),
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("op {op} lacks its weight role `{role}`")]
    MissingRole { op: &'static str, role: String },
    #[error("layer {layer}'s recurrent state is at {at}, the block starts at position {want}; a recurrent state goes back only to position 0")]
    RecurrentState { layer: usize, at: String, want: usize },
    #[error("the forward's input holds {have} floats, {rows} rows of {width} are needed (a draft model runs from its target's rows)")]
    MissingInput { rows: usize, width: usize, have: usize },
    #[error("layer {layer}'s KV compressor holds {held} positions, the block starts at position {want}")]
    CompressedRows { layer: usize, held: usize, want: usize },
}

impl Env<'_> {
    fn width(&self, v: ValueId) -> usize {
        self.widths[v.0 as usize]
    }

    /// Takes `out` out of the buffer table, sized for `n` rows (its old contents are kept
    /// when the size already matches, so in-place ops can read them).
    fn take(&mut self, v: ValueId) -> Vec<f32> {
        let len = self.n * self.width(v);
        let mut b = std::mem::take(&mut self.values[v.0 as usize]);
        b.resize(len, 0.0);
        b
    }

    fn put(&mut self, v: ValueId, b: Vec<f32>) {
        self.values[v.0 as usize] = b;
    }

    fn get(&self, v: ValueId) -> &[f32] {
        &self.values[v.0 as usize][..self.n * self.width(v)]
    }

    /// The input `v` as an owned copy when it aliases `out`, else borrowed (via the closure).
    fn with_input<R>(&mut self, v: ValueId, out: ValueId, f: impl FnOnce(&[f32], &mut Vec<f32>) -> R) -> R {
        let mut o = self.take(out);
        let r = if v == out {
            let copy = o.clone();
            f(&copy, &mut o)
        } else {
            f(self.get(v), &mut o)
        };
        self.put(out, o);
        r
    }
}

/// Buffers reused across ops on one thread: the quantized activations of the last matmul
/// input and the RoPE angle table (both fully rewritten before use; the table is keyed by
/// everything it depends on).
#[derive(Default)]
struct Scratch {
    acts: QuantizedActs,
    angles: rope::AngleCache,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `Linear`s reading the same input `x` (q/k/v, gate/up; the schedule's
/// `Kernel::Linears`) at `Precision::Fast`: one quantization of `x`, one parallel pass over all
/// matrices.
pub fn run_linears(x: ValueId, outs: &[LinearOut], env: &mut Env) {
    let n = env.n;
    // Each product's matrix, output rows and bias.
    type Product<'w> = (Matrix<'w>, Vec<f32>, Option<&'w [f32]>);
    let mut mats: Vec<Product> = Vec::with_capacity(outs.len());
    for o in outs {
        let m = env.weights.matrix(&o.weight.name);
        let b = o.bias.as_ref().map(|b| env.weights.vector(&b.name));
        mats.push((m, env.take(o.out), b));
    }
    SCRATCH.with(|sc| {
        let acts = &mut sc.borrow_mut().acts;
        let mut outs: Vec<(Matrix, &mut [f32])> = mats.iter_mut().map(|(m, o, _)| (*m, o.as_mut_slice())).collect();
        matmul_multi(&mut outs, env.get(x), n, acts);
    });
    for (o, (_, mut rows, b)) in outs.iter().zip(mats) {
        if let Some(b) = b {
            for row in rows.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
            }
        }
        env.put(o.out, rows);
    }
}

/// Runs one op on the CPU.
pub fn run_op(op: &Op, env: &mut Env) -> Result<(), CpuError> {
    let n = env.n;
    match op {
        Op::Embed { out, table, scale } => {
            let t = env.weights.matrix(&table.name);
            let (vocab, width) = (t.rows, t.cols);
            let mut o = env.take(*out);
            for (i, &id) in env.tokens.iter().enumerate() {
                if id as usize >= vocab {
                    return Err(CpuError::TokenOutOfRange { id, vocab });
                }
                let row = &mut o[i * width..(i + 1) * width];
                dequant_row(t.format, t.row(id as usize), row);
                if *scale != 1.0 {
                    row.iter_mut().for_each(|v| *v *= scale);
                }
            }
            env.put(*out, o);
        }
        Op::RmsNorm { x, out, weight, eps, group, offset, scale } => {
            // Unweighted: a weight of ones.
            let ones;
            let w = match weight {
                Some(weight) => env.weights.vector(&weight.name),
                None => {
                    ones = vec![1f32; *group];
                    &ones
                }
            };
            debug_assert_eq!(w.len(), *group);
            env.with_input(*x, *out, |xs, o| {
                norm::rms_norm(xs, o, w, *eps, *offset);
                if *scale != 1.0 {
                    o.iter_mut().for_each(|v| *v *= scale);
                }
            });
        }
        Op::LayerNorm { x, out, weight, bias, eps } => {
            let w = env.weights.vector(&weight.name);
            let b = bias.as_ref().map(|b| env.weights.vector(&b.name));
            env.with_input(*x, *out, |xs, o| norm::layer_norm(xs, o, w, b, *eps));
        }
        Op::Linear { x, out, weight, bias } => {
            let precision = env.precision;
            let m = env.weights.matrix(&weight.name);
            let b = bias.as_ref().map(|b| env.weights.vector(&b.name));
            env.with_input(*x, *out, |xs, o| {
                linear::linear(&m, xs, n, o, precision);
                if let Some(b) = b {
                    for row in o.chunks_exact_mut(b.len()) {
                        row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
                    }
                }
            });
        }
        Op::Rope { x, heads, head_dim, rotary_dim, style, theta, scaling, tail, inverse } => {
            let w = env.width(*x);
            let pos0 = env.pos0;
            let mut b = env.take(*x);
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                let table = sc.angles.get(*rotary_dim, *theta, *scaling, pos0, n);
                let cw = 2 * (rotary_dim / 2);
                let part = rope::Part {
                    heads: *heads,
                    head_dim: *head_dim,
                    rotary_dim: *rotary_dim,
                    tail: *tail,
                    inverse: *inverse,
                };
                for (row, cs) in b.chunks_exact_mut(w).zip(table.chunks_exact(cw.max(1))) {
                    rope::rotate_part(row, &part, *style, cs);
                }
            });
            env.put(*x, b);
        }
        Op::GroupedLinear { x, out, weight, groups } => {
            let precision = env.precision;
            let m = env.weights.matrix(&weight.name);
            env.with_input(*x, *out, |xs, o| hyper::grouped_linear(&m, *groups, xs, n, o, precision));
        }
        Op::HyperPre { x, out, mix, spec } => {
            let w = hyper::HyperWeights {
                fn_weight: env.weights.matrix(&spec.fn_weight.name),
                base: env.weights.vector(&spec.base.name),
                scale: env.weights.vector(&spec.scale.name),
            };
            let xs = env.get(*x).to_vec();
            let mut o = env.take(*out);
            let mut m = mix.map(|m| env.take(m));
            hyper::hyper_pre(spec, &w, &xs, n, &mut o, m.as_deref_mut());
            env.put(*out, o);
            if let (Some(v), Some(m)) = (mix, m) {
                env.put(*v, m);
            }
        }
        Op::HyperPost { x, residual, mix, out, streams } => {
            let xs = env.get(*x).to_vec();
            let m = mix.map(|m| env.get(m).to_vec());
            // In place where the residual is the output.
            let res = residual.filter(|r| r != out).map(|r| env.get(r).to_vec());
            let mut o = env.take(*out);
            hyper::hyper_post(&xs, res.as_deref(), m.as_deref(), *streams, n, &mut o);
            env.put(*out, o);
        }
        Op::Attention { q, k, v, out, layer, spec } => {
            let l = layer.0 as usize;
            let kv = &mut env.kv.layers[l];
            if kv.len() != env.pos0 {
                // The cache must hold exactly the positions before this block.
                kv.truncate(env.pos0);
            }
            let (kw, vw) = (env.widths[k.0 as usize], env.widths[v.0 as usize]);
            kv.append(&env.values[k.0 as usize][..n * kw], &env.values[v.0 as usize][..n * vw]);
            let shape = attention::AttnShape::of(spec);
            let sinks = spec.sinks.as_ref().map(|s| env.weights.vector(&s.name));
            if let Some(c) = &spec.compressed {
                let mut o = std::mem::take(&mut env.values[out.0 as usize]);
                o.resize(n * spec.heads * spec.v_head_dim, 0.0);
                let kv = &env.kv.layers[l];
                let rows = kv.compress.first().map_or(&[][..], |c| &c.entries[..]);
                let select = c
                    .select
                    .map(|s| (&env.values[s.0 as usize][..n * env.widths[s.0 as usize]], env.widths[s.0 as usize]));
                let entries = compress::Entries { rows, rate: c.rate, select };
                let q = &env.values[q.0 as usize][..n * spec.heads * spec.head_dim];
                compress::attend(shape, q, (&kv.k, &kv.v), &entries, env.pos0, sinks, &mut o);
                env.values[out.0 as usize] = o;
                return Ok(());
            }
            // Inkling's relative logits: each row's states mixed into one logit per distance.
            let rel = spec.rel.as_ref().map(|r| {
                let states = &env.values[r.r.0 as usize][..n * spec.heads * r.d_rel];
                attention::rel_logits(states, env.weights.vector(&r.proj.name), spec.heads, r.d_rel, r.extent)
            });
            let bias = rel
                .as_deref()
                .zip(spec.rel.as_ref())
                .map(|(logits, r)| attention::RelBias { logits, extent: r.extent });
            let mut o = std::mem::take(&mut env.values[out.0 as usize]);
            o.resize(n * spec.heads * spec.v_head_dim, 0.0);
            let kv = &env.kv.layers[l];
            attention::attend_rel(
                shape,
                &env.values[q.0 as usize][..n * spec.heads * spec.head_dim],
                &kv.k,
                &kv.v,
                env.pos0,
                sinks,
                bias,
                &mut o,
            );
            // Scaled values (MiMo's `attention_value_scale`) scale the output alike; the cache
            // keeps the projections as they are.
            if spec.value_scale != 1.0 {
                o.iter_mut().for_each(|x| *x *= spec.value_scale);
            }
            env.values[out.0 as usize] = o;
        }
        Op::Act { x, out, act } => {
            env.with_input(*x, *out, |xs, o| {
                o.iter_mut().zip(xs).for_each(|(o, &v)| *o = elementwise::activate(*act, v))
            });
        }
        Op::Glu { gate, up, out, kind } => {
            if out != gate && out != up {
                let mut o = env.take(*out);
                elementwise::glu(*kind, env.get(*gate), env.get(*up), &mut o);
                env.put(*out, o);
            } else {
                let (g, u) = (env.get(*gate).to_vec(), env.get(*up).to_vec());
                let mut o = env.take(*out);
                elementwise::glu(*kind, &g, &u, &mut o);
                env.put(*out, o);
            }
        }
        // The host wrote the rows before the forward (`exec::Session::forward_from`).
        Op::Input { out } => {
            let (have, want) = (env.values[out.0 as usize].len(), n * env.width(*out));
            if have < want {
                return Err(CpuError::MissingInput { rows: n, width: env.width(*out), have });
            }
        }
        Op::Concat { a, b, out } => {
            let (wa, wb) = (env.width(*a), env.width(*b));
            let (av, bv) = (env.get(*a).to_vec(), env.get(*b).to_vec());
            let mut o = env.take(*out);
            for (r, row) in o.chunks_exact_mut(wa + wb).enumerate() {
                row[..wa].copy_from_slice(&av[r * wa..(r + 1) * wa]);
                row[wa..].copy_from_slice(&bv[r * wb..(r + 1) * wb]);
            }
            env.put(*out, o);
        }
        Op::Add { a, b, out } => {
            // The residual adds run in place (`out == a`): no copy of either input.
            let (a, b) = if out == b && out != a { (b, a) } else { (a, b) };
            let mut o = env.take(*out);
            if a == out && b == out {
                o.iter_mut().for_each(|v| *v += *v);
            } else if a == out {
                o.iter_mut().zip(env.get(*b)).for_each(|(v, y)| *v += y);
            } else {
                o.iter_mut().zip(env.get(*a)).zip(env.get(*b)).for_each(|((v, x), y)| *v = x + y);
            }
            env.put(*out, o);
        }
        Op::Mul { a, b, out } => {
            let (wa, wb) = (env.width(*a), env.width(*b));
            let bv = env.get(*b).to_vec();
            env.with_input(*a, *out, |av, o| {
                for r in 0..n {
                    for c in 0..wa {
                        o[r * wa + c] = av[r * wa + c] * if wb == 1 { bv[r] } else { bv[r * wb + c] };
                    }
                }
            });
        }
        Op::Route {
            logits,
            out,
            scoring,
            top_k,
            renormalize,
            correction_bias,
            groups,
            group_score,
            scale,
            shared,
            scale_by,
            hash,
        } => {
            let bias = correction_bias.as_ref().map(|b| env.weights.vector(&b.name));
            let spec = route::RouteSpec {
                scoring: *scoring,
                top_k: *top_k,
                renormalize: *renormalize,
                correction_bias: bias,
                groups: *groups,
                group_score: *group_score,
                scale: *scale,
            };
            let lw = env.width(*logits);
            let by = scale_by.as_ref().map_or(1.0, |b| env.weights.vector(&b.name).first().copied().unwrap_or(1.0));
            let ow = 2 * (top_k + shared);
            let table = hash.as_ref().map(|h| (env.weights.vector(&h.name), h.shape[0]));
            let tokens = env.tokens;
            env.with_input(*logits, *out, |lg, o| {
                for r in 0..n {
                    let (l, o) = (&lg[r * lw..(r + 1) * lw], &mut o[r * ow..(r + 1) * ow]);
                    if let Some((table, vocab)) = table {
                        let id = tokens.get(r).copied().unwrap_or(u32::MAX);
                        if id as usize >= vocab {
                            return Err(CpuError::TokenOutOfRange { id, vocab });
                        }
                        let ids = &table[id as usize * top_k..][..*top_k];
                        route::route_row_hash(&spec, ids, l, o);
                    } else if *shared > 0 || scale_by.is_some() {
                        route::route_row_shared(&spec, *shared, by, l, o);
                    } else {
                        route::route_row(&spec, l, o);
                    }
                }
                Ok(())
            })?;
        }
        Op::RoutedExperts { x, routing, out, weights, glu, experts: count, .. } => {
            let hidden = env.width(*x);
            let top_k = env.width(*routing) / 2;
            let ws = env.weights;
            // Past the routed experts, the shared ones (Inkling: the routing weighs them too).
            let expert = |e: usize| experts::ExpertMats::routed_or_shared(ws, weights, *count, e);
            let (xs, rt) = (env.get(*x).to_vec(), env.get(*routing).to_vec());
            let mut o = env.take(*out);
            let rows = experts::Routed { x: &xs, n, hidden, routing: &rt, top_k };
            experts::routed_experts(rows, *glu, env.precision, &expert, &mut o);
            env.put(*out, o);
        }
        Op::Mla { x, out, layer, spec } => {
            let w = mla::MlaWeights::resolve(spec, env.weights)
                .map_err(|m| CpuError::MissingRole { op: op_name(op), role: m.0 })?;
            let xs = env.get(*x).to_vec();
            let sel = spec.select.map(|v| env.get(v).to_vec());
            let mut o = env.take(*out);
            let form = mla::MlaForm::for_rows(n);
            let call = mla::MlaCall { spec, weights: &w, precision: env.precision, form, select: sel.as_deref() };
            mla::mla(&call, &xs, n, env.pos0, &mut env.kv.layers[layer.0 as usize], &mut o);
            env.put(*out, o);
        }
        Op::Indexer { x, q, out, layer, spec } => {
            let w = indexer::IndexerWeights::resolve(spec, env.weights)
                .map_err(|role| CpuError::MissingRole { op: op_name(op), role })?;
            let (l, pos0) = (layer.0 as usize, env.pos0);
            let (xs, qs) = (env.get(*x).to_vec(), env.get(*q).to_vec());
            let lk = &mut env.kv.layers[l];
            lk.index_width = spec.head_dim;
            if lk.index.len() < pos0 * spec.head_dim {
                let at = format!("{} index keys", lk.index.len() / spec.head_dim);
                return Err(CpuError::RecurrentState { layer: l, at, want: pos0 });
            }
            let mut keys = std::mem::take(&mut lk.index);
            let mut o = env.take(*out);
            let rows = indexer::IndexerRows { x: &xs, q: &qs, n, pos0 };
            indexer::indexer(spec, &w, &rows, env.precision, &mut keys, &mut o);
            env.kv.layers[l].index = keys;
            env.put(*out, o);
        }
        Op::KvCompress { x, q, out, layer, spec } => {
            let w = compress::CompressWeights::resolve(spec, env.weights)
                .map_err(|role| CpuError::MissingRole { op: op_name(op), role })?;
            let (l, pos0) = (layer.0 as usize, env.pos0);
            let (xs, qs) = (env.get(*x).to_vec(), q.map(|q| env.get(q).to_vec()));
            let mut state = std::mem::take(&mut env.kv.layers[l].compress);
            let mut o = out.map(|o| env.take(o));
            let r = compress::kv_compress(
                spec,
                &w,
                (&xs, qs.as_deref(), n, pos0),
                env.precision,
                &mut state,
                o.as_deref_mut(),
            );
            env.kv.layers[l].compress = state;
            if let (Some(v), Some(o)) = (out, o) {
                env.put(*v, o);
            }
            if let Err(held) = r {
                return Err(CpuError::CompressedRows { layer: l, held, want: pos0 });
            }
        }
        Op::LinearAttention { x, out, layer, spec } => {
            let missing = |m: deltanet::MissingRole| CpuError::MissingRole { op: op_name(op), role: m.0 };
            if spec.kind == LinearAttentionKind::ShortConv {
                return run_short_conv(op, spec, (*x, *out, layer.0 as usize), env);
            }
            // The weights of the kind (resolved before any state moves).
            let (mut gdn, mut kdaw) = (None, None);
            match spec.kind {
                LinearAttentionKind::GatedDeltaNet => {
                    gdn = Some(deltanet::DeltaNetWeights::resolve(spec, env.weights).map_err(missing)?)
                }
                LinearAttentionKind::Kda => kdaw = Some(kda::KdaWeights::resolve(spec, env.weights).map_err(missing)?),
                LinearAttentionKind::ShortConv => {}
            }
            let (l, pos0) = (layer.0 as usize, env.pos0);
            let xs = env.get(*x).to_vec();
            let mut o = env.take(*out);
            let lk = &mut env.kv.layers[l];
            // A sequence starting at 0 starts from a zero state; else the state must be at pos0.
            if pos0 == 0 {
                lk.reset_state(spec.state_floats());
            } else if lk.state_len != Some(pos0) {
                let at = lk.state_len.map_or("unknown (truncated)".to_string(), |s| format!("position {s}"));
                env.put(*out, o);
                return Err(CpuError::RecurrentState { layer: l, at, want: pos0 });
            }
            // The state this step starts from stays at hand (a failed forward goes back to it).
            lk.keep_back();
            if let Some(w) = &gdn {
                let call = deltanet::DeltaNetCall { spec, weights: w, eps: spec.norm_eps, precision: env.precision };
                deltanet::gated_deltanet(&call, &xs, n, &mut lk.state, &mut o);
            } else if let Some(w) = &kdaw {
                let call = kda::KdaCall { spec, weights: w, eps: spec.norm_eps, precision: env.precision };
                kda::kda(&call, &xs, n, &mut lk.state, &mut o);
            }
            lk.state_len = Some(pos0 + n);
            env.put(*out, o);
        }
    }
    Ok(())
}

/// A short convolution (`LinearAttentionKind::ShortConv`) of `x` into `out` at layer `l`: its
/// input rows in the layer's cache (by the weight's name) cut to the block's first position,
/// then this block's appended; `input_scale` multiplies `x` first where the spec has one.
fn run_short_conv(
    op: &Op,
    spec: &coli_compiler::ir::LinearAttentionSpec,
    (x, out, l): (ValueId, ValueId, usize),
    env: &mut Env,
) -> Result<(), CpuError> {
    let role = |r: &str| spec.weights.iter().find(|(n, _)| n == r).map(|(_, w)| w);
    let w = role("conv1d").ok_or_else(|| CpuError::MissingRole { op: op_name(op), role: "conv1d".into() })?;
    let taps = env.weights.vector(&w.name);
    let by = role("input_scale").map_or(1.0, |s| env.weights.vector(&s.name).first().copied().unwrap_or(1.0));
    let (width, kernel, pos0) = (env.width(x), spec.conv_kernel, env.pos0);
    let mut xs = env.get(x).to_vec();
    if by != 1.0 {
        xs.iter_mut().for_each(|v| *v *= by);
    }
    let lk = &mut env.kv.layers[l];
    let at = match lk.conv.iter().position(|c| c.key == w.name) {
        Some(i) => i,
        None => {
            lk.conv.push(crate::store::kv::ConvRows { key: w.name.clone(), width, rows: Vec::new() });
            lk.conv.len() - 1
        }
    };
    let c = &mut lk.conv[at];
    if c.len() < pos0 {
        let at = format!("{} rows of its input", c.len());
        return Err(CpuError::RecurrentState { layer: l, at, want: pos0 });
    }
    c.rows.truncate(pos0 * width);
    let mut o = env.take(out);
    short_conv::short_conv(taps, kernel, &xs, width, &mut env.kv.layers[l].conv[at].rows, &mut o);
    env.put(out, o);
    Ok(())
}
