//! Elementwise ops over rows: activations, gated units (SwiGLU and its clamped form),
//! residual add and products. Pure functions over slices.

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
                            + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
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

/// `out[i] = glu(gate[i], up[i])`.
pub fn glu(kind: GluKind, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match kind {
        GluKind::SwiGlu => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = silu(g) * u;
            }
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
}
