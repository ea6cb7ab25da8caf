//! MLA over the rows of several sequences in one call (`Frame::mla_seqs`, a batched step: the
//! products once over every row, each sequence's cache rows and attention over its own cache)
//! against `Frame::mla_at` over each sequence's rows alone and against the CPU op
//! (`cpu::mla::mla`, each sequence over its own host cache), on Lavapipe: f32 weights and
//! activations (`Precision::Exact`), three sequences with caches of different lengths, a decode
//! row each and then blocks of 1, 3 and 2 rows (a prompt chunk beside decode rows), positions
//! fixed and read on the device. Tolerance: outputs (against both), mirrors and read-back rows
//! (against `mla_at`'s) within 1e-5 of their largest |value| (the products over every row may
//! take a GEMM where a row alone takes a GEMV; on Lavapipe they agree with `mla_at` bit for
//! bit); the batched call records fewer dispatches than the calls one a sequence (12 against
//! 24 for three sequences).
//!
//! Must not: grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{MlaSpec, RopeScaling, RopeStyle};
use coli_runtime::cpu::mla::{mla, MlaCall as CpuCall, MlaForm, MlaWeights, QueryWeights};
use coli_runtime::cpu::rope::inv_freq;
use coli_runtime::cpu::Precision;
use coli_runtime::exec::kv::LayerKv;
use coli_runtime::format::{Matrix, WeightFormat};
use coli_runtime::vk::{
    Context, DeviceBuffer, MlaCache, MlaCall, MlaMats, MlaQuery, MlaScratch, MlaSeq, MlaShape, Pos, RopeArgs,
};
use vk_common::*;

/// A sequence's cache: mirrors of `cap` positions and read-back rows of `rows`, and its
/// position buffer.
struct Cache {
    ml: DeviceBuffer,
    mr: DeviceBuffer,
    sl: DeviceBuffer,
    sr: DeviceBuffer,
    pos: DeviceBuffer,
}

impl Cache {
    fn view(&self) -> MlaCache<'_> {
        MlaCache { latent: self.ml.all(), rope: self.mr.all(), latent_back: self.sl.all(), rope_back: self.sr.all() }
    }

    fn dump(&self, ctx: &Context) -> Vec<Vec<f32>> {
        [&self.ml, &self.mr, &self.sl, &self.sr].iter().map(|b| ctx.download_f32(b.all()).unwrap()).collect()
    }
}

#[test]
fn one_call_over_every_sequence_matches_a_call_a_sequence() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_3a1a);
    let (hidden, heads, q_lora, latent, nope, rope, v) = (48, 3, 24, 32, 16, 8, 16);
    let spec = MlaSpec {
        heads,
        q_lora_rank: Some(q_lora),
        kv_lora_rank: latent,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: v,
        scale: 1.0 / ((nope + rope) as f32).sqrt(),
        weights: vec![],
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        norm_eps: 1e-6,
        rope_interleave: false,
        select: None,
    };
    let s = MlaShape::of(&spec);
    let dims = [
        (q_lora, hidden),
        (heads * (nope + rope), q_lora),
        (latent + rope, hidden),
        (heads * (nope + v), latent),
        (hidden, heads * v),
    ];
    let stored: Vec<Vec<u8>> = dims.iter().map(|&(r, k)| random_rows(WeightFormat::F32, r, k, &mut rng)).collect();
    let dm: Vec<_> =
        dims.iter().zip(&stored).map(|(&(r, k), b)| ctx.upload_matrix(WeightFormat::F32, r, k, b).unwrap()).collect();
    let qn: Vec<f32> = rng.vec(q_lora, 0.5).iter().map(|x| 1.0 + x).collect();
    let kn: Vec<f32> = rng.vec(latent, 0.5).iter().map(|x| 1.0 + x).collect();
    // The CPU's op over the same weights, and each sequence's cache on the host.
    let m = |i: usize| Matrix::new(WeightFormat::F32, dims[i].0, dims[i].1, &stored[i]).unwrap();
    let cw = MlaWeights {
        q: QueryWeights::Lora { q_a: m(0), q_a_norm: &qn, q_b: m(1) },
        q_a_bias: None,
        kv_a: m(2),
        kv_a_bias: None,
        kv_a_norm: &kn,
        kv_b: m(3),
        o: m(4),
        o_bias: None,
    };
    let mut host: Vec<LayerKv> =
        (0..3).map(|_| LayerKv { k_width: latent, v_width: rope, ..Default::default() }).collect();
    let cpu = |x: &[f32], n: usize, pos0: usize, kv: &mut LayerKv| {
        let call = CpuCall {
            spec: &spec,
            weights: &cw,
            precision: Precision::Exact,
            form: MlaForm::for_rows(n),
            select: None,
        };
        let mut out = vec![0f32; n * hidden];
        mla(&call, x, n, pos0, kv, &mut out);
        out
    };
    let (dqn, dkn) = (ctx.upload_f32(&qn).unwrap(), ctx.upload_f32(&kn).unwrap());
    let mats = MlaMats {
        q: MlaQuery::Lora { q_a: &dm[0], q_a_norm: dqn.all(), q_b: &dm[1] },
        q_a_bias: None,
        kv_a: &dm[2],
        kv_a_bias: None,
        kv_a_norm: dkn.all(),
        kv_b: &dm[3],
        o: &dm[4],
        o_bias: None,
    };
    let (freq, mscale) = inv_freq(rope, spec.rope_theta, spec.rope_scaling);
    let dfreq = ctx.upload_f32(&freq).unwrap();
    let ra = RopeArgs { freq: dfreq.all(), style: RopeStyle::RotateHalf, mscale };
    let cap = 40;
    let most = 12;
    let scratch = MlaScratch::new(ctx, most, s).unwrap();
    let call = |cache| MlaCall {
        shape: s,
        weights: mats,
        rope: ra,
        cache,
        scratch: &scratch,
        precision: Precision::Exact,
        select: None,
    };
    // Two sets of caches filled alike: prompts of 5, 11 and 2 rows.
    let new_cache = || Cache {
        ml: ctx.f32_buffer(cap * latent).unwrap(),
        mr: ctx.f32_buffer(cap * rope).unwrap(),
        sl: ctx.f32_buffer(most * latent).unwrap(),
        sr: ctx.f32_buffer(most * rope).unwrap(),
        pos: ctx.f32_buffer(4).unwrap(),
    };
    let (each, one): (Vec<Cache>, Vec<Cache>) = (0..3).map(|_| (new_cache(), new_cache())).unzip();
    let (dx, dy) = (ctx.f32_buffer(most * hidden).unwrap(), ctx.f32_buffer(most * hidden).unwrap());
    let mut pos = [0usize; 3];
    for (i, n) in [5usize, 11, 2].into_iter().enumerate() {
        let x = rng.vec(n * hidden, 1.0);
        ctx.write(&dx, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        for c in [&each[i], &one[i]] {
            let mut f = ctx.frame().unwrap();
            f.mla(call(c.view()), dx.view(0, n * hidden), n, 0, dy.view(0, n * hidden)).unwrap();
            f.run().unwrap();
        }
        cpu(&x, n, 0, &mut host[i]);
        pos[i] = n;
    }
    // Steps: each sequence's rows this step, and whether its position is read on the device.
    for (step, rows) in [[1usize, 1, 1], [1, 3, 2], [2, 1, 1]].iter().enumerate() {
        let dynamic = step == 2;
        let n: usize = rows.iter().sum();
        let x = rng.vec(n * hidden, 1.0);
        ctx.write(&dx, 0, &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let starts: Vec<usize> = rows.iter().scan(0, |a, &r| Some(std::mem::replace(a, *a + r))).collect();
        for (c, &p) in one.iter().zip(&pos).chain(each.iter().zip(&pos)) {
            ctx.write(&c.pos, 0, &(p as u32).to_le_bytes()).unwrap();
        }
        fn at(c: &Cache, p: usize, dynamic: bool) -> Pos<'_> {
            if dynamic {
                Pos::Dynamic(c.pos.all())
            } else {
                Pos::Fixed(p)
            }
        }
        // A call a sequence, each in a frame of its own, into its rows of `dy`.
        let mut alone = 0;
        for i in 0..3 {
            let (r0, m) = (starts[i], rows[i]);
            let mut f = ctx.frame().unwrap();
            let (xv, yv) = (dx.view(r0 * hidden, m * hidden), dy.view(r0 * hidden, m * hidden));
            f.mla_at(call(each[i].view()), xv, m, at(&each[i], pos[i], dynamic), yv).unwrap();
            alone += f.dispatch_count();
            f.run().unwrap();
        }
        let want = ctx.download_f32(dy.view(0, n * hidden)).unwrap();
        // One call over every sequence.
        let seqs: Vec<MlaSeq> = (0..3)
            .map(|i| MlaSeq {
                rows: starts[i]..starts[i] + rows[i],
                cache: one[i].view(),
                pos: at(&one[i], pos[i], dynamic),
                select: None,
            })
            .collect();
        let mut f = ctx.frame().unwrap();
        f.mla_seqs(call(one[0].view()), dx.view(0, n * hidden), n, dy.view(0, n * hidden), &seqs).unwrap();
        let batched = f.dispatch_count();
        f.run().unwrap();
        let got = ctx.download_f32(dy.view(0, n * hidden)).unwrap();
        let what = format!(
            "step {step}, rows {rows:?}, positions {pos:?}{}",
            if dynamic { " read on the device" } else { "" }
        );
        let e = worst(&got, &want);
        eprintln!("{what}: output {e:.2e}, {batched} dispatches against {alone}");
        assert!(e <= 1e-5, "{what}: output off by {e} of its largest value");
        assert!(batched < alone, "{what}: {batched} dispatches, {alone} one a sequence");
        for i in 0..3 {
            let (r0, m) = (starts[i], rows[i]);
            let want = cpu(&x[r0 * hidden..(r0 + m) * hidden], m, pos[i], &mut host[i]);
            let e = worst(&got[r0 * hidden..(r0 + m) * hidden], &want);
            assert!(e <= 1e-5, "{what}: sequence {i}'s rows off the CPU's by {e} of their largest value");
        }
        for i in 0..3 {
            let (a, b) = (one[i].dump(ctx), each[i].dump(ctx));
            // The read-back rows hold this step's rows only.
            for (k, (g, w)) in a.iter().zip(&b).enumerate() {
                let len = match k {
                    0 => (pos[i] + rows[i]) * latent,
                    1 => (pos[i] + rows[i]) * rope,
                    2 => rows[i] * latent,
                    _ => rows[i] * rope,
                };
                let e = worst(&g[..len], &w[..len]);
                assert!(e <= 1e-5, "{what}: sequence {i}'s cache buffer {k} off by {e}");
            }
        }
        for i in 0..3 {
            pos[i] += rows[i];
        }
    }
}
