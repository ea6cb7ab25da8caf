//! Routed experts on the device (`Frame::moe`) against `cpu::experts::routed_experts`, on
//! whatever device the machine has (Lavapipe in CI): several weight formats, top-k 1 to 8, one
//! row and many, the three kernel paths (per-pair GEMVs, per-expert GEMVs, grouped GEMMs),
//! both precisions, the four gated units (DeepSeek V4's limited SwiGLU too), biases; and the routing computed by `route` in the
//! same frame, so the experts are chosen on the device with no host round trip.
//!
//! Tolerance: relative to the largest |reference| of the output, 1e-5 where activations stay
//! f32 (float formats, `Precision::Exact`; measured on Lavapipe: at most 8e-7); 1e-4 with q8
//! activations, plus `q8_slack`: a last-bit difference in a gated hidden value (the gate and
//! up products sum in another order) can move its 8-bit code by one step before the down
//! matrix, and one step of a block whose scale is large moves the outputs by more than 1e-4
//! of the largest (seen: IQ3_XXS, n = 3, x / d = 0.49999937 in a block of d = 5.48, which moved
//! an output of 7484 by 39.4, 1.2e-3 of the largest).

mod vk_common;

use coli_compiler::ir::{GluKind, GroupScore, RouterScoring};
use coli_runtime::cpu::experts::{routed_experts, ExpertMats, Routed};
use coli_runtime::cpu::linear::linear;
use coli_runtime::cpu::route::{route_row, RouteSpec};
use coli_runtime::cpu::{elementwise as cpu_elementwise, Precision};
use coli_runtime::format::{dequant_row, Matrix, WeightFormat};
use coli_runtime::vk::{MatIn, MoeCall, MoePath, MoeRoute, MoeScratch, RouteParams};
use vk_common::{assert_close, ctx, random_rows, routing, Rng};

/// One layer's experts in a format: their stored bytes per role, and biases when wanted.
struct Layer {
    format: WeightFormat,
    experts: usize,
    hidden: usize,
    ffn: usize,
    gate: Vec<Vec<u8>>,
    up: Vec<Vec<u8>>,
    down: Vec<Vec<u8>>,
    bias: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
}

impl Layer {
    fn new(format: WeightFormat, experts: usize, hidden: usize, ffn: usize, bias: bool, rng: &mut Rng) -> Layer {
        let mut mk = |rows, cols| (0..experts).map(|_| random_rows(format, rows, cols, rng)).collect::<Vec<_>>();
        let (gate, up, down) = (mk(ffn, hidden), mk(ffn, hidden), mk(hidden, ffn));
        let bias =
            bias.then(|| (rng.vec(experts * ffn, 0.5), rng.vec(experts * ffn, 0.5), rng.vec(experts * hidden, 0.5)));
        Layer { format, experts, hidden, ffn, gate, up, down, bias }
    }

    fn mats(&self, e: usize) -> ExpertMats<'_> {
        let (f, h, format) = (self.ffn, self.hidden, self.format);
        fn m(format: WeightFormat, b: &[u8], rows: usize, cols: usize) -> Matrix<'_> {
            Matrix::new(format, rows, cols, b).unwrap()
        }
        ExpertMats {
            gate: m(format, &self.gate[e], f, h),
            up: m(format, &self.up[e], f, h),
            down: m(format, &self.down[e], h, f),
            gate_bias: self.bias.as_ref().map(|b| &b.0[e * f..(e + 1) * f]),
            up_bias: self.bias.as_ref().map(|b| &b.1[e * f..(e + 1) * f]),
            down_bias: self.bias.as_ref().map(|b| &b.2[e * h..(e + 1) * h]),
        }
    }
}

/// The CPU reference and the device for one case.
fn check(layer: &Layer, n: usize, top_k: usize, glu: GluKind, precision: Precision, path: MoePath, rng: &mut Rng) {
    let ctx = ctx().unwrap();
    let scratch = ctx.moe_scratch(n, top_k, layer.hidden, layer.ffn, layer.experts).unwrap();
    check_in(&scratch, layer, (n, top_k), (glu, precision, path), rng);
}

/// `check` in a given scratch (one that earlier calls used: decode's gate/up GEMV counts the
/// values it writes into each block of h, and the counts carry over from call to call).
fn check_in(
    scratch: &MoeScratch,
    layer: &Layer,
    (n, top_k): (usize, usize),
    (glu, precision, path): (GluKind, Precision, MoePath),
    rng: &mut Rng,
) {
    let ctx = ctx().unwrap();
    let h = layer.hidden;
    let x = rng.vec(n * h, 1.0);
    let rt = routing(n, top_k, layer.experts, rng);
    let mut want = vec![0f32; n * h];
    routed_experts(Routed { x: &x, n, hidden: h, routing: &rt, top_k }, glu, precision, &|e| layer.mats(e), &mut want);
    let dev = ctx.upload_experts(layer.experts, &|e| layer.mats(e)).unwrap();
    // Views at offsets inside larger buffers.
    let xb = ctx.upload_f32(&[vec![7.0; 5], x.clone()].concat()).unwrap();
    let rb = ctx.upload_f32(&[vec![3.0; 2], rt.clone()].concat()).unwrap();
    let ob = ctx.f32_buffer(n * h + 3).unwrap();
    let mut f = ctx.frame().unwrap();
    let call = MoeCall { experts: &dev, scratch, n, top_k, glu, precision, path };
    f.moe(call, xb.view(5, n * h), rb.view(2, n * 2 * top_k), ob.view(3, n * h)).unwrap();
    f.run().unwrap();
    let got = ctx.download_f32(ob.view(3, n * h)).unwrap();
    let float_acts =
        precision == Precision::Exact || !layer.format.uses_q8_acts(layer.ffn) && !layer.format.uses_q8_acts(h);
    let what = format!(
        "{} E={} {}x{} n={n} top {top_k} {glu:?} {precision:?} {path:?}",
        layer.format, layer.experts, h, layer.ffn
    );
    if float_acts {
        assert_close(&what, &got, &want, 1e-5);
        return;
    }
    assert_q8_close(&what, &got, &want, &q8_slack(layer, &x, &rt, n, top_k, glu), h);
}

/// Each output within 1e-4 of the largest |want| plus its row's `slack` (rows of `hidden`).
fn assert_q8_close(what: &str, got: &[f32], want: &[f32], slack: &[f32], hidden: usize) {
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = 1e-4 * max + slack[i / hidden];
        assert!((g - w).abs() <= bound, "{what}: |{g} - {w}| at {i} = {:e} > {bound:e}", (g - w).abs());
    }
}

/// Each output row's allowance for gated values that took the neighbouring 8-bit code before
/// the down matrix (the module's doc): two steps of the largest block scale (`max |h| / 127`)
/// for each of the row's experts, times the largest |down weight| and the routing weight.
fn q8_slack(layer: &Layer, x: &[f32], rt: &[f32], n: usize, top_k: usize, glu: GluKind) -> Vec<f32> {
    let (h, f) = (layer.hidden, layer.ffn);
    let mut wrow = vec![0f32; f];
    (0..n)
        .map(|i| {
            let mut slack = 0f32;
            for k in 0..top_k {
                let (e, weight) = (rt[i * 2 * top_k + 2 * k] as usize, rt[i * 2 * top_k + 2 * k + 1]);
                let m = layer.mats(e);
                let (mut g, mut u, mut hid) = (vec![0f32; f], vec![0f32; f], vec![0f32; f]);
                linear(&m.gate, &x[i * h..(i + 1) * h], 1, &mut g, Precision::Exact);
                linear(&m.up, &x[i * h..(i + 1) * h], 1, &mut u, Precision::Exact);
                for (v, b) in [(&mut g, m.gate_bias), (&mut u, m.up_bias)] {
                    v.iter_mut().zip(b.unwrap_or(&[])).for_each(|(v, b)| *v += b);
                }
                cpu_elementwise::glu(glu, &g, &u, &mut hid);
                let step = hid.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                let wmax = (0..h).fold(0f32, |a, r| {
                    dequant_row(layer.format, m.down.row(r), &mut wrow);
                    wrow.iter().fold(a, |a, v| a.max(v.abs()))
                });
                slack += 2.0 * weight * step * wmax;
            }
            slack
        })
        .collect()
}

/// A MoE layer's FFN norm absorbed into the experts' 8-bit activations and the residual Add
/// folded into the summed store (`moe_fused`), decode and a chunk: against the CPU's norm, then
/// experts, then add (1e-4, the q8 tolerance above); a float format refuses the norm.
#[test]
fn norm_input_and_residual_store_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e03);
    let (top_k, glu) = (3, GluKind::SwiGlu);
    for &(format, hidden, ffn) in &[(WeightFormat::I8Row, 96, 64), (WeightFormat::Q8_0, 64, 96)] {
        let layer = Layer::new(format, 7, hidden, ffn, false, &mut rng);
        for (n, path) in [(1, MoePath::Gemv), (2, MoePath::Gemv), (37, MoePath::Grouped)] {
            let h = rng.vec(n * hidden, 1.0);
            let nw = rng.vec(hidden, 1.0);
            let rt = routing(n, top_k, layer.experts, &mut rng);
            let mut x = vec![0f32; n * hidden];
            for (xr, hr) in x.chunks_exact_mut(hidden).zip(h.chunks_exact(hidden)) {
                coli_runtime::cpu::norm::rms_norm(hr, xr, &nw, 1e-5, 0.0);
            }
            let mut moe = vec![0f32; n * hidden];
            routed_experts(
                Routed { x: &x, n, hidden, routing: &rt, top_k },
                glu,
                Precision::Fast,
                &|e| layer.mats(e),
                &mut moe,
            );
            let want: Vec<f32> = h.iter().zip(&moe).map(|(a, b)| a + b).collect();
            let dev = ctx.upload_experts(layer.experts, &|e| layer.mats(e)).unwrap();
            let scratch = ctx.moe_scratch(n, top_k, hidden, ffn, layer.experts).unwrap();
            let hb = ctx.upload_f32(&h).unwrap();
            let wb = ctx.upload_f32(&nw).unwrap();
            let rb = ctx.upload_f32(&rt).unwrap();
            let mut f = ctx.frame().unwrap();
            // In place, as a layer's h += moe(norm(h)).
            let input = MatIn::Norm { x: hb.all(), weight: wb.all(), eps: 1e-5, offset: 0.0 };
            let call = MoeCall { experts: &dev, scratch: &scratch, n, top_k, glu, precision: Precision::Fast, path };
            f.moe_fused(call, input, Some(hb.all()), rb.all(), hb.all()).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(hb.all()).unwrap();
            assert_close(&format!("{format} {hidden}x{ffn} n={n} {path:?} norm+res"), &got, &want, 1e-4);
        }
    }
    let layer = Layer::new(WeightFormat::BF16, 4, 32, 32, false, &mut rng);
    let dev = ctx.upload_experts(layer.experts, &|e| layer.mats(e)).unwrap();
    let scratch = ctx.moe_scratch(1, 2, 32, 32, 4).unwrap();
    let (b, rb) = (ctx.f32_buffer(32).unwrap(), ctx.upload_f32(&routing(1, 2, 4, &mut rng)).unwrap());
    let mut f = ctx.frame().unwrap();
    let input = MatIn::Norm { x: b.all(), weight: b.all(), eps: 1e-5, offset: 0.0 };
    let call = MoeCall {
        experts: &dev,
        scratch: &scratch,
        n: 1,
        top_k: 2,
        glu,
        precision: Precision::Fast,
        path: MoePath::Gemv,
    };
    assert!(f.moe_fused(call, input, None, rb.all(), b.all()).is_err());
}

/// (format, hidden, ffn): tails for the formats that take any length, whole blocks else.
const SHAPES: &[(WeightFormat, usize, usize)] = &[
    (WeightFormat::F32, 45, 40),
    (WeightFormat::F16, 64, 48),
    (WeightFormat::BF16, 72, 40),
    (WeightFormat::Q8_0, 96, 64),
    (WeightFormat::Q4_0, 64, 96),
    (WeightFormat::Q4_K, 256, 256),
    (WeightFormat::Q6_K, 256, 256),
    (WeightFormat::I8Row, 96, 64),
    (WeightFormat::I8Row, 45, 40),
    (WeightFormat::I4G64, 128, 64),
    (WeightFormat::Q5_0, 96, 64),
    (WeightFormat::Q5_1, 64, 96),
    (WeightFormat::IQ4_NL, 96, 64),
    (WeightFormat::Q2_K, 256, 256),
    // Q3_K at 256 x 256 meets, at n = 37, one activation row whose q8 rounding before the
    // down projection differs from the CPU's (the GEMM sums the gate/up products in another
    // order), which moves that output row by one quantization step, past 1e-4.
    (WeightFormat::Q3_K, 512, 256),
    (WeightFormat::Q5_K, 256, 256),
    (WeightFormat::IQ4_XS, 256, 256),
    (WeightFormat::MXFP4, 96, 64),
    (WeightFormat::FP8_E4M3, 256, 128),
    (WeightFormat::IQ2_XXS, 256, 256),
    // IQ2_XS at 256 x 256 and 512 x 256 meets Q3_K's case above at n = 19, top 8 (per-pair
    // and per-expert GEMVs, which agree exactly): one token's gated value a quantization step
    // from the CPU's moves its outputs by 2.1e-4 (the grouped GEMM on the same inputs: 2.8e-7).
    (WeightFormat::IQ2_XS, 256, 512),
    (WeightFormat::IQ2_S, 256, 256),
    (WeightFormat::IQ3_XXS, 256, 256),
    (WeightFormat::IQ3_S, 512, 256),
    (WeightFormat::IQ1_S, 256, 256),
    (WeightFormat::IQ1_M, 256, 512),
];

#[test]
fn decode_and_chunks_match_cpu_for_every_format() {
    let Some(_) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e01);
    for &(format, hidden, ffn) in SHAPES {
        let layer = Layer::new(format, 10, hidden, ffn, false, &mut rng);
        for (n, top_k, path) in [
            (1, 1, MoePath::Auto),
            (1, 8, MoePath::Auto),
            (3, 2, MoePath::Auto),
            (37, 4, MoePath::Auto),
            (2, 8, MoePath::Grouped),
            (6, 3, MoePath::Gemv),
            (6, 3, MoePath::ExpertGemv),
            (19, 8, MoePath::ExpertGemv),
        ] {
            check(&layer, n, top_k, GluKind::SwiGlu, Precision::Fast, path, &mut rng);
        }
        for (n, path) in [(1, MoePath::Auto), (9, MoePath::Auto)] {
            check(&layer, n, 5, GluKind::SwiGlu, Precision::Exact, path, &mut rng);
        }
    }
}

/// Decode steps one after another in one scratch, as a session's frames run them: h's 8-bit
/// blocks, which the gate/up GEMV makes as each block's last value lands (its counts never
/// reset), are right at every step, whatever the rows and ranks of the steps before.
#[test]
fn decode_steps_in_one_scratch_keep_h_blocks_right() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e07);
    let layer = Layer::new(WeightFormat::Q8_0, 12, 64, 96, false, &mut rng);
    let scratch = ctx.moe_scratch(3, 8, layer.hidden, layer.ffn, layer.experts).unwrap();
    for (n, top_k) in [(1, 8), (3, 2), (1, 1), (2, 8), (1, 8), (3, 8)] {
        check_in(&scratch, &layer, (n, top_k), (GluKind::SwiGlu, Precision::Fast, MoePath::Auto), &mut rng);
    }
}

/// (Top-k up to 9: the decode kernel takes ranks eight at a time.)
#[test]
fn every_top_k_and_gated_unit_with_biases() {
    let Some(_) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e02);
    let layer = Layer::new(WeightFormat::BF16, 9, 64, 96, true, &mut rng);
    for top_k in 1..=9 {
        for path in [MoePath::Gemv, MoePath::ExpertGemv, MoePath::Grouped] {
            check(&layer, 5, top_k, GluKind::SwiGlu, Precision::Fast, path, &mut rng);
        }
    }
    let limited = GluKind::LimitedSwiGlu { limit: 0.7 };
    for glu in [GluKind::GeGlu, GluKind::ClampedSwiGlu { limit: 0.7, alpha: 1.702 }, limited] {
        for (n, path) in [(1, MoePath::Auto), (40, MoePath::Auto)] {
            check(&layer, n, 4, glu, Precision::Fast, path, &mut rng);
        }
    }
    let q = Layer::new(WeightFormat::Q8_0, 12, 64, 32, true, &mut rng);
    check(&q, 1, 6, GluKind::SwiGlu, Precision::Fast, MoePath::Auto, &mut rng);
    check(&q, 33, 6, GluKind::SwiGlu, Precision::Fast, MoePath::Auto, &mut rng);
}

/// The router on the device feeds the experts in the same frame: the expert ids never leave
/// the device. Against the CPU's route then routed experts.
#[test]
fn routing_on_the_device_feeds_the_experts() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e03);
    let layer = Layer::new(WeightFormat::Q8_0, 16, 64, 64, false, &mut rng);
    for (n, top_k) in [(1, 4), (21, 2)] {
        let (h, e) = (layer.hidden, layer.experts);
        let x = rng.vec(n * h, 1.0);
        let logits = rng.vec(n * e, 2.0);
        let spec = RouteSpec {
            scoring: RouterScoring::Softmax,
            top_k,
            renormalize: true,
            correction_bias: None,
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.0,
        };
        let mut rt = vec![0f32; n * 2 * top_k];
        for r in 0..n {
            route_row(&spec, &logits[r * e..(r + 1) * e], &mut rt[r * 2 * top_k..(r + 1) * 2 * top_k]);
        }
        let mut want = vec![0f32; n * h];
        routed_experts(
            Routed { x: &x, n, hidden: h, routing: &rt, top_k },
            GluKind::SwiGlu,
            Precision::Fast,
            &|i| layer.mats(i),
            &mut want,
        );
        let dev = ctx.upload_experts(e, &|i| layer.mats(i)).unwrap();
        let scratch = ctx.moe_scratch(n, top_k, h, layer.ffn, e).unwrap();
        let (xb, lb) = (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&logits).unwrap());
        let (rb, ob) = (ctx.f32_buffer(n * 2 * top_k).unwrap(), ctx.f32_buffer(n * h).unwrap());
        let mut f = ctx.frame().unwrap();
        let params = RouteParams {
            scoring: RouterScoring::Softmax,
            top_k,
            renormalize: true,
            groups: None,
            group_score: GroupScore::TopTwoSum,
            scale: 1.0,
        };
        f.route(lb.all(), None, rb.all(), n, e, params).unwrap();
        let call = MoeCall {
            experts: &dev,
            scratch: &scratch,
            n,
            top_k,
            glu: GluKind::SwiGlu,
            precision: Precision::Fast,
            path: MoePath::Auto,
        };
        f.moe(call, xb.all(), rb.all(), ob.all()).unwrap();
        f.run().unwrap();
        let ids: Vec<f32> = ctx.download_f32(rb.all()).unwrap().iter().step_by(2).copied().collect();
        assert_eq!(ids, rt.iter().step_by(2).copied().collect::<Vec<_>>(), "the device chose the CPU's experts");
        assert_close(&format!("route + moe n={n} top {top_k}"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-4);
    }
}

#[test]
fn bad_operands_are_errors() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e04);
    let layer = Layer::new(WeightFormat::F32, 4, 32, 32, false, &mut rng);
    let dev = ctx.upload_experts(4, &|e| layer.mats(e)).unwrap();
    let scratch = ctx.moe_scratch(2, 2, 32, 32, 4).unwrap();
    let b = ctx.f32_buffer(1024).unwrap();
    let mut f = ctx.frame().unwrap();
    // More rows than the scratch holds; more ranks than experts.
    let call = |n, top_k| MoeCall {
        experts: &dev,
        scratch: &scratch,
        n,
        top_k,
        glu: GluKind::SwiGlu,
        precision: Precision::Fast,
        path: MoePath::Auto,
    };
    assert!(f.moe(call(3, 2), b.all(), b.all(), b.all()).is_err());
    assert!(f.moe(call(1, 5), b.all(), b.all(), b.all()).is_err());
    // Experts of different shapes do not stack.
    let other = Layer::new(WeightFormat::F32, 4, 32, 64, false, &mut rng);
    let mixed = |e: usize| if e == 2 { other.mats(e) } else { layer.mats(e) };
    assert!(ctx.upload_experts(4, &mixed).is_err());
}

/// The expert tier's batch (`Frame::moe_pairs`) against `cpu::experts::pair_outputs`: experts
/// written one by one into slots out of order (`expert_slots`, `write_expert`), the routing in
/// slot ids with some pairs marked absent (the CPU's), both paths, a bias case; each present
/// pair's output row as the CPU's (not weighted), the absent pairs' rows left untouched.
/// Tolerance as above.
#[test]
fn tier_pairs_in_slots_match_cpu_pair_outputs() {
    use coli_runtime::cpu::experts::pair_outputs;
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e09);
    for &(format, hidden, ffn, bias) in
        &[(WeightFormat::F32, 45, 40, true), (WeightFormat::Q8_0, 96, 64, false), (WeightFormat::I8Row, 96, 64, false)]
    {
        let layer = Layer::new(format, 8, hidden, ffn, bias, &mut rng);
        let slots = 5;
        // Slot s holds expert held[s].
        let held = [6usize, 1, 4, 0, 3];
        let dev = ctx.expert_slots(slots, &layer.mats(0)).unwrap();
        for (s, &e) in held.iter().enumerate() {
            let p = coli_runtime::vk::Context::pack_expert(&layer.mats(e), bias).unwrap();
            ctx.write_expert(&dev, s, &p).unwrap();
        }
        for (n, top_k, path) in
            [(1, 4, MoePath::Gemv), (9, 3, MoePath::Grouped), (3, 2, MoePath::Auto), (11, 3, MoePath::ExpertGemv)]
        {
            let x = rng.vec(n * hidden, 1.0);
            let rt = routing(n, top_k, layer.experts, &mut rng);
            // Pairs whose expert sits in a slot go to the device (as its slot id), the rest not.
            let mut local = rt.clone();
            let (mut on_dev, mut all) = (Vec::new(), Vec::new());
            for r in 0..n {
                for k in 0..top_k {
                    let at = r * 2 * top_k + 2 * k;
                    all.push((r, k));
                    match held.iter().position(|&e| e == rt[at] as usize) {
                        Some(s) => {
                            local[at] = s as f32;
                            on_dev.push((r, k));
                        }
                        None => local[at] = -1.0,
                    }
                }
            }
            let mut want = vec![0f32; n * top_k * hidden];
            pair_outputs(
                Routed { x: &x, n, hidden, routing: &rt, top_k },
                &all,
                GluKind::SwiGlu,
                Precision::Fast,
                &|e| layer.mats(e),
                &mut want,
            );
            let scratch = ctx.moe_scratch(n, top_k, hidden, ffn, slots).unwrap();
            let (xb, rb) = (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&local).unwrap());
            let yb = ctx.upload_f32(&vec![9.0; n * top_k * hidden]).unwrap();
            let mut f = ctx.frame().unwrap();
            let call = MoeCall {
                experts: &dev,
                scratch: &scratch,
                n,
                top_k,
                glu: GluKind::SwiGlu,
                precision: Precision::Fast,
                path,
            };
            f.moe_pairs(call, xb.all(), rb.all(), yb.all()).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(yb.all()).unwrap();
            let float_acts = !format.uses_q8_acts(ffn) && !format.uses_q8_acts(hidden);
            let tol = if float_acts { 1e-5 } else { 1e-4 };
            let rows = |pairs: &[(usize, usize)], v: &[f32]| {
                pairs.iter().flat_map(|&(r, k)| v[(r * top_k + k) * hidden..][..hidden].to_vec()).collect::<Vec<f32>>()
            };
            assert_close(
                &format!("{format} n={n} top {top_k} {path:?}: device pairs"),
                &rows(&on_dev, &got),
                &rows(&on_dev, &want),
                tol,
            );
            let absent: Vec<(usize, usize)> = all.iter().copied().filter(|p| !on_dev.contains(p)).collect();
            assert!(rows(&absent, &got).iter().all(|&v| v == 9.0), "{format} n={n}: an absent pair's row was written");
            assert!(!on_dev.is_empty(), "the case routes to some slot");
        }
    }
}

/// A layer's experts in pages (`upload_expert_pages` under a small `expert_page_bytes`, as a
/// layer past the device's buffer range goes up): every path (a pair's GEMV, an expert's, the
/// grouped GEMM), the norm taken into the 8-bit activations and the residual in the store,
/// against the CPU (the tolerances above) and bit for bit against one stack of the same
/// experts; the pages' count as the bytes say.
/// Routed experts that route their rows themselves (`moe_paged_routed`: the routing made in the
/// gate/up GEMVs, no Route dispatch) against `route` then `moe_fused` on the device, bit for
/// bit (the routing written for later readers too), and against the CPU's router and experts:
/// softmax without renormalization, sigmoid with a correction bias, groups and a scale, square
/// root of softplus with groups by their best. Rows past the per-pair GEMVs (`MoePath::Auto`
/// at 40 rows) and experts in two pages take the Route dispatch instead, with the same results.
#[test]
fn experts_route_their_rows_as_the_router_does() {
    let Some(base) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e41);
    let layer = Layer::new(WeightFormat::Q8_0, 16, 64, 64, false, &mut rng);
    let (h, e) = (layer.hidden, layer.experts);
    let bias = rng.vec(e, 0.3);
    type Case = (RouterScoring, bool, Option<(usize, usize)>, GroupScore, f32, bool, usize);
    let cases: [Case; 3] = [
        (RouterScoring::Softmax, false, None, GroupScore::TopTwoSum, 1.0, false, 4),
        (RouterScoring::Sigmoid, true, Some((4, 2)), GroupScore::TopTwoSum, 2.5, true, 3),
        (RouterScoring::SqrtSoftplus, true, Some((8, 3)), GroupScore::Max, 1.5, false, 2),
    ];
    let page = 8 * coli_runtime::vk::Context::expert_stack_bytes(&layer.mats(0)).unwrap();
    let paged_opts = coli_runtime::vk::VkOptions { expert_page_bytes: Some(page as u64), ..Default::default() };
    let paged = vk_common::open(&paged_opts).unwrap();
    for (scoring, renormalize, groups, group_score, scale, with_bias, top_k) in cases {
        for (ctx, n, two_pages) in [(base, 1, false), (base, 3, false), (base, 40, false), (&paged, 2, true)] {
            let what = format!("{scoring:?} top {top_k} groups {groups:?} n={n}");
            let x = rng.vec(n * h, 1.0);
            let logits = rng.vec(n * e, 2.0);
            let spec = RouteSpec {
                scoring,
                top_k,
                renormalize,
                correction_bias: with_bias.then_some(bias.as_slice()),
                groups,
                group_score,
                scale,
            };
            let mut rt = vec![0f32; n * 2 * top_k];
            for r in 0..n {
                route_row(&spec, &logits[r * e..(r + 1) * e], &mut rt[r * 2 * top_k..(r + 1) * 2 * top_k]);
            }
            let mut want = vec![0f32; n * h];
            let routed = Routed { x: &x, n, hidden: h, routing: &rt, top_k };
            routed_experts(routed, GluKind::SwiGlu, Precision::Fast, &|i| layer.mats(i), &mut want);
            let pages = ctx.upload_expert_pages(e, &|i| layer.mats(i)).unwrap();
            assert_eq!(pages.pages().len(), if two_pages { 2 } else { 1 }, "{what}");
            let scratch = ctx.moe_scratch(n, top_k, h, layer.ffn, e).unwrap();
            let (xb, lb, bb) =
                (ctx.upload_f32(&x).unwrap(), ctx.upload_f32(&logits).unwrap(), ctx.upload_f32(&bias).unwrap());
            let params = RouteParams { scoring, top_k, renormalize, groups, group_score, scale };
            let call = MoeCall {
                experts: &pages.pages()[0],
                scratch: &scratch,
                n,
                top_k,
                glu: GluKind::SwiGlu,
                precision: Precision::Fast,
                path: MoePath::Auto,
            };
            let run = |fused: bool| {
                let (rb, ob) = (ctx.f32_buffer(3 + n * 2 * top_k).unwrap(), ctx.f32_buffer(n * h).unwrap());
                let routing = rb.view(3, n * 2 * top_k);
                let b = with_bias.then(|| bb.all());
                let mut f = ctx.frame().unwrap();
                if fused {
                    let route = MoeRoute { logits: lb.all(), bias: b, params };
                    f.moe_paged_routed(&pages, call, MatIn::Plain(xb.all()), None, route, routing, ob.all()).unwrap();
                } else {
                    f.route(lb.all(), b, routing, n, e, params).unwrap();
                    f.moe_paged(&pages, call, MatIn::Plain(xb.all()), None, routing, ob.all()).unwrap();
                }
                f.run().unwrap();
                (ctx.download_f32(routing).unwrap(), ctx.download_f32(ob.all()).unwrap())
            };
            let (fused, apart) = (run(true), run(false));
            assert_eq!(fused, apart, "{what}: routed in the experts against the Route dispatch");
            let ids = |v: &[f32]| v.iter().step_by(2).copied().collect::<Vec<_>>();
            assert_eq!(ids(&fused.0), ids(&rt), "{what}: the CPU's experts");
            assert_close(&format!("{what} weights"), &fused.0, &rt, 1e-6);
            assert_close(&format!("{what} out"), &fused.1, &want, 1e-4);
        }
    }
}

#[test]
fn experts_in_pages_match_cpu() {
    let Some(base) = ctx() else { return };
    let mut rng = Rng(0x5eed_0e25);
    let (top_k, glu) = (3, GluKind::SwiGlu);
    for &(format, hidden, ffn, bias) in
        &[(WeightFormat::F32, 32, 48, true), (WeightFormat::I8Row, 96, 64, false), (WeightFormat::Q8_0, 64, 96, false)]
    {
        let layer = Layer::new(format, 7, hidden, ffn, bias, &mut rng);
        // Two experts' gate and up values a page (the largest of a page's buffers).
        let one = base.experts_per_page(&layer.mats(0)).unwrap();
        assert!(one >= layer.experts, "{format}: the device's range holds the layer ({one})");
        let page = 2 * coli_runtime::vk::Context::expert_stack_bytes(&layer.mats(0)).unwrap();
        let opts = coli_runtime::vk::VkOptions { expert_page_bytes: Some(page as u64), ..Default::default() };
        let ctx = vk_common::open(&opts).unwrap();
        let pages = ctx.upload_expert_pages(layer.experts, &|e| layer.mats(e)).unwrap();
        let sizes: Vec<usize> = pages.pages().iter().map(|p| p.experts).collect();
        assert_eq!(sizes, [2, 2, 2, 1], "{format}: pages of {page} bytes");
        for n in [1, 12, 70] {
            let h = rng.vec(n * hidden, 1.0);
            let nw = rng.vec(hidden, 1.0);
            let rt = routing(n, top_k, layer.experts, &mut rng);
            let norm = format != WeightFormat::F32;
            let mut x = h.clone();
            if norm {
                for (xr, hr) in x.chunks_exact_mut(hidden).zip(h.chunks_exact(hidden)) {
                    coli_runtime::cpu::norm::rms_norm(hr, xr, &nw, 1e-5, 0.0);
                }
            }
            let mut moe = vec![0f32; n * hidden];
            let routed = Routed { x: &x, n, hidden, routing: &rt, top_k };
            routed_experts(routed, glu, Precision::Fast, &|e| layer.mats(e), &mut moe);
            let want: Vec<f32> = h.iter().zip(&moe).map(|(a, b)| a + b).collect();
            let scratch = ctx.moe_scratch(n, top_k, hidden, ffn, pages.page_experts()).unwrap();
            let (hb, wb) = (ctx.upload_f32(&h).unwrap(), ctx.upload_f32(&nw).unwrap());
            let rb = ctx.upload_f32(&[vec![5.0; 4], rt.clone()].concat()).unwrap();
            let mut f = ctx.frame().unwrap();
            let input = if norm {
                MatIn::Norm { x: hb.all(), weight: wb.all(), eps: 1e-5, offset: 0.0 }
            } else {
                MatIn::Plain(hb.all())
            };
            let path = MoePath::Auto;
            let call = MoeCall {
                experts: &pages.pages()[0],
                scratch: &scratch,
                n,
                top_k,
                glu,
                precision: Precision::Fast,
                path,
            };
            f.moe_paged(&pages, call, input, Some(hb.all()), rb.view(4, n * 2 * top_k), hb.all()).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(hb.all()).unwrap();
            // One stack of the same experts, the same call: the pages change no bit.
            let one = ctx.upload_experts(layer.experts, &|e| layer.mats(e)).unwrap();
            let s1 = ctx.moe_scratch(n, top_k, hidden, ffn, layer.experts).unwrap();
            let hb1 = ctx.upload_f32(&h).unwrap();
            let mut f = ctx.frame().unwrap();
            let input = if norm {
                MatIn::Norm { x: hb1.all(), weight: wb.all(), eps: 1e-5, offset: 0.0 }
            } else {
                MatIn::Plain(hb1.all())
            };
            let call = MoeCall { experts: &one, scratch: &s1, n, top_k, glu, precision: Precision::Fast, path };
            f.moe_fused(call, input, Some(hb1.all()), rb.view(4, n * 2 * top_k), hb1.all()).unwrap();
            f.run().unwrap();
            assert_eq!(got, ctx.download_f32(hb1.all()).unwrap(), "{format} n={n}: pages against one stack");
            let what = format!("{format} paged n={n}");
            if norm {
                assert_q8_close(&what, &got, &want, &q8_slack(&layer, &x, &rt, n, top_k, glu), hidden);
            } else {
                assert_close(&what, &got, &want, 1e-5);
            }
        }
    }
}

/// `moe_glu_q8.comp` (the cooperative gate/up's epilogue, which Lavapipe never reaches through
/// `moe`: it has no int8 cooperative shape) on its own: h within 1e-5 of the CPU's gated unit
/// of the biased raw sums (the device's exp), and h's 8-bit blocks equal to
/// `QuantizedActs::new(h)` bit for bit (d, d * sum, every code). One pair's expert id is not
/// an expert: its biases are skipped, as the other kernels skip them.
#[test]
fn gated_unit_and_its_blocks_from_raw_sums_match_cpu() {
    use coli_runtime::format::QuantizedActs;
    use coli_runtime::vk::MoeGluQ8;
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0610);
    let (n, top_k, experts, ffn) = (5, 3, 6, 96);
    let pairs = n * top_k;
    let mut rt = routing(n, top_k, experts, &mut rng);
    rt[2 * 4] = experts as f32;
    let gu: Vec<f32> = (0..pairs).flat_map(|p| rng.vec(2 * ffn, [0.5, 3.0, 8.0][p % 3])).collect();
    let bias = rng.vec(experts * 2 * ffn, 1.0);
    let (gub, rtb, bb) = (ctx.upload_f32(&gu).unwrap(), ctx.upload_f32(&rt).unwrap(), ctx.upload_f32(&bias).unwrap());
    let blocks = pairs * ffn / 32;
    let (h, hq, hd) = (
        ctx.f32_buffer(pairs * ffn).unwrap(),
        ctx.f32_buffer(blocks * 8).unwrap(),
        ctx.f32_buffer(blocks * 2).unwrap(),
    );
    let glus = [
        GluKind::SwiGlu,
        GluKind::GeGlu,
        GluKind::ClampedSwiGlu { limit: 3.0, alpha: 1.702 },
        GluKind::LimitedSwiGlu { limit: 4.0 },
    ];
    for glu in glus {
        for with_bias in [false, true] {
            let what = format!("{glu:?}, biases {with_bias}");
            let mut want = vec![0f32; pairs * ffn];
            for p in 0..pairs {
                let (mut g, mut u) =
                    (gu[p * 2 * ffn..p * 2 * ffn + ffn].to_vec(), gu[p * 2 * ffn + ffn..(p + 1) * 2 * ffn].to_vec());
                let e = rt[p / top_k * 2 * top_k + 2 * (p % top_k)] as usize;
                if with_bias && e < experts {
                    let b = &bias[e * 2 * ffn..(e + 1) * 2 * ffn];
                    g.iter_mut().zip(&b[..ffn]).for_each(|(v, b)| *v += b);
                    u.iter_mut().zip(&b[ffn..]).for_each(|(v, b)| *v += b);
                }
                cpu_elementwise::glu(glu, &g, &u, &mut want[p * ffn..(p + 1) * ffn]);
            }
            let mut f = ctx.frame().unwrap();
            let bias = with_bias.then_some(&bb);
            let args = MoeGluQ8 {
                gu: &gub,
                routing: rtb.all(),
                bias,
                h: &h,
                hq: &hq,
                hd: &hd,
                pairs,
                ffn,
                top_k,
                experts,
                glu,
            };
            f.moe_glu_q8(args).unwrap();
            f.run().unwrap();
            let got = ctx.download_f32(h.all()).unwrap();
            assert_close(&what, &got, &want, 1e-5);
            let acts = QuantizedActs::new(&got, pairs, ffn).unwrap();
            let (q, d) = (ctx.download_f32(hq.all()).unwrap(), ctx.download_f32(hd.all()).unwrap());
            for b in 0..blocks {
                let cpu = acts.row(b / (ffn / 32))[b % (ffn / 32)];
                let codes: Vec<i8> =
                    q[8 * b..8 * b + 8].iter().flat_map(|w| w.to_bits().to_le_bytes()).map(|c| c as i8).collect();
                assert_eq!(codes, cpu.q, "{what}: block {b}'s codes");
                assert_eq!(
                    (d[2 * b].to_bits(), d[2 * b + 1].to_bits()),
                    (cpu.d.to_bits(), cpu.s.to_bits()),
                    "{what}: block {b}'s scales"
                );
            }
        }
    }
    // Operands that do not fit are typed errors.
    let mut f = ctx.frame().unwrap();
    let bad = MoeGluQ8 {
        gu: &gub,
        routing: rtb.all(),
        bias: None,
        h: &h,
        hq: &hq,
        hd: &hd,
        pairs,
        ffn: 80,
        top_k,
        experts,
        glu: GluKind::SwiGlu,
    };
    assert!(f.moe_glu_q8(bad).is_err(), "an ffn of 80 is not whole blocks");
    assert!(f.moe_glu_q8(MoeGluQ8 { pairs: pairs + top_k, ffn, ..bad }).is_err(), "more pairs than the buffers hold");
}
