//! Routed experts on the CPU: rows grouped by expert, each expert's gated FFN run as one
//! batched matmul over its rows, and every (row, rank) output summed into its row in rank
//! order, so the sum does not depend on which expert ran where or when.

use super::elementwise::glu;
use super::linear::{linear, Precision};
use crate::format::{pool, try_matmul_q_each, Matrix, QuantizedActs};
use coli_compiler::ir::GluKind;
use rayon::prelude::*;

/// The three matrices of one expert.
#[derive(Clone, Copy)]
pub struct ExpertMats<'a> {
    pub gate: Matrix<'a>,
    pub up: Matrix<'a>,
    pub down: Matrix<'a>,
    /// Biases added after each matrix (gpt-oss); none for most families.
    pub gate_bias: Option<&'a [f32]>,
    pub up_bias: Option<&'a [f32]>,
    pub down_bias: Option<&'a [f32]>,
}

/// Adds `bias` to every row of `rows` (its length a multiple of the bias's).
fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in rows.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}

/// Runs one expert over `rows` (row indices into `x`, width `hidden`), writing its output
/// (not yet weighted) for each row into `outs` (`rows.len() x hidden`).
pub fn expert_ffn(
    m: &ExpertMats,
    kind: GluKind,
    precision: Precision,
    x: &[f32],
    hidden: usize,
    rows: &[usize],
    outs: &mut [f32],
) {
    let n = rows.len();
    let ffn = m.gate.rows;
    let mut xs = vec![0.0f32; n * hidden];
    for (i, &r) in rows.iter().enumerate() {
        xs[i * hidden..(i + 1) * hidden].copy_from_slice(&x[r * hidden..(r + 1) * hidden]);
    }
    let mut g = vec![0.0f32; n * ffn];
    let mut u = vec![0.0f32; n * ffn];
    linear(&m.gate, &xs, n, &mut g, precision);
    linear(&m.up, &xs, n, &mut u, precision);
    add_bias(&mut g, m.gate_bias);
    add_bias(&mut u, m.up_bias);
    let mut h = vec![0.0f32; n * ffn];
    glu(kind, &g, &u, &mut h);
    linear(&m.down, &h, n, outs, precision);
    add_bias(outs, m.down_bias);
}

impl<'a> ExpertMats<'a> {
    /// Shared expert `s` of a routed-experts op (no biases).
    pub fn shared(
        ws: &'a crate::store::weights::WeightStore,
        w: &coli_compiler::ir::SharedExperts,
        s: usize,
    ) -> ExpertMats<'a> {
        ExpertMats {
            gate: ws.expert(&w.gate, s),
            up: ws.expert(&w.up, s),
            down: ws.expert(&w.down, s),
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        }
    }

    /// Expert `e` of a routing over `routed` experts and, after them, the op's shared ones
    /// (Inkling: the routing weighs them too).
    pub fn routed_or_shared(
        ws: &'a crate::store::weights::WeightStore,
        w: &coli_compiler::ir::ExpertWeights,
        routed: usize,
        e: usize,
    ) -> ExpertMats<'a> {
        match &w.shared {
            Some(s) if e >= routed => ExpertMats::shared(ws, s, e - routed),
            _ => ExpertMats::of(ws, w, e),
        }
    }

    /// Expert `e` of a `RoutedExperts` op's weights.
    pub fn of(
        ws: &'a crate::store::weights::WeightStore,
        w: &coli_compiler::ir::ExpertWeights,
        e: usize,
    ) -> ExpertMats<'a> {
        let bias = |b: &Option<coli_compiler::ir::ExpertBias>| b.as_ref().map(|b| ws.expert_bias(b, e));
        ExpertMats {
            gate: ws.expert(&w.gate, e),
            up: ws.expert(&w.up, e),
            down: ws.expert(&w.down, e),
            gate_bias: bias(&w.gate_bias),
            up_bias: bias(&w.up_bias),
            down_bias: bias(&w.down_bias),
        }
    }
}

/// The expert of pair (row `r`, rank `k`) in a routing of `top_k` `(expert, weight)` pairs a row.
pub fn pair_expert(routing: &[f32], top_k: usize, r: usize, k: usize) -> usize {
    routing[r * 2 * top_k + 2 * k] as usize
}

/// One expert's pairs (row, rank) and their output rows.
type GroupRows = (Vec<(usize, usize)>, Vec<f32>);

/// A MoE step's rows: `x` (`n x hidden`) and `routing` (per row `top_k` pairs `(expert,
/// weight)`).
#[derive(Clone, Copy)]
pub struct Routed<'r> {
    pub x: &'r [f32],
    pub n: usize,
    pub hidden: usize,
    pub routing: &'r [f32],
    pub top_k: usize,
}

/// `out[r] = sum over ranks k of weight[r,k] * expert[r,k](x[r])`. `expert(e)` gives expert
/// `e`'s matrices.
pub fn routed_experts<'a>(
    rows: Routed,
    kind: GluKind,
    precision: Precision,
    expert: &(dyn Fn(usize) -> ExpertMats<'a> + Sync),
    out: &mut [f32],
) {
    let Routed { n, hidden, routing, top_k, .. } = rows;
    let pairs: Vec<(usize, usize)> = (0..n).flat_map(|r| (0..top_k).map(move |k| (r, k))).collect();
    let mut table = vec![0.0f32; n * top_k * hidden];
    pair_outputs(rows, &pairs, kind, precision, expert, &mut table);
    join_ranks(routing, n, top_k, hidden, &table, out);
}

/// Below this many rows the experts run one after another, each matmul on the whole thread
/// team; from it on, experts run side by side (each small matmul then splits across a team
/// already busy). Measured on pymoe-22m (2 cores, alternated, 3 rounds): forwards of 2 rows
/// 706-3,800 -> 3,521-4,610 tok/s, of 4 rows 2,461-2,793 -> 3,956-4,622 (docs/BENCHMARKS.md).
const SERIAL_GROUP_ROWS: usize = 8;

/// The fewest rows a run of a cut expert gets: `format::TILE_ROWS`, from which the q8 matmul
/// takes the AMX tiles where the CPU has them.
const MIN_RUN: usize = crate::format::TILE_ROWS;

/// Runs the experts of `pairs` ((row, rank), grouped here by expert, each expert one batched
/// matmul over its rows) and writes each pair's output, not weighted, into its row of `table`
/// (`(r * top_k + k) x hidden`). Other rows of the table are left as they were.
pub fn pair_outputs<'a>(
    rows: Routed,
    pairs: &[(usize, usize)],
    kind: GluKind,
    precision: Precision,
    expert: &(dyn Fn(usize) -> ExpertMats<'a> + Sync),
    table: &mut [f32],
) {
    let Routed { x, n, hidden, routing, top_k } = rows;
    let mut by_expert: std::collections::BTreeMap<usize, Vec<(usize, usize)>> = Default::default();
    for &(r, k) in pairs {
        by_expert.entry(pair_expert(routing, top_k, r, k)).or_default().push((r, k));
    }
    let groups: Vec<(usize, Vec<(usize, usize)>)> = by_expert.into_iter().collect();
    let results: Vec<GroupRows> = if n < SERIAL_GROUP_ROWS {
        // Decode and a few rows (a checked draft): every expert's gate and up in one job of the
        // thread team, then every down in another, where the formats allow.
        match few_rows(&groups, x, hidden, kind, precision, expert) {
            Some(outs) => groups.into_iter().map(|g| g.1).zip(outs).collect(),
            None => {
                groups.into_iter().map(|(e, pairs)| run_group(e, pairs, x, hidden, kind, precision, expert)).collect()
            }
        }
    } else {
        // Experts side by side on rayon's threads, each expert's matmuls on its own thread
        // (one tile a matrix: the kernels' team beside rayon's threads would put a third thread
        // on two cores); an expert with more than a thread's share of the pairs is split into
        // runs of its rows (each row's sums are the same bits in any run), so a skewed routing
        // still keeps every thread busy.
        split_groups(groups, pairs.len(), rayon::current_num_threads())
            .into_par_iter()
            .map(|(e, pairs)| pool::inline(|| run_group(e, pairs, x, hidden, kind, precision, expert)))
            .collect()
    };
    for (pairs, outs) in results {
        for (i, &(r, k)) in pairs.iter().enumerate() {
            table[(r * top_k + k) * hidden..][..hidden].copy_from_slice(&outs[i * hidden..(i + 1) * hidden]);
        }
    }
}

/// Joins the pairs' outputs (`table`, as `pair_outputs` writes it) to their rows: for each
/// row, from zero, `out[r] += weight[r,k] * table[r,k]` in rank order, whichever side
/// computed the pair.
pub fn join_ranks(routing: &[f32], n: usize, top_k: usize, hidden: usize, table: &[f32], out: &mut [f32]) {
    let row = |r: usize, o: &mut [f32]| {
        o.iter_mut().for_each(|v| *v = 0.0);
        for k in 0..top_k {
            let w = routing[r * 2 * top_k + 2 * k + 1];
            for (v, &t) in o.iter_mut().zip(&table[(r * top_k + k) * hidden..][..hidden]) {
                *v += w * t;
            }
        }
    };
    // Rows are independent (each summed in rank order): in parallel for a prompt's many rows.
    if n >= 16 {
        out[..n * hidden].par_chunks_mut(hidden).enumerate().for_each(|(r, o)| row(r, o));
    } else {
        out[..n * hidden].chunks_mut(hidden).enumerate().for_each(|(r, o)| row(r, o));
    }
}

/// `groups` with every group of more than half a thread's share of `total` pairs (and more
/// than `SERIAL_GROUP_ROWS`) cut into even runs about that long, in expert order, none shorter
/// than `MIN_RUN` (runs of fewer rows would leave the AMX tiles for slower kernels).
fn split_groups(
    groups: Vec<(usize, Vec<(usize, usize)>)>,
    total: usize,
    threads: usize,
) -> Vec<(usize, Vec<(usize, usize)>)> {
    let most = total.div_ceil(2 * threads.max(1)).max(SERIAL_GROUP_ROWS);
    let mut out = Vec::with_capacity(groups.len());
    for (e, pairs) in groups {
        let runs = pairs.len().div_ceil(most).min(pairs.len() / MIN_RUN).max(1);
        // `runs` runs of `len / runs` or one more: each at least `MIN_RUN` when cut.
        let (base, extra) = (pairs.len() / runs, pairs.len() % runs);
        let mut at = 0;
        for i in 0..runs {
            let len = base + usize::from(i < extra);
            out.push((e, pairs[at..at + len].to_vec()));
            at += len;
        }
    }
    out
}

/// The experts of `groups` over their rows as `expert_ffn` computes each (the same bits), with
/// two jobs of the thread team in all: every gate and up, then every down. `None` where a
/// matrix does not take 8-bit activations or the precision is not `Fast` (`linear`'s paths).
fn few_rows<'a>(
    groups: &[(usize, Vec<(usize, usize)>)],
    x: &[f32],
    hidden: usize,
    kind: GluKind,
    precision: Precision,
    expert: &(dyn Fn(usize) -> ExpertMats<'a> + Sync),
) -> Option<Vec<Vec<f32>>> {
    let mats: Vec<ExpertMats> = groups.iter().map(|g| expert(g.0)).collect();
    let q8 = |m: &Matrix| m.format.uses_q8_acts(m.cols);
    if precision != Precision::Fast || !mats.iter().all(|m| q8(&m.gate) && q8(&m.up) && q8(&m.down)) {
        return None;
    }
    let ffn: Vec<usize> = mats.iter().map(|m| m.gate.rows).collect();
    let acts: Vec<QuantizedActs> = groups
        .iter()
        .map(|(_, pairs)| {
            let xs: Vec<f32> = pairs.iter().flat_map(|&(r, _)| &x[r * hidden..(r + 1) * hidden]).copied().collect();
            QuantizedActs::new(&xs, pairs.len(), hidden)
        })
        .collect::<Result<_, _>>()
        .ok()?;
    let mut g: Vec<Vec<f32>> = groups.iter().zip(&ffn).map(|((_, p), &f)| vec![0.0; p.len() * f]).collect();
    let mut u = g.clone();
    let mut jobs: Vec<(Matrix, &QuantizedActs, &mut [f32])> = Vec::with_capacity(2 * groups.len());
    for (((m, a), gi), ui) in mats.iter().zip(&acts).zip(g.iter_mut()).zip(u.iter_mut()) {
        jobs.push((m.gate, a, gi));
        jobs.push((m.up, a, ui));
    }
    try_matmul_q_each(&mut jobs).ok()?;
    let mut hs = Vec::with_capacity(groups.len());
    for ((m, gi), ui) in mats.iter().zip(&mut g).zip(&mut u) {
        add_bias(gi, m.gate_bias);
        add_bias(ui, m.up_bias);
        let mut h = vec![0.0f32; gi.len()];
        glu(kind, gi, ui, &mut h);
        hs.push(h);
    }
    let hq: Vec<QuantizedActs> = hs
        .iter()
        .zip(groups)
        .zip(&ffn)
        .map(|((h, (_, p)), &f)| QuantizedActs::new(h, p.len(), f))
        .collect::<Result<_, _>>()
        .ok()?;
    let mut outs: Vec<Vec<f32>> = groups.iter().map(|(_, p)| vec![0.0; p.len() * hidden]).collect();
    let mut jobs: Vec<(Matrix, &QuantizedActs, &mut [f32])> =
        mats.iter().zip(&hq).zip(outs.iter_mut()).map(|((m, a), o)| (m.down, a, o.as_mut_slice())).collect();
    try_matmul_q_each(&mut jobs).ok()?;
    for (m, o) in mats.iter().zip(&mut outs) {
        add_bias(o, m.down_bias);
    }
    Some(outs)
}

fn run_group<'a>(
    e: usize,
    pairs: Vec<(usize, usize)>,
    x: &[f32],
    hidden: usize,
    kind: GluKind,
    precision: Precision,
    expert: &(dyn Fn(usize) -> ExpertMats<'a> + Sync),
) -> (Vec<(usize, usize)>, Vec<f32>) {
    let rows: Vec<usize> = pairs.iter().map(|p| p.0).collect();
    let mut outs = vec![0.0f32; rows.len() * hidden];
    expert_ffn(&expert(e), kind, precision, x, hidden, &rows, &mut outs);
    (pairs, outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{quantize, WeightFormat};

    const HIDDEN: usize = 64;
    const FFN: usize = 32;
    const EXPERTS: usize = 6;
    const TOP_K: usize = 2;

    fn vals(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7919 + seed * 104729) % 2003) as f32 / 1001.0 - 1.0).collect()
    }

    /// Every expert's gate, up and down in `format`.
    fn weights(format: WeightFormat) -> Vec<[Vec<u8>; 3]> {
        (0..EXPERTS)
            .map(|e| {
                [
                    quantize(format, &vals(FFN * HIDDEN, 3 * e), HIDDEN).unwrap(),
                    quantize(format, &vals(FFN * HIDDEN, 3 * e + 1), HIDDEN).unwrap(),
                    quantize(format, &vals(HIDDEN * FFN, 3 * e + 2), FFN).unwrap(),
                ]
            })
            .collect()
    }

    fn mats(format: WeightFormat, w: &[[Vec<u8>; 3]], e: usize) -> ExpertMats<'_> {
        ExpertMats {
            gate: Matrix::new(format, FFN, HIDDEN, &w[e][0]).unwrap(),
            up: Matrix::new(format, FFN, HIDDEN, &w[e][1]).unwrap(),
            down: Matrix::new(format, HIDDEN, FFN, &w[e][2]).unwrap(),
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        }
    }

    /// `pair_outputs` over `n` rows whose first rank is expert 0 and whose second spreads over
    /// the rest, checked pair by pair against `expert_ffn` over all of its expert's rows at once.
    fn check_against_each_expert(format: WeightFormat, n: usize) {
        let w = weights(format);
        let expert = |e: usize| mats(format, &w, e);
        let x = vals(n * HIDDEN, 99);
        let mut routing = vec![0f32; n * 2 * TOP_K];
        for r in 0..n {
            routing[r * 2 * TOP_K + 2] = (1 + r % (EXPERTS - 1)) as f32;
            routing[r * 2 * TOP_K + 1] = 0.7;
            routing[r * 2 * TOP_K + 3] = 0.3;
        }
        let rows = Routed { x: &x, n, hidden: HIDDEN, routing: &routing, top_k: TOP_K };
        let pairs: Vec<(usize, usize)> = (0..n).flat_map(|r| (0..TOP_K).map(move |k| (r, k))).collect();
        let mut table = vec![0f32; n * TOP_K * HIDDEN];
        pair_outputs(rows, &pairs, GluKind::SwiGlu, Precision::Fast, &expert, &mut table);
        for e in 0..EXPERTS {
            let mine: Vec<(usize, usize)> =
                pairs.iter().copied().filter(|&(r, k)| pair_expert(&routing, TOP_K, r, k) == e).collect();
            let rows: Vec<usize> = mine.iter().map(|p| p.0).collect();
            let mut outs = vec![0f32; rows.len() * HIDDEN];
            expert_ffn(&expert(e), GluKind::SwiGlu, Precision::Fast, &x, HIDDEN, &rows, &mut outs);
            for (i, &(r, k)) in mine.iter().enumerate() {
                let got = &table[(r * TOP_K + k) * HIDDEN..][..HIDDEN];
                assert_eq!(got, &outs[i * HIDDEN..(i + 1) * HIDDEN], "{format}, {n} rows: expert {e}, pair ({r}, {k})");
            }
        }
    }

    /// A hot expert (every row's first rank) is cut into runs of its rows on rayon's threads:
    /// each pair still gets the bits of its expert run over all of that expert's rows at once.
    #[test]
    fn a_hot_expert_cut_into_runs_gives_the_bits_of_one_run() {
        let n = 40;
        let hot: Vec<(usize, usize)> = (0..n).map(|r| (r, 0)).collect();
        assert!(split_groups(vec![(0, hot)], n * TOP_K, 2).len() > 1, "expert 0's {n} pairs are cut into runs");
        for format in [WeightFormat::Q8_0, WeightFormat::F32] {
            check_against_each_expert(format, n);
        }
    }

    /// A cut group's runs are at least `MIN_RUN` rows (the tiles' threshold) and cover the
    /// group in order.
    #[test]
    fn cut_runs_are_never_shorter_than_the_tile_rows() {
        for len in [17, 31, 32, 33, 40, 65, 100, 257] {
            for (total, threads) in [(len, 2), (4 * len, 2), (len, 16), (8 * len, 16)] {
                let pairs: Vec<(usize, usize)> = (0..len).map(|r| (r, 0)).collect();
                let runs = split_groups(vec![(3, pairs.clone())], total, threads);
                let joined: Vec<(usize, usize)> = runs
                    .iter()
                    .flat_map(|(e, p)| {
                        assert_eq!(*e, 3);
                        p.clone()
                    })
                    .collect();
                assert_eq!(joined, pairs, "{len} pairs, {total} in all, {threads} threads");
                if runs.len() > 1 {
                    assert!(
                        runs.iter().all(|r| r.1.len() >= MIN_RUN),
                        "{len} pairs: {:?}",
                        runs.iter().map(|r| r.1.len()).collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    /// A few rows (decode, a checked draft) run every expert's gate and up in one job and every
    /// down in another (8-bit formats; float formats take each expert's own matmuls): the
    /// bits of each expert run alone.
    #[test]
    fn a_few_rows_in_two_jobs_give_the_bits_of_each_expert_alone() {
        for n in [1, 3, 7] {
            for format in [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::F32] {
                check_against_each_expert(format, n);
            }
        }
    }
}
