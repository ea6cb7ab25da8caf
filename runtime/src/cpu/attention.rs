//! Causal grouped-query attention of a block of query rows over one layer's KV rows, with a
//! sliding window and per-head sink logits where the spec has them. Parallel over
//! (row, head) with rayon. The KV rows are the caller's (the executor's cache); this module
//! only reads them.

use rayon::prelude::*;

/// Geometry and options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// `q`: `n x heads*head_dim`, row `i` at position `pos0 + i`. `k`, `v`: all cached rows of the
/// layer (`len x kv_heads*head_dim`, `len x kv_heads*v_head_dim`), including this block's.
/// `out`: `n x heads*v_head_dim`. `sinks`: one logit per head, or none.
pub fn attend(s: AttnShape, q: &[f32], k: &[f32], v: &[f32], pos0: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    let group = s.heads / s.kv_heads;
    let qw = s.heads * s.head_dim;
    let kw = s.kv_heads * s.head_dim;
    let vw = s.kv_heads * s.v_head_dim;
    let ow = s.heads * s.v_head_dim;
    out.par_chunks_mut(s.v_head_dim).enumerate().for_each(|(idx, o)| {
        let (row, h) = (idx / s.heads, idx % s.heads);
        let _ = ow;
        let p = pos0 + row;
        let lo = s.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let qh = &q[row * qw + h * s.head_dim..][..s.head_dim];
        let kvh = h / group;
        let mut scores: Vec<f32> = (lo..=p)
            .map(|j| {
                let kh = &k[j * kw + kvh * s.head_dim..][..s.head_dim];
                qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>() * s.scale
            })
            .collect();
        let mut m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sink = sinks.map(|sk| sk[h]);
        if let Some(sv) = sink {
            m = m.max(sv);
        }
        let mut l = 0.0f32;
        for sc in scores.iter_mut() {
            *sc = (*sc - m).exp();
            l += *sc;
        }
        if let Some(sv) = sink {
            l += (sv - m).exp();
        }
        o.iter_mut().for_each(|x| *x = 0.0);
        for (j, &w) in (lo..=p).zip(&scores) {
            let vh = &v[j * vw + kvh * s.v_head_dim..][..s.v_head_dim];
            for (x, &vv) in o.iter_mut().zip(vh) {
                *x += w * vv;
            }
        }
        let inv = 1.0 / l;
        o.iter_mut().for_each(|x| *x *= inv);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(window: Option<usize>) -> AttnShape {
        AttnShape { heads: 2, kv_heads: 1, head_dim: 2, v_head_dim: 2, scale: 1.0, window }
    }

    #[test]
    fn single_position_returns_its_value() {
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [0.5, 0.5];
        let v = [3.0, 4.0];
        let mut out = [0.0; 4];
        attend(shape(None), &q, &k, &v, 0, None, &mut out);
        assert_eq!(out, [3.0, 4.0, 3.0, 4.0]);
    }

    #[test]
    fn equal_scores_average_values() {
        let q = [0.0; 4];
        let k = [1.0, 2.0, 3.0, 4.0];
        let v = [2.0, 0.0, 4.0, 2.0];
        let mut out = [0.0; 4];
        attend(shape(None), &q, &k, &v, 1, None, &mut out);
        assert_eq!(out, [3.0, 1.0, 3.0, 1.0]);
    }

    #[test]
    fn window_hides_old_positions() {
        let q = [0.0; 4];
        let k = [0.0; 4];
        let v = [2.0, 0.0, 4.0, 2.0];
        let mut out = [0.0; 4];
        attend(shape(Some(1)), &q, &k, &v, 1, None, &mut out);
        assert_eq!(out, [4.0, 2.0, 4.0, 2.0]);
    }

    #[test]
    fn sink_takes_its_share_of_the_denominator() {
        let q = [0.0; 4];
        let k = [0.0; 2];
        let v = [1.0, 1.0];
        let mut out = [0.0; 4];
        // score 0 and sink 0: the value gets half the weight.
        attend(shape(None), &q, &k, &v, 0, Some(&[0.0, f32::NEG_INFINITY]), &mut out);
        assert!((out[0] - 0.5).abs() < 1e-6 && (out[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn causal_block_rows_see_only_the_past() {
        // two rows at positions 0 and 1; row 0 must not see position 1's value.
        let s = AttnShape { heads: 1, kv_heads: 1, head_dim: 1, v_head_dim: 1, scale: 1.0, window: None };
        let q = [0.0, 0.0];
        let k = [0.0, 0.0];
        let v = [1.0, 3.0];
        let mut out = [0.0; 2];
        attend(s, &q, &k, &v, 0, None, &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }
}
