//! The Kimi Delta Attention op on the device (`Frame::kda`: the q/k/v, decay, gate and beta
//! projections, the three short convolutions over their ring, the channel-wise gated delta
//! rule per head, the sigmoid-gated norm, the out projection) against the CPU op
//! (`cpu::kda::kda`) on Lavapipe: random weights, inputs and a random starting state (heads and
//! ring, never zeros), steps of 1, 3 and 17 rows one after another from the state the previous
//! step left, on several geometries (the Kimi Linear fixture's odd one, Kimi-Linear-48B's
//! 128-wide heads, heads wider than a workgroup, a kernel of 1, a kernel of 8).
//!
//! Tolerance: f32 weights with f32 activations (`Precision::Exact`): each step's output within
//! 1e-5 of its largest |value|, the heads' state and the ring each within 1e-5 of their largest
//! |value| (the device and the CPU differ in the order of float operations and in `exp`/`log`).
//! Q8_0 weights with 8-bit activations (`Precision::Fast`, the quantization as the CPU's): 1e-4.

mod vk_common;

use coli_compiler::ir::{LinearAttentionKind, LinearAttentionSpec};
use coli_runtime::cpu::kda::{kda, KdaCall as CpuCall, KdaWeights};
use coli_runtime::cpu::Precision;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::{KdaCall, KdaMats, KdaScratch, KdaShape};
use vk_common::*;

struct Case {
    heads: usize,
    d: usize,
    kk: usize,
    hidden: usize,
    format: WeightFormat,
}

fn run_case(c: &Case, seed: u64) {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(seed);
    let spec = LinearAttentionSpec {
        kind: LinearAttentionKind::Kda,
        key_heads: c.heads,
        value_heads: c.heads,
        key_head_dim: c.d,
        value_head_dim: c.d,
        conv_kernel: c.kk,
        weights: vec![],
        norm_eps: 1e-5,
    };
    assert!(KdaShape::supported(&spec), "the library claims the geometry");
    let s = KdaShape::of(&spec);
    let (wd, d, hidden, f) = (s.width(), c.d, c.hidden, c.format);
    let exact = f == WeightFormat::F32;
    let precision = if exact { Precision::Exact } else { Precision::Fast };
    let tol = if exact { 1e-5 } else { 1e-4 };
    // (rows, cols) of q, k, v, f_a, f_b, b, g_a, g_b, out.
    let dims =
        [(wd, hidden), (wd, hidden), (wd, hidden), (d, hidden), (wd, d), (c.heads, hidden), (d, hidden), (wd, d)];
    let mut dims = dims.to_vec();
    dims.push((hidden, wd));
    let raw: Vec<Vec<u8>> = dims.iter().map(|&(r, k)| random_rows(f, r, k, &mut rng)).collect();
    let taps: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(wd * c.kk, 0.7)).collect();
    let dt = rng.vec(wd, 1.0);
    let alog = rng.vec(c.heads, 1.0);
    let norm = rng.vec(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>();
    let m = |i: usize| Matrix::new(f, dims[i].0, dims[i].1, &raw[i]).unwrap();
    let cw = KdaWeights {
        q: m(0),
        k: m(1),
        v: m(2),
        conv: [&taps[0], &taps[1], &taps[2]],
        f_a: m(3),
        f_b: m(4),
        dt_bias: &dt,
        a_log: &alog,
        b: m(5),
        g_a: m(6),
        g_b: m(7),
        norm: &norm,
        out: m(8),
    };
    let dm: Vec<_> = dims.iter().zip(&raw).map(|(&(r, k), b)| ctx.upload_matrix(f, r, k, b).unwrap()).collect();
    // The three convolutions' taps side by side, as the executor uploads them.
    let dtaps = ctx.upload_f32(&taps.concat()).unwrap();
    let (ddt, dal, dnorm) =
        (ctx.upload_f32(&dt).unwrap(), ctx.upload_f32(&alog).unwrap(), ctx.upload_f32(&norm).unwrap());
    let mats = KdaMats {
        q: &dm[0],
        k: &dm[1],
        v: &dm[2],
        f_a: &dm[3],
        f_b: &dm[4],
        b: &dm[5],
        g_a: &dm[6],
        g_b: &dm[7],
        out: &dm[8],
        conv: dtaps.all(),
        dt_bias: ddt.all(),
        a_log: dal.all(),
        norm: dnorm.all(),
    };
    // A random state (as after some positions): heads small enough to stay stable, a full ring.
    let mut state = rng.vec(s.heads_floats(), 0.3);
    state.extend(rng.vec(s.state_floats() - s.heads_floats(), 1.0));
    assert_eq!(state.len(), spec.state_floats());
    // The state in the middle of a larger buffer: the op honours its view's offset.
    let lead = 7;
    let mut padded = rng.vec(lead, 1.0);
    padded.extend(&state);
    let dstate = ctx.upload_f32(&padded).unwrap();
    let sview = dstate.view(lead, state.len());
    let scratch = KdaScratch::new(ctx, 17, s).unwrap();
    let (dx, dy) = (ctx.f32_buffer(17 * hidden).unwrap(), ctx.f32_buffer(17 * hidden).unwrap());
    for n in [1usize, 3, 17] {
        let what = format!("{} heads of {d}, kernel {}, hidden {hidden}, {f:?}, {n} rows", c.heads, c.kk);
        let x = rng.vec(n * hidden, 1.0);
        let mut want = vec![0f32; n * hidden];
        kda(&CpuCall { spec: &spec, weights: &cw, eps: spec.norm_eps, precision }, &x, n, &mut state, &mut want);
        assert!(want.iter().any(|v| v.abs() > 1e-3), "{what}: the output is not all zero");
        ctx.write(&dx, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let mut fr = ctx.frame().unwrap();
        let call = KdaCall { shape: s, weights: mats, scratch: &scratch, precision };
        fr.kda(call, dx.view(0, n * hidden), n, sview, dy.view(0, n * hidden)).unwrap();
        fr.run().unwrap();
        let got = ctx.download_f32(dy.view(0, n * hidden)).unwrap();
        let gs = ctx.download_f32(sview).unwrap();
        let hf = s.heads_floats();
        let (eo, eh, er) = (worst(&got, &want), worst(&gs[..hf], &state[..hf]), worst(&gs[hf..], &state[hf..]));
        eprintln!("{what}: output {eo:.2e}, state {eh:.2e}, ring {er:.2e}");
        assert!(eo <= tol, "{what}: output off by {eo} of its largest value");
        assert!(eh <= tol, "{what}: heads' state off by {eh} of its largest value");
        assert!(er <= tol, "{what}: the ring off by {er} of its largest value");
        assert_eq!(
            ctx.download_f32(dstate.view(0, lead)).unwrap(),
            padded[..lead].to_vec(),
            "{what}: outside the view"
        );
    }
}

#[test]
fn the_fixture_geometry_matches_the_cpu() {
    run_case(&Case { heads: 3, d: 14, kk: 4, hidden: 72, format: WeightFormat::F32 }, 0xcda1);
}

#[test]
fn kimi_linear_48b_heads_match_the_cpu() {
    run_case(&Case { heads: 2, d: 128, kk: 4, hidden: 48, format: WeightFormat::F32 }, 0xcda2);
}

#[test]
fn heads_wider_than_a_workgroup_and_odd_geometries_match_the_cpu() {
    run_case(&Case { heads: 1, d: 200, kk: 2, hidden: 40, format: WeightFormat::F32 }, 0xcda3);
    run_case(&Case { heads: 5, d: 7, kk: 1, hidden: 19, format: WeightFormat::F32 }, 0xcda4);
    run_case(&Case { heads: 2, d: 33, kk: 8, hidden: 29, format: WeightFormat::F32 }, 0xcda5);
}

#[test]
fn quantized_projections_with_8_bit_activations_match_the_cpu() {
    run_case(&Case { heads: 2, d: 32, kk: 4, hidden: 64, format: WeightFormat::Q8_0 }, 0xcda6);
}

#[test]
fn out_of_range_geometries_are_not_claimed() {
    for (heads, d, kk, kd) in [(1, 300, 4, 300), (2, 16, 9, 16), (2, 16, 0, 16), (2, 16, 4, 8)] {
        let spec = LinearAttentionSpec {
            kind: LinearAttentionKind::Kda,
            key_heads: heads,
            value_heads: heads,
            key_head_dim: kd,
            value_head_dim: d,
            conv_kernel: kk,
            weights: vec![],
            norm_eps: 1e-5,
        };
        assert!(!KdaShape::supported(&spec), "heads of {kd}/{d}, a kernel of {kk}: not claimed");
    }
}
