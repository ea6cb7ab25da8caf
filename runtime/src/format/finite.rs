//! Finding a non-finite value (NaN, +-inf) in stored weights, the first in storage order:
//! every element of a float format, and every float field of a block format (its scales and
//! mins; the quantized values are small integers, so a block decodes to non-finite values only
//! through those), and every E4M3 code of `FP8_E4M3` (its NaN codes `0x7F`/`0xFF`) after its
//! block's f32 scale. Large tensors are split into 1 MiB pieces scanned in parallel; a piece is
//! first scanned for any bad bit pattern (a loop the compiler vectorizes), and only a piece
//! that has one is searched for the first.
//!
//! Must not: decode whole values to find one (the exponent bits decide), or know tensor names.

use super::fp16::{bf16_to_f32, f16_to_f32};
use super::WeightFormat;
use rayon::prelude::*;
use std::fmt;

/// The first non-finite value found, and where.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// What holds it: `"the value"` for float formats, else the block format's field.
    pub field: &'static str,
    /// The element's row and column (for a block's field, its block's first element's) in the
    /// tensor seen as a matrix of `cols` columns.
    pub row: usize,
    pub col: usize,
    pub value: f32,
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at row {}, column {} is {}", self.field, self.row, self.col, self.value)
    }
}

#[derive(Clone, Copy)]
enum Float {
    F16,
    BF16,
    F32,
    /// An f16 whose four nibbles are the top nibbles of four u16 (`IQ1_M`'s `d`).
    F16Nibbles,
}

impl Float {
    #[inline(always)]
    fn bad(self, b: &[u8], at: usize) -> bool {
        match self {
            Float::F16 => u16::from_le_bytes([b[at], b[at + 1]]) & 0x7c00 == 0x7c00,
            Float::BF16 => u16::from_le_bytes([b[at], b[at + 1]]) & 0x7f80 == 0x7f80,
            Float::F32 => u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) & 0x7f80_0000 == 0x7f80_0000,
            Float::F16Nibbles => super::iq_grid::nibbles_f16(b, at) & 0x7c00 == 0x7c00,
        }
    }

    fn value(self, b: &[u8], at: usize) -> f32 {
        match self {
            Float::F16 => f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])),
            Float::BF16 => bf16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])),
            Float::F32 => f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]),
            Float::F16Nibbles => f16_to_f32(super::iq_grid::nibbles_f16(b, at)),
        }
    }
}

/// Where a format keeps its floats: a unit of `unit` bytes (an element, a block or a row)
/// holding `elements` elements, with float fields at byte offsets.
struct Layout {
    unit: usize,
    elements: usize,
    fields: &'static [(usize, Float, &'static str)],
    /// Byte offset of a run of `elements` E4M3 codes after the fields (`FP8_E4M3`).
    codes: Option<usize>,
}

const CODE_FIELD: &str = "the e4m3 value";

fn layout(format: WeightFormat, cols: usize) -> Layout {
    use Float::*;
    let (unit, elements, fields): (usize, usize, &'static [(usize, Float, &'static str)]) = match format {
        WeightFormat::F32 => (4, 1, &[(0, F32, "the value")]),
        WeightFormat::F16 => (2, 1, &[(0, F16, "the value")]),
        WeightFormat::BF16 => (2, 1, &[(0, BF16, "the value")]),
        WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
            (format.block_bytes(), 32, &[(0, F16, "the f16 scale d of the block")])
        }
        WeightFormat::Q4_1 => {
            (20, 32, &[(0, F16, "the f16 scale d of the block"), (2, F16, "the f16 min m of the block")])
        }
        WeightFormat::Q4_K => (
            format.block_bytes(),
            256,
            &[(0, F16, "the f16 scale d of the super-block"), (2, F16, "the f16 min dmin of the super-block")],
        ),
        WeightFormat::Q6_K => (format.block_bytes(), 256, &[(208, F16, "the f16 scale d of the super-block")]),
        WeightFormat::Q5_0 | WeightFormat::IQ4_NL => {
            (format.block_bytes(), 32, &[(0, F16, "the f16 scale d of the block")])
        }
        WeightFormat::Q5_1 => {
            (24, 32, &[(0, F16, "the f16 scale d of the block"), (2, F16, "the f16 min m of the block")])
        }
        WeightFormat::Q2_K => (
            format.block_bytes(),
            256,
            &[(80, F16, "the f16 scale d of the super-block"), (82, F16, "the f16 min dmin of the super-block")],
        ),
        WeightFormat::Q3_K => (format.block_bytes(), 256, &[(108, F16, "the f16 scale d of the super-block")]),
        WeightFormat::Q5_K => (
            format.block_bytes(),
            256,
            &[(0, F16, "the f16 scale d of the super-block"), (2, F16, "the f16 min dmin of the super-block")],
        ),
        WeightFormat::IQ4_XS
        | WeightFormat::IQ2_XXS
        | WeightFormat::IQ2_XS
        | WeightFormat::IQ2_S
        | WeightFormat::IQ3_XXS
        | WeightFormat::IQ3_S
        | WeightFormat::IQ1_S => (format.block_bytes(), 256, &[(0, F16, "the f16 scale d of the super-block")]),
        WeightFormat::IQ1_M => (
            format.block_bytes(),
            256,
            &[(super::iq_grid::IQ1_M_SCALES, F16Nibbles, "the f16 scale d of the super-block")],
        ),
        // Every E8M0 byte is a finite power of two (GGUF decodes 255 as 2^127, not NaN).
        WeightFormat::MXFP4 => (format.block_bytes(), 32, &[]),
        WeightFormat::FP8_E4M3 => {
            let l = &[(0, F32, "the f32 scale of the block")];
            return Layout { unit: format.block_bytes(), elements: format.block_size(), fields: l, codes: Some(4) };
        }
        WeightFormat::I8Row => (cols + 4, cols, &[(0, F32, "the f32 scale of the row")]),
        WeightFormat::I4G64 => {
            (36, 64, &[(0, F16, "the f16 scale of the group"), (2, F16, "the f16 min of the group")])
        }
    };
    Layout { unit, elements, fields, codes: None }
}

/// Whether any unit of `chunk` (whole units) has a bad field: no early exit, so it vectorizes.
fn any_bad(l: &Layout, chunk: &[u8]) -> bool {
    if let Some(at) = l.codes {
        let codes = |u: &[u8]| u[at..at + l.elements].iter().fold(false, |a, &c| a | super::fp8::is_nan_code(c));
        return chunk
            .chunks_exact(l.unit)
            .fold(false, |a, u| a | codes(u) | l.fields.iter().fold(false, |a, &(at, f, _)| a | f.bad(u, at)));
    }
    match l.fields {
        // Float formats: the whole chunk is fields of one width.
        &[(0, Float::F32, _)] if l.unit == 4 => chunk.chunks_exact(4).fold(false, |a, c| a | Float::F32.bad(c, 0)),
        &[(0, f, _)] if l.unit == 2 => chunk.chunks_exact(2).fold(false, |a, c| a | f.bad(c, 0)),
        fields => chunk
            .chunks_exact(l.unit)
            .fold(false, |a, u| a | fields.iter().fold(false, |a, &(at, f, _)| a | f.bad(u, at))),
    }
}

/// The first non-finite float of `bytes`, a tensor of `cols` columns in `format` whose size the
/// caller has checked (`Matrix::new`); `None` when every value is finite.
pub fn first_non_finite(format: WeightFormat, bytes: &[u8], cols: usize) -> Option<NonFinite> {
    let l = layout(format, cols);
    if cols == 0 || l.unit == 0 || l.elements == 0 {
        return None;
    }
    let per_row = cols / l.elements;
    let piece = (1 << 20) / l.unit * l.unit + l.unit;
    bytes.par_chunks(piece).enumerate().find_map_first(|(p, chunk)| {
        if !any_bad(&l, chunk) {
            return None;
        }
        let first = p * (piece / l.unit);
        chunk.chunks_exact(l.unit).enumerate().find_map(|(i, u)| {
            let unit = first + i;
            let (row, col) = (unit / per_row, unit % per_row * l.elements);
            if let Some(&(at, f, field)) = l.fields.iter().find(|&&(at, f, _)| f.bad(u, at)) {
                return Some(NonFinite { field, row, col, value: f.value(u, at) });
            }
            let at = l.codes?;
            let k = u[at..at + l.elements].iter().position(|&c| super::fp8::is_nan_code(c))?;
            Some(NonFinite { field: CODE_FIELD, row, col: col + k, value: f32::NAN })
        })
    })
}
