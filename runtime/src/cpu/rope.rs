//! Rotary position embeddings: the inverse frequencies (with the checkpoint's scaling), their
//! angles per position (`angles`, cached across the ops of a forward by `AngleCache`), and
//! their application to rows of heads, in both pair layouts.

use coli_compiler::ir::{RopeScaling, RopeStyle};

/// Inverse frequencies of one head's `rotary_dim / 2` pairs, and the factor that multiplies
/// cos and sin (YaRN's attention factor; 1 otherwise). Computed in f32 the way the reference
/// implementations do, so that angles agree bit for bit where possible.
pub fn inv_freq(rotary_dim: usize, theta: f32, scaling: RopeScaling) -> (Vec<f32>, f32) {
    let half = rotary_dim / 2;
    let base: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32)).collect();
    match scaling {
        RopeScaling::None => (base, 1.0),
        // Angle 0 at every position: cos 1 and sin 0, the identity in f32.
        RopeScaling::NoPe => (vec![0.0; half], 1.0),
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
    let mut cs = vec![0f32; 2 * inv_freq.len()];
    angles(inv_freq, mscale, pos, &mut cs);
    rotate(row, head_dim, style, &cs);
}

/// `cos * mscale` then `sin * mscale` of each pair's angle at `pos` (`out`: `2 * half`).
pub fn angles(inv_freq: &[f32], mscale: f32, pos: usize, out: &mut [f32]) {
    let half = inv_freq.len();
    for (i, &f) in inv_freq.iter().enumerate() {
        let a = pos as f32 * f;
        out[i] = a.cos() * mscale;
        out[half + i] = a.sin() * mscale;
    }
}

/// Rotates each head of `row` by the angles of `cs` (as `angles` writes them); nothing for a
/// rotary width of 0.
pub fn rotate(row: &mut [f32], head_dim: usize, style: RopeStyle, cs: &[f32]) {
    if head_dim == 0 {
        return;
    }
    let half = cs.len() / 2;
    let (cos, sin) = cs.split_at(half);
    for head in row.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::RotateHalf => {
                let (x0s, rest) = head.split_at_mut(half);
                for (i, (x0, x1)) in x0s.iter_mut().zip(&mut rest[..half]).enumerate() {
                    let (a, b) = (*x0, *x1);
                    *x0 = a * cos[i] - b * sin[i];
                    *x1 = b * cos[i] + a * sin[i];
                }
            }
            RopeStyle::Interleaved => {
                for (i, pair) in head[..2 * half].chunks_exact_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * cos[i] - b * sin[i];
                    pair[1] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}

/// Which columns of a row's heads RoPE rotates, and which way.
pub struct Part {
    pub heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    /// The last `rotary_dim` columns of each head (DeepSeek V4's `[nope | rope]`), not the first.
    pub tail: bool,
    /// By the opposite angles: the conjugate rotation, which undoes the rotation.
    pub inverse: bool,
}

/// Rotates the heads of `row` as `part` says, by the angles of `cs` (as `angles` writes them).
pub fn rotate_part(row: &mut [f32], part: &Part, style: RopeStyle, cs: &[f32]) {
    let conj: Vec<f32>;
    let cs = if part.inverse {
        let half = cs.len() / 2;
        conj = cs.iter().enumerate().map(|(i, &v)| if i < half { v } else { -v }).collect();
        &conj
    } else {
        cs
    };
    let (hd, rd) = (part.head_dim, part.rotary_dim);
    let heads = &mut row[..part.heads * hd];
    if part.tail {
        for head in heads.chunks_exact_mut(hd) {
            rotate(&mut head[hd - rd..], rd, style, cs);
        }
    } else {
        rotate(heads, hd, style, cs);
    }
}

/// The angles of positions `pos0..pos0 + n` for one rotary configuration, computed once and
/// reused by every RoPE op of a forward that asks for the same ones (q and k, every layer).
#[derive(Default)]
pub struct AngleCache {
    key: Option<(usize, u32, RopeScaling, usize, usize)>,
    table: Vec<f32>,
}

impl AngleCache {
    /// Rows of `2 * rotary_dim / 2` angles (`angles`' layout) for positions `pos0..pos0 + n`.
    pub fn get(&mut self, rotary_dim: usize, theta: f32, scaling: RopeScaling, pos0: usize, n: usize) -> &[f32] {
        let key = (rotary_dim, theta.to_bits(), scaling, pos0, n);
        if self.key != Some(key) {
            let (freq, mscale) = inv_freq(rotary_dim, theta, scaling);
            let w = 2 * freq.len();
            self.table.resize(n * w, 0.0);
            for (i, row) in self.table.chunks_exact_mut(w.max(1)).enumerate() {
                angles(&freq, mscale, pos0 + i, row);
            }
            self.key = Some(key);
        }
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek V4's form: the last columns of each head rotate, the first stay; the inverse
    /// rotation at the same position undoes it.
    #[test]
    fn a_tail_rotation_leaves_the_head_start_and_its_inverse_undoes_it() {
        let (heads, hd, rd) = (2, 6, 4);
        let x: Vec<f32> = (0..heads * hd).map(|i| i as f32 * 0.3 - 1.0).collect();
        let (freq, ms) = inv_freq(rd, 10000.0, RopeScaling::None);
        let mut cs = vec![0f32; rd];
        angles(&freq, ms, 5, &mut cs);
        let fwd = Part { heads, head_dim: hd, rotary_dim: rd, tail: true, inverse: false };
        let mut y = x.clone();
        rotate_part(&mut y, &fwd, RopeStyle::Interleaved, &cs);
        for h in 0..heads {
            assert_eq!(y[h * hd..h * hd + hd - rd], x[h * hd..h * hd + hd - rd], "head {h}'s start");
            let mut want = x[h * hd + hd - rd..(h + 1) * hd].to_vec();
            rotate(&mut want, rd, RopeStyle::Interleaved, &cs);
            assert_eq!(y[h * hd + hd - rd..(h + 1) * hd], want[..], "head {h}'s tail");
        }
        rotate_part(&mut y, &Part { inverse: true, ..fwd }, RopeStyle::Interleaved, &cs);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5, "{y:?} vs {x:?}");
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let (f, m) = inv_freq(4, 10000.0, RopeScaling::None);
        let mut row = [1.0, 2.0, 3.0, 4.0];
        apply_row(&mut row, 4, RopeStyle::RotateHalf, &f, m, 0);
        assert_eq!(row, [1.0, 2.0, 3.0, 4.0]);
    }

    /// NoPE (Kimi Linear's MLA): no position moves any pair, in either layout, bit for bit.
    #[test]
    fn nope_leaves_every_position_alone() {
        let (f, m) = inv_freq(6, 10000.0, RopeScaling::NoPe);
        assert_eq!((f.as_slice(), m), ([0.0; 3].as_slice(), 1.0));
        for style in [RopeStyle::Interleaved, RopeStyle::RotateHalf] {
            for pos in [0, 1, 7, 100_000] {
                let mut row = [0.3, -1.7, 2.5, 4.0e-3, -9.0, 1.0e6];
                apply_row(&mut row, 6, style, &f, m, pos);
                assert_eq!(row, [0.3, -1.7, 2.5, 4.0e-3, -9.0, 1.0e6], "{style:?} at {pos}");
            }
        }
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

    /// A rotary width of 0 (a partial factor that rounds to nothing) rotates nothing, head start
    /// or tail, instead of panicking.
    #[test]
    fn a_rotary_width_of_zero_rotates_nothing() {
        let mut row = vec![1.0f32, 2.0, 3.0, 4.0];
        for tail in [false, true] {
            rotate_part(
                &mut row,
                &Part { heads: 2, head_dim: 2, rotary_dim: 0, tail, inverse: false },
                RopeStyle::Interleaved,
                &[],
            );
        }
        assert_eq!(row, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn partial_rotary_leaves_tail_alone() {
        let (f, m) = inv_freq(2, 10000.0, RopeScaling::None);
        let mut row = [1.0, 0.0, 5.0, 6.0];
        apply_row(&mut row, 4, RopeStyle::RotateHalf, &f, m, 3);
        assert_eq!(&row[2..], &[5.0, 6.0]);
    }

    #[test]
    fn cached_angles_match_per_row_application() {
        let s =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 };
        let (f, m) = inv_freq(16, 10000.0, s);
        let mut cache = AngleCache::default();
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            let rows: Vec<f32> = (0..3 * 40).map(|i| (i as f32 * 0.37).sin()).collect();
            let table = cache.get(16, 10000.0, s, 7, 3).to_vec();
            for r in 0..3 {
                let mut a = rows[r * 40..(r + 1) * 40].to_vec();
                let mut b = a.clone();
                apply_row(&mut a[..40], 20, style, &f, m, 7 + r);
                rotate(&mut b[..40], 20, style, &table[r * 16..(r + 1) * 16]);
                assert_eq!(a, b);
            }
        }
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
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        };
        let (plain, _) = inv_freq(64, 500000.0, RopeScaling::None);
        let (scaled, _) = inv_freq(64, 500000.0, s);
        assert_eq!(plain[0], scaled[0]);
        assert!((scaled[31] - plain[31] / 8.0).abs() < 1e-12);
    }
}
