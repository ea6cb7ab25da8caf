//! Expansion of one stored row to f32, for every `WeightFormat`. Used for small tensors (norm
//! weights, biases, embedding rows) and as the reference the dot kernels are tested against.
//!
//! Must not: check lengths (`format::dequant_row` does), or allocate.

use super::fp16::{bf16_to_f32, f16_to_f32, read_f16};
use super::WeightFormat;
use super::{fp8, iq4, iq_grid, kquant, kquant_lo, mxfp4, q5};

pub fn dequant_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
        WeightFormat::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        WeightFormat::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        WeightFormat::Q8_0 => {
            for (b, o) in row.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = read_f16(b, 0);
                for i in 0..32 {
                    o[i] = d * b[2 + i] as i8 as f32;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (b, o) in row.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = read_f16(b, 0);
                for i in 0..16 {
                    o[i] = d * ((b[2 + i] & 0x0f) as i32 - 8) as f32;
                    o[i + 16] = d * ((b[2 + i] >> 4) as i32 - 8) as f32;
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (b, o) in row.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let (d, m) = (read_f16(b, 0), read_f16(b, 2));
                for i in 0..16 {
                    o[i] = d * (b[4 + i] & 0x0f) as f32 + m;
                    o[i + 16] = d * (b[4 + i] >> 4) as f32 + m;
                }
            }
        }
        WeightFormat::Q4_K => kquant::dequant_q4k(row, out),
        WeightFormat::Q6_K => kquant::dequant_q6k(row, out),
        WeightFormat::Q5_0 => q5::dequant_q5_0(row, out),
        WeightFormat::Q5_1 => q5::dequant_q5_1(row, out),
        WeightFormat::Q2_K => kquant_lo::dequant_q2k(row, out),
        WeightFormat::Q3_K => kquant_lo::dequant_q3k(row, out),
        WeightFormat::Q5_K => kquant_lo::dequant_q5k(row, out),
        WeightFormat::IQ4_NL => iq4::dequant_iq4_nl(row, out),
        WeightFormat::MXFP4 => mxfp4::dequant_mxfp4(row, out),
        WeightFormat::FP8_E4M3 => fp8::dequant_fp8(row, out),
        WeightFormat::IQ4_XS => iq4::dequant_iq4_xs(row, out),
        WeightFormat::IQ2_XXS => iq_grid::dequant_iq2_xxs(row, out),
        WeightFormat::IQ2_XS => iq_grid::dequant_iq2_xs(row, out),
        WeightFormat::IQ2_S => iq_grid::dequant_iq2_s(row, out),
        WeightFormat::IQ3_XXS => iq_grid::dequant_iq3_xxs(row, out),
        WeightFormat::IQ3_S => iq_grid::dequant_iq3_s(row, out),
        WeightFormat::IQ1_S => iq_grid::dequant_iq1_s(row, out),
        WeightFormat::IQ1_M => iq_grid::dequant_iq1_m(row, out),
        WeightFormat::I8Row => {
            let scale = f32::from_le_bytes(row[0..4].try_into().unwrap());
            for (o, &q) in out.iter_mut().zip(&row[4..]) {
                *o = scale * q as i8 as f32;
            }
        }
        WeightFormat::I4G64 => {
            for (b, o) in row.chunks_exact(36).zip(out.chunks_exact_mut(64)) {
                let (d, m) = (read_f16(b, 0), read_f16(b, 2));
                for i in 0..32 {
                    o[i] = d * (b[4 + i] & 0x0f) as f32 + m;
                    o[i + 32] = d * (b[4 + i] >> 4) as f32 + m;
                }
            }
        }
    }
}
