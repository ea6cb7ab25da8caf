//! A short convolution on a row stream (Inkling's `*_sconv`): per channel, a causal depthwise
//! convolution of the last `kernel` inputs (no bias, no activation), plus the input itself:
//! `out[t] = x[t] + sum_j w[c, j] * x[t - kernel + 1 + j]`, inputs before position 0 zero.
//!
//! The state is the caller's: the input rows of every earlier position (`store::kv::ConvRows`),
//! to which this block's rows are appended, so a rewind is a truncation. This module only
//! computes; it must not decide what the state holds.

/// Appends `x` (`n x width`, positions `pos0 ..`) to `hist` (the rows of positions `0 ..
/// pos0`) and writes `x + conv(x)` into `out`. `taps`: `[width, kernel]`, the oldest tap first.
pub fn short_conv(taps: &[f32], kernel: usize, x: &[f32], width: usize, hist: &mut Vec<f32>, out: &mut [f32]) {
    let pos0 = hist.len() / width.max(1);
    hist.extend_from_slice(x);
    let n = x.len() / width.max(1);
    for t in 0..n {
        let p = pos0 + t;
        let row = &mut out[t * width..(t + 1) * width];
        row.copy_from_slice(&x[t * width..(t + 1) * width]);
        for j in 0..kernel {
            // Tap `j` reads position `p + 1 + j - kernel`.
            let Some(src) = (p + 1 + j).checked_sub(kernel) else { continue };
            let xs = &hist[src * width..(src + 1) * width];
            for (c, (o, &v)) in row.iter_mut().zip(xs).enumerate() {
                *o += taps[c * kernel + j] * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    #[test]
    fn first_rows_see_zeros_before_the_start() {
        // One channel, taps [a, b, c]: out[0] = x0 + c x0, out[1] = x1 + b x0 + c x1.
        let taps = [0.5, -2.0, 3.0];
        let mut hist = Vec::new();
        let mut out = [0.0; 2];
        short_conv(&taps, 3, &[1.0, 2.0], 1, &mut hist, &mut out);
        assert_eq!(out, [1.0 + 3.0, 2.0 - 2.0 + 6.0]);
        assert_eq!(hist, vec![1.0, 2.0]);
    }

    #[test]
    fn chunks_equal_one_block() {
        let (w, k, n) = (5, 4, 11);
        let taps = data(w * k, 7);
        let x = data(n * w, 3);
        let mut whole = vec![0.0; n * w];
        short_conv(&taps, k, &x, w, &mut Vec::new(), &mut whole);
        for chunk in [1, 3, 4] {
            let mut hist = Vec::new();
            let mut got = Vec::new();
            for c in x.chunks(chunk * w) {
                let mut o = vec![0.0; c.len()];
                short_conv(&taps, k, c, w, &mut hist, &mut o);
                got.extend(o);
            }
            assert_eq!(got, whole, "chunk {chunk}");
        }
    }

    #[test]
    fn a_truncated_history_redoes_the_same_rows() {
        let (w, k) = (3, 4);
        let taps = data(w * k, 1);
        let x = data(6 * w, 2);
        let mut hist = Vec::new();
        let mut first = vec![0.0; 6 * w];
        short_conv(&taps, k, &x, w, &mut hist, &mut first);
        hist.truncate(2 * w);
        let mut again = vec![0.0; 4 * w];
        short_conv(&taps, k, &x[2 * w..], w, &mut hist, &mut again);
        assert_eq!(&first[2 * w..], &again[..]);
    }
}
