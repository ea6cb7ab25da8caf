//! The Gated DeltaNet op on the device (`Frame::deltanet`: projections, the causal convolution
//! over its ring, the gated delta rule per value head, the gated RMSNorm, the out projection)
//! against the CPU op (`cpu::deltanet::gated_deltanet`) on Lavapipe: random weights, inputs
//! and a random starting state (heads and ring, never zeros), steps of 1, 3 and 17 rows one
//! after another from the state the previous step left, on several geometries (the Qwen3-Next
//! fixture's, Qwen3-Next-80B's 128-wide heads, value heads wider than a workgroup, one value
//! head per key head, a short kernel), with the projections grouped (Qwen3-Next) or apart
//! (Qwen3.5).
//!
//! Tolerance: f32 weights with f32 activations (`Precision::Exact`): each step's output within
//! 1e-5 of its largest |value|, the heads' state and the ring (the projections' last rows) each
//! within 1e-5 of their largest |value|. Q8_0 weights with 8-bit activations (`Precision::Fast`,
//! the quantization as the CPU's): 1e-4.

mod vk_common;

use coli_compiler::ir::{LinearAttentionKind, LinearAttentionSpec};
use coli_runtime::cpu::deltanet::{gated_deltanet, DeltaNetCall as CpuCall, DeltaNetProjections, DeltaNetWeights};
use coli_runtime::cpu::Precision;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::{DeltaNetCall, DeltaNetIn, DeltaNetMats, DeltaNetScratch, DeltaNetShape};
use vk_common::*;

struct Case {
    nk: usize,
    nv: usize,
    dk: usize,
    dv: usize,
    kk: usize,
    hidden: usize,
    format: WeightFormat,
    /// Qwen3.5's four projections apart, not Qwen3-Next's grouped pair.
    apart: bool,
}

fn run_case(c: &Case, seed: u64) {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(seed);
    let spec = LinearAttentionSpec {
        kind: LinearAttentionKind::GatedDeltaNet,
        key_heads: c.nk,
        value_heads: c.nv,
        key_head_dim: c.dk,
        value_head_dim: c.dv,
        conv_kernel: c.kk,
        weights: vec![],
        norm_eps: 1e-6,
    };
    let s = DeltaNetShape::of(&spec);
    let (pw, ch, hw) = (s.proj_width(), s.channels(), s.out_heads());
    let exact = c.format == WeightFormat::F32;
    let precision = if exact { Precision::Exact } else { Precision::Fast };
    let tol = if exact { 1e-5 } else { 1e-4 };
    // The projections: grouped `[qkvz, ba]`, or apart `[qkv, z, b, a]`.
    let widths = if c.apart { vec![ch, hw, c.nv, c.nv] } else { vec![pw, 2 * c.nv] };
    let projs: Vec<Vec<u8>> = widths.iter().map(|&w| random_rows(c.format, w, c.hidden, &mut rng)).collect();
    let host = |i: usize| Matrix::new(c.format, widths[i], c.hidden, &projs[i]).unwrap();
    let outw = random_rows(c.format, c.hidden, hw, &mut rng);
    let taps = rng.vec(ch * c.kk, 0.7);
    let dt = rng.vec(c.nv, 1.0);
    let alog = rng.vec(c.nv, 1.0);
    let norm = rng.vec(c.dv, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>();
    let proj = if c.apart {
        DeltaNetProjections::Split { qkv: host(0), z: host(1), b: host(2), a: host(3) }
    } else {
        DeltaNetProjections::Grouped { qkvz: host(0), ba: host(1) }
    };
    let cw = DeltaNetWeights {
        proj,
        conv: &taps,
        dt_bias: &dt,
        a_log: &alog,
        norm: &norm,
        out: Matrix::new(c.format, c.hidden, hw, &outw).unwrap(),
    };
    let dev: Vec<_> =
        widths.iter().zip(&projs).map(|(&w, p)| ctx.upload_matrix(c.format, w, c.hidden, p).unwrap()).collect();
    let dout = ctx.upload_matrix(c.format, c.hidden, hw, &outw).unwrap();
    let (dtaps, ddt, dal, dnorm) = (
        ctx.upload_f32(&taps).unwrap(),
        ctx.upload_f32(&dt).unwrap(),
        ctx.upload_f32(&alog).unwrap(),
        ctx.upload_f32(&norm).unwrap(),
    );
    let input = if c.apart {
        DeltaNetIn::Apart { qkv: &dev[0], z: &dev[1], b: &dev[2], a: &dev[3] }
    } else {
        DeltaNetIn::Grouped { qkvz: &dev[0], ba: &dev[1] }
    };
    let mats =
        DeltaNetMats { input, out: &dout, conv: dtaps.all(), dt_bias: ddt.all(), a_log: dal.all(), norm: dnorm.all() };
    // A random state (as after some positions): heads small enough to stay stable, a full ring.
    let mut state = rng.vec(s.heads_floats(), 0.3);
    state.extend(rng.vec(s.state_floats() - s.heads_floats(), 1.0));
    assert_eq!(state.len(), spec.state_floats());
    // The state in the middle of a larger buffer: the op honours its view's offset.
    let lead = 5;
    let mut padded = rng.vec(lead, 1.0);
    padded.extend(&state);
    let dstate = ctx.upload_f32(&padded).unwrap();
    let sview = dstate.view(lead, state.len());
    let rows = [1usize, 3, 17];
    let scratch = DeltaNetScratch::new(ctx, 17, s).unwrap();
    let (dx, dy) = (ctx.f32_buffer(17 * c.hidden).unwrap(), ctx.f32_buffer(17 * c.hidden).unwrap());
    for n in rows {
        let what = format!(
            "{}/{} heads of {}/{}, kernel {}, hidden {}, {:?}{}, {n} rows",
            c.nk,
            c.nv,
            c.dk,
            c.dv,
            c.kk,
            c.hidden,
            c.format,
            if c.apart { ", apart" } else { "" }
        );
        let x = rng.vec(n * c.hidden, 1.0);
        let mut want = vec![0f32; n * c.hidden];
        let call = CpuCall { spec: &spec, weights: &cw, eps: spec.norm_eps, precision };
        gated_deltanet(&call, &x, n, &mut state, &mut want);
        ctx.write(&dx, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let mut f = ctx.frame().unwrap();
        let call = DeltaNetCall { shape: s, weights: mats, scratch: &scratch, precision };
        f.deltanet(call, dx.view(0, n * c.hidden), n, sview, dy.view(0, n * c.hidden)).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(dy.view(0, n * c.hidden)).unwrap();
        let gs = ctx.download_f32(sview).unwrap();
        let (eo, eh) = (worst(&got, &want), worst(&gs[..s.heads_floats()], &state[..s.heads_floats()]));
        eprintln!("{what}: output {eo:.2e}, state {eh:.2e}");
        assert!(eo <= tol, "{what}: output off by {eo} of its largest value");
        assert!(eh <= tol, "{what}: heads' state off by {eh} of its largest value");
        let er = worst(&gs[s.heads_floats()..], &state[s.heads_floats()..]);
        assert!(er <= tol, "{what}: the ring off by {er} of its largest value");
        // The words before the state's view are untouched.
        assert_eq!(
            ctx.download_f32(dstate.view(0, lead)).unwrap(),
            padded[..lead].to_vec(),
            "{what}: outside the view"
        );
    }
}

#[test]
fn the_fixture_geometry_matches_the_cpu() {
    run_case(
        &Case { nk: 2, nv: 4, dk: 16, dv: 12, kk: 4, hidden: 64, format: WeightFormat::F32, apart: false },
        0xde17a,
    );
}

#[test]
fn qwen3_next_80b_heads_match_the_cpu() {
    run_case(
        &Case { nk: 1, nv: 2, dk: 128, dv: 128, kk: 4, hidden: 48, format: WeightFormat::F32, apart: false },
        0xde17b,
    );
}

#[test]
fn value_heads_wider_than_a_workgroup_and_odd_geometries_match_the_cpu() {
    run_case(
        &Case { nk: 3, nv: 3, dk: 70, dv: 200, kk: 2, hidden: 40, format: WeightFormat::F32, apart: false },
        0xde17c,
    );
    run_case(&Case { nk: 1, nv: 3, dk: 8, dv: 5, kk: 1, hidden: 16, format: WeightFormat::F32, apart: false }, 0xde17d);
    run_case(
        &Case { nk: 2, nv: 8, dk: 32, dv: 32, kk: 8, hidden: 96, format: WeightFormat::F32, apart: false },
        0xde17e,
    );
}

/// Qwen3.5's projections apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`): the
/// convolution reads the channels' order, the rule the gates and b/a planes.
#[test]
fn projections_apart_match_the_cpu() {
    run_case(
        &Case { nk: 2, nv: 6, dk: 12, dv: 10, kk: 4, hidden: 72, format: WeightFormat::F32, apart: true },
        0xde180,
    );
    run_case(
        &Case { nk: 1, nv: 2, dk: 128, dv: 128, kk: 4, hidden: 48, format: WeightFormat::F32, apart: true },
        0xde181,
    );
    run_case(
        &Case { nk: 2, nv: 4, dk: 32, dv: 32, kk: 4, hidden: 64, format: WeightFormat::Q8_0, apart: true },
        0xde182,
    );
}

#[test]
fn quantized_projections_with_8_bit_activations_match_the_cpu() {
    run_case(
        &Case { nk: 2, nv: 4, dk: 32, dv: 32, kk: 4, hidden: 64, format: WeightFormat::Q8_0, apart: false },
        0xde17f,
    );
}

#[test]
fn out_of_range_geometries_are_typed_errors() {
    let Some(ctx) = ctx() else { return };
    let b = ctx.f32_buffer(1 << 16).unwrap();
    for (dk, dv, kk) in [(300, 16, 4), (16, 300, 4), (16, 16, 9), (16, 16, 0)] {
        let s = DeltaNetShape {
            key_heads: 1,
            value_heads: 1,
            key_head_dim: dk,
            value_head_dim: dv,
            conv_kernel: kk,
            eps: 1e-6,
        };
        let mut f = ctx.frame().unwrap();
        let ring = b.view(0, s.channels() * kk.saturating_sub(1));
        let e = f.deltanet_conv(
            s,
            b.view(0, s.proj_width()),
            b.view(0, s.channels() * kk),
            ring,
            b.view(0, s.channels()),
            1,
        );
        assert!(e.is_err(), "heads of {dk}/{dv}, a kernel of {kk}: refused");
    }
}
