//! DeepSeek Sparse Attention's selection on the device (`Frame::dsa_select`) against the CPU's
//! (`cpu::indexer::select_rows`) on Lavapipe: random rotated queries, keys and head weights
//! (of both signs: scores below zero, exact zeros where every head's ReLU cuts), blocks
//! appended one after another (1, 3 and 9 rows; a first block of 70, past a workgroup's 64
//! positions; 300 positions), a top-k below and above the rows' positions, the outputs at
//! offsets, the position fixed when recorded or read on the device; head weights all negative,
//! so that most scores tie at zero and the earlier positions win. The index keys' LayerNorm
//! (`Frame::layer_norm`) against `cpu::norm::layer_norm`.
//!
//! Tolerance: none for the selections: they are equal position for position in every row
//! whose k-th and (k+1)-th scores are more than 1e-5 apart (the order of float operations
//! moves a score by about 1e-6 here; at least nine rows in ten are so and checked; ties are
//! exact zeros on both sides). The LayerNorm within 1e-5 of the largest |value| (f32, sums in another order).

mod vk_common;

use coli_compiler::ir::{IndexerSpec, RopeScaling, RopeStyle};
use coli_runtime::cpu::indexer::select_rows;
use coli_runtime::cpu::norm::layer_norm;
use coli_runtime::vk::{DsaSelectArgs, DsaShape, Pos};
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

/// Per row, the gap between the k-th and (k+1)-th score (infinite where the row drops no
/// position or they tie).
fn gaps(s: &IndexerSpec, qs: &[f32], hw: &[f32], keys: &[f32], pos0: usize) -> Vec<f32> {
    let (h, d) = (s.heads, s.head_dim);
    let n = hw.len() / h;
    let scale = (d as f32).powf(-0.5);
    (0..n)
        .map(|i| {
            let seen = pos0 + i + 1;
            if seen <= s.topk {
                return f32::INFINITY;
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
            if sc[s.topk - 1] == sc[s.topk] {
                f32::INFINITY
            } else {
                sc[s.topk - 1] - sc[s.topk]
            }
        })
        .collect()
}

/// How a case's head weights and positions are made.
#[derive(Clone, Copy)]
struct Case {
    /// Head weights all below zero: most scores tie at exactly zero.
    negative: bool,
    /// The position read on the device (a decode recording), scores `total` apart.
    dynamic: bool,
    /// Rows a selection pass takes (a long context's chunk selects in passes, the executor's
    /// `score_rows`), at their offsets and positions; 0: the whole block at once.
    pass: usize,
}

fn run_case(heads: usize, head_dim: usize, topk: usize, blocks: &[usize], seed: u64, case: Case) {
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
    let scores = ctx.f32_buffer(DsaShape::scores_len(most, total)).unwrap();
    let dpos = ctx.f32_buffer(1).unwrap();
    let w_scale = 0.37;
    let mut pos0 = 0;
    for &n in blocks {
        let qs = rng.vec(n * heads * head_dim, 1.0);
        let mut hw = rng.vec(n * heads, 1.0);
        if case.negative {
            hw.iter_mut().for_each(|v| *v = -v.abs() - 0.01);
        }
        let scaled: Vec<f32> = hw.iter().map(|v| v * w_scale).collect();
        let visible = &keys[..(pos0 + n) * head_dim];
        let gap = gaps(&s, &qs, &scaled, visible, pos0);
        let clear: Vec<bool> = gap.iter().map(|&g| g > 1e-5).collect();
        let checked = clear.iter().filter(|&&c| c).count();
        assert!(10 * checked >= 9 * n, "{checked} of {n} rows have their cut clear of rounding");
        let mut want = vec![0f32; n * topk];
        select_rows(&s, &qs, &scaled, visible, pos0, &mut want);
        ctx.write(&dq, lead * 4, &bytes(&qs)).unwrap();
        ctx.write(&dw, lead * 4, &bytes(&hw)).unwrap();
        ctx.write(&dpos, 0, &(pos0 as u32).to_le_bytes()).unwrap();
        let (stride, pos) = match case.dynamic {
            true => (total, Pos::Dynamic(dpos.view(0, 1))),
            false => (pos0 + n, Pos::Fixed(pos0)),
        };
        let mut f = ctx.frame().unwrap();
        let pass = if case.pass == 0 { n } else { case.pass };
        for p0 in (0..n).step_by(pass) {
            let pn = pass.min(n - p0);
            let at = match pos {
                Pos::Fixed(p) => Pos::Fixed(p + p0),
                dynamic => dynamic,
            };
            let args = DsaSelectArgs {
                q: dq.view(lead + p0 * heads * head_dim, pn * heads * head_dim),
                keys: dkeys.view(0, if case.dynamic { total * head_dim } else { (pos0 + p0 + pn) * head_dim }),
                w: dw.view(lead + p0 * heads, pn * heads),
                w_scale,
                scores: scores.view(0, DsaShape::scores_len(pn, stride)),
                stride,
                out: dout.view(lead + p0 * topk, pn * topk),
                n: pn,
            };
            f.dsa_select(DsaShape::of(&s), args, at).unwrap();
        }
        f.run().unwrap();
        let got = ctx.download_f32(dout.view(lead, n * topk)).unwrap();
        let what = format!("{heads} heads x {head_dim}, top-{topk}, {n} rows at {pos0}");
        eprintln!("{what}: {checked} rows clear of rounding");
        for (i, _) in clear.iter().enumerate().filter(|(_, &c)| c) {
            let row = i * topk..(i + 1) * topk;
            assert_eq!(got[row.clone()], want[row], "{what}, row {i}");
        }
        pos0 += n;
    }
}

const FIXED: Case = Case { negative: false, dynamic: false, pass: 0 };

#[test]
fn the_selection_matches_the_cpu() {
    run_case(4, 16, 5, &[1, 3, 9], 0xd5a1, FIXED);
    run_case(8, 16, 6, &[70, 1, 3], 0xd5a2, FIXED);
    run_case(2, 8, 33, &[300, 1], 0xd5a4, FIXED);
    // In passes of 4 rows (the last one short), one after another over one score buffer.
    run_case(8, 16, 6, &[70, 1, 11], 0xd5a8, Case { pass: 4, ..FIXED });
}

/// A published indexer's widths: heads of 128 columns, 40 of them, so the kernel stages the
/// queries in two chunks of heads (32 and 8); positions over several tiles of 16.
#[test]
fn wide_heads_in_chunks_match_the_cpu() {
    run_case(40, 128, 9, &[37, 1, 2], 0xd5a9, FIXED);
}

/// One recording per block with the position read on the device, as a replayed decode step.
#[test]
fn a_position_read_on_the_device_selects_as_a_fixed_one() {
    run_case(4, 16, 5, &[1, 1, 1, 1, 1, 1, 1, 1], 0xd5a5, Case { negative: false, dynamic: true, pass: 0 });
    run_case(3, 8, 7, &[80, 1, 1], 0xd5a6, Case { negative: false, dynamic: true, pass: 0 });
}

/// Most scores are exactly zero: of equal scores the earlier position, on both sides.
#[test]
fn ties_go_to_the_earlier_positions() {
    run_case(2, 8, 6, &[40, 1, 3], 0xd5a7, Case { negative: true, dynamic: false, pass: 0 });
}

#[test]
fn a_top_k_above_every_row_keeps_every_position() {
    run_case(3, 24, 40, &[9, 1, 3], 0xd5a3, FIXED);
}

#[test]
fn the_key_layer_norm_matches_the_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut rng = Rng(0x1a7e);
    for (width, n, bias) in [(24, 5, true), (130, 3, false), (7, 1, true)] {
        let x: Vec<f32> = rng.vec(n * width, 2.0).iter().map(|v| v + 0.5).collect();
        let (w, b) = (rng.vec(width, 1.0), rng.vec(width, 1.0));
        let mut want = vec![0f32; n * width];
        layer_norm(&x, &mut want, &w, bias.then_some(&b[..]), 1e-6);
        let lead = 3;
        let dx = ctx.f32_buffer(lead + n * width).unwrap();
        ctx.write(&dx, lead * 4, &bytes(&x)).unwrap();
        let (dw, db) = (ctx.upload_f32(&w).unwrap(), ctx.upload_f32(&b).unwrap());
        let mut f = ctx.frame().unwrap();
        let xv = dx.view(lead, n * width);
        // In place, as the indexer runs it.
        f.layer_norm(xv, dw.all(), bias.then(|| db.all()), xv, n, 1e-6).unwrap();
        f.run().unwrap();
        let got = ctx.download_f32(xv).unwrap();
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("layer_norm {n} x {width}, bias {bias}: {:.2e} of max |value|", err / max);
        assert!(err <= 1e-5 * max, "{err} of {max}");
    }
}
