//! Weight matrices on the device: the host repacks a checkpoint's rows (layouts in
//! `format/mod.rs`) into the device layout of `shaders/wformat.glsl`: the quantized values of
//! each row in whole 16-byte units (zero-padded), and the scales apart, so the shaders load
//! 16 bytes at a time from aligned addresses. Values are copied bit for bit (Q6_K's f16 `d`
//! widens to f32, exactly); nothing is re-quantized.
//!
//! Must not: change a value, or depend on the device (pure repacking, then one upload).

use super::context::{Context, DeviceBuffer};
use super::error::{Result, VkError};
use super::memory::MemoryUse;
use super::shaders::FormatVariant;
use crate::format::{fp16, Matrix, WeightFormat};

/// A matrix in device layout, on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    pub variant: FormatVariant,
    /// uvec4s of quantized values per row.
    pub qs: usize,
    /// uints of scales per row.
    pub ss: usize,
    pub q: Vec<u8>,
    pub s: Vec<u8>,
}

fn pad_to(v: &mut Vec<u8>, multiple: usize) {
    let n = v.len().div_ceil(multiple) * multiple;
    v.resize(n, 0);
}

/// The grid formats (`shaders/iq_grid.glsl`): uvec4s of one super-block's bytes after its f16
/// `d` (`IQ1_M`, whose `d` is split over its scale words: all its bytes), zero-padded (`IQ_QB`
/// there).
fn grid_units(format: WeightFormat) -> usize {
    match format {
        WeightFormat::IQ1_M => format.block_bytes().div_ceil(16),
        _ => (format.block_bytes() - 2).div_ceil(16),
    }
}

/// Repacks `rows` rows of `cols` elements in `format` (`bytes` as the checkpoint stores them).
pub fn pack(format: WeightFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Packed> {
    let m = Matrix::new(format, rows, cols, bytes)?;
    let Some(variant) = FormatVariant::of(format, cols) else {
        return Err(VkError::UnsupportedFormat { op: "weight upload", format });
    };
    let bs = format.block_size();
    let nb = cols / bs;
    // Per format: q bytes and s bytes of one row.
    let (qs, ss) = match format {
        WeightFormat::F32 => (cols.div_ceil(4), 0),
        WeightFormat::F16 | WeightFormat::BF16 => (cols.div_ceil(8), 0),
        WeightFormat::I8Row => (cols.div_ceil(16), 1),
        WeightFormat::Q8_0 => (2 * nb, nb.div_ceil(2)),
        WeightFormat::Q4_0 => (nb, nb.div_ceil(2)),
        WeightFormat::Q4_1 => (nb, nb),
        WeightFormat::I4G64 => (2 * nb, nb),
        WeightFormat::Q4_K => (8 * nb, 4 * nb),
        WeightFormat::Q6_K => (12 * nb, 5 * nb),
        WeightFormat::Q5_0 | WeightFormat::Q5_1 => (nb, 2 * nb),
        WeightFormat::IQ4_NL => (nb, nb.div_ceil(2)),
        WeightFormat::IQ4_XS => (8 * nb, 2 * nb),
        WeightFormat::MXFP4 => (nb, nb),
        WeightFormat::FP8_E4M3 => (8 * nb, nb),
        WeightFormat::Q5_K => (10 * nb, 4 * nb),
        WeightFormat::Q2_K => (4 * nb, 5 * nb),
        WeightFormat::Q3_K => (6 * nb, 4 * nb),
        WeightFormat::IQ2_XXS
        | WeightFormat::IQ2_XS
        | WeightFormat::IQ2_S
        | WeightFormat::IQ3_XXS
        | WeightFormat::IQ3_S
        | WeightFormat::IQ1_S
        | WeightFormat::IQ1_M => (grid_units(format) * nb, nb.div_ceil(2)),
    };
    let mut q = Vec::with_capacity(rows * qs * 16);
    let mut s = Vec::with_capacity(rows * ss * 4);
    for r in 0..rows {
        let row = m.row(r);
        let (q0, s0) = (q.len(), s.len());
        match format {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => q.extend_from_slice(row),
            WeightFormat::I8Row => {
                s.extend_from_slice(&row[..4]);
                q.extend_from_slice(&row[4..]);
            }
            _ => {
                let bb = format.block_bytes();
                for b in row.chunks_exact(bb) {
                    match format {
                        WeightFormat::Q8_0 => {
                            q.extend_from_slice(&b[2..34]);
                            s.extend_from_slice(&b[0..2]);
                        }
                        WeightFormat::Q4_0 => {
                            q.extend_from_slice(&b[2..18]);
                            s.extend_from_slice(&b[0..2]);
                        }
                        WeightFormat::Q4_1 => {
                            q.extend_from_slice(&b[4..20]);
                            s.extend_from_slice(&b[0..4]);
                        }
                        WeightFormat::I4G64 => {
                            q.extend_from_slice(&b[4..36]);
                            s.extend_from_slice(&b[0..4]);
                        }
                        WeightFormat::Q4_K => {
                            q.extend_from_slice(&b[16..144]);
                            s.extend_from_slice(&b[0..16]);
                        }
                        WeightFormat::Q6_K => {
                            q.extend_from_slice(&b[0..192]);
                            s.extend_from_slice(&b[192..208]);
                            let d = fp16::f16_to_f32(u16::from_le_bytes([b[208], b[209]]));
                            s.extend_from_slice(&d.to_le_bytes());
                        }
                        WeightFormat::Q5_0 => {
                            q.extend_from_slice(&b[6..22]);
                            s.extend_from_slice(&b[0..2]);
                            s.extend_from_slice(&[0, 0]);
                            s.extend_from_slice(&b[2..6]);
                        }
                        WeightFormat::Q5_1 => {
                            q.extend_from_slice(&b[8..24]);
                            s.extend_from_slice(&b[0..8]);
                        }
                        WeightFormat::IQ4_NL => {
                            q.extend_from_slice(&b[2..18]);
                            s.extend_from_slice(&b[0..2]);
                        }
                        WeightFormat::IQ4_XS => {
                            q.extend_from_slice(&b[8..136]);
                            s.extend_from_slice(&b[0..8]);
                        }
                        WeightFormat::FP8_E4M3 => {
                            q.extend_from_slice(&b[4..132]);
                            s.extend_from_slice(&b[0..4]);
                        }
                        WeightFormat::MXFP4 => {
                            q.extend_from_slice(&b[1..17]);
                            s.extend_from_slice(&crate::format::mxfp4::half_scale(b[0]).to_le_bytes());
                        }
                        WeightFormat::Q5_K => {
                            q.extend_from_slice(&b[48..176]);
                            q.extend_from_slice(&b[16..48]);
                            s.extend_from_slice(&b[0..16]);
                        }
                        WeightFormat::Q2_K => {
                            q.extend_from_slice(&b[16..80]);
                            s.extend_from_slice(&b[0..16]);
                            s.extend_from_slice(&b[80..84]);
                        }
                        WeightFormat::Q3_K => {
                            q.extend_from_slice(&b[32..96]);
                            q.extend_from_slice(&b[0..32]);
                            s.extend_from_slice(&b[96..110]);
                            s.extend_from_slice(&[0, 0]);
                        }
                        WeightFormat::IQ2_XXS
                        | WeightFormat::IQ2_XS
                        | WeightFormat::IQ2_S
                        | WeightFormat::IQ3_XXS
                        | WeightFormat::IQ3_S
                        | WeightFormat::IQ1_S => {
                            let q0 = q.len();
                            q.extend_from_slice(&b[2..]);
                            q.resize(q0 + 16 * grid_units(format), 0);
                            s.extend_from_slice(&b[0..2]);
                        }
                        WeightFormat::IQ1_M => {
                            let q0 = q.len();
                            q.extend_from_slice(b);
                            q.resize(q0 + 16 * grid_units(format), 0);
                            let d = crate::format::iq1m_d_bits(b);
                            s.extend_from_slice(&d.to_le_bytes());
                        }
                        _ => unreachable!("float formats and I8Row are handled above"),
                    }
                }
            }
        }
        q.resize(q0 + qs * 16, 0);
        s.resize(s0 + ss * 4, 0);
    }
    pad_to(&mut q, 16);
    Ok(Packed { variant, qs, ss, q, s })
}

/// A weight matrix resident on the device.
#[derive(Debug)]
pub struct DeviceMatrix {
    pub format: WeightFormat,
    pub variant: FormatVariant,
    pub rows: usize,
    pub cols: usize,
    pub(crate) qs: usize,
    pub(crate) ss: usize,
    pub(crate) q: DeviceBuffer,
    pub(crate) s: DeviceBuffer,
}

impl DeviceMatrix {
    /// Device bytes the matrix takes.
    pub fn device_bytes(&self) -> usize {
        self.q.len_bytes() + self.s.len_bytes()
    }
}

impl Context {
    /// Repacks and uploads a weight matrix (`bytes`: its rows as the checkpoint stores them).
    pub fn upload_matrix(&self, format: WeightFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<DeviceMatrix> {
        let p = pack(format, rows, cols, bytes)?;
        let q = self.buffer(MemoryUse::Device, p.q.len())?;
        self.write(&q, 0, &p.q)?;
        let s = self.buffer(MemoryUse::Device, p.s.len().max(16))?;
        self.write(&s, 0, &p.s)?;
        Ok(DeviceMatrix { format, variant: p.variant, rows, cols, qs: p.qs, ss: p.ss, q, s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_padded_to_whole_units_with_zeros() {
        let bytes: Vec<u8> = (0..3 * 5 * 4).map(|i| i as u8).collect();
        let p = pack(WeightFormat::F32, 3, 5, &bytes).unwrap();
        assert_eq!((p.qs, p.ss), (2, 0));
        assert_eq!(p.q.len(), 3 * 32);
        assert_eq!(&p.q[32..52], &bytes[20..40]);
        assert!(p.q[52..64].iter().all(|&b| b == 0));
    }

    #[test]
    fn q8_0_splits_values_from_scales() {
        let mut row = Vec::new();
        for b in 0..3u8 {
            row.extend_from_slice(&[b, 0x3c]);
            row.extend((0..32).map(|i| i as u8 + b));
        }
        let p = pack(WeightFormat::Q8_0, 1, 96, &row).unwrap();
        assert_eq!((p.qs, p.ss), (6, 2));
        assert_eq!(&p.q[32..64], &row[36..68]);
        assert_eq!(&p.s, &[0, 0x3c, 1, 0x3c, 2, 0x3c, 0, 0]);
    }

    #[test]
    fn block_formats_keep_every_byte() {
        // Lossless: the packed values and scales hold every stored byte (each nonzero byte value
        // as often as the rows do; zeros only added, as padding), whatever the format.
        for format in WeightFormat::ALL.into_iter().filter(|f| f.block_size() > 1) {
            let cols = 2 * format.block_size();
            let n = 3 * format.row_bytes(cols).unwrap();
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8 | 1).collect();
            if FormatVariant::of(format, cols).is_none() {
                // No shader decodes it: refused, not packed into something else.
                assert!(matches!(pack(format, 3, cols, &bytes), Err(VkError::UnsupportedFormat { .. })), "{format}");
                continue;
            }
            let p = pack(format, 3, cols, &bytes).unwrap();
            let mut want = [0usize; 256];
            bytes.iter().for_each(|&b| want[b as usize] += 1);
            let mut got = [0usize; 256];
            p.q.iter().chain(&p.s).for_each(|&b| got[b as usize] += 1);
            // Q6_K widens its f16 d to f32: its two bytes become four; MXFP4 decodes its
            // exponent byte into an f32 scale; IQ1_M's d, assembled from its scale words'
            // nibbles, comes in addition to them: count the rest.
            if !matches!(format, WeightFormat::Q6_K | WeightFormat::MXFP4 | WeightFormat::IQ1_M) {
                assert_eq!(want[1..], got[1..], "{format}");
            }
            assert_eq!(p.q.len(), 3 * p.qs * 16, "{format}");
            assert!(p.s.len() == 3 * p.ss * 4, "{format}");
        }
    }

    #[test]
    fn mxfp4_keeps_the_nibbles_and_decodes_the_scale() {
        let mut row = vec![0u8; 2 * 17];
        row[0] = 128;
        row[17] = 3;
        row[1..17].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let p = pack(WeightFormat::MXFP4, 1, 64, &row).unwrap();
        assert_eq!((p.qs, p.ss), (2, 2));
        assert_eq!(&p.q[..16], &row[1..17]);
        assert_eq!(&p.s[..4], &1f32.to_le_bytes());
        assert_eq!(&p.s[4..], &2f32.powi(-125).to_le_bytes());
    }

    #[test]
    fn i8row_short_rows_take_the_float_variant() {
        assert_eq!(FormatVariant::of(WeightFormat::I8Row, 64), Some(FormatVariant::I8Row));
        assert_eq!(FormatVariant::of(WeightFormat::I8Row, 40), Some(FormatVariant::I8RowF));
        assert!(!FormatVariant::I8RowF.q8_acts() && FormatVariant::Q4_K.q8_acts());
    }
}
