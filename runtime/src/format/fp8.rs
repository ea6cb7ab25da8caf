//! `FP8_E4M3` (coli's block form of the FP8 checkpoints DeepSeek-V3/R1, GLM-4.5, Kimi K2 and
//! MiMo publish, whose weights are `F8_E4M3` with one f32 multiplier per 128 x 128 tile):
//! 128 elements in 132 bytes, the f32 `scale` of the element's tile (replicated on each of the
//! tile's rows, so every row stands alone) then 128 E4M3 codes; `x = scale * e4m3(q)`.
//!
//! E4M3 (the OCP "fn" variant): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
//! exponent 0 is subnormal (`m / 8 * 2^-6`), `0x7F`/`0xFF` are NaN, there is no infinity, the
//! largest value is 448. Codes decode through a 256-entry table built from the bit fields.
//! Dot products take f32 activations (`uses_q8_acts` is false: the codes are not integers).
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::prim::{arr, fdot};

/// Elements per block, and bytes per block (the f32 scale and the codes).
pub const FP8_BLOCK: usize = 128;
pub const FP8_BYTES: usize = 4 + FP8_BLOCK;

/// The value of one E4M3 code (NaN for `0x7F` and `0xFF`).
const fn e4m3(code: u8) -> f32 {
    let sign = ((code as u32) >> 7) << 31;
    let exp = ((code >> 3) & 15) as u32;
    let man = (code & 7) as u32;
    if exp == 15 && man == 7 {
        return f32::from_bits(sign | 0x7fc0_0000);
    }
    if exp == 0 {
        // m * 2^-9, exact in f32.
        return f32::from_bits(sign | (man as f32 * (1.0 / 512.0)).to_bits());
    }
    f32::from_bits(sign | ((exp + 127 - 7) << 23) | (man << 20))
}

const fn table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3(i as u8);
        i += 1;
    }
    t
}

/// Every E4M3 code's value.
pub static E4M3: [f32; 256] = table();

/// Whether a code is NaN (the format's only non-finite codes).
#[inline(always)]
pub fn is_nan_code(code: u8) -> bool {
    code & 0x7f == 0x7f
}

#[inline(always)]
fn scale(b: &[u8]) -> f32 {
    f32::from_le_bytes(*arr(b, 0))
}

#[inline(always)]
fn values(b: &[u8]) -> [f32; FP8_BLOCK] {
    let qs: &[u8; FP8_BLOCK] = arr(b, 4);
    qs.map(|q| E4M3[q as usize])
}

pub fn dequant_fp8(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(FP8_BYTES).zip(out.chunks_exact_mut(FP8_BLOCK)) {
        let d = scale(b);
        for (o, v) in o.iter_mut().zip(values(b)) {
            *o = d * v;
        }
    }
}

#[inline(always)]
pub fn dot_fp8(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(FP8_BYTES).zip(x.chunks_exact(FP8_BLOCK)) {
        acc += scale(b) * fdot(&values(b), xs);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decode_by_their_bit_fields() {
        assert_eq!(E4M3[0x00], 0.0);
        assert_eq!(E4M3[0x80].to_bits(), (-0f32).to_bits());
        assert_eq!(E4M3[0x38], 1.0); // exponent 7, mantissa 0
        assert_eq!(E4M3[0x7e], 448.0); // the largest
        assert_eq!(E4M3[0xfe], -448.0);
        assert_eq!(E4M3[0x01], 2f32.powi(-9)); // the smallest subnormal
        assert_eq!(E4M3[0x07], 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3[0x08], 2f32.powi(-6)); // the smallest normal
        assert!(E4M3[0x7f].is_nan() && E4M3[0xff].is_nan());
        assert_eq!((0..=255u8).filter(|&c| is_nan_code(c)).count(), 2);
    }

    #[test]
    fn a_block_decodes_in_element_order() {
        let mut b = [0u8; FP8_BYTES];
        b[0..4].copy_from_slice(&0.5f32.to_le_bytes());
        b[4] = 0x40; // 2.0
        b[5] = 0xc8; // -4.0
        b[4 + 127] = 0x3c; // 1.5
        let mut out = [0f32; FP8_BLOCK];
        dequant_fp8(&b, &mut out);
        assert_eq!((out[0], out[1], out[2], out[127]), (1.0, -2.0, 0.0, 0.75));
        let x: Vec<f32> = (0..FP8_BLOCK).map(|i| i as f32 * 0.25).collect();
        let want: f32 = out.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((dot_fp8(&b, &x) - want).abs() < 1e-4);
    }
}
