//! A sliding window's KV mirror as a ring (`AttnShape::ring`, `CompressedShape::ring`: position
//! `p` in row `p % ring`, the ring holding only the newest `ring` positions) against the CPU
//! over every position: the split decode kernel, the blocked kernel, the one-row kernel that
//! appends its own row into the ring, and DeepSeek V4's attention over cached rows and
//! compressed entries; blocks that cross the ring's end, rings of the window and one row (the
//! least a decode row needs) and of the window and a chunk. The rows a ring does not hold are
//! poison (a read of one would show far past the bound). Tolerance 1e-5 of the largest
//! |output| (f32 sums in another order).

mod vk_common;

use coli_runtime::vk::{AttnArgs, AttnPath, AttnShape, DecodeArgs, KvMirror, Pos};
use vk_common::{assert_close, attention_case, ctx, to_ring, AttnCase, Rng};

#[test]
fn attention_over_a_ring_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0a01);
    let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
    // (heads, kv_heads, head_dim, v_head_dim, window, sinks, n, pos0, ring)
    let cases = [
        (4, 2, 64, 64, 5, true, 19, 53, 24),
        (4, 2, 64, 64, 5, false, 1, 150, 6),
        (4, 1, 32, 48, 37, true, 3, 70, 40),
        (4, 1, 32, 48, 37, false, 1, 300, 45),
        (8, 2, 192, 128, 4, true, 1, 22, 5),
        (2, 2, 80, 80, 130, true, 20, 400, 149),
        (2, 2, 80, 80, 130, false, 1, 399, 131),
    ];
    for (heads, kv_heads, hd, vhd, window, sinks, n, pos0, ring) in cases {
        let dims = (heads, kv_heads, hd, vhd);
        let AttnCase { q, k, v, sinks: sk, shape, want } =
            attention_case(&mut rng, dims, Some(window), sinks, 1.0, n, pos0);
        let shape = AttnShape { ring: Some(ring), ..shape };
        let (kw, vw, len) = (kv_heads * hd, kv_heads * vhd, pos0 + n);
        let (qb, sb) = (up(&q), up(&sk));
        let (kb, vb) = (up(&to_ring(&k, kw, len, ring)), up(&to_ring(&v, vw, len, ring)));
        let what =
            |path: &str| format!("{heads}/{kv_heads}x{hd}/{vhd} window {window} n {n} at {pos0} ring {ring} {path}");
        for path in [AttnPath::Split, AttnPath::Block] {
            let ob = ctx.f32_buffer(want.len()).unwrap();
            let mut f = ctx.frame().unwrap();
            let args =
                AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: sinks.then(|| sb.all()), out: ob.all(), n };
            f.attention(shape, args, pos0, path).unwrap();
            f.run().unwrap();
            assert_close(&what(&format!("{path:?}")), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        }
        if n > 1 {
            continue;
        }
        // The one-row kernel: the ring holds the positions before the row, the row's own slot
        // poison; the kernel writes the row's k and v there (no RoPE) and to the read-back rows.
        let (mk, mv) = (up(&to_ring(&k, kw, pos0, ring)), up(&to_ring(&v, vw, pos0, ring)));
        let (krow, vrow) = (up(&k[pos0 * kw..]), up(&v[pos0 * vw..]));
        let (kback, vback) = (ctx.f32_buffer(kw).unwrap(), ctx.f32_buffer(vw).unwrap());
        let ob = ctx.f32_buffer(want.len()).unwrap();
        let mut f = ctx.frame().unwrap();
        let decode = DecodeArgs {
            rope: None,
            q: qb.all(),
            k: krow.all(),
            v: vrow.all(),
            mirror: KvMirror { k: mk.all(), v: mv.all(), k_back: kback.all(), v_back: vback.all() },
            sinks: sinks.then(|| sb.all()),
            out: ob.all(),
            pos: Pos::Fixed(pos0),
            norm: None,
            q8: false,
        };
        f.attention_decode(shape, decode).unwrap();
        f.run().unwrap();
        assert_close(&what("one-row kernel"), &ctx.download_f32(ob.all()).unwrap(), &want, 1e-5);
        let slot = pos0 % ring;
        assert_eq!(ctx.download_f32(mk.all()).unwrap()[slot * kw..][..kw], k[pos0 * kw..][..kw], "{}", what("k slot"));
        assert_eq!(ctx.download_f32(mv.all()).unwrap()[slot * vw..][..vw], v[pos0 * vw..][..vw], "{}", what("v slot"));
    }
}

/// A ring shorter than the window and the block's rows before the last one is refused.
#[test]
fn a_ring_short_of_the_window_and_block_is_refused() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0a02);
    let AttnCase { q, k, v, shape, want, .. } = attention_case(&mut rng, (2, 1, 16, 16), Some(8), false, 1.0, 4, 20);
    let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
    let (qb, kb, vb, ob) = (up(&q), up(&k), up(&v), ctx.f32_buffer(want.len()).unwrap());
    for (ring, window) in [(10, Some(8)), (64, None)] {
        let shape = AttnShape { ring: Some(ring), window, ..shape };
        let args = AttnArgs { q: qb.all(), k: kb.all(), v: vb.all(), sinks: None, out: ob.all(), n: 4 };
        let err = ctx.frame().unwrap().attention(shape, args, 20, AttnPath::Block).unwrap_err().to_string();
        assert!(err.contains("a ring of"), "ring {ring} window {window:?}: {err}");
    }
}

/// DeepSeek V4's attention over its window's cached rows in a ring and the compressed entries
/// (`attn_compressed.comp`) against `cpu::compress::attend` over every position.
#[test]
fn compressed_attention_over_a_ring_matches_cpu() {
    use coli_runtime::cpu::attention::AttnShape as CpuShape;
    use coli_runtime::cpu::compress::{attend, Entries};
    use coli_runtime::vk::{CompressedArgs, CompressedShape};
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_0a03);
    let up = |x: &[f32]| ctx.upload_f32(x).unwrap();
    // (heads, head_dim, window, rate, pos0, n, topk, ring, dynamic)
    let cases = [
        (3, 24, 4, 5, 37, 22, 0, 26, false),
        (3, 24, 4, 3, 91, 9, 3, 12, false),
        (5, 19, 70, 2, 260, 30, 0, 99, false),
        (2, 130, 8, 5, 99, 1, 0, 9, true),
    ];
    for (heads, d, window, rate, pos0, n, topk, ring, dynamic) in cases {
        let len = pos0 + n;
        let count = len / rate;
        let q = rng.vec(n * heads * d, 1.0);
        let (k, v) = (rng.vec(len * d, 1.0), rng.vec(len * d, 1.0));
        let entries = rng.vec(count.max(1) * d, 1.0);
        let sinks = rng.vec(heads, 1.0);
        let select: Vec<f32> = (0..n * topk).map(|_| rng.below(count + 1) as f32 - 1.0).collect();
        let cs = CpuShape {
            heads,
            kv_heads: 1,
            head_dim: d,
            v_head_dim: d,
            scale: (d as f32).powf(-0.5),
            window: Some(window),
        };
        let e = Entries { rows: &entries, rate, select: (topk > 0).then_some((select.as_slice(), topk)) };
        let mut want = vec![0f32; n * heads * d];
        attend(cs, &q, (&k, &v), &e, pos0, Some(&sinks), &mut want);
        let shape =
            CompressedShape { heads, head_dim: d, scale: cs.scale, window: Some(window), rate, ring: Some(ring) };
        let (dk, dv) = (up(&to_ring(&k, d, len, ring)), up(&to_ring(&v, d, len, ring)));
        let (dq, de, ds, dsel) = (up(&q), up(&entries), up(&sinks), up(&select));
        let (out, dpos) = (ctx.f32_buffer(n * heads * d).unwrap(), ctx.f32_buffer(1).unwrap());
        ctx.write(&dpos, 0, &(pos0 as u32).to_le_bytes()).unwrap();
        let pos = if dynamic { Pos::Dynamic(dpos.view(0, 1)) } else { Pos::Fixed(pos0) };
        let args = CompressedArgs {
            q: dq.all(),
            k: dk.all(),
            v: dv.all(),
            entries: de.all(),
            sinks: Some(ds.all()),
            select: (topk > 0).then(|| (dsel.all(), topk)),
            out: out.all(),
            n,
        };
        let mut f = ctx.frame().unwrap();
        f.attention_compressed(shape, args, pos).unwrap();
        f.run().unwrap();
        let what = format!("compressed {heads}x{d} window {window} rate {rate} at {pos0}+{n} topk {topk} ring {ring}");
        assert_close(&what, &ctx.download_f32(out.all()).unwrap(), &want, 1e-5);
    }
}
