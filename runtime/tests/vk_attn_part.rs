//! A KV split's device ops against the CPU on Lavapipe: `attn_part` (each row's part over its
//! device share, read from a ring mirror) against `cpu::attn_part::attend_part` over the same
//! positions, and `rope_kv_ring` (the append into the ring) against the CPU's rotation; then
//! the device part merged with the CPU's part over the older positions (sinks on the host's
//! side) against `cpu::attention::attend` over every position. GQA, value heads narrower than
//! key heads, a window, sinks, prompt blocks and decode rows, fixed and device-read positions;
//! rings of f32 and of f16 (the keys and values then f16 values, so the CPU's are the same).
//!
//! Tolerance: the part's acc and l within 1e-5 relative to their largest magnitude, m within
//! 1e-5; the merged output within 1e-5 of the largest |reference| (values in [-1, 1]).

mod vk_common;

use coli_compiler::ir::{RopeScaling, RopeStyle};
use coli_compiler::place::kv_split::device_from;
use coli_runtime::cpu::attention::{attend, AttnShape as CpuShape};
use coli_runtime::cpu::attn_part::{attend_part, merge};
use coli_runtime::cpu::rope as cpu_rope;
use coli_runtime::vk::ops::attn_part::{PartArgs, SplitShape};
use coli_runtime::vk::{KvMirror, KvShape, Pos, RopeArgs, RopeKvArgs};
use vk_common::*;

#[test]
fn the_device_part_over_a_ring_matches_the_cpu_and_merges_to_the_full_attention() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_a77a);
    // (heads, kv_heads, head_dim, v_head_dim, window, sinks, positions, block, pos0, n, dynamic)
    let cases = [
        (4, 2, 16, 16, None, false, 16, 4, 37, 1, false),
        (4, 2, 16, 16, None, false, 16, 4, 38, 1, true),
        (6, 2, 32, 24, None, true, 24, 8, 50, 7, false),
        (3, 1, 64, 64, Some(20), true, 32, 8, 70, 3, false),
        (2, 2, 128, 128, None, false, 256, 64, 300, 2, false),
        (4, 4, 16, 16, None, true, 8, 8, 3, 9, false),
    ];
    let kvs = kv_types(ctx);
    for ((heads, kv_heads, head_dim, v_head_dim, window, with_sinks, positions, block, pos0, n, dynamic), kv) in
        cases.into_iter().flat_map(|c| kvs.iter().map(move |&t| (c, t)))
    {
        let what = format!(
            "{heads}/{kv_heads}/{head_dim}/{v_head_dim} window {window:?} share {positions}/{block} pos0 {pos0} n {n} {kv:?}"
        );
        let (kw, vw) = (kv_heads * head_dim, kv_heads * v_head_dim);
        let len = pos0 + n;
        let ring = positions + n.max(4);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let q = rng.vec(n * heads * head_dim, 1.0);
        let k = as_kv(&rng.vec(len * kw, 1.0), kv);
        let v = as_kv(&rng.vec(len * vw, 1.0), kv);
        let sinks = rng.vec(heads, 1.0);
        let sinks = with_sinks.then_some(sinks.as_slice());
        // The ring as the executor leaves it: position j in row j % ring (the latest writer).
        let mut rk = rng.vec(ring * kw, 1.0);
        let mut rv = rng.vec(ring * vw, 1.0);
        for j in len.saturating_sub(ring)..len {
            rk[(j % ring) * kw..][..kw].copy_from_slice(&k[j * kw..][..kw]);
            rv[(j % ring) * vw..][..vw].copy_from_slice(&v[j * vw..][..vw]);
        }
        let (qb, kb, vb) = (ctx.upload_f32(&q).unwrap(), upload_kv(ctx, &rk, kv), upload_kv(ctx, &rv, kv));
        let (acc, ml) = (ctx.f32_buffer(n * heads * v_head_dim).unwrap(), ctx.f32_buffer(n * heads * 2).unwrap());
        let pb = ctx.upload_u32(&[pos0 as u32]).unwrap();
        let pos = if dynamic { Pos::Dynamic(pb.all()) } else { Pos::Fixed(pos0) };
        let cs = CpuShape { heads, kv_heads, head_dim, v_head_dim, scale, window };
        let mut f = ctx.frame().unwrap();
        let part = PartArgs { q: qb.all(), k: kb.all(), v: vb.all(), acc: acc.all(), ml: ml.all(), n, pos, kv };
        f.attn_part(cs, SplitShape { positions, block, ring }, part).unwrap();
        f.run().unwrap();
        let lo = |p: usize| window.map_or(0, |w| (p + 1).saturating_sub(w));
        let dev_from = |i: usize| device_from(pos0 + i, positions, block).max(lo(pos0 + i));
        let want = attend_part(&cs, &q, &k, &v, n, &|i| (dev_from(i), pos0 + i + 1), None);
        let (got_acc, got_ml) = (ctx.download_f32(acc.all()).unwrap(), ctx.download_f32(ml.all()).unwrap());
        assert!(worst(&got_acc, &want.acc) <= 1e-5, "{what}: acc off by {}", worst(&got_acc, &want.acc));
        let (gm, wm): (Vec<f32>, Vec<f32>) =
            (got_ml.iter().step_by(2).copied().collect(), want.ml.iter().step_by(2).copied().collect());
        let (gl, wl): (Vec<f32>, Vec<f32>) =
            (got_ml.iter().skip(1).step_by(2).copied().collect(), want.ml.iter().skip(1).step_by(2).copied().collect());
        assert!(gm.iter().zip(&wm).all(|(a, b)| (a - b).abs() <= 1e-5), "{what}: m {gm:?} vs {wm:?}");
        assert!(worst(&gl, &wl) <= 1e-5, "{what}: l {gl:?} vs {wl:?}");
        // Merged with the host's part (the older positions and the sinks): the full attention.
        let host = attend_part(&cs, &q, &k, &v, n, &|i| (lo(pos0 + i), dev_from(i)), sinks);
        let device = coli_runtime::cpu::attn_part::Parts { acc: got_acc, ml: got_ml };
        let mut out = vec![f32::NAN; n * heads * v_head_dim];
        merge(&cs, &device, &host, &mut out);
        let mut full = vec![0.0; out.len()];
        attend(cs, &q, &k, &v, pos0, sinks, &mut full);
        assert!(worst(&out, &full) <= 1e-5, "{what}: merged off by {}", worst(&out, &full));
    }
}

/// The append into a ring: rows of positions pos0.. land in rows p % ring, rotated as
/// `cpu::rope::apply_row`; the other rows stay; the read-back rows hold the block; f32 and f16
/// rings. Tolerance 1e-5 (rotations; f16: one f16 step, 1e-3); copies exact.
#[test]
fn rope_kv_ring_wraps() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x5eed_a77b);
    let (heads, kv_heads, head_dim, v_head_dim, ring) = (4, 2, 16, 8, 10);
    let (kw, vw) = (kv_heads * head_dim, kv_heads * v_head_dim);
    let (freq, mscale) = cpu_rope::inv_freq(head_dim, 10000.0, RopeScaling::None);
    // 9 rows from row 5 of the ring: the read-back rows by two copy commands (rows 5..10, 0..4).
    let kvs = kv_types(ctx);
    for ((n, pos0), kv) in [(4, 27), (1, 39), (9, 25)].into_iter().flat_map(|c| kvs.iter().map(move |&t| (c, t))) {
        let (q, k, v) = (rng.vec(n * heads * head_dim, 1.0), rng.vec(n * kw, 1.0), rng.vec(n * vw, 1.0));
        let mut wk = k.clone();
        for (i, row) in wk.chunks_exact_mut(kw).enumerate() {
            cpu_rope::apply_row(row, head_dim, RopeStyle::RotateHalf, &freq, mscale, pos0 + i);
        }
        let (old_k, old_v) = (rng.vec(ring * kw, 1.0), rng.vec(ring * vw, 1.0));
        let (qb, kb, vb) = (ctx.upload_f32(&q).unwrap(), ctx.upload_f32(&k).unwrap(), ctx.upload_f32(&v).unwrap());
        let (mk, mv) = (upload_kv(ctx, &old_k, kv), upload_kv(ctx, &old_v, kv));
        let (sk, sv) = (upload_kv(ctx, &vec![0.0; n * kw], kv), upload_kv(ctx, &vec![0.0; n * vw], kv));
        let fb = ctx.upload_f32(&freq).unwrap();
        let rope = Some(RopeArgs { freq: fb.all(), style: RopeStyle::RotateHalf, mscale });
        let mut f = ctx.frame().unwrap();
        let shape = KvShape { n, heads, kv_heads, head_dim, v_head_dim, kv };
        let mirror = KvMirror { k: mk.all(), v: mv.all(), k_back: sk.all(), v_back: sv.all() };
        let args = RopeKvArgs { rope, q: qb.all(), k: kb.all(), v: vb.all(), shape, mirror, pos: Pos::Fixed(pos0) };
        f.rope_kv_ring(args, ring).unwrap();
        f.run().unwrap();
        let (wk, v) = (as_kv(&wk, kv), as_kv(&v, kv));
        let (mut want_k, mut want_v) = (as_kv(&old_k, kv), as_kv(&old_v, kv));
        for i in 0..n {
            let r = (pos0 + i) % ring;
            want_k[r * kw..][..kw].copy_from_slice(&wk[i * kw..][..kw]);
            want_v[r * vw..][..vw].copy_from_slice(&v[i * vw..][..vw]);
        }
        let tol = if kv == coli_runtime::vk::KvType::F16 { 1e-3 } else { 1e-5 };
        let got_k = download_kv(ctx, &mk, ring * kw, kv);
        assert!(worst(&got_k, &want_k) <= tol, "n {n} {kv:?}: k ring");
        assert_eq!(download_kv(ctx, &mv, ring * vw, kv), want_v, "n {n} {kv:?}: v ring");
        let back_k = download_kv(ctx, &sk, n * kw, kv);
        assert!(worst(&back_k, &wk) <= tol, "n {n} {kv:?}: k read-back");
        for i in 0..n {
            let r = (pos0 + i) % ring;
            assert_eq!(
                &back_k[i * kw..][..kw],
                &got_k[r * kw..][..kw],
                "n {n} {kv:?}: read-back row {i} is the ring's"
            );
        }
        assert_eq!(download_kv(ctx, &sv, n * vw, kv), v, "n {n} {kv:?}: v read-back");
    }
}
