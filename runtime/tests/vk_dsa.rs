//! DeepSeek Sparse Attention's selection on the device (`Frame::dsa_select`) against the CPU's
//! (`cpu::indexer::select_rows`) on Lavapipe: random rotated queries, keys and head weights
//! (of both signs: scores below zero, exact zeros where every head's ReLU cuts), blocks
//! appended one after another (1, 3 and 9 rows; a first block of 70, past a workgroup's 64
//! positions), a top-k below and above the rows' positions, the outputs at offsets.
//!
//! Tolerance: none: the selections are equal position for position (the random scores' k-th
//! and (k+1)-th are far apart against the order of float operations; the test checks that
//! they are, so an equal selection is well posed).

mod vk_common;

use coli_compiler::ir::{IndexerSpec, RopeScaling, RopeStyle};
use coli_runtime::cpu::indexer::select_rows;
use coli_runtime::vk::{DsaSelectArgs, DsaShape};
use vk_common::*;

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn spec(heads: usize, head_dim: usize, topk: usize) -> IndexerSpec {
    IndexerSpec {
        heads,
        head_dim,
        rope_dim: 0,
        topk,
        rope_style: RopeStyle::RotateHalf,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        eps: 1e-6,
        weights: vec![],
    }
}

/// The smallest gap between the k-th and (k+1)-th score of the rows that drop positions.
fn min_gap(s: &IndexerSpec, qs: &[f32], hw: &[f32], keys: &[f32], pos0: usize) -> f32 {
    let (h, d) = (s.heads, s.head_dim);
    let n = hw.len() / h;
    let scale = (d as f32).powf(-0.5);
    let mut gap = f32::INFINITY;
    for i in 0..n {
        let seen = pos0 + i + 1;
        if seen <= s.topk {
            continue;
        }
        let mut sc: Vec<f32> = (0..seen)
            .map(|t| {
                (0..h)
                    .map(|hh| {
                        let q = &qs[(i * h + hh) * d..][..d];
                        let dot: f32 = q.iter().zip(&keys[t * d..(t + 1) * d]).map(|(a, b)| a * b).sum();
                        hw[i * h + hh] * (dot * scale).max(0.0)
                    })
                    .sum()
            })
            .collect();
        sc.sort_by(|a, b| b.total_cmp(a));
        // Tied zeros fall to the earlier position on both sides alike.
        if sc[s.topk - 1] != sc[s.topk] {
            gap = gap.min(sc[s.topk - 1] - sc[s.topk]);
        }
    }
    gap
}

fn run_case(heads: usize, head_dim: usize, topk: usize, blocks: &[usize], seed: u64) {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(seed);
    let s = spec(heads, head_dim, topk);
    let total: usize = blocks.iter().sum();
    let most = *blocks.iter().max().unwrap();
    let keys = rng.vec(total * head_dim, 1.0);
    let dkeys = ctx.upload_f32(&keys).unwrap();
    let lead = 5;
    let (dq, dw, dout) = (
        ctx.f32_buffer(lead + most * heads * head_dim).unwrap(),
        ctx.f32_buffer(lead + most * heads).unwrap(),
        ctx.f32_buffer(lead + most * topk).unwrap(),
    );
    let scratch_all = ctx.f32_buffer(DsaShape::scratch_len(total, total)).unwrap();
    let mut pos0 = 0;
    for &n in blocks {
        let qs = rng.vec(n * heads * head_dim, 1.0);
        let hw = rng.vec(n * heads, 1.0);
        let visible = &keys[..(pos0 + n) * head_dim];
        let gap = min_gap(&s, &qs, &hw, visible, pos0);
        assert!(gap > 1e-4, "the random scores' cut is too close to call: {gap}");
        let mut want = vec![0f32; n * topk];
        select_rows(&s, &qs, &hw, visible, pos0, &mut want);
        ctx.write(&dq, lead * 4, &bytes(&qs)).unwrap();
        ctx.write(&dw, lead * 4, &bytes(&hw)).unwrap();
        let mut f = ctx.frame().unwrap();
        let args = DsaSelectArgs {
            q: dq.view(lead, n * heads * head_dim),
            keys: dkeys.view(0, (pos0 + n) * head_dim),
            w: dw.view(lead, n * heads),
            scratch: scratch_all.view(0, DsaShape::scratch_len(n, pos0)),
            out: dout.view(lead, n * topk),
            n,
        };
        f.dsa_select(DsaShape::of(&s), args, pos0).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(dout.view(lead, n * topk)).unwrap();
        eprintln!("{heads} heads x {head_dim}, top-{topk}, {n} rows at {pos0}: min score gap {gap:.2e}");
        assert_eq!(got, want, "{heads} heads x {head_dim}, top-{topk}, {n} rows at {pos0}");
        pos0 += n;
    }
}

#[test]
fn the_selection_matches_the_cpu() {
    run_case(4, 16, 5, &[1, 3, 9], 0xd5a1);
    run_case(8, 16, 6, &[70, 1, 3], 0xd5a2);
}

#[test]
fn a_top_k_above_every_row_keeps_every_position() {
    run_case(3, 24, 40, &[9, 1, 3], 0xd5a3);
}
