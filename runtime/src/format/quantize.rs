//! Encoders from f32 rows into stored formats: coli's load-time formats (`I8Row`, `I4G64`), the
//! float formats, and the simple GGUF block formats (`Q8_0`, `Q4_0`, `Q4_1`, used by tests and
//! tools). Rows are encoded in parallel. Scales are rounded to their stored precision before the
//! values are quantized against them, so the stored scale is the one the values were fit to.
//!
//! Must not: encode the k-quants, the 5-bit or the IQ formats (coli only reads them), or accept
//! values it cannot represent (non-finite, or beyond f16 range where a scale is f16).

use super::fp16::{f16_to_f32, f32_to_f16};
use super::{FormatError, WeightFormat};
use rayon::prelude::*;

const F16_MAX: f32 = 65504.0;

/// Encodes `rows` (row-major, `rows.len() / cols` rows of `cols`) into `format`.
pub fn quantize(format: WeightFormat, rows: &[f32], cols: usize) -> Result<Vec<u8>, FormatError> {
    if !matches!(
        format,
        WeightFormat::F32
            | WeightFormat::F16
            | WeightFormat::BF16
            | WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::I8Row
            | WeightFormat::I4G64
    ) {
        return Err(FormatError::NotAQuantizeTarget { format });
    }
    let row_bytes = format.row_bytes(cols)?;
    if cols == 0 || !rows.len().is_multiple_of(cols) {
        return Err(FormatError::Length { what: "rows (a multiple of cols)", expected: cols, found: rows.len() });
    }
    let limit =
        if matches!(format, WeightFormat::F32 | WeightFormat::BF16 | WeightFormat::I8Row) { f32::MAX } else { F16_MAX };
    if let Some((index, &value)) = rows.iter().enumerate().find(|(_, v)| !v.is_finite() || v.abs() > limit) {
        return Err(FormatError::NonFinite { format, index, value });
    }
    let mut out = vec![0u8; rows.len() / cols * row_bytes];
    out.par_chunks_mut(row_bytes)
        .zip(rows.par_chunks(cols))
        .with_min_len(16)
        .for_each(|(o, r)| encode_row(format, r, o));
    Ok(out)
}

fn put_f16(o: &mut [u8], v: f32) -> f32 {
    let bits = f32_to_f16(v);
    o.copy_from_slice(&bits.to_le_bytes());
    f16_to_f32(bits)
}

/// Asymmetric 4-bit block: `x ~ scale * q + min`, q in 0..=15; writes f16 scale, f16 min, nibbles
/// (element `i < n/2` low nibble of byte `i`, element `i + n/2` its high nibble).
fn encode_min_block(x: &[f32], o: &mut [u8]) {
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let scale = put_f16(&mut o[0..2], (hi - lo) / 15.0);
    let min = put_f16(&mut o[2..4], lo);
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let half = x.len() / 2;
    for i in 0..half {
        let q = |v: f32| ((v - min) * inv).round().clamp(0.0, 15.0) as u8;
        o[4 + i] = q(x[i]) | (q(x[i + half]) << 4);
    }
}

fn encode_row(format: WeightFormat, x: &[f32], o: &mut [u8]) {
    match format {
        WeightFormat::F32 => {
            for (b, v) in o.chunks_exact_mut(4).zip(x) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        WeightFormat::F16 => {
            for (b, v) in o.chunks_exact_mut(2).zip(x) {
                b.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        WeightFormat::BF16 => {
            for (b, v) in o.chunks_exact_mut(2).zip(x) {
                b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        WeightFormat::Q8_0 => {
            for (b, xs) in o.chunks_exact_mut(34).zip(x.chunks_exact(32)) {
                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = put_f16(&mut b[0..2], amax / 127.0);
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                for i in 0..32 {
                    b[2 + i] = (xs[i] * inv).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (b, xs) in o.chunks_exact_mut(18).zip(x.chunks_exact(32)) {
                // The value of largest magnitude maps to -8, so its sign picks the scale's sign.
                let peak = xs.iter().copied().fold(0f32, |a, v| if v.abs() > a.abs() { v } else { a });
                let d = put_f16(&mut b[0..2], peak / -8.0);
                let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q = |v: f32| (v * inv + 8.0).round().clamp(0.0, 15.0) as u8;
                for i in 0..16 {
                    b[2 + i] = q(xs[i]) | (q(xs[i + 16]) << 4);
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (b, xs) in o.chunks_exact_mut(20).zip(x.chunks_exact(32)) {
                encode_min_block(xs, b);
            }
        }
        WeightFormat::I4G64 => {
            for (b, xs) in o.chunks_exact_mut(36).zip(x.chunks_exact(64)) {
                encode_min_block(xs, b);
            }
        }
        WeightFormat::I8Row => {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            o[0..4].copy_from_slice(&scale.to_le_bytes());
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            for (b, v) in o[4..].iter_mut().zip(x) {
                *b = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
            }
        }
        WeightFormat::Q4_K
        | WeightFormat::Q6_K
        | WeightFormat::Q5_0
        | WeightFormat::Q5_1
        | WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q5_K
        | WeightFormat::IQ4_NL
        | WeightFormat::IQ4_XS
        | WeightFormat::IQ2_XXS
        | WeightFormat::IQ2_XS
        | WeightFormat::IQ2_S
        | WeightFormat::IQ3_XXS
        | WeightFormat::IQ3_S
        | WeightFormat::IQ1_S
        | WeightFormat::IQ1_M
        | WeightFormat::MXFP4
        | WeightFormat::FP8_E4M3 => unreachable!("rejected by quantize"),
    }
}
