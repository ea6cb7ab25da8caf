//! Elementwise ops over rows: activations, gated units (SwiGLU and its clamped form),
//! residual add and products. Pure functions over slices; SwiGLU, the one on every dense
//! layer's hot path, runs eight lanes at a time with a polynomial `exp` (within 2 ulp of
//! libm's), compiled with AVX2+FMA where the CPU has them, and large batches split over the
//! format module's thread team.

use coli_compiler::ir::{Activation, GluKind};

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn erf(x: f32) -> f32 {
    // Abramowitz-Stegun 7.1.26 is too coarse for parity; use the f64 series/continued form.
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

pub fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => silu(x),
        Activation::Sigmoid => sigmoid(x),
        Activation::Relu => x.max(0.0),
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
        Activation::GeluTanh => {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// `e^x` for eight lanes: Cody-Waite reduction by `ln 2` and a degree-7 polynomial (Cephes'
/// `expf` coefficients), within 2 ulp of the true value over the whole f32 range; 0 where
/// the result would be subnormal, infinity past the largest f32, NaN for NaN.
#[inline(always)]
pub fn exp8(x: [f32; 8]) -> [f32; 8] {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Beyond these e^x is below the least normal f32, or above the greatest.
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.722_84;
    const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    // Adding 1.5 * 2^23 rounds to an integer (ties to even) held in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    let mut out = [0f32; 8];
    for l in 0..8 {
        // Not `clamp`: a NaN input becomes LO here (as the SIMD path's max/min do), where
        // `clamp` would keep it.
        #[allow(clippy::manual_clamp)]
        let v = x[l].max(LO).min(HI);
        let t = v * LOG2E + SHIFT;
        let n = t - SHIFT;
        let ni = (t.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
        let r = v - n * C1 - n * C2;
        let mut p = P[0];
        for &c in &P[1..] {
            p = p * r + c;
        }
        let y = p * r * r + r + 1.0;
        // 2^n in two factors, so n = 128 (just below the overflow) stays finite.
        let (n1, n2) = (ni >> 1, ni - (ni >> 1));
        let e = y * f32::from_bits(((n1 + 127) << 23) as u32) * f32::from_bits(((n2 + 127) << 23) as u32);
        let e = if x[l] < LO { 0.0 } else { e };
        let e = if x[l] > HI { f32::INFINITY } else { e };
        out[l] = if x[l].is_nan() { x[l] } else { e };
    }
    out
}

/// `x = e^(x - m)` for every element, in place, returning their sum (a softmax's numerators
/// and denominator), with `exp8`'s accuracy.
pub fn exp_shifted_sum(xs: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::format::wide_simd() {
        // SAFETY: `wide_simd` reported AVX2+FMA.
        return unsafe { exp_shifted_sum_avx2(xs, m) };
    }
    exp_shifted_sum_body(xs, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_sum_avx2(xs: &mut [f32], m: f32) -> f32 {
    exp_shifted_sum_body(xs, m)
}

#[inline(always)]
fn exp_shifted_sum_body(xs: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = xs.chunks_exact_mut(8);
    for c in &mut chunks {
        let v: [f32; 8] = std::array::from_fn(|l| c[l] - m);
        let e = exp8(v);
        c.copy_from_slice(&e);
        acc.iter_mut().zip(&e).for_each(|(a, v)| *a += v);
    }
    let rest = chunks.into_remainder();
    let mut v = [f32::NEG_INFINITY; 8];
    for (d, &x) in v.iter_mut().zip(rest.iter()) {
        *d = x - m;
    }
    let e = exp8(v);
    rest.copy_from_slice(&e[..rest.len()]);
    acc.iter().sum::<f32>() + e[..rest.len()].iter().sum::<f32>()
}

#[inline(always)]
fn swiglu_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let mut o8 = out.chunks_exact_mut(8);
    let mut g8 = gate.chunks_exact(8);
    let mut u8 = up.chunks_exact(8);
    for ((o, g), u) in (&mut o8).zip(&mut g8).zip(&mut u8) {
        let g: [f32; 8] = g.try_into().unwrap();
        let e = exp8(g.map(|v| -v));
        for l in 0..8 {
            o[l] = g[l] / (1.0 + e[l]) * u[l];
        }
    }
    for ((o, &g), &u) in o8.into_remainder().iter_mut().zip(g8.remainder()).zip(u8.remainder()) {
        *o = silu(g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_body(gate, up, out)
}

fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::format::wide_simd() {
        // SAFETY: `wide_simd` reported AVX2+FMA.
        return unsafe { swiglu_avx2(gate, up, out) };
    }
    swiglu_body(gate, up, out)
}

/// Elements per task when a gated unit is split over the thread team.
const GLU_TASK: usize = 16 * 1024;

/// `out[i] = glu(gate[i], up[i])`.
pub fn glu(kind: GluKind, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match kind {
        GluKind::SwiGlu => {
            let len = out.len().min(gate.len()).min(up.len());
            let o = crate::format::pool::SendPtr(out.as_mut_ptr());
            crate::format::pool::run(len.div_ceil(GLU_TASK), &|t| {
                let (a, b) = (t * GLU_TASK, ((t + 1) * GLU_TASK).min(len));
                // SAFETY: tasks write disjoint ranges `a..b` of `out` (length >= `len`).
                let out = unsafe { std::slice::from_raw_parts_mut(o.get().add(a), b - a) };
                swiglu(&gate[a..b], &up[a..b], out);
            });
        }
        GluKind::GeGlu => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = activate(Activation::Gelu, g) * u;
            }
        }
        GluKind::ClampedSwiGlu { limit, alpha } => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                *o = g * sigmoid(alpha * g) * (u + 1.0);
            }
        }
        GluKind::LimitedSwiGlu { limit } => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                let g = g.min(limit);
                *o = g * sigmoid(g) * u.clamp(-limit, limit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_known_values() {
        // gelu(1) = 0.8413447, gelu(-1) = -0.1586553
        assert!((activate(Activation::Gelu, 1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((activate(Activation::Gelu, -1.0) + 0.158_655_3).abs() < 1e-6);
    }

    #[test]
    fn exp8_is_within_two_ulp_of_exp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.7 {
            let xs: [f32; 8] = std::array::from_fn(|l| x + l as f32 * 1e-3);
            let e = exp8(xs);
            for l in 0..8 {
                let want = (xs[l] as f64).exp();
                worst = worst.max(((e[l] as f64 - want) / want).abs());
            }
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "max relative error {worst}");
        let e = exp8([-100.0, 100.0, f32::NAN, 0.0, -0.0, 1.0, f32::NEG_INFINITY, f32::INFINITY]);
        assert_eq!(&e[..2], &[0.0, f32::INFINITY]);
        assert!(e[2].is_nan());
        assert_eq!(&e[3..5], &[1.0, 1.0]);
        assert!((e[5] - std::f32::consts::E).abs() < 1e-6);
        assert_eq!(&e[6..], &[0.0, f32::INFINITY]);
    }

    #[test]
    fn exp_shifted_sum_matches_libm() {
        for len in [0usize, 5, 8, 37] {
            let xs: Vec<f32> = (0..len).map(|i| (i as f32 * 0.77).sin() * 9.0).collect();
            let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut got = xs.clone();
            let sum = exp_shifted_sum(&mut got, m);
            let want: Vec<f64> = xs.iter().map(|&x| ((x - m) as f64).exp()).collect();
            for (g, w) in got.iter().zip(&want) {
                assert!(((*g as f64) - w).abs() <= 3e-7 * w, "{g} vs {w}");
            }
            assert!((sum as f64 - want.iter().sum::<f64>()).abs() <= 1e-6 * want.iter().sum::<f64>().max(1.0));
        }
    }

    #[test]
    fn swiglu_matches_the_scalar_definition_on_long_rows() {
        let n = 3 * GLU_TASK + 13;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 37.0).collect();
        let u: Vec<f32> = (0..n).map(|i| ((i * 104729 % 997) as f32 - 500.0) / 91.0).collect();
        let mut out = vec![f32::NAN; n];
        glu(GluKind::SwiGlu, &g, &u, &mut out);
        for i in 0..n {
            let want = silu(g[i]) * u[i];
            assert!((out[i] - want).abs() <= 1e-6 * want.abs().max(1e-3), "{i}: {} vs {want}", out[i]);
        }
    }

    #[test]
    fn swiglu_is_silu_times_up() {
        let mut out = [0.0; 2];
        glu(GluKind::SwiGlu, &[0.0, 2.0], &[5.0, 3.0], &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 3.0 * 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn clamped_swiglu_clamps() {
        let mut out = [0.0; 1];
        glu(GluKind::ClampedSwiGlu { limit: 1.0, alpha: 1.702 }, &[10.0], &[10.0], &mut out);
        assert!((out[0] - 1.0 * sigmoid(1.702) * 2.0).abs() < 1e-6);
    }

    /// DeepSeek V4's form: gate clamped above only, up both ways, `silu(gate) * up` (no `+ 1`).
    #[test]
    fn limited_swiglu_clamps_gate_above_and_up_both_ways() {
        let mut out = [0.0; 3];
        let kind = GluKind::LimitedSwiGlu { limit: 2.0 };
        glu(kind, &[10.0, -3.0, 1.0], &[10.0, -5.0, 0.5], &mut out);
        assert!((out[0] - 2.0 * sigmoid(2.0) * 2.0).abs() < 1e-6, "{out:?}");
        assert!((out[1] - (-3.0) * sigmoid(-3.0) * -2.0).abs() < 1e-6, "{out:?}");
        assert!((out[2] - sigmoid(1.0) * 0.5).abs() < 1e-6, "{out:?}");
    }
}
