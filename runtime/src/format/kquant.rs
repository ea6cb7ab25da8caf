//! GGUF's k-quant super-blocks, `Q4_K` and `Q6_K`: decoding, f32 dot products and dot products
//! against 8-bit activations.
//!
//! `Q4_K`, 256 elements in 144 bytes: f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and
//! mins for eight sub-blocks of 32, then 128 bytes of nibbles. Sub-block `j` has scale `sc[j]`
//! and min `m[j]`: for `j < 4`, `sc = b[j] & 63`, `m = b[j+4] & 63`; for `j >= 4`, the low four
//! bits come from `b[j+4]` (scale: low nibble, min: high nibble) and the top two from the top
//! two bits of `b[j-4]` (scale) and `b[j]` (min). The nibbles come in four 32-byte chunks; chunk
//! `c` holds sub-block `2c` in its low nibbles and `2c+1` in its high nibbles.
//! `x = d * sc[j] * q - dmin * m[j]`.
//!
//! `Q6_K`, 256 elements in 210 bytes: 128 bytes `ql` (low four bits), 64 bytes `qh` (high two
//! bits), 16 x i8 scales (one per 16 elements), f16 `d`. Each half of 128 elements uses 64 bytes
//! of `ql` and 32 of `qh`: for `l < 32`, element `l` is `ql[l] & 15 | (qh[l] & 3) << 4`,
//! `l+32` is `ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4`, `l+64` is `ql[l] >> 4 | (qh[l] >> 4 & 3) << 4`,
//! `l+96` is `ql[l+32] >> 4 | (qh[l] >> 6) << 4`. `x = d * scale[p / 16] * (q - 32)`.
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::fp16::read_f16;
use super::prim::{fdot, idot_i8, idot_u8};
use super::BlockQ8;

pub const QK_K: usize = 256;
pub const Q4K_BYTES: usize = 144;
pub const Q6K_BYTES: usize = 210;

/// The eight 6-bit scales and mins of a `Q4_K` super-block.
#[inline(always)]
pub fn q4k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, m)
}

/// The 256 4-bit values of a `Q4_K` super-block, in element order.
#[inline(always)]
pub fn q4k_values(qs: &[u8], out: &mut [u8; QK_K]) {
    for c in 0..4 {
        let src: &[u8; 32] = qs[32 * c..32 * c + 32].try_into().unwrap();
        for l in 0..32 {
            out[64 * c + l] = src[l] & 0x0f;
            out[64 * c + 32 + l] = src[l] >> 4;
        }
    }
}

/// The 256 6-bit values of a `Q6_K` super-block minus 32, in element order.
#[inline(always)]
pub fn q6k_values(ql: &[u8], qh: &[u8], out: &mut [i8; QK_K]) {
    for h in 0..2 {
        let ql: &[u8; 64] = ql[64 * h..64 * h + 64].try_into().unwrap();
        let qh: &[u8; 32] = qh[32 * h..32 * h + 32].try_into().unwrap();
        let o = 128 * h;
        for l in 0..32 {
            out[o + l] = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[o + l + 32] = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[o + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[o + l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) << 4)) as i8 - 32;
        }
    }
}

#[inline(always)]
fn q6k_parts(b: &[u8]) -> (&[u8], &[u8], [i8; 16], f32) {
    let mut sc = [0i8; 16];
    for (i, s) in sc.iter_mut().enumerate() {
        *s = b[192 + i] as i8;
    }
    (&b[0..128], &b[128..192], sc, read_f16(b, 208))
}

pub fn dequant_q4k(row: &[u8], out: &mut [f32]) {
    let mut q = [0u8; QK_K];
    for (b, o) in row.chunks_exact(Q4K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        let dmin = read_f16(b, 2);
        let (sc, m) = q4k_scales(&b[4..16]);
        q4k_values(&b[16..144], &mut q);
        for j in 0..8 {
            let (a, c) = (d * sc[j] as f32, dmin * m[j] as f32);
            for i in 0..32 {
                o[32 * j + i] = a * q[32 * j + i] as f32 - c;
            }
        }
    }
}

pub fn dequant_q6k(row: &[u8], out: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, o) in row.chunks_exact(Q6K_BYTES).zip(out.chunks_exact_mut(QK_K)) {
        let (ql, qh, sc, d) = q6k_parts(b);
        q6k_values(ql, qh, &mut q);
        for p in 0..QK_K {
            o[p] = d * sc[p / 16] as f32 * q[p] as f32;
        }
    }
}

#[inline(always)]
pub fn dot_q4k(row: &[u8], x: &[f32]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q4K_BYTES).zip(x.chunks_exact(QK_K)) {
        let d = read_f16(b, 0);
        let dmin = read_f16(b, 2);
        let (sc, m) = q4k_scales(&b[4..16]);
        q4k_values(&b[16..144], &mut q);
        for j in 0..8 {
            let mut qf = [0f32; 32];
            for i in 0..32 {
                qf[i] = q[32 * j + i] as f32;
            }
            let xj = &xs[32 * j..32 * j + 32];
            let sum_x: f32 = xj.iter().sum();
            total += d * sc[j] as f32 * fdot(&qf, xj) - dmin * m[j] as f32 * sum_x;
        }
    }
    total
}

#[inline(always)]
pub fn dot_q6k(row: &[u8], x: &[f32]) -> f32 {
    let mut q = [0i8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q6K_BYTES).zip(x.chunks_exact(QK_K)) {
        let (ql, qh, sc, d) = q6k_parts(b);
        q6k_values(ql, qh, &mut q);
        let mut sb = 0f32;
        for k in 0..16 {
            let mut qf = [0f32; 16];
            for i in 0..16 {
                qf[i] = q[16 * k + i] as f32;
            }
            sb += sc[k] as f32 * fdot(&qf, &xs[16 * k..16 * k + 16]);
        }
        total += d * sb;
    }
    total
}

#[inline(always)]
pub fn dot_q4k_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut q = [0u8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q4K_BYTES).zip(x.chunks_exact(8)) {
        let d = read_f16(b, 0);
        let dmin = read_f16(b, 2);
        let (sc, m) = q4k_scales(&b[4..16]);
        q4k_values(&b[16..144], &mut q);
        let (mut a, mut c) = (0f32, 0f32);
        for j in 0..8 {
            let qj: &[u8; 32] = q[32 * j..32 * j + 32].try_into().unwrap();
            a += xs[j].d * (sc[j] as i32 * idot_u8(qj, &xs[j].q)) as f32;
            c += m[j] as f32 * xs[j].s;
        }
        total += d * a - dmin * c;
    }
    total
}

#[inline(always)]
pub fn dot_q6k_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut q = [0i8; QK_K];
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(Q6K_BYTES).zip(x.chunks_exact(8)) {
        let (ql, qh, sc, d) = q6k_parts(b);
        q6k_values(ql, qh, &mut q);
        let mut a = 0f32;
        for j in 0..8 {
            let lo: &[i8; 16] = q[32 * j..32 * j + 16].try_into().unwrap();
            let hi: &[i8; 16] = q[32 * j + 16..32 * j + 32].try_into().unwrap();
            let xl: &[i8; 16] = xs[j].q[..16].try_into().unwrap();
            let xh: &[i8; 16] = xs[j].q[16..].try_into().unwrap();
            let i = sc[2 * j] as i32 * idot_i8(lo, xl) + sc[2 * j + 1] as i32 * idot_i8(hi, xh);
            a += xs[j].d * i as f32;
        }
        total += d * a;
    }
    total
}
