//! GGUF's grid formats, `IQ2_XXS`, `IQ2_XS`, `IQ2_S`, `IQ3_XXS`, `IQ3_S`, `IQ1_S` and `IQ1_M`:
//! super-blocks of 256 whose values come in groups of 8 (`IQ2_*`, `IQ1_*`) or 4 (`IQ3_*`)
//! picked by index from a fixed lattice (`iq_grids.rs`), each element then negated by a sign
//! bit (`IQ2_*`, `IQ3_*`) or shifted by a delta of +-1/8 (`IQ1_*`), each sub-block of 32 (or
//! half of one) scaled by a 4-bit (`IQ1_*`: 3-bit) scale `s` times the super-block's f16 `d`.
//! Decoding, f32 dot products and dot products against 8-bit activations (the signed values
//! fit in i8, so a sub-block sums in integers).
//!
//! Layouts (offsets in bytes; sub-block `ib` is elements `32 ib..32 ib + 32`; all but `IQ1_M`
//! start with f16 `d` at 0):
//! - `IQ2_XXS`, 66 bytes: per sub-block 8 bytes at `2 + 8 ib`: four grid indices (bytes), then
//!   a u32 whose bits `7l..7l + 7` index `KSIGNS` for group `l` and whose top 4 bits are `s`.
//!   `x = d (0.5 + s) / 4 * g`.
//! - `IQ2_XS`, 74 bytes: 32 u16 at 2, group `4 ib + l`: bits 0..9 the grid index, bits 9..16 the
//!   `KSIGNS` index; scale bytes at `66 + ib`, the low nibble for groups 0-1, the high for 2-3.
//!   `x = d (0.5 + s) / 4 * g`.
//! - `IQ2_S`, 82 bytes: grid index low bytes at `2 + 4 ib + l`, sign bytes at `34 + 4 ib + l`,
//!   high bits at `66 + ib` (bits `2l..2l + 2`), scales at `74 + ib` as in `IQ2_XS`.
//! - `IQ3_XXS`, 98 bytes: 64 grid indices at 2 (group `k` of sub-block `ib` at `2 + 8 ib + k`,
//!   4 elements each), then at `66 + 4 ib` a u32 of four 7-bit `KSIGNS` indices (one per 8
//!   elements) and `s` in the top 4 bits. `x = d (0.5 + s) / 2 * g`.
//! - `IQ3_S`, 110 bytes: grid index low bytes at `2 + 8 ib + k`, their ninth bits at `66 + ib`
//!   (bit `k`), sign bytes (8 elements each) at `74 + 4 ib + l`, scales at `106 + ib / 2` (low
//!   nibble for even `ib`). `x = d (1 + 2 s) * g`.
//! - `IQ1_S`, 50 bytes: grid index low bytes at `2 + 4 ib + l` (group `l` of 8 elements), then at
//!   `34 + 2 ib` a u16 of the indices' three high bits (bits `3l..3l + 3`), `s` (bits 12..15)
//!   and the delta's sign (bit 15: set is -1/8). The lattice (2048 entries) has values -1, 0, 1.
//!   `x = d (2 s + 1) * (g + delta)`.
//! - `IQ1_M`, 56 bytes, no `d` in front: grid index low bytes at `4 ib + l`, then at
//!   `32 + 2 ib + l / 2` a byte whose nibble `l % 2` holds the index's three high bits and the
//!   group's own delta sign (bit 3); four u16 scale words at 48: the 3-bit scale of half `h` of
//!   sub-block `ib` at bits `6 (ib % 2) + 3 h` of word `ib / 2`, and the top nibbles of words
//!   0..3 are the bits 0..3, 4..7, 8..11, 12..15 of the f16 `d`.
//!   `x = d (2 s + 1) * (g + delta)`.
//!
//! Every scale is `c (2 s + 1)` with `c` 1/8, 1/4 or 1, which is how the dot products apply it
//! (`IQ1_*`: the values are held as `8 (g + delta)`, in -9..=9, with `c` 1/8).
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::fp16::{f16_to_f32, read_f16};
use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use super::prim::{arr, fdot, idot_i8};
use super::BlockQ8;

pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;
pub const IQ3_XXS_BYTES: usize = 98;
pub const IQ3_S_BYTES: usize = 110;
pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;
/// Where `IQ1_M` keeps its four scale words (and, in their top nibbles, its `d`).
pub const IQ1_M_SCALES: usize = 48;

/// Which grid format a kernel is compiled for (a const parameter, so each format's decode is
/// folded into its own loop).
pub const XXS2: u8 = 0;
pub const XS2: u8 = 1;
pub const S2: u8 = 2;
pub const XXS3: u8 = 3;
pub const S3: u8 = 4;
pub const S1: u8 = 5;
pub const M1: u8 = 6;

const fn block_bytes(k: u8) -> usize {
    match k {
        XXS2 => IQ2_XXS_BYTES,
        XS2 => IQ2_XS_BYTES,
        S2 => IQ2_S_BYTES,
        XXS3 => IQ3_XXS_BYTES,
        S3 => IQ3_S_BYTES,
        S1 => IQ1_S_BYTES,
        _ => IQ1_M_BYTES,
    }
}

/// `c` of the scale `c (2 s + 1)`.
const fn scale_unit(k: u8) -> f32 {
    match k {
        XXS2 | XS2 | S2 | S1 | M1 => 0.125,
        XXS3 => 0.25,
        _ => 1.0,
    }
}

/// The f16 bits whose nibbles, lowest first, are the top nibbles of the four u16 at byte `at`
/// of `b` (`IQ1_M`'s `d`, at `IQ1_M_SCALES`).
#[inline(always)]
pub fn nibbles_f16(b: &[u8], at: usize) -> u16 {
    let w = |k: usize| u16::from_le_bytes([b[at + 2 * k], b[at + 2 * k + 1]]);
    w(0) >> 12 | (w(1) >> 8) & 0x00f0 | (w(2) >> 4) & 0x0f00 | w(3) & 0xf000
}

/// The super-block's `d`.
#[inline(always)]
fn block_d<const K: u8>(b: &[u8]) -> f32 {
    if K == M1 {
        f16_to_f32(nibbles_f16(b, IQ1_M_SCALES))
    } else {
        read_f16(b, 0)
    }
}

/// The reference's f32 scale of a sub-block (or half) with 4-bit scale `s`, computed in the
/// reference's order so that dequantization is bit-exact.
#[inline(always)]
fn db<const K: u8>(d: f32, s: u8) -> f32 {
    match K {
        XXS2 | XS2 | S2 => d * (0.5 + s as f32) * 0.25,
        XXS3 => d * (0.5 + s as f32) * 0.5,
        // The reference's `d (2 s + 1) * (g + delta)` with the value held as 8 (g + delta):
        // every step is exact (11 + 4 + 4 significant bits), so any order gives its bits.
        S1 | M1 => d * (1 + 2 * s as i32) as f32 * 0.125,
        _ => d * (1 + 2 * s as i32) as f32,
    }
}

/// Per sign byte, the mask whose byte `j` is 0xff where bit `j` is set.
const SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            if i >> j & 1 != 0 {
                t[i] |= 0xff << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    t
};

/// The first `N` magnitudes of `grid` (byte `j` element `j`, each 1..=62) with the sign bits of
/// `signs` applied, as two's-complement bytes into `out`: a negated byte is `(v ^ 0xff) + 1`,
/// which never carries into the next byte because no magnitude is 0.
#[inline(always)]
fn put<const N: usize>(out: &mut [u8], grid: u64, signs: u8) {
    let m = SIGN_MASKS[signs as usize];
    let v = (grid ^ m).wrapping_add(m & 0x0101_0101_0101_0101).to_le_bytes();
    out[..N].copy_from_slice(&v[..N]);
}

/// `IQ1_*`'s lattice, entry `e`'s byte `j` being `0x80 + 8 (g_j + 1)`: `iq1` subtracts
/// `8 - delta` from every byte at once (no byte borrows: each is at least 0x80) and flips bit 7,
/// which leaves `8 g_j + delta` in two's complement.
const IQ1_BIASED: [u64; 2048] = {
    let mut t = [0u64; 2048];
    let mut e = 0;
    while e < 2048 {
        let mut j = 0;
        while j < 8 {
            let c = (IQ1S_GRID[e] >> (2 * j) & 3) as u64;
            t[e] |= (0x80 + 8 * c) << (8 * j);
            j += 1;
        }
        e += 1;
    }
    t
};

/// The eight values `8 (g + delta)` of `IQ1_*` lattice entry `idx` with the delta's sign
/// (`neg`: -1/8) into `out`.
#[inline(always)]
fn iq1(out: &mut [u8], idx: usize, neg: bool) {
    let sub = if neg { 0x0909_0909_0909_0909 } else { 0x0707_0707_0707_0707 };
    let v = (IQ1_BIASED[idx] - sub) ^ 0x8080_8080_8080_8080;
    out[..8].copy_from_slice(&v.to_le_bytes());
}

/// Whether the format scales the two halves of a sub-block apart.
const fn split_halves(k: u8) -> bool {
    matches!(k, XS2 | S2 | M1)
}

/// Sub-block `ib` of super-block `b`: its 32 signed magnitudes and the 4-bit scales of its two
/// halves (the same twice where one scale covers all 32).
#[inline(always)]
fn sub<const K: u8>(b: &[u8], ib: usize) -> ([i8; 32], [u8; 2]) {
    let mut g = [0u8; 32];
    let s = match K {
        XXS2 => {
            let q: &[u8; 8] = arr(b, 2 + 8 * ib);
            let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
            for l in 0..4 {
                let signs = KSIGNS[(aux >> (7 * l) & 127) as usize];
                put::<8>(&mut g[8 * l..], IQ2XXS_GRID[q[l] as usize], signs);
            }
            let s = (aux >> 28) as u8;
            [s, s]
        }
        XS2 => {
            for l in 0..4 {
                let q = u16::from_le_bytes(*arr(b, 2 + 2 * (4 * ib + l)));
                put::<8>(&mut g[8 * l..], IQ2XS_GRID[(q & 511) as usize], KSIGNS[(q >> 9) as usize]);
            }
            let sc = b[66 + ib];
            [sc & 15, sc >> 4]
        }
        S2 => {
            let qh = b[66 + ib] as usize;
            for l in 0..4 {
                let idx = b[2 + 4 * ib + l] as usize | (qh >> (2 * l) & 3) << 8;
                put::<8>(&mut g[8 * l..], IQ2S_GRID[idx], b[34 + 4 * ib + l]);
            }
            let sc = b[74 + ib];
            [sc & 15, sc >> 4]
        }
        XXS3 => {
            let aux = u32::from_le_bytes(*arr(b, 66 + 4 * ib));
            for k in 0..8 {
                let signs = KSIGNS[(aux >> (7 * (k / 2)) & 127) as usize] >> (4 * (k % 2));
                put::<4>(&mut g[4 * k..], IQ3XXS_GRID[b[2 + 8 * ib + k] as usize] as u64, signs);
            }
            let s = (aux >> 28) as u8;
            [s, s]
        }
        S1 => {
            let qh = u16::from_le_bytes(*arr(b, 34 + 2 * ib)) as usize;
            for l in 0..4 {
                iq1(&mut g[8 * l..], b[2 + 4 * ib + l] as usize | (qh >> (3 * l) & 7) << 8, qh >> 15 != 0);
            }
            let s = (qh >> 12 & 7) as u8;
            [s, s]
        }
        M1 => {
            for l in 0..4 {
                let n = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
                iq1(&mut g[8 * l..], b[4 * ib + l] as usize | (n & 7) << 8, n & 8 != 0);
            }
            let w = u16::from_le_bytes(*arr(b, IQ1_M_SCALES + 2 * (ib / 2))) >> (6 * (ib % 2));
            [(w & 7) as u8, (w >> 3 & 7) as u8]
        }
        _ => {
            let qh = b[66 + ib] as usize;
            for k in 0..8 {
                let idx = b[2 + 8 * ib + k] as usize | (qh >> k & 1) << 8;
                let signs = b[74 + 4 * ib + k / 2] >> (4 * (k % 2));
                put::<4>(&mut g[4 * k..], IQ3S_GRID[idx] as u64, signs);
            }
            let s = b[106 + ib / 2] >> (4 * (ib % 2)) & 15;
            [s, s]
        }
    };
    (g.map(|v| v as i8), s)
}

#[inline(always)]
fn dequant<const K: u8>(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(block_bytes(K)).zip(out.chunks_exact_mut(256)) {
        let d = block_d::<K>(b);
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            let (g, s) = sub::<K>(b, ib);
            let dl = [db::<K>(d, s[0]), db::<K>(d, s[1])];
            for (i, (o, q)) in o.iter_mut().zip(g).enumerate() {
                *o = dl[i / 16] * q as f32;
            }
        }
    }
}

#[inline(always)]
fn dot<const K: u8>(row: &[u8], x: &[f32]) -> f32 {
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(block_bytes(K)).zip(x.chunks_exact(256)) {
        let mut a = 0f32;
        for ib in 0..8 {
            let (g, s) = sub::<K>(b, ib);
            let gf = g.map(|q| q as f32);
            let x = &xs[32 * ib..32 * ib + 32];
            a += if !split_halves(K) {
                (2 * s[0] as i32 + 1) as f32 * fdot::<32>(&gf, x)
            } else {
                let (lo, hi): (&[f32; 16], &[f32; 16]) = (arr(&gf, 0), arr(&gf, 16));
                (2 * s[0] as i32 + 1) as f32 * fdot(lo, &x[..16]) + (2 * s[1] as i32 + 1) as f32 * fdot(hi, &x[16..])
            };
        }
        total += block_d::<K>(b) * scale_unit(K) * a;
    }
    total
}

#[inline(always)]
fn dot_q8<const K: u8>(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut total = 0f32;
    for (b, xs) in row.chunks_exact(block_bytes(K)).zip(x.chunks_exact(8)) {
        let mut a = 0f32;
        for (ib, xb) in xs.iter().enumerate() {
            let (g, s) = sub::<K>(b, ib);
            let i = if !split_halves(K) {
                (2 * s[0] as i32 + 1) * idot_i8(&g, &xb.q)
            } else {
                let (glo, ghi): (&[i8; 16], &[i8; 16]) = (arr(&g, 0), arr(&g, 16));
                let (qlo, qhi): (&[i8; 16], &[i8; 16]) = (arr(&xb.q, 0), arr(&xb.q, 16));
                (2 * s[0] as i32 + 1) * idot_i8(glo, qlo) + (2 * s[1] as i32 + 1) * idot_i8(ghi, qhi)
            };
            a += xb.d * i as f32;
        }
        total += block_d::<K>(b) * scale_unit(K) * a;
    }
    total
}

pub fn dequant_iq2_xxs(row: &[u8], out: &mut [f32]) {
    dequant::<XXS2>(row, out)
}
pub fn dequant_iq2_xs(row: &[u8], out: &mut [f32]) {
    dequant::<XS2>(row, out)
}
pub fn dequant_iq2_s(row: &[u8], out: &mut [f32]) {
    dequant::<S2>(row, out)
}
pub fn dequant_iq3_xxs(row: &[u8], out: &mut [f32]) {
    dequant::<XXS3>(row, out)
}
pub fn dequant_iq3_s(row: &[u8], out: &mut [f32]) {
    dequant::<S3>(row, out)
}
pub fn dequant_iq1_s(row: &[u8], out: &mut [f32]) {
    dequant::<S1>(row, out)
}
pub fn dequant_iq1_m(row: &[u8], out: &mut [f32]) {
    dequant::<M1>(row, out)
}

#[inline(always)]
pub fn dot_iq2_xxs(row: &[u8], x: &[f32]) -> f32 {
    dot::<XXS2>(row, x)
}
#[inline(always)]
pub fn dot_iq2_xs(row: &[u8], x: &[f32]) -> f32 {
    dot::<XS2>(row, x)
}
#[inline(always)]
pub fn dot_iq2_s(row: &[u8], x: &[f32]) -> f32 {
    dot::<S2>(row, x)
}
#[inline(always)]
pub fn dot_iq3_xxs(row: &[u8], x: &[f32]) -> f32 {
    dot::<XXS3>(row, x)
}
#[inline(always)]
pub fn dot_iq3_s(row: &[u8], x: &[f32]) -> f32 {
    dot::<S3>(row, x)
}
#[inline(always)]
pub fn dot_iq1_s(row: &[u8], x: &[f32]) -> f32 {
    dot::<S1>(row, x)
}
#[inline(always)]
pub fn dot_iq1_m(row: &[u8], x: &[f32]) -> f32 {
    dot::<M1>(row, x)
}

#[inline(always)]
pub fn dot_iq2_xxs_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<XXS2>(row, x)
}
#[inline(always)]
pub fn dot_iq2_xs_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<XS2>(row, x)
}
#[inline(always)]
pub fn dot_iq2_s_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<S2>(row, x)
}
#[inline(always)]
pub fn dot_iq3_xxs_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<XXS3>(row, x)
}
#[inline(always)]
pub fn dot_iq3_s_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<S3>(row, x)
}
#[inline(always)]
pub fn dot_iq1_s_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<S1>(row, x)
}
#[inline(always)]
pub fn dot_iq1_m_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    dot_q8::<M1>(row, x)
}
