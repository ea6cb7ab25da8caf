//! GGUF's k-quant super-blocks of 256 below and beside `Q4_K`: `Q2_K`, `Q3_K` and `Q5_K`:
//! decoding, f32 dot products and dot products against 8-bit activations. Elements are numbered
//! `p` in `0..256` within the super-block.
//!
//! `Q2_K`, 256 elements in 84 bytes: 16 scale bytes (one per 16 elements: low nibble the
//! scale `sc`, high nibble the min `m`), 64 bytes `qs`, f16 `d`, f16 `dmin`. Each half
//! `h = p / 128` uses 32 bytes of `qs`: with `s = p % 128 / 32`, `l = p % 32`,
//! `q = qs[32h + l] >> 2s & 3`. `x = d * sc[p / 16] * q - dmin * m[p / 16]`.
//!
//! `Q3_K`, 256 in 110 bytes: 32 bytes `hmask`, 64 bytes `qs`, 12 bytes of packed 6-bit
//! scales, f16 `d`. The low two bits are as in `Q2_K`; the third bit is bit `p / 32` of
//! `hmask[p % 32]`; `q = (low | bit << 2) - 4`, in `-4..=3`. Scale `k` (one per 16 elements)
//! takes its low four bits from byte `k` (low nibble, `k < 8`) or byte `k - 8` (high nibble),
//! its top two from bits `2 (k / 4)` of byte `8 + k % 4`, and is stored plus 32.
//! `x = d * (scale[p / 16] - 32) * q`.
//!
//! `Q5_K`, 256 in 176 bytes: f16 `d`, f16 `dmin`, 12 bytes of scales and mins packed as in
//! `Q4_K`, 32 bytes `qh`, 128 bytes of nibbles in `Q4_K`'s order; the fifth bit of element
//! `p` is bit `p / 32` of `qh[p % 32]`. `x = d * sc[p / 32] * q - dmin * m[p / 32]`.
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::fp16::read_f16;
use super::kquant::{q4k_scales, q4k_values, QK_K};
use super::prim::{arr, fdot, idot_i8, idot_u8, isum};
use super::BlockQ8;

pub const Q2K_BYTES: usize = 84;
pub const Q3K_BYTES: usize = 110;
pub const Q5K_BYTES: usize = 176;

/// The two-bit values of a 64-byte `qs` (`Q2_K`, and the low bits of `Q3_K`), in element order.
#[inline(always)]
fn two_bit_values(qs: &[u8], out: &mut [u8; QK_K]) {
    for h in 0..2 {
        let src: &[u8; 32] = arr(qs, 32 * h);
        for s in 0..4 {
            for l in 0..32 {
                out[128 * h + 32 * s + l] = (src[l] >> (2 * s)) & 3;
            }
        }
    }
}

/// The 256 `Q3_K` values, `-4..=3`, in element order.
#[inline(always)]
pub fn q3k_values(b: &[u8], out: &mut [i8; QK_K]) {
    let mut low = [0u8; QK_K];
    two_bit_values(&b[32..96], &mut low);
    let hm: &[u8; 32] = arr(b, 0);
    for j in 0..8 {
        for l in 0..32 {
            out[32 * j + l] = (low[32 * j + l] | (((hm[l] >> j) & 1) << 2)) as i8 - 4;
        }
    }
}

/// The sixteen `Q3_K` scales, `-32..=31`.
#[inline(always)]
pub fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low = if k < 8 { s[k] & 15 } else { s[k - 8] >> 4 };
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// The 256 five-bit `Q5_K` values, in element order.
#[inline(always)]
pub fn q5k_values(b: &[u8], out: &mut [u8; QK_K]) {
    q4k_values(&b[48..176], out);
    let qh: &[u8; 32] = arr(b, 16);
    for j in 0..8 {
        for l in 0..32 {
            out[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
        }
    }
}

pub fn dequant_q2k(row: &[u8], out: &mut [f32]) {
    let mut q = [0u8; QK_K];
    for (b, o) in row.chunks_exact(Q2K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, 80), read_f16(b, 82));
        two_bit_values(&b[16..80], &mut q);
        for k in 0..16 {
            let (a, c) = (d * (b[k] & 15) as f32, dmin * (b[k] >> 4) as f32);
            for i in 0..16 {
                o[16 * k + i] = a * q[16 * k + i] as f32 - c;
            }
        }
    }
}

pub fn dequant_q3k(row: &[u8], out: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, o) in row.chunks_exact(Q3K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 108);
        let sc = q3k_scales(&b[96..108]);
        q3k_values(b, &mut q);
        for p in 0..QK_K {
            o[p] = d * sc[p / 16] as f32 * q[p] as f32;
        }
    }
}

pub fn dequant_q5k(row: &[u8], out: &mut [f32]) {
    let mut q = [0u8; QK_K];
    for (b, o) in row.chunks_exact(Q5K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, m) = q4k_scales(&b[4..16]);
        q5k_values(b, &mut q);
        for j in 0..8 {
            let (a, c) = (d * sc[j] as f32, dmin * m[j] as f32);
            for i in 0..32 {
                o[32 * j + i] = a * q[32 * j + i] as f32 - c;
            }
        }
    }
}

#[inline(always)]
pub fn dot_q2k(row: &[u8], x: &[f32]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q2K_BYTES).zip(x.chunks_exact(QK_K)) {
        let (d, dmin) = (read_f16(b, 80), read_f16(b, 82));
        two_bit_values(&b[16..80], &mut q);
        let (mut a, mut c) = (0f32, 0f32);
        for k in 0..16 {
            let qk: &[u8; 16] = arr(&q, 16 * k);
            let xk = &xs[16 * k..16 * k + 16];
            a += (b[k] & 15) as f32 * fdot(&qk.map(|v| v as f32), xk);
            c += (b[k] >> 4) as f32 * xk.iter().sum::<f32>();
        }
        total += d * a - dmin * c;
    }
    total
}

#[inline(always)]
pub fn dot_q3k(row: &[u8], x: &[f32]) -> f32 {
    let mut q = [0i8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q3K_BYTES).zip(x.chunks_exact(QK_K)) {
        let sc = q3k_scales(&b[96..108]);
        q3k_values(b, &mut q);
        let mut a = 0f32;
        for k in 0..16 {
            let qk: &[i8; 16] = arr(&q, 16 * k);
            a += sc[k] as f32 * fdot(&qk.map(|v| v as f32), &xs[16 * k..16 * k + 16]);
        }
        total += read_f16(b, 108) * a;
    }
    total
}

#[inline(always)]
pub fn dot_q5k(row: &[u8], x: &[f32]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q5K_BYTES).zip(x.chunks_exact(QK_K)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, m) = q4k_scales(&b[4..16]);
        q5k_values(b, &mut q);
        for j in 0..8 {
            let qj: &[u8; 32] = arr(&q, 32 * j);
            let xj = &xs[32 * j..32 * j + 32];
            let sum_x: f32 = xj.iter().sum();
            total += d * sc[j] as f32 * fdot(&qj.map(|v| v as f32), xj) - dmin * m[j] as f32 * sum_x;
        }
    }
    total
}

#[inline(always)]
pub fn dot_q2k_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q2K_BYTES).zip(x.chunks_exact(8)) {
        two_bit_values(&b[16..80], &mut q);
        let (mut a, mut c) = (0f32, 0f32);
        for j in 0..8 {
            let (s0, s1) = (b[2 * j], b[2 * j + 1]);
            let (xl, xh): (&[i8; 16], &[i8; 16]) = (arr(&xs[j].q, 0), arr(&xs[j].q, 16));
            let i =
                (s0 & 15) as i32 * idot_u8(arr(&q, 32 * j), xl) + (s1 & 15) as i32 * idot_u8(arr(&q, 32 * j + 16), xh);
            let m = (s0 >> 4) as i32 * isum(xl) + (s1 >> 4) as i32 * isum(xh);
            a += xs[j].d * i as f32;
            c += xs[j].d * m as f32;
        }
        total += read_f16(b, 80) * a - read_f16(b, 82) * c;
    }
    total
}

#[inline(always)]
pub fn dot_q3k_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut q = [0i8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q3K_BYTES).zip(x.chunks_exact(8)) {
        let sc = q3k_scales(&b[96..108]);
        q3k_values(b, &mut q);
        let mut a = 0f32;
        for j in 0..8 {
            let lo = idot_i8::<16>(arr(&q, 32 * j), arr(&xs[j].q, 0));
            let hi = idot_i8::<16>(arr(&q, 32 * j + 16), arr(&xs[j].q, 16));
            a += xs[j].d * (sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi) as f32;
        }
        total += read_f16(b, 108) * a;
    }
    total
}

#[inline(always)]
pub fn dot_q5k_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q5K_BYTES).zip(x.chunks_exact(8)) {
        let (sc, m) = q4k_scales(&b[4..16]);
        q5k_values(b, &mut q);
        let (mut a, mut c) = (0f32, 0f32);
        for j in 0..8 {
            a += xs[j].d * (sc[j] as i32 * idot_u8(arr(&q, 32 * j), &xs[j].q)) as f32;
            c += m[j] as f32 * xs[j].s;
        }
        total += read_f16(b, 0) * a - read_f16(b, 2) * c;
    }
    total
}
