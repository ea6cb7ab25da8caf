//! GGUF's 5-bit blocks of 32, `Q5_0` and `Q5_1`: decoding, f32 dot products and dot products
//! against 8-bit activations.
//!
//! `Q5_0`, 32 elements in 22 bytes: f16 `d`, a little-endian u32 `qh`, 16 bytes `qs`. Element
//! `i < 16` is the low nibble of `qs[i]`, element `i + 16` its high nibble; the fifth bit of
//! element `i` is bit `i` of `qh`. `x = d * (q - 16)`.
//! `Q5_1`, 32 in 24 bytes: f16 `d`, f16 `m`, then `qh` and `qs` as in `Q5_0`; `x = d * q + m`.
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::fp16::read_f16;
use super::prim::{arr, fdot, idot_i8, idot_u8};
use super::BlockQ8;

pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;

/// The 32 five-bit values of a block whose `qh` starts at byte `at` (its `qs` follow).
#[inline(always)]
pub fn values(b: &[u8], at: usize) -> [u8; 32] {
    let qh = u32::from_le_bytes(*arr(b, at));
    let qs: &[u8; 16] = arr(b, at + 4);
    let mut out = [0u8; 32];
    for i in 0..16 {
        out[i] = (qs[i] & 15) | ((((qh >> i) & 1) as u8) << 4);
        out[i + 16] = (qs[i] >> 4) | ((((qh >> (i + 16)) & 1) as u8) << 4);
    }
    out
}

pub fn dequant_q5_0(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(Q5_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = read_f16(b, 0);
        for (o, q) in o.iter_mut().zip(values(b, 2)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

pub fn dequant_q5_1(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(Q5_1_BYTES).zip(out.chunks_exact_mut(32)) {
        let (d, m) = (read_f16(b, 0), read_f16(b, 2));
        for (o, q) in o.iter_mut().zip(values(b, 4)) {
            *o = d * q as f32 + m;
        }
    }
}

#[inline(always)]
pub fn dot_q5_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(Q5_0_BYTES).zip(x.chunks_exact(32)) {
        let w = values(b, 2).map(|q| (q as i32 - 16) as f32);
        acc += read_f16(b, 0) * fdot(&w, xs);
    }
    acc
}

#[inline(always)]
pub fn dot_q5_1(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(Q5_1_BYTES).zip(x.chunks_exact(32)) {
        let w = values(b, 4).map(|q| q as f32);
        let sum_x: f32 = xs.iter().sum();
        acc += read_f16(b, 0) * fdot(&w, xs) + read_f16(b, 2) * sum_x;
    }
    acc
}

#[inline(always)]
pub fn dot_q5_0_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(Q5_0_BYTES).zip(x) {
        let q = values(b, 2).map(|v| v as i8 - 16);
        acc += read_f16(b, 0) * xb.d * idot_i8(&q, &xb.q) as f32;
    }
    acc
}

#[inline(always)]
pub fn dot_q5_1_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(Q5_1_BYTES).zip(x) {
        let q = values(b, 4);
        acc += read_f16(b, 0) * xb.d * idot_u8(&q, &xb.q) as f32 + read_f16(b, 2) * xb.s;
    }
    acc
}
