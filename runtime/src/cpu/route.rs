//! Router: from a row's router logits to its top-k (expert, weight) pairs. Softmax, sigmoid
//! or `sqrt(softplus)` scores, a correction bias that steers the choice only, group-limited
//! top-k, renormalization and a routed scaling factor. Ties break toward the lower expert
//! index. Hash routing (DeepSeek V4) takes its experts from a table instead of a top-k.

use coli_compiler::ir::{GroupScore, RouterScoring};

/// Options of one routing, as the program's `Route` op carries them.
#[derive(Clone, Copy, Debug)]
pub struct RouteSpec<'a> {
    pub scoring: RouterScoring,
    pub top_k: usize,
    pub renormalize: bool,
    pub correction_bias: Option<&'a [f32]>,
    pub groups: Option<(usize, usize)>,
    pub group_score: GroupScore,
    pub scale: f32,
}

/// Writes `top_k` pairs `(expert as f32, weight)` into `out` (`2 * top_k` floats), by rank.
pub fn route_row(spec: &RouteSpec, logits: &[f32], out: &mut [f32]) {
    let n = logits.len();
    let scores: Vec<f32> = match spec.scoring {
        RouterScoring::Softmax => {
            let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&l| (l - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
        RouterScoring::Sigmoid => logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
        RouterScoring::SqrtSoftplus => logits.iter().map(|&l| softplus(l).sqrt()).collect(),
    };
    let mut choice: Vec<f32> = match spec.correction_bias {
        Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => scores.clone(),
    };
    if let Some((n_group, topk_group)) = spec.groups {
        let per = n / n_group;
        // A group's score: the sum of its two best choice scores, or its best.
        let best = match spec.group_score {
            GroupScore::TopTwoSum => 2,
            GroupScore::Max => 1,
        };
        let mut gs: Vec<(usize, f32)> = (0..n_group)
            .map(|g| {
                let mut v: Vec<f32> = choice[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                (g, v.iter().take(best).sum())
            })
            .collect();
        gs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let keep: Vec<usize> = gs.iter().take(topk_group).map(|g| g.0).collect();
        for (i, c) in choice.iter_mut().enumerate() {
            if !keep.contains(&(i / per)) {
                *c = f32::NEG_INFINITY;
            }
        }
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    let chosen = &idx[..spec.top_k];
    let mut w: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
    if spec.renormalize {
        let s: f32 = w.iter().sum::<f32>() + if spec.scoring == RouterScoring::Softmax { 0.0 } else { 1e-20 };
        w.iter_mut().for_each(|x| *x /= s);
    }
    for (r, (&e, &wt)) in chosen.iter().zip(&w).enumerate() {
        out[2 * r] = e as f32;
        out[2 * r + 1] = wt * spec.scale;
    }
}

/// `ln(1 + e^x)` as torch computes it (`x` past 20: `x`).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Hash routing: the experts `ids` (a row of the table, as f32) in order, each weighed by its
/// score, renormalised (plus 1e-20) where the spec says so, times the scale.
pub fn route_row_hash(spec: &RouteSpec, ids: &[f32], logits: &[f32], out: &mut [f32]) {
    let score = |l: f32| match spec.scoring {
        RouterScoring::Sigmoid => 1.0 / (1.0 + (-l).exp()),
        RouterScoring::SqrtSoftplus => softplus(l).sqrt(),
        RouterScoring::Softmax => {
            let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            (l - m).exp() / logits.iter().map(|&v| (v - m).exp()).sum::<f32>()
        }
    };
    let w: Vec<f32> = ids.iter().map(|&e| logits.get(e as usize).map_or(0.0, |&l| score(l))).collect();
    let norm = if spec.renormalize { w.iter().sum::<f32>() + 1e-20 } else { 1.0 };
    for (r, (&e, &wt)) in ids.iter().zip(&w).enumerate() {
        out[2 * r] = e;
        out[2 * r + 1] = wt / norm * spec.scale;
    }
}

/// A routing with `shared` experts whose logits follow the routed ones' (Inkling's sink):
/// the top-k among the routed logits as `route_row` chooses them, then the shared experts'
/// pairs `(routed + s, weight)`; every weight is its score (sigmoid scoring), renormalised over
/// the chosen and the shared together when the spec says so, times the scale and `scale_by`.
/// `out`: `2 * (top_k + shared)` floats.
pub fn route_row_shared(spec: &RouteSpec, shared: usize, scale_by: f32, logits: &[f32], out: &mut [f32]) {
    let routed = logits.len() - shared;
    let plain = RouteSpec { renormalize: false, scale: 1.0, ..*spec };
    let k = spec.top_k;
    route_row(&plain, &logits[..routed], &mut out[..2 * k]);
    for s in 0..shared {
        out[2 * (k + s)] = (routed + s) as f32;
        out[2 * (k + s) + 1] = 1.0 / (1.0 + (-logits[routed + s]).exp());
    }
    let sum: f32 = (0..k + shared).map(|r| out[2 * r + 1]).sum();
    let norm = if spec.renormalize { 1.0 / sum } else { 1.0 };
    for r in 0..k + shared {
        out[2 * r + 1] *= norm * spec.scale * scale_by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scoring: RouterScoring, top_k: usize, renormalize: bool) -> RouteSpec<'static> {
        RouteSpec {
            scoring,
            top_k,
            renormalize,
            correction_bias: None,
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.0,
        }
    }

    #[test]
    fn softmax_top2_without_renormalize_keeps_full_softmax_weights() {
        let mut out = [0.0; 4];
        route_row(&spec(RouterScoring::Softmax, 2, false), &[0.0, 2.0, 1.0, 0.0], &mut out);
        let z = 2.0 + 2f32.exp() + 1f32.exp();
        assert_eq!((out[0], out[2]), (1.0, 2.0));
        assert!((out[1] - 2f32.exp() / z).abs() < 1e-6 && (out[3] - 1f32.exp() / z).abs() < 1e-6);
    }

    /// DeepSeek V4: scores `sqrt(softplus)`, chosen with the bias, weighed without it,
    /// renormalised and scaled.
    #[test]
    fn sqrt_softplus_scores_choose_with_the_bias_and_weigh_without() {
        let bias = [0.0, 0.0, 0.0, 1.0];
        let s = RouteSpec { correction_bias: Some(&bias), scale: 1.5, ..spec(RouterScoring::SqrtSoftplus, 2, true) };
        let logits = [0.5, 2.0, -1.0, 0.0];
        let mut out = [0.0; 4];
        route_row(&s, &logits, &mut out);
        let score = |x: f32| (1.0 + x.exp()).ln().sqrt();
        assert_eq!((out[0], out[2]), (3.0, 1.0));
        let z = score(0.0) + score(2.0);
        assert!((out[1] - score(0.0) / z * 1.5).abs() < 1e-6, "{out:?}");
        assert!((out[3] - score(2.0) / z * 1.5).abs() < 1e-6, "{out:?}");
        assert_eq!(softplus(30.0), 30.0);
    }

    #[test]
    fn hash_routing_takes_the_table_row_in_order() {
        let s = RouteSpec { scale: 2.0, ..spec(RouterScoring::SqrtSoftplus, 2, true) };
        let logits = [3.0, -2.0, 0.5];
        let mut out = [0.0; 4];
        route_row_hash(&s, &[2.0, 1.0], &logits, &mut out);
        let score = |x: f32| (1.0 + x.exp()).ln().sqrt();
        let z = score(0.5) + score(-2.0);
        assert_eq!((out[0], out[2]), (2.0, 1.0));
        assert!((out[1] - score(0.5) / z * 2.0).abs() < 1e-6 && (out[3] - score(-2.0) / z * 2.0).abs() < 1e-6);
    }

    #[test]
    fn renormalized_weights_sum_to_one() {
        let mut out = [0.0; 4];
        route_row(&spec(RouterScoring::Softmax, 2, true), &[0.3, 2.0, 1.0, -1.0], &mut out);
        assert!((out[1] + out[3] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn correction_bias_steers_choice_not_weight() {
        let bias = [0.0, 0.0, 10.0, 0.0];
        let s = RouteSpec { correction_bias: Some(&bias), ..spec(RouterScoring::Sigmoid, 1, false) };
        let mut out = [0.0; 2];
        route_row(&s, &[1.0, 2.0, 0.0, 0.0], &mut out);
        assert_eq!(out[0], 2.0);
        assert!((out[1] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn group_limit_excludes_weak_groups() {
        // groups {0,1} and {2,3}; best single expert 0 sits in the weaker group.
        let s = RouteSpec { groups: Some((2, 1)), ..spec(RouterScoring::Sigmoid, 2, false) };
        let mut out = [0.0; 4];
        route_row(&s, &[5.0, -5.0, 3.0, 3.0], &mut out);
        assert_eq!((out[0], out[2]), (2.0, 3.0));
    }

    #[test]
    fn group_max_keeps_the_group_with_the_best_single_score() {
        // groups {0,1} and {2,3}: by the sum of two {2,3} wins, by the best one {0,1}.
        let logits = [5.0, -5.0, 3.0, 3.0];
        for (by, want) in [(GroupScore::TopTwoSum, (2.0, 3.0)), (GroupScore::Max, (0.0, 1.0))] {
            let s = RouteSpec { groups: Some((2, 1)), group_score: by, ..spec(RouterScoring::Sigmoid, 2, false) };
            let mut out = [0.0; 4];
            route_row(&s, &logits, &mut out);
            assert_eq!((out[0], out[2]), want, "{by:?}");
        }
    }

    #[test]
    fn shared_experts_join_the_normalisation_not_the_choice() {
        // Routed logits [0, 3, 1], one shared logit 5 (it would win a choice); the bias moves
        // the choice to expert 2; weights sigmoid / (sum over expert 2 and the shared one).
        let bias = [0.0, 0.0, 1.0];
        let s = RouteSpec {
            correction_bias: Some(&bias),
            renormalize: true,
            scale: 2.0,
            ..spec(RouterScoring::Sigmoid, 1, true)
        };
        let mut out = [0.0; 4];
        route_row_shared(&s, 1, 0.5, &[0.0, 3.0, 1.0, 5.0], &mut out);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let z = sig(1.0) + sig(5.0);
        assert_eq!((out[0], out[2]), (2.0, 3.0));
        assert!((out[1] - sig(1.0) / z).abs() < 1e-6 && (out[3] - sig(5.0) / z).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn scale_multiplies_weights() {
        let s = RouteSpec { scale: 2.5, ..spec(RouterScoring::Softmax, 1, true) };
        let mut out = [0.0; 2];
        route_row(&s, &[1.0, 0.0], &mut out);
        assert!((out[1] - 2.5).abs() < 1e-6);
    }
}
