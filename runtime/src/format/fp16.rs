//! Half-precision conversions used inside the kernels: f16 and bf16 bit patterns to f32, written
//! branch-free so the compiler can inline and vectorize them in the hot loops, and f32 to f16
//! (round to nearest even, through the `half` crate) for the quantizers.
//!
//! Must not: allocate, or depend on CPU features (callers compile these into feature-specific
//! kernels by inlining).

/// f16 bits to f32: exact for every input (normals, subnormals, infinities, NaN).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let x = bits as u32;
    let sign = (x & 0x8000) << 16;
    let em = x & 0x7fff;
    // Moving exponent+mantissa into f32 position and scaling by 2^112 re-biases the exponent
    // (15 -> 127) and turns f16 subnormals into the right f32 normals in one multiply.
    let scaled = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let inf_nan = f32::from_bits(0x7f80_0000 | (em & 0x3ff) << 13);
    let mag = if em >= 0x7c00 { inf_nan } else { scaled };
    f32::from_bits(mag.to_bits() | sign)
}

/// bf16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to f16 bits, rounding to nearest even.
#[inline]
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// The f16 at byte offset `at` of `b` (little-endian), as f32.
#[inline(always)]
pub fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_matches_half_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let ours = f16_to_f32(bits);
            let theirs = half::f16::from_bits(bits).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn bf16_conversion_is_exact() {
        for bits in [0u16, 0x3f80, 0xbf80, 0x4049, 0x7f80, 0x0001] {
            assert_eq!(bf16_to_f32(bits), half::bf16::from_bits(bits).to_f32());
        }
    }
}
