//! Normalizations over rows of f32: RMSNorm (whole row or per group, e.g. per head; eight
//! lanes, with AVX2 where the CPU has it) and LayerNorm. Pure functions over slices; the
//! caller owns the buffers and the parallelism.

/// `out = x / rms(x) * (weight + offset)`, over consecutive groups of `weight.len()` columns.
/// `x` and `out` hold whole rows; their length is a multiple of the group.
pub fn rms_norm(x: &[f32], out: &mut [f32], weight: &[f32], eps: f32, offset: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::format::wide_simd() {
        // SAFETY: `wide_simd` reported AVX2+FMA.
        return unsafe { rms_norm_avx2(x, out, weight, eps, offset) };
    }
    rms_norm_body(x, out, weight, eps, offset)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rms_norm_avx2(x: &[f32], out: &mut [f32], weight: &[f32], eps: f32, offset: f32) {
    rms_norm_body(x, out, weight, eps, offset)
}

/// The sum of squares in eight lanes (so it vectorizes), then the scaled copy.
#[inline(always)]
fn rms_norm_body(x: &[f32], out: &mut [f32], weight: &[f32], eps: f32, offset: f32) {
    let g = weight.len();
    debug_assert_eq!(x.len() % g, 0);
    for (xs, os) in x.chunks_exact(g).zip(out.chunks_exact_mut(g)) {
        let mut acc = [0f32; 8];
        let mut c8 = xs.chunks_exact(8);
        for c in &mut c8 {
            for l in 0..8 {
                acc[l] += c[l] * c[l];
            }
        }
        let tail: f32 = c8.remainder().iter().map(|v| v * v).sum();
        let ss = (acc.iter().sum::<f32>() + tail) / g as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &w) in os.iter_mut().zip(xs).zip(weight) {
            *o = v * inv * (w + offset);
        }
    }
}

/// `out = (x - mean) / sqrt(var + eps) * weight + bias`, over consecutive groups of
/// `weight.len()` columns.
pub fn layer_norm(x: &[f32], out: &mut [f32], weight: &[f32], bias: Option<&[f32]>, eps: f32) {
    let g = weight.len();
    for (xs, os) in x.chunks_exact(g).zip(out.chunks_exact_mut(g)) {
        let mean = xs.iter().sum::<f32>() / g as f32;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / g as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, (o, &v)) in os.iter_mut().zip(xs).enumerate() {
            *o = (v - mean) * inv * weight[i] + bias.map_or(0.0, |b| b[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_row_is_weight() {
        let x = [3.0f32; 4];
        let mut out = [0.0; 4];
        rms_norm(&x, &mut out, &[1.0, 2.0, 3.0, 4.0], 0.0, 0.0);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rms_norm_per_group_normalizes_each_group() {
        let x = [1.0f32, 1.0, 10.0, 10.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &mut out, &[1.0, 1.0], 0.0, 0.0);
        for v in out {
            assert!((v - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn rms_norm_offset_adds_to_weight() {
        let x = [2.0f32, 2.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &mut out, &[0.5, 0.0], 0.0, 1.0);
        assert!((out[0] - 1.5).abs() < 1e-6 && (out[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rms_norm_matches_the_plain_definition_on_odd_groups() {
        for g in [576usize, 13, 64] {
            let x: Vec<f32> = (0..3 * g).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let w: Vec<f32> = (0..g).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect();
            let mut out = vec![0f32; 3 * g];
            rms_norm(&x, &mut out, &w, 1e-5, 0.0);
            for r in 0..3 {
                let xs = &x[r * g..(r + 1) * g];
                let ss: f64 = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / g as f64;
                let inv = 1.0 / (ss + 1e-5).sqrt();
                for i in 0..g {
                    let want = (xs[i] as f64 * inv * w[i] as f64) as f32;
                    assert!((out[r * g + i] - want).abs() <= 1e-5 * want.abs().max(1.0), "group {g} [{r},{i}]");
                }
            }
        }
    }

    #[test]
    fn layer_norm_zero_mean_unit_variance() {
        let x = [1.0f32, 3.0];
        let mut out = [0.0; 2];
        layer_norm(&x, &mut out, &[1.0, 1.0], Some(&[0.5, 0.5]), 0.0);
        assert!((out[0] + 0.5).abs() < 1e-6 && (out[1] - 1.5).abs() < 1e-6);
    }
}
