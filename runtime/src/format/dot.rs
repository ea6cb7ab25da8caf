//! Dot products of one stored row with f32 activations, block by block, for every
//! `WeightFormat`: the row is never expanded to f32 as a whole; each block's sum is taken over
//! its stored integers and scaled once. This is the float path of `matmul` (F32, F16, BF16, FP8_E4M3) and
//! the exact reference for the quantized-activation path.
//!
//! Must not: check lengths (`format::dot_row` does), or allocate.

use super::fp16::{bf16_to_f32, f16_to_f32, read_f16};
pub use super::prim::fdot;
use super::WeightFormat;
use super::{fp8, iq4, iq_grid, kquant, kquant_lo, mxfp4, q5};

/// `w . x_c` for `C` activation rows at once, each with eight accumulators (all slices the
/// same length).
#[inline(always)]
pub fn fdot_rows<const C: usize>(w: &[f32], xs: [&[f32]; C]) -> [f32; C] {
    let n16 = w.len() / 16 * 16;
    let x16: [&[f32]; C] = std::array::from_fn(|c| &xs[c][..n16]);
    // Two accumulators of eight lanes per row (static indices, so they stay in registers).
    let mut lo = [[0f32; 8]; C];
    let mut hi = [[0f32; 8]; C];
    for (j, wc) in w[..n16].chunks_exact(16).enumerate() {
        let wc: &[f32; 16] = wc.try_into().unwrap();
        for c in 0..C {
            let xc: &[f32; 16] = x16[c][16 * j..16 * j + 16].try_into().unwrap();
            for l in 0..8 {
                lo[c][l] += wc[l] * xc[l];
                hi[c][l] += wc[l + 8] * xc[l + 8];
            }
        }
    }
    let mut out = [0f32; C];
    for c in 0..C {
        let tail: f32 = w[n16..].iter().zip(&xs[c][n16..]).map(|(a, b)| a * b).sum();
        out[c] = (0..8).map(|l| lo[c][l] + hi[c][l]).sum::<f32>() + tail;
    }
    out
}

#[inline(always)]
fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut rows = row.chunks_exact(32);
    let mut xs = x.chunks_exact(8);
    for (b, xc) in (&mut rows).zip(&mut xs) {
        for i in 0..8 {
            acc[i] += f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) * xc[i];
        }
    }
    let mut tail = 0f32;
    for (b, xv) in rows.remainder().chunks_exact(4).zip(xs.remainder()) {
        tail += f32::from_le_bytes(b.try_into().unwrap()) * xv;
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn dot_half(row: &[u8], x: &[f32], conv: impl Fn(u16) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut rows = row.chunks_exact(16);
    let mut xs = x.chunks_exact(8);
    for (b, xc) in (&mut rows).zip(&mut xs) {
        for i in 0..8 {
            acc[i] += conv(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) * xc[i];
        }
    }
    let mut tail = 0f32;
    for (b, xv) in rows.remainder().chunks_exact(2).zip(xs.remainder()) {
        tail += conv(u16::from_le_bytes([b[0], b[1]])) * xv;
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
        let mut w = [0f32; 32];
        for i in 0..32 {
            w[i] = b[2 + i] as i8 as f32;
        }
        acc += read_f16(b, 0) * fdot(&w, xs);
    }
    acc
}

#[inline(always)]
fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
        let mut w = [0f32; 32];
        for i in 0..16 {
            w[i] = ((b[2 + i] & 0x0f) as i32 - 8) as f32;
            w[i + 16] = ((b[2 + i] >> 4) as i32 - 8) as f32;
        }
        acc += read_f16(b, 0) * fdot(&w, xs);
    }
    acc
}

#[inline(always)]
fn dot_q4_1(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(20).zip(x.chunks_exact(32)) {
        let mut w = [0f32; 32];
        for i in 0..16 {
            w[i] = (b[4 + i] & 0x0f) as f32;
            w[i + 16] = (b[4 + i] >> 4) as f32;
        }
        let sum_x: f32 = xs.iter().sum();
        acc += read_f16(b, 0) * fdot(&w, xs) + read_f16(b, 2) * sum_x;
    }
    acc
}

#[inline(always)]
fn dot_i8row(row: &[u8], x: &[f32]) -> f32 {
    let scale = f32::from_le_bytes(row[0..4].try_into().unwrap());
    let body = &row[4..];
    let mut acc = 0f32;
    let mut bs = body.chunks_exact(32);
    let mut xs = x.chunks_exact(32);
    for (b, xc) in (&mut bs).zip(&mut xs) {
        let mut w = [0f32; 32];
        for i in 0..32 {
            w[i] = b[i] as i8 as f32;
        }
        acc += fdot(&w, xc);
    }
    for (&q, xv) in bs.remainder().iter().zip(xs.remainder()) {
        acc += q as i8 as f32 * xv;
    }
    scale * acc
}

#[inline(always)]
fn dot_i4g64(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(36).zip(x.chunks_exact(64)) {
        let mut w = [0f32; 64];
        for i in 0..32 {
            w[i] = (b[4 + i] & 0x0f) as f32;
            w[i + 32] = (b[4 + i] >> 4) as f32;
        }
        let sum_x: f32 = xs.iter().sum();
        acc += read_f16(b, 0) * fdot(&w, xs) + read_f16(b, 2) * sum_x;
    }
    acc
}

/// `row . x` for any format; lengths already checked.
#[inline(always)]
pub fn dot_row(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    match format {
        WeightFormat::F32 => dot_f32(row, x),
        WeightFormat::F16 => dot_half(row, x, f16_to_f32),
        WeightFormat::BF16 => dot_half(row, x, bf16_to_f32),
        WeightFormat::Q8_0 => dot_q8_0(row, x),
        WeightFormat::Q4_0 => dot_q4_0(row, x),
        WeightFormat::Q4_1 => dot_q4_1(row, x),
        WeightFormat::Q4_K => kquant::dot_q4k(row, x),
        WeightFormat::Q6_K => kquant::dot_q6k(row, x),
        WeightFormat::Q5_0 => q5::dot_q5_0(row, x),
        WeightFormat::Q5_1 => q5::dot_q5_1(row, x),
        WeightFormat::Q2_K => kquant_lo::dot_q2k(row, x),
        WeightFormat::Q3_K => kquant_lo::dot_q3k(row, x),
        WeightFormat::Q5_K => kquant_lo::dot_q5k(row, x),
        WeightFormat::IQ4_NL => iq4::dot_iq4_nl(row, x),
        WeightFormat::MXFP4 => mxfp4::dot_mxfp4(row, x),
        WeightFormat::FP8_E4M3 => fp8::dot_fp8(row, x),
        WeightFormat::IQ4_XS => iq4::dot_iq4_xs(row, x),
        WeightFormat::IQ2_XXS => iq_grid::dot_iq2_xxs(row, x),
        WeightFormat::IQ2_XS => iq_grid::dot_iq2_xs(row, x),
        WeightFormat::IQ2_S => iq_grid::dot_iq2_s(row, x),
        WeightFormat::IQ3_XXS => iq_grid::dot_iq3_xxs(row, x),
        WeightFormat::IQ3_S => iq_grid::dot_iq3_s(row, x),
        WeightFormat::IQ1_S => iq_grid::dot_iq1_s(row, x),
        WeightFormat::IQ1_M => iq_grid::dot_iq1_m(row, x),
        WeightFormat::I8Row => dot_i8row(row, x),
        WeightFormat::I4G64 => dot_i4g64(row, x),
    }
}
