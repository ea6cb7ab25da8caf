//! `MXFP4` (OCP microscaling FP4, as GGUF stores it: gpt-oss's experts): 32 elements in 17
//! bytes, an 8-bit power-of-two scale `e` (E8M0) then 16 bytes of 4-bit E2M1 values; element
//! `i < 16` is the low nibble of byte `1 + i`, element `i + 16` its high nibble. The 16 E2M1
//! values doubled are the integers of `LEVELS`, so `x = half(e) * LEVELS[q]` with
//! `half(e) = 2^(e - 128)` (GGUF's convention; `e` of 0 and 1 give the subnormals 2^-128 and
//! 2^-127 exactly). Decoding, f32 dot products and dot products against 8-bit activations (the
//! levels fit in i8, so blocks sum in integers, as `IQ4_NL`'s).
//!
//! Must not: check lengths (the callers in `format` do), or allocate.

use super::prim::{arr, fdot, idot_i8};
use super::BlockQ8;

pub const MXFP4_BYTES: usize = 17;

/// The E2M1 values, doubled, that a nibble selects.
pub const LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: half the E8M0 scale (the levels are doubled values).
#[inline(always)]
pub fn half_scale(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// The 32 levels of block `b`, in element order.
#[inline(always)]
fn levels(b: &[u8]) -> [i8; 32] {
    let qs: &[u8; 16] = arr(b, 1);
    let mut out = [0i8; 32];
    for i in 0..16 {
        out[i] = LEVELS[(qs[i] & 15) as usize];
        out[i + 16] = LEVELS[(qs[i] >> 4) as usize];
    }
    out
}

pub fn dequant_mxfp4(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(MXFP4_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = half_scale(b[0]);
        for (o, q) in o.iter_mut().zip(levels(b)) {
            *o = d * q as f32;
        }
    }
}

#[inline(always)]
pub fn dot_mxfp4(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, xs) in row.chunks_exact(MXFP4_BYTES).zip(x.chunks_exact(32)) {
        acc += half_scale(b[0]) * fdot(&levels(b).map(|q| q as f32), xs);
    }
    acc
}

#[inline(always)]
pub fn dot_mxfp4_q8(row: &[u8], x: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(MXFP4_BYTES).zip(x) {
        acc += half_scale(b[0]) * xb.d * idot_i8(&levels(b), &xb.q) as f32;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_scale_is_two_to_the_e_minus_128() {
        assert_eq!(half_scale(128), 1.0);
        assert_eq!(half_scale(127), 0.5);
        assert_eq!(half_scale(130), 4.0);
        assert_eq!(half_scale(0), 2f32.powi(-128));
        assert_eq!(half_scale(1), 2f32.powi(-127));
        assert_eq!(half_scale(2), 2f32.powi(-126));
        assert_eq!(half_scale(255), 2f32.powi(127));
    }

    #[test]
    fn a_block_decodes_in_element_order() {
        let mut b = [0u8; MXFP4_BYTES];
        b[0] = 129; // half scale 2
        b[1] = 0x9f; // element 0: level 15 (-12), element 16: level 9 (-1)
        b[2] = 0x07; // element 1: level 7 (12)
        let mut out = [0f32; 32];
        dequant_mxfp4(&b, &mut out);
        assert_eq!((out[0], out[16], out[1], out[17]), (-24.0, -2.0, 24.0, 0.0));
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.25).collect();
        let want: f32 = out.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((dot_mxfp4(&b, &x) - want).abs() < 1e-5);
    }
}
