//! GGUF's non-linear 4-bit formats, `IQ4_NL` and `IQ4_XS`: each nibble indexes a fixed table of
//! 16 signed levels (`LEVELS`) instead of being the value itself. Decoding, f32 dot products
//! and dot products against 8-bit activations (the levels fit in i8, so blocks sum in integers).
//!
//! `IQ4_NL`, 32 elements in 18 bytes: f16 `d`, 16 bytes; element `i < 16` is the low nibble of
//! byte `i`, element `i + 16` its high nibble. `x = d * LEVELS[q]`.
//! `IQ4_XS`, 256 in 136 bytes: f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, 128 bytes of nibbles;
//! sub-block `j` of 32 has its nibbles in bytes `16j..16j + 16` in `IQ4_NL`'s order and the
//! 6-bit scale `(scales_l[j / 2] >> 4 (j % 2) & 15) | (scales_h >> 2j & 3) << 4`, stored plus
//! 32. `x = d * (scale[j] - 32) * LEVELS[q]`.
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::fp16::read_f16;
use super::prim::{arr, fdot, idot_i8};
use super::BlockQ8;

pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;

/// The 16 levels a nibble selects.
pub const LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The 32 levels of 16 bytes of nibbles starting at byte `at`, in element order.
#[inline(always)]
fn levels(b: &[u8], at: usize) -> [i8; 32] {
    let qs: &[u8; 16] = arr(b, at);
    let mut out = [0i8; 32];
    for i in 0..16 {
        out[i] = LEVELS[(qs[i] & 15) as usize];
        out[i + 16] = LEVELS[(qs[i] >> 4) as usize];
    }
    out
}

/// The eight `IQ4_XS` sub-block scales, `-32..=31`.
#[inline(always)]
pub fn xs_scales(b: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes(*arr(b, 2));
    let mut out = [0i8; 8];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
        *o = (low | ((((high >> (2 * j)) & 3) as u8) << 4)) as i8 - 32;
    }
    out
}

pub fn dequant_iq4_nl(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(IQ4_NL_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = read_f16(b, 0);
        for (o, q) in o.iter_mut().zip(levels(b, 2)) {
            *o = d * q as f32;
        }
    }
}

pub fn dequant_iq4_xs(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(IQ4_XS_BYTES).zip(out.chunks_exact_mut(256)) {
        let d = read_f16(b, 0);
        let sc = xs_scales(b);
        for (j, o) in o.chunks_exact_mut(32).enumerate() {
            let dl = d * sc[j] as f32;
            for (o, q) in o.iter_mut().zip(levels(b, 8 + 16 * j)) {
                *o = dl * q as f32;
            }
        }
    }
}

#[inline(always)]
pub fn dot_iq4_nl(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(IQ4_NL_BYTES).zip(x.chunks_exact(32)) {
        acc += read_f16(b, 0) * fdot(&levels(b, 2).map(|q| q as f32), xs);
    }
    acc
}

#[inline(always)]
pub fn dot_iq4_xs(row: &[u8], x: &[f32]) -> f32 {
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(IQ4_XS_BYTES).zip(x.chunks_exact(256)) {
        let sc = xs_scales(b);
        let mut a = 0f32;
        for j in 0..8 {
            a += sc[j] as f32 * fdot(&levels(b, 8 + 16 * j).map(|q| q as f32), &xs[32 * j..32 * j + 32]);
        }
        total += read_f16(b, 0) * a;
    }
    total
}

#[inline(always)]
pub fn dot_iq4_nl_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(IQ4_NL_BYTES).zip(x) {
        acc += read_f16(b, 0) * xb.d * idot_i8(&levels(b, 2), &xb.q) as f32;
    }
    acc
}

#[inline(always)]
pub fn dot_iq4_xs_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(IQ4_XS_BYTES).zip(x.chunks_exact(8)) {
        let sc = xs_scales(b);
        let mut a = 0f32;
        for j in 0..8 {
            a += xs[j].d * (sc[j] as i32 * idot_i8(&levels(b, 8 + 16 * j), &xs[j].q)) as f32;
        }
        total += read_f16(b, 0) * a;
    }
    total
}
