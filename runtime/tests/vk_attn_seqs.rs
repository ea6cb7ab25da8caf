//! A batched decode step's attention in one dispatch (`attention_decode_rows`, `attn_seqs.comp`:
//! each sequence's mirror, read-back rows and position reached by address) against a kernel a
//! sequence (`attention_decode_each`, the one-row kernel each sequence took before) and the CPU.
//! The one dispatch must compute the one-row kernel's arithmetic: outputs, mirrors and read-back
//! rows bit for bit; both within 1e-5 of the CPU's attention over the mirrors they leave.
//!
//! Must not: compare the batched kernel only with itself, or grow past a few seconds on Lavapipe.

mod vk_common;

use coli_compiler::ir::{RopeScaling, RopeStyle};
use coli_runtime::cpu::{attention as cpu_attention, rope as cpu_rope};
use coli_runtime::vk::{AttnShape, Context, DecodeArgs, DeviceBuffer, KvMirror, KvType, Pos, RopeArgs};
use vk_common::{assert_close, ctx, download_kv, kv_types, upload_kv, Rng};

/// One case: heads, kv heads, head dim, a window (a ring of its size and a row), sinks, and
/// each sequence's position with whether the kernel reads it on the device.
struct Case {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    sinks: bool,
    seqs: Vec<(usize, bool)>,
}

/// A sequence's buffers: its mirror's keys and values, its read-back rows, its position.
struct Seq {
    mk: DeviceBuffer,
    mv: DeviceBuffer,
    sk: DeviceBuffer,
    sv: DeviceBuffer,
    pos: DeviceBuffer,
}

/// What a run leaves: the output rows, and each sequence's keys, values and read-back rows.
type Left = (Vec<f32>, Vec<(Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>)>);

/// Runs `c` with one dispatch (`one`) or a kernel a sequence, from the same inputs (seeded):
/// returns what it leaves and the dispatches it recorded. Row `i` of q, k, v and the output
/// belongs to sequence `order[i]` (rows need not follow the sequences).
fn run(ctx: &Context, c: &Case, kv: KvType, one: bool) -> (Left, usize, Vec<f32>, Vec<f32>) {
    let mut rng = Rng(0x5eed_5e95 ^ c.seqs.len() as u64 ^ (c.head_dim as u64) << 8);
    let (kw, qw) = (c.kv_heads * c.head_dim, c.heads * c.head_dim);
    let n = c.seqs.len();
    let (q, k, v) = (rng.vec(n * qw, 1.0), rng.vec(n * kw, 1.0), rng.vec(n * kw, 1.0));
    let sinks = rng.vec(c.heads, 1.0);
    let (qb, kb, vb, ob) = (
        ctx.upload_f32(&q).unwrap(),
        ctx.upload_f32(&k).unwrap(),
        ctx.upload_f32(&v).unwrap(),
        ctx.f32_buffer(n * qw).unwrap(),
    );
    let sb = ctx.upload_f32(&sinks).unwrap();
    let (freq, mscale) = cpu_rope::inv_freq(c.head_dim, 10000.0, RopeScaling::None);
    let fb = ctx.upload_f32(&freq).unwrap();
    let rows_of = |p: usize| c.window.map_or(p + 1, |w| w + 1);
    let seqs: Vec<Seq> = c
        .seqs
        .iter()
        .map(|&(p, _)| {
            let rows = rows_of(p);
            Seq {
                mk: upload_kv(ctx, &rng.vec(rows * kw, 1.0), kv),
                mv: upload_kv(ctx, &rng.vec(rows * kw, 1.0), kv),
                sk: upload_kv(ctx, &vec![0.0; kw], kv),
                sv: upload_kv(ctx, &vec![0.0; kw], kv),
                pos: ctx.upload_u32(&[p as u32]).unwrap(),
            }
        })
        .collect();
    // Sequence i's row: the rows in reverse order of the sequences.
    let row = |i: usize| n - 1 - i;
    let shape = AttnShape {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        v_head_dim: c.head_dim,
        scale: 1.0 / (c.head_dim as f32).sqrt(),
        window: c.window,
        value_scale: 1.0,
        ring: c.window.map(|w| w + 1),
        kv,
    };
    let rope = Some(RopeArgs { freq: fb.all(), style: RopeStyle::RotateHalf, mscale });
    let args: Vec<DecodeArgs> = c
        .seqs
        .iter()
        .zip(&seqs)
        .enumerate()
        .map(|(i, (&(p, dynamic), s))| DecodeArgs {
            rope,
            q: qb.view(row(i) * qw, qw),
            k: kb.view(row(i) * kw, kw),
            v: vb.view(row(i) * kw, kw),
            mirror: KvMirror { k: s.mk.all(), v: s.mv.all(), k_back: s.sk.all(), v_back: s.sv.all() },
            sinks: c.sinks.then(|| sb.all()),
            out: ob.view(row(i) * qw, qw),
            pos: if dynamic { Pos::Dynamic(s.pos.all()) } else { Pos::Fixed(p) },
            norm: None,
            q8: false,
        })
        .collect();
    let mut f = ctx.frame().unwrap();
    if one {
        f.attention_decode_rows(shape, &args).unwrap();
    } else {
        f.attention_decode_each(shape, &args).unwrap();
    }
    let dispatches = f.dispatch_count() as usize;
    f.run().unwrap();
    let out = ctx.download_f32(ob.all()).unwrap();
    let left = c
        .seqs
        .iter()
        .zip(&seqs)
        .map(|(&(p, _), s)| {
            let rows = rows_of(p);
            (
                download_kv(ctx, &s.mk, rows * kw, kv),
                download_kv(ctx, &s.mv, rows * kw, kv),
                download_kv(ctx, &s.sk, kw, kv),
                download_kv(ctx, &s.sv, kw, kv),
            )
        })
        .collect();
    // The rotated q rows, in row order, for the CPU.
    let mut rq = q.clone();
    for (i, &(p, _)) in c.seqs.iter().enumerate() {
        cpu_rope::apply_row(
            &mut rq[row(i) * qw..(row(i) + 1) * qw],
            c.head_dim,
            RopeStyle::RotateHalf,
            &freq,
            mscale,
            p,
        );
    }
    ((out, left), dispatches, rq, sinks)
}

/// Every case: the one dispatch leaves what a kernel a sequence leaves, bit for bit; one
/// dispatch per `MAX_SEQS` sequences where the device reaches buffers by address; the output
/// within 1e-5 of the largest |reference| of the CPU's attention over the mirror it leaves.
#[test]
fn one_dispatch_for_every_sequence_matches_a_kernel_each_and_the_cpu() {
    let Some(ctx) = ctx() else { return };
    let cases = [
        Case {
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            window: None,
            sinks: false,
            seqs: vec![(0, false), (7, true), (300, false), (31, true), (64, false)],
        },
        // Scalar key loads (a head of 18), sinks, every position read on the device.
        Case {
            heads: 3,
            kv_heads: 3,
            head_dim: 18,
            window: None,
            sinks: true,
            seqs: vec![(5, true), (129, true), (33, true)],
        },
        // A sliding window's ring, positions past it and short of it.
        Case {
            heads: 4,
            kv_heads: 1,
            head_dim: 16,
            window: Some(40),
            sinks: false,
            seqs: vec![(3, false), (95, true), (40, false), (41, true)],
        },
        // More sequences than one dispatch takes.
        Case {
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            window: None,
            sinks: false,
            seqs: (0..coli_runtime::vk::MAX_ATTN_SEQS + 6).map(|i| ((i * 37) % 90, i % 2 == 0)).collect(),
        },
    ];
    for c in &cases {
        for kv in kv_types(ctx) {
            let what = format!(
                "{}/{}x{} window {:?} sinks {} {} seqs {kv:?}",
                c.heads,
                c.kv_heads,
                c.head_dim,
                c.window,
                c.sinks,
                c.seqs.len()
            );
            let ((out, left), dispatches, rq, sinks) = run(ctx, c, kv, true);
            let ((out_each, left_each), each, _, _) = run(ctx, c, kv, false);
            assert_eq!(each, c.seqs.len(), "{what}: a kernel a sequence");
            if ctx.caps().buffer_device_address {
                assert_eq!(dispatches, c.seqs.len().div_ceil(coli_runtime::vk::MAX_ATTN_SEQS), "{what}: dispatches");
            }
            let differ = out.iter().zip(&out_each).position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(differ.is_none(), "{what}: outputs differ from element {differ:?}");
            assert!(left == left_each, "{what}: mirrors and read-back rows");
            let qw = c.heads * c.head_dim;
            let n = c.seqs.len();
            for (i, (&(p, _), (k, v, _, _))) in c.seqs.iter().zip(&left).enumerate() {
                let r = n - 1 - i;
                let cs = cpu_attention::AttnShape {
                    heads: c.heads,
                    kv_heads: c.kv_heads,
                    head_dim: c.head_dim,
                    v_head_dim: c.head_dim,
                    scale: 1.0 / (c.head_dim as f32).sqrt(),
                    window: c.window,
                };
                // The ring's rows in position order (position j in row j % ring).
                let kw = c.kv_heads * c.head_dim;
                let (k, v) = match c.window {
                    None => (k.clone(), v.clone()),
                    Some(w) => {
                        let ring = w + 1;
                        let (mut kk, mut vv) = (vec![0.0; (p + 1) * kw], vec![0.0; (p + 1) * kw]);
                        for j in (p + 1).saturating_sub(w)..=p {
                            let s = (j % ring) * kw;
                            kk[j * kw..(j + 1) * kw].copy_from_slice(&k[s..s + kw]);
                            vv[j * kw..(j + 1) * kw].copy_from_slice(&v[s..s + kw]);
                        }
                        (kk, vv)
                    }
                };
                let mut want = vec![0f32; qw];
                let sk = c.sinks.then_some(&sinks[..]);
                cpu_attention::attend(cs, &rq[r * qw..(r + 1) * qw], &k, &v, p, sk, &mut want);
                assert_close(&format!("{what}: sequence {i} at {p}"), &out[r * qw..(r + 1) * qw], &want, 1e-5);
            }
        }
    }
}
