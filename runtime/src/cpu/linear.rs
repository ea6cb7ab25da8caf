//! `out = x W^T` for the CPU op library, in one of two precisions:
//! - `Precision::Fast`: the format module's kernels; integer formats multiply activations
//!   quantized to 8 bits per block of 32 (as llama.cpp does on the CPU).
//! - `Precision::Exact`: activations stay f32 for every format (each weight block decoded and
//!   multiplied in f32), so a quantized checkpoint matches a reference that dequantized it,
//!   up to the order of float operations. Slower; for checks against oracles.

use crate::format::{dequant_row, dot_row, matmul, Matrix};
use rayon::prelude::*;

/// How activations meet quantized weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    Fast,
    Exact,
}

/// `out[n x rows] = x[n x cols] * W^T`.
pub fn linear(w: &Matrix, x: &[f32], n: usize, out: &mut [f32], precision: Precision) {
    if precision == Precision::Fast || !w.format.uses_q8_acts(w.cols) {
        matmul(w, x, n, out);
        return;
    }
    let cols = w.cols;
    // Row-major by weight row, transposed at the end.
    let mut t = vec![0f32; w.rows * n];
    t.par_chunks_mut(n * 16).enumerate().for_each(|(c, chunk)| {
        let mut wf = vec![0f32; cols];
        for (k, o) in chunk.chunks_exact_mut(n).enumerate() {
            let row = w.row(c * 16 + k);
            if n == 1 {
                o[0] = dot_row(w.format, row, x);
            } else {
                dequant_row(w.format, row, &mut wf);
                for (i, v) in o.iter_mut().enumerate() {
                    *v = wf.iter().zip(&x[i * cols..(i + 1) * cols]).map(|(a, b)| a * b).sum();
                }
            }
        }
    });
    for (r, vals) in t.chunks_exact(n).enumerate() {
        for (i, &v) in vals.iter().enumerate() {
            out[i * w.rows + r] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{quantize, WeightFormat};

    #[test]
    fn exact_and_fast_agree_closely_and_exact_matches_dequantized_reference() {
        let (rows, cols, n) = (8, 64, 3);
        let wf: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 13 % 29) as f32 / 14.0) - 1.0).collect();
        let bytes = quantize(WeightFormat::I8Row, &wf, cols).unwrap();
        let m = Matrix::new(WeightFormat::I8Row, rows, cols, &bytes).unwrap();
        let mut deq = vec![0f32; cols];
        let mut want = vec![0f32; n * rows];
        for r in 0..rows {
            m.dequant_row(r, &mut deq).unwrap();
            for i in 0..n {
                want[i * rows + r] = deq.iter().zip(&x[i * cols..(i + 1) * cols]).map(|(a, b)| a * b).sum();
            }
        }
        let (mut exact, mut fast) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        linear(&m, &x, n, &mut exact, Precision::Exact);
        linear(&m, &x, n, &mut fast, Precision::Fast);
        for ((e, f), w) in exact.iter().zip(&fast).zip(&want) {
            assert!((e - w).abs() < 1e-4, "exact {e} vs reference {w}");
            assert!((f - w).abs() < 0.05, "fast {f} vs reference {w}");
        }
    }
}
