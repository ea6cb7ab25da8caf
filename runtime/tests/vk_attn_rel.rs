//! Attention with relative-position logits (Inkling's `attention_rel`) on the device against
//! the CPU (`cpu::attention::rel_logits` then `attend_rel`) on Lavapipe: grouped query heads
//! (kv heads fewer than heads), a global layer (an extent shorter than the positions seen, so
//! the logits stop at it) and a sliding one (the extent its window), decode rows (one row: the
//! split kernel, and the one-row kernel that appends its own k and v rows) and prompt chunks
//! (the blocked kernel, and the split kernel on several rows), from position 0 and deep into
//! the cache, with and without sinks.
//!
//! Tolerance: within 1e-5 of the largest |output| (f32 sums in another order; the relative
//! logits are the CPU's sums in the CPU's order).

mod vk_common;

use coli_runtime::cpu::attention as cpu;
use coli_runtime::vk::{AttnArgs, AttnPath, AttnShape, DecodeArgs, KvMirror, Pos, RelArgs};
use vk_common::*;

/// One layer's geometry: (heads, kv heads, head dim, d_rel, extent, window).
type Geometry = (usize, usize, usize, usize, usize, Option<usize>);

struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    r: Vec<f32>,
    proj: Vec<f32>,
    sinks: Vec<f32>,
    shape: AttnShape,
    want: Vec<f32>,
}

fn case(rng: &mut Rng, g: Geometry, sinks: bool, n: usize, pos0: usize) -> Case {
    let (heads, kv_heads, hd, d_rel, extent, window) = g;
    let scale = 1.0 / hd as f32;
    let cs = cpu::AttnShape { heads, kv_heads, head_dim: hd, v_head_dim: hd, scale, window };
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        v_head_dim: hd,
        scale,
        window,
        value_scale: 1.0,
        ring: None,
        kv: coli_runtime::vk::KvType::F32,
    };
    let len = pos0 + n;
    let (q, k, v) =
        (rng.vec(n * heads * hd, 2.0), rng.vec(len * kv_heads * hd, 2.0), rng.vec(len * kv_heads * hd, 1.0));
    let (r, proj, s) = (rng.vec(n * heads * d_rel, 1.0), rng.vec(d_rel * extent, 1.0), rng.vec(heads, 1.0));
    let logits = cpu::rel_logits(&r, &proj, heads, d_rel, extent);
    let bias = cpu::RelBias { logits: &logits, extent };
    let mut want = vec![0f32; n * heads * hd];
    cpu::attend_rel(cs, &q, &k, &v, pos0, sinks.then_some(&s[..]), Some(bias), &mut want);
    Case { q, k, v, r, proj, sinks: s, shape, want }
}

#[test]
fn relative_logits_match_cpu_global_and_sliding() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0a11);
    let mut worst = 0f32;
    // A global layer whose extent the cache outgrows, and a sliding one (extent = window).
    let layers: [Geometry; 2] = [(8, 2, 32, 4, 24, None), (6, 3, 16, 8, 16, Some(16))];
    for (li, &g) in layers.iter().enumerate() {
        let (heads, _, _, d_rel, extent, window) = g;
        for (n, pos0, sinks) in [(1, 40, false), (1, 3, true), (13, 30, false), (5, 0, true), (3, 18, false)] {
            let c = case(&mut rng, g, sinks, n, pos0);
            let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
            let (qb, kb, vb, rb, pb, sb) = (up(&c.q), up(&c.k), up(&c.v), up(&c.r), up(&c.proj), up(&c.sinks));
            let rel = RelArgs { r: rb.all(), proj: pb.all(), d_rel, extent };
            for path in [AttnPath::Auto, AttnPath::Split, AttnPath::Block] {
                let ob = ctx.f32_buffer(c.want.len()).unwrap();
                let mut f = ctx.frame().unwrap();
                let s = sinks.then(|| sb.all());
                let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: s, out: ob.all(), n };
                f.attention_rel_at(c.shape, args, Some(rel), Pos::Fixed(pos0), path).unwrap();
                f.run().unwrap();
                let got = ctx.download_f32(ob.all()).unwrap();
                let what =
                    format!("layer {li} (window {window:?}, extent {extent}) n {n} pos0 {pos0} sinks {sinks} {path:?}");
                worst = worst.max(rel_err(&got, &c.want));
                assert_close(&what, &got, &c.want, 1e-5);
            }
            if n == 1 {
                // The one-row kernel: the row's k and v appended by the kernel itself (the
                // mirror's row `pos0` starts as garbage), no RoPE.
                let kw = g.1 * g.2;
                let mut mk = c.k.clone();
                let mut mv = c.v.clone();
                mk[pos0 * kw..].iter_mut().for_each(|x| *x = 9.0);
                mv[pos0 * kw..].iter_mut().for_each(|x| *x = -9.0);
                let (mkb, mvb) = (up(&mk), up(&mv));
                let (krow, vrow) = (up(&c.k[pos0 * kw..]), up(&c.v[pos0 * kw..]));
                let (skb, svb) = (ctx.f32_buffer(kw).unwrap(), ctx.f32_buffer(kw).unwrap());
                let ob = ctx.f32_buffer(c.want.len()).unwrap();
                let mut f = ctx.frame().unwrap();
                let decode = DecodeArgs {
                    rope: None,
                    q: qb.all(),
                    k: krow.all(),
                    v: vrow.all(),
                    mirror: KvMirror { k: mkb.all(), v: mvb.all(), k_back: skb.all(), v_back: svb.all() },
                    sinks: sinks.then(|| sb.all()),
                    out: ob.all(),
                    pos: Pos::Fixed(pos0),
                    norm: None,
                    q8: false,
                };
                f.attention_decode_rel(c.shape, decode, Some(rel)).unwrap();
                f.run().unwrap();
                let got = ctx.download_f32(ob.all()).unwrap();
                worst = worst.max(rel_err(&got, &c.want));
                assert_close(&format!("layer {li} one-row kernel pos0 {pos0} heads {heads}"), &got, &c.want, 1e-5);
            }
        }
    }
    eprintln!("attention_rel: worst {worst:.2e} of the largest |output| (bound 1e-5)");
}

/// The f16 cooperative kernel does not take relative logits: asking for it is an error.
#[test]
fn relative_logits_refuse_the_cooperative_kernel() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0a12);
    let c = case(&mut rng, (4, 2, 16, 4, 8, None), false, 4, 0);
    let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
    let (qb, kb, vb, rb, pb, ob) = (up(&c.q), up(&c.k), up(&c.v), up(&c.r), up(&c.proj), up(&c.want));
    let rel = RelArgs { r: rb.all(), proj: pb.all(), d_rel: 4, extent: 8 };
    let mut f = ctx.frame().unwrap();
    let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: None, out: ob.all(), n: 4 };
    let e = f.attention_rel_at(c.shape, args, Some(rel), Pos::Fixed(0), AttnPath::Coop).unwrap_err();
    assert!(e.to_string().contains("relative logits"), "{e}");
}
