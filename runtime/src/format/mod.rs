//! Weight formats and their CPU kernels: how a row of a weight matrix is stored (`WeightFormat`),
//! how to expand it (`dequant_row`), how to take its dot product with f32 activations without
//! expanding it (`dot_row`), the quantized-activation fast path (`QuantizedActs`), the
//! parallel `matmul` every Linear and every expert goes through, and quantization of f32 rows
//! into coli's own load-time formats (`I8Row`, `I4G64`); `first_non_finite` finds a NaN or an
//! infinity in stored weights (elements of float formats, scale and min fields of block formats).
//!
//! Byte layouts (all little-endian; one row is a whole number of blocks, blocks never span rows):
//! - `F32` 4 bytes, `F16` 2, `BF16` 2 per element.
//! - `Q8_0`: 32 elements in 34 bytes: f16 `d`, 32 x i8 `q`; `x = d * q`.
//! - `Q4_0`: 32 in 18: f16 `d`, 16 bytes; element `i < 16` is the low nibble of byte `i`,
//!   element `i + 16` its high nibble; `x = d * (q - 8)`.
//! - `Q4_1`: 32 in 20: f16 `d`, f16 `m`, 16 bytes as in `Q4_0`; `x = d * q + m`.
//! - `Q5_0`: 32 in 22: f16 `d`, u32 `qh` (bit `i` is element `i`'s fifth bit), 16 bytes of
//!   nibbles as in `Q4_0`; `x = d * (q - 16)`. `Q5_1`: 32 in 24: f16 `d`, f16 `m`, `qh`, nibbles;
//!   `x = d * q + m` (see `q5.rs`).
//! - `IQ4_NL`: 32 in 18: f16 `d`, nibbles as in `Q4_0` indexing 16 fixed levels;
//!   `x = d * level[q]`. `IQ4_XS`: 256 in 136, eight sub-blocks of 32 with 6-bit scales
//!   (see `iq4.rs`).
//! - `IQ2_XXS` (66 bytes per 256), `IQ2_XS` (74), `IQ2_S` (82), `IQ3_XXS` (98), `IQ3_S` (110):
//!   groups of 8 or 4 values indexing fixed lattices, with sign bits and 4-bit sub-block scales;
//!   `IQ1_S` (50) and `IQ1_M` (56): groups of 8 values in -1, 0, 1 from one lattice, shifted by
//!   +-1/8, with 3-bit scales (`IQ1_M`'s f16 `d` split over its scale words' top nibbles; see
//!   `iq_grid.rs`; the lattices in `iq_grids.rs`).
//! - `MXFP4`: 32 in 17: an E8M0 power-of-two scale, nibbles as in `Q4_0` indexing the E2M1
//!   values (see `mxfp4.rs`).
//! - `FP8_E4M3` (coli's block form of FP8 checkpoints): 128 in 132: the f32 `scale` of the
//!   element's 128 x 128 tile (the checkpoint's `weight_scale_inv`, replicated on each of the
//!   tile's rows), then 128 E4M3 codes; `x = scale * e4m3(q)` (see `fp8.rs`). Rows must be a
//!   whole number of 128-blocks (a shorter row is `RaggedRow`; no published checkpoint has one).
//! - `Q4_K`, `Q6_K`: GGUF's k-quant super-blocks of 256 (see `kquant.rs`); `Q2_K` (84 bytes),
//!   `Q3_K` (110) and `Q5_K` (176), the same family (see `kquant_lo.rs`).
//! - `I8Row` (coli): per row one f32 `scale`, then `cols` x i8; `x = scale * q`, symmetric,
//!   `scale = max|x| / 127`. Any `cols`.
//! - `I4G64` (coli): groups of 64 elements in 36 bytes: f16 `scale`, f16 `min`, 32 bytes where
//!   element `i < 32` is the low nibble of byte `i` and element `i + 32` its high nibble;
//!   `x = scale * q + min` with `q` in `0..=15`.
//!
//! Errors: everything built from outside data is checked once and reported as a `FormatError`
//! (`row_bytes`, `Matrix::new`, `quantize`, `QuantizedActs::new`, the `try_*` kernels). The hot
//! entry points (`dequant_row`, `dot_row`, `matmul`) take sizes their caller already checked
//! and panic, naming the mismatch, if that invariant is broken.
//!
//! Must not: read files, or know tensor names or checkpoints.

#[cfg(target_arch = "x86_64")]
mod amx;
mod dequant;
mod dot;
mod finite;
pub mod fp16;
pub(crate) mod fp8;
mod fsimd;
mod iq4;
mod iq_grid;
mod iq_grids;
mod kquant;
mod kquant_lo;
mod matmul;
mod matrix;
pub(crate) mod mxfp4;
pub mod pool;
mod prim;
mod q5;
mod q8;
mod quantize;
mod simd;
#[cfg(test)]
mod tests;

pub use finite::{first_non_finite, NonFinite};
pub use matmul::{
    kernel_level, matmul, matmul_multi, matmul_q, matmul_q_multi, try_matmul, try_matmul_multi, try_matmul_q,
    try_matmul_q_each, try_matmul_q_multi, wide_simd, TILE_ROWS,
};
pub use matrix::Matrix;
pub use q8::{BlockQ8, QuantizedActs};
pub use quantize::quantize;

use std::fmt;

/// The storage format of a weight tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q5_K,
    IQ4_NL,
    IQ4_XS,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
    MXFP4,
    /// coli: blocks of 128 E4M3 codes, each after its f32 scale (FP8 checkpoints, repacked).
    FP8_E4M3,
    /// coli: per-row f32 scale then i8 values.
    I8Row,
    /// coli: groups of 64 with an f16 scale and an f16 min, 4-bit values.
    I4G64,
}

/// A malformed argument to a format kernel.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("GGUF type id {0} is not a weight format coli reads")]
    UnknownGgufType(u32),
    #[error("{format}: a row of {cols} columns is not a whole number of {block}-element blocks")]
    RaggedRow { format: WeightFormat, cols: usize, block: usize },
    #[error("{format}: a row of {cols} columns takes {expected} bytes, got {found}")]
    RowBytes { format: WeightFormat, cols: usize, expected: usize, found: usize },
    #[error("{format}: matrix of {rows} x {cols} takes {expected} bytes, got {found}")]
    MatrixBytes { format: WeightFormat, rows: usize, cols: usize, expected: usize, found: usize },
    #[error("{what}: expected {expected} values, got {found}")]
    Length { what: &'static str, expected: usize, found: usize },
    #[error("{format} is not a format coli quantizes into (use I8Row or I4G64)")]
    NotAQuantizeTarget { format: WeightFormat },
    #[error("{format}: cannot encode non-finite value {value} at index {index}")]
    NonFinite { format: WeightFormat, index: usize, value: f32 },
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 26] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q4_K,
        WeightFormat::Q6_K,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q5_K,
        WeightFormat::IQ4_NL,
        WeightFormat::IQ4_XS,
        WeightFormat::IQ2_XXS,
        WeightFormat::IQ2_XS,
        WeightFormat::IQ2_S,
        WeightFormat::IQ3_XXS,
        WeightFormat::IQ3_S,
        WeightFormat::IQ1_S,
        WeightFormat::IQ1_M,
        WeightFormat::MXFP4,
        WeightFormat::FP8_E4M3,
        WeightFormat::I8Row,
        WeightFormat::I4G64,
    ];

    /// The name GGUF and safetensors use (`Q4_K`, `BF16`), and coli's own for `I8Row`/`I4G64`/`FP8_E4M3`
    /// (safetensors' raw `F8_E4M3` has no scales; `FP8_E4M3` is the repacked block form).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "F32",
            WeightFormat::F16 => "F16",
            WeightFormat::BF16 => "BF16",
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Q4_0 => "Q4_0",
            WeightFormat::Q4_1 => "Q4_1",
            WeightFormat::Q4_K => "Q4_K",
            WeightFormat::Q6_K => "Q6_K",
            WeightFormat::Q5_0 => "Q5_0",
            WeightFormat::Q5_1 => "Q5_1",
            WeightFormat::Q2_K => "Q2_K",
            WeightFormat::Q3_K => "Q3_K",
            WeightFormat::Q5_K => "Q5_K",
            WeightFormat::IQ4_NL => "IQ4_NL",
            WeightFormat::IQ4_XS => "IQ4_XS",
            WeightFormat::IQ2_XXS => "IQ2_XXS",
            WeightFormat::IQ2_XS => "IQ2_XS",
            WeightFormat::IQ2_S => "IQ2_S",
            WeightFormat::IQ3_XXS => "IQ3_XXS",
            WeightFormat::IQ3_S => "IQ3_S",
            WeightFormat::IQ1_S => "IQ1_S",
            WeightFormat::IQ1_M => "IQ1_M",
            WeightFormat::MXFP4 => "MXFP4",
            WeightFormat::FP8_E4M3 => "FP8_E4M3",
            WeightFormat::I8Row => "I8Row",
            WeightFormat::I4G64 => "I4G64",
        }
    }

    /// Elements per block. `I8Row` has one scale per row and reports 1 (any column count);
    /// its per-row header is accounted for by `row_bytes`.
    pub fn block_size(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 | WeightFormat::I8Row => 1,
            WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::IQ4_NL
            | WeightFormat::MXFP4 => 32,
            WeightFormat::Q4_K
            | WeightFormat::Q6_K
            | WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q5_K
            | WeightFormat::IQ4_XS
            | WeightFormat::IQ2_XXS
            | WeightFormat::IQ2_XS
            | WeightFormat::IQ2_S
            | WeightFormat::IQ3_XXS
            | WeightFormat::IQ3_S
            | WeightFormat::IQ1_S
            | WeightFormat::IQ1_M => 256,
            WeightFormat::I4G64 => 64,
            WeightFormat::FP8_E4M3 => fp8::FP8_BLOCK,
        }
    }

    /// Byte offsets of the f16 scale and min fields in one block, for the block formats coli
    /// reads but does not encode (tests and benchmarks fill them with sane scales when they
    /// make random blocks, through `set_f16_field`); empty for every other format. `IQ1_M`'s
    /// `d` is no two bytes of its own: its field, at 48, is the top nibbles of the four u16
    /// scale words there.
    pub fn f16_fields(self) -> &'static [usize] {
        match self {
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q5_1 => &[0, 2],
            WeightFormat::Q6_K => &[208],
            WeightFormat::Q2_K => &[80, 82],
            WeightFormat::Q3_K => &[108],
            WeightFormat::Q5_0
            | WeightFormat::IQ4_NL
            | WeightFormat::IQ4_XS
            | WeightFormat::IQ2_XXS
            | WeightFormat::IQ2_XS
            | WeightFormat::IQ2_S
            | WeightFormat::IQ3_XXS
            | WeightFormat::IQ3_S
            | WeightFormat::IQ1_S => &[0],
            WeightFormat::IQ1_M => &[iq_grid::IQ1_M_SCALES],
            _ => &[],
        }
    }

    /// Writes the f16 `bits` into the field of `f16_fields` at byte `at` of `block`: two
    /// bytes, except `IQ1_M`'s `d`, whose nibbles go to the top of its four scale words (their
    /// other bits, the scales, are kept).
    pub fn set_f16_field(self, block: &mut [u8], at: usize, bits: u16) {
        if self == WeightFormat::IQ1_M && at == iq_grid::IQ1_M_SCALES {
            for k in 0..4 {
                let b = &mut block[at + 2 * k + 1];
                *b = (*b & 0x0f) | ((bits >> (4 * k) & 15) as u8) << 4;
            }
        } else {
            block[at..at + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }

    /// Bytes per block (for `I8Row`: per element, excluding the 4-byte row scale).
    pub fn block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            WeightFormat::Q8_0 => 34,
            WeightFormat::Q4_0 => 18,
            WeightFormat::Q4_1 => 20,
            WeightFormat::Q4_K => kquant::Q4K_BYTES,
            WeightFormat::Q6_K => kquant::Q6K_BYTES,
            WeightFormat::Q5_0 => q5::Q5_0_BYTES,
            WeightFormat::Q5_1 => q5::Q5_1_BYTES,
            WeightFormat::Q2_K => kquant_lo::Q2K_BYTES,
            WeightFormat::Q3_K => kquant_lo::Q3K_BYTES,
            WeightFormat::Q5_K => kquant_lo::Q5K_BYTES,
            WeightFormat::IQ4_NL => iq4::IQ4_NL_BYTES,
            WeightFormat::IQ4_XS => iq4::IQ4_XS_BYTES,
            WeightFormat::IQ2_XXS => iq_grid::IQ2_XXS_BYTES,
            WeightFormat::IQ2_XS => iq_grid::IQ2_XS_BYTES,
            WeightFormat::IQ2_S => iq_grid::IQ2_S_BYTES,
            WeightFormat::IQ3_XXS => iq_grid::IQ3_XXS_BYTES,
            WeightFormat::IQ3_S => iq_grid::IQ3_S_BYTES,
            WeightFormat::IQ1_S => iq_grid::IQ1_S_BYTES,
            WeightFormat::IQ1_M => iq_grid::IQ1_M_BYTES,
            WeightFormat::MXFP4 => mxfp4::MXFP4_BYTES,
            WeightFormat::FP8_E4M3 => fp8::FP8_BYTES,
            WeightFormat::I8Row => 1,
            WeightFormat::I4G64 => 36,
        }
    }

    /// Bytes of one row of `cols` elements; an error when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize, FormatError> {
        let block = self.block_size();
        if !cols.is_multiple_of(block) {
            return Err(FormatError::RaggedRow { format: self, cols, block });
        }
        let body = cols / block * self.block_bytes();
        Ok(if self == WeightFormat::I8Row { body + 4 } else { body })
    }

    /// The GGUF `ggml_type` id of this format; `None` for coli's own formats.
    pub fn gguf_type(self) -> Option<u32> {
        Some(match self {
            WeightFormat::F32 => 0,
            WeightFormat::F16 => 1,
            WeightFormat::Q4_0 => 2,
            WeightFormat::Q4_1 => 3,
            WeightFormat::Q5_0 => 6,
            WeightFormat::Q5_1 => 7,
            WeightFormat::Q8_0 => 8,
            WeightFormat::Q2_K => 10,
            WeightFormat::Q3_K => 11,
            WeightFormat::Q4_K => 12,
            WeightFormat::Q5_K => 13,
            WeightFormat::Q6_K => 14,
            WeightFormat::IQ2_XXS => 16,
            WeightFormat::IQ2_XS => 17,
            WeightFormat::IQ3_XXS => 18,
            WeightFormat::IQ1_S => 19,
            WeightFormat::IQ4_NL => 20,
            WeightFormat::IQ3_S => 21,
            WeightFormat::IQ2_S => 22,
            WeightFormat::IQ4_XS => 23,
            WeightFormat::IQ1_M => 29,
            WeightFormat::BF16 => 30,
            WeightFormat::MXFP4 => 39,
            WeightFormat::I8Row | WeightFormat::I4G64 | WeightFormat::FP8_E4M3 => return None,
        })
    }

    /// The format of a GGUF `ggml_type` id; unknown or unsupported ids are an error.
    pub fn from_gguf_type(id: u32) -> Result<WeightFormat, FormatError> {
        Ok(match id {
            0 => WeightFormat::F32,
            1 => WeightFormat::F16,
            2 => WeightFormat::Q4_0,
            3 => WeightFormat::Q4_1,
            6 => WeightFormat::Q5_0,
            7 => WeightFormat::Q5_1,
            8 => WeightFormat::Q8_0,
            10 => WeightFormat::Q2_K,
            11 => WeightFormat::Q3_K,
            12 => WeightFormat::Q4_K,
            13 => WeightFormat::Q5_K,
            14 => WeightFormat::Q6_K,
            16 => WeightFormat::IQ2_XXS,
            17 => WeightFormat::IQ2_XS,
            18 => WeightFormat::IQ3_XXS,
            19 => WeightFormat::IQ1_S,
            20 => WeightFormat::IQ4_NL,
            21 => WeightFormat::IQ3_S,
            22 => WeightFormat::IQ2_S,
            23 => WeightFormat::IQ4_XS,
            29 => WeightFormat::IQ1_M,
            30 => WeightFormat::BF16,
            39 => WeightFormat::MXFP4,
            _ => return Err(FormatError::UnknownGgufType(id)),
        })
    }

    /// Whether `matmul` quantizes the activations to 8 bits per 32-block for this format
    /// (the integer formats), given the row length. `FP8_E4M3` codes are floats: f32 activations.
    pub fn uses_q8_acts(self, cols: usize) -> bool {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 | WeightFormat::FP8_E4M3 => false,
            WeightFormat::I8Row => cols.is_multiple_of(32),
            _ => true,
        }
    }
}

/// The f16 bits of an `IQ1_M` super-block's `d` (the top nibbles of its four scale words).
pub(crate) fn iq1m_d_bits(block: &[u8]) -> u16 {
    iq_grid::nibbles_f16(block, iq_grid::IQ1_M_SCALES)
}

fn check_row(format: WeightFormat, row: &[u8], cols: usize) -> Result<(), FormatError> {
    let expected = format.row_bytes(cols)?;
    if row.len() != expected {
        return Err(FormatError::RowBytes { format, cols, expected, found: row.len() });
    }
    Ok(())
}

/// Panics with the `FormatError` text: kernels are called on sizes the caller already checked
/// (`Matrix::new`, a loaded `Tensor`), so a mismatch here is a bug in the caller.
#[track_caller]
fn expect_row(format: WeightFormat, row: &[u8], cols: usize) {
    if let Err(e) = check_row(format, row, cols) {
        panic!("format kernel called with a malformed row: {e}");
    }
}

/// Expands one row into `out` (whose length is the row's column count).
/// Panics if `row` is not exactly one row of `out.len()` columns; see `try_dequant_row`.
#[track_caller]
pub fn dequant_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    expect_row(format, row, out.len());
    dequant::dequant_row(format, row, out);
}

/// `dequant_row` that reports a malformed row as an error.
pub fn try_dequant_row(format: WeightFormat, row: &[u8], out: &mut [f32]) -> Result<(), FormatError> {
    check_row(format, row, out.len())?;
    dequant::dequant_row(format, row, out);
    Ok(())
}

/// `row . x` computed block by block, with f32 activations (no expansion of the row).
/// Panics if `row` is not exactly one row of `x.len()` columns; see `try_dot_row`.
#[track_caller]
pub fn dot_row(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    expect_row(format, row, x.len());
    dot::dot_row(format, row, x)
}

/// `dot_row` that reports a malformed row as an error.
pub fn try_dot_row(format: WeightFormat, row: &[u8], x: &[f32]) -> Result<f32, FormatError> {
    check_row(format, row, x.len())?;
    Ok(dot::dot_row(format, row, x))
}

/// `row . x` with activations quantized to 8 bits per 32-block (the `matmul` fast path).
/// `x` is one row of a `QuantizedActs`; formats that do not use q8 activations
/// (`uses_q8_acts`) are computed from the dequantized activations.
/// Panics if `row` is not exactly one row of `32 * x.len()` columns.
#[track_caller]
pub fn dot_row_q8(format: WeightFormat, row: &[u8], x: &[BlockQ8]) -> f32 {
    let cols = x.len() * 32;
    expect_row(format, row, cols);
    if format.uses_q8_acts(cols) {
        q8::dot_row_q8(format, row, x)
    } else {
        let xf: Vec<f32> = x.iter().flat_map(|b| b.q.iter().map(move |&q| b.d * q as f32)).collect();
        dot::dot_row(format, row, &xf)
    }
}
