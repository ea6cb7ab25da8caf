//! Rotary position embeddings: the inverse frequencies (with the checkpoint's scaling) and
//! their application to rows of heads, in both pair layouts. Pure functions.

use coli_compiler::ir::{RopeScaling, RopeStyle};

/// Inverse frequencies of one head's `rotary_dim / 2` pairs, and the factor that multiplies
/// cos and sin (YaRN's attention factor; 1 otherwise). Computed in f32 the way the reference
/// implementations do, so that angles agree bit for bit where possible.
pub fn inv_freq(rotary_dim: usize, theta: f32, scaling: RopeScaling) -> (Vec<f32>, f32) {
    let half = rotary_dim / 2;
    let base: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32)).collect();
    match scaling {
        RopeScaling::None => (base, 1.0),
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
            let old = original_max_position as f32;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            let out = base
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (out, 1.0)
        }
        RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, attention_factor, truncate } => {
            let dim = rotary_dim as f32;
            let correction = |rot: f32| {
                dim * (original_max_position as f32 / (rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (low, high) = (correction(beta_fast), correction(beta_slow));
            let (low, high) = if truncate { (low.floor(), high.ceil()) } else { (low, high) };
            let low = low.max(0.0);
            let mut high = high.min(dim - 1.0);
            if low == high {
                high += 0.001;
            }
            let out = base
                .iter()
                .enumerate()
                .map(|(i, &extra)| {
                    let inter = extra / factor;
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let extra_factor = 1.0 - ramp;
                    inter * (1.0 - extra_factor) + extra * extra_factor
                })
                .collect();
            (out, attention_factor)
        }
    }
}

/// Rotates the first `rotary_dim` columns of each head of one row, at position `pos`.
pub fn apply_row(row: &mut [f32], head_dim: usize, style: RopeStyle, inv_freq: &[f32], mscale: f32, pos: usize) {
    let half = inv_freq.len();
    let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
        .iter()
        .map(|&f| {
            let a = pos as f32 * f;
            (a.cos() * mscale, a.sin() * mscale)
        })
        .unzip();
    for head in row.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::RotateHalf => (i, i + half),
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x1 * cos[i] + x0 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let (f, m) = inv_freq(4, 10000.0, RopeScaling::None);
        let mut row = [1.0, 2.0, 3.0, 4.0];
        apply_row(&mut row, 4, RopeStyle::RotateHalf, &f, m, 0);
        assert_eq!(row, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn first_pair_rotates_by_position() {
        let (f, m) = inv_freq(4, 10000.0, RopeScaling::None);
        assert_eq!(f[0], 1.0);
        let mut row = [1.0, 0.0, 0.0, 0.0];
        apply_row(&mut row, 4, RopeStyle::Interleaved, &f, m, 1);
        assert!((row[0] - 1f32.cos()).abs() < 1e-6 && (row[1] - 1f32.sin()).abs() < 1e-6);
        let mut row = [1.0, 0.0, 0.0, 0.0];
        apply_row(&mut row, 4, RopeStyle::RotateHalf, &f, m, 1);
        assert!((row[0] - 1f32.cos()).abs() < 1e-6 && (row[2] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn partial_rotary_leaves_tail_alone() {
        let (f, m) = inv_freq(2, 10000.0, RopeScaling::None);
        let mut row = [1.0, 0.0, 5.0, 6.0];
        apply_row(&mut row, 4, RopeStyle::RotateHalf, &f, m, 3);
        assert_eq!(&row[2..], &[5.0, 6.0]);
    }

    #[test]
    fn rotation_preserves_norm() {
        let (f, m) = inv_freq(8, 500.0, RopeScaling::Linear { factor: 2.0 });
        let mut row: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 1.0).collect();
        let n0: f32 = row.iter().map(|v| v * v).sum();
        apply_row(&mut row, 8, RopeStyle::RotateHalf, &f, m, 1234);
        let n1: f32 = row.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() / n0 < 1e-5);
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies() {
        let s = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 8192 };
        let (plain, _) = inv_freq(64, 500000.0, RopeScaling::None);
        let (scaled, _) = inv_freq(64, 500000.0, s);
        assert_eq!(plain[0], scaled[0]);
        assert!((scaled[31] - plain[31] / 8.0).abs() < 1e-12);
    }
}
