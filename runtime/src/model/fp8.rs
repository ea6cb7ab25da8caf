//! FP8 checkpoints (DeepSeek-V3/R1, GLM-4.5+, Kimi K2, MiMo: `quantization_config` with
//! `weight_block_size` [128, 128]): a linear weight `X.weight` stored `F8_E4M3` [.., out, in]
//! comes with `X.weight_scale_inv` (F32 or BF16) of shape [.., ceil(out/128), ceil(in/128)],
//! and `w[r][c] = e4m3(X.weight[r][c]) * X.weight_scale_inv[r/128][c/128]`. At open each such
//! weight is paired with its scale (`pair_all`); when the tensor is asked for it is repacked
//! into `WeightFormat::FP8_E4M3` rows (`repack`: per 128 elements the tile's f32 scale then the
//! 128 codes, bit for bit; the same bytes every time; `Fp8Source` makes it again from the maps
//! alone, so a released copy costs no memory). A weight whose scale is missing or
//! mis-shaped, or whose rows are not whole 128-blocks, opens, and is a `LoadError::Fp8` naming
//! it when asked for.
//!
//! Must not: dequantize (the codes stay codes), or know which tensors a model reads.

use super::file::MappedFile;
use super::{Entry, LoadError, Tensor};
use crate::format::{fp16::bf16_to_f32, WeightFormat};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The safetensors dtype of FP8 weights, and the suffix that names a weight's scale tensor.
pub const DTYPE: &str = "F8_E4M3";
pub const SCALE_SUFFIX: &str = "_scale_inv";
const BLOCK: usize = 128;

/// Why an `F8_E4M3` tensor cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fp8Problem {
    #[error("it has no block scale tensor {scale} (coli reads FP8 weights with 128 x 128 block scales)")]
    MissingScale { scale: String },
    #[error("its scale tensor {scale} has type {dtype}, not F32 or BF16")]
    ScaleType { scale: String, dtype: String },
    #[error("its scale tensor {scale} has shape {got:?}, not {want:?} (one scale per 128 x 128 block)")]
    ScaleShape { scale: String, got: Vec<usize>, want: Vec<usize> },
    #[error("it has shape {shape:?}: coli reads FP8 weights as matrices whose rows are whole 128-element blocks")]
    Shape { shape: Vec<usize> },
}

/// The scale tensor's name for `X.weight`: `X.weight_scale_inv`.
pub fn scale_name(name: &str) -> String {
    format!("{name}{SCALE_SUFFIX}")
}

/// Checks an `F8_E4M3` weight against its scale; `Ok` with the scale's name when they pair.
pub(super) fn pair(entries: &BTreeMap<String, Entry>, name: &str, e: &Entry) -> Result<String, Fp8Problem> {
    let shape = &e.shape;
    let cols = shape.last().copied().unwrap_or(0);
    if shape.len() < 2 || cols == 0 || !cols.is_multiple_of(BLOCK) {
        return Err(Fp8Problem::Shape { shape: shape.clone() });
    }
    let scale = scale_name(name);
    let Some(s) = entries.get(&scale) else { return Err(Fp8Problem::MissingScale { scale }) };
    if !matches!(s.format, Some(WeightFormat::F32 | WeightFormat::BF16)) {
        return Err(Fp8Problem::ScaleType { scale, dtype: s.dtype.clone() });
    }
    let mut want = shape.clone();
    let n = want.len();
    want[n - 2] = shape[n - 2].div_ceil(BLOCK);
    want[n - 1] = cols / BLOCK;
    if s.shape != want {
        return Err(Fp8Problem::ScaleShape { scale, got: s.shape.clone(), want });
    }
    Ok(scale)
}

/// Marks every `F8_E4M3` tensor that pairs with its scale as `FP8_E4M3` (read by `repack`).
pub(super) fn pair_all(entries: &mut BTreeMap<String, Entry>) {
    let paired: Vec<(String, String)> = entries
        .iter()
        .filter(|(_, e)| e.dtype == DTYPE)
        .filter_map(|(name, e)| pair(entries, name, e).ok().map(|s| (name.clone(), s)))
        .collect();
    for (name, scale) in paired {
        if let Some(e) = entries.get_mut(&name) {
            e.format = Some(WeightFormat::FP8_E4M3);
            e.scale = Some(scale);
        }
    }
}

/// `FP8_E4M3` rows of a paired weight: `codes` its bytes ([.., out, in], row-major), `scales`
/// its scale tensor's bytes in `scale_format` (F32 or BF16; shape as `pair` checked).
pub(super) fn repack(shape: &[usize], codes: &[u8], scales: &[u8], scale_format: WeightFormat) -> Vec<u8> {
    let n = shape.len();
    let (out, cols) = (shape[n - 2], shape[n - 1]);
    let (tiles, blocks) = (out.div_ceil(BLOCK), cols / BLOCK);
    let scale = |i: usize| match scale_format {
        WeightFormat::BF16 => bf16_to_f32(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]])),
        _ => f32::from_le_bytes([scales[4 * i], scales[4 * i + 1], scales[4 * i + 2], scales[4 * i + 3]]),
    };
    let mut bytes = Vec::with_capacity(codes.len() / BLOCK * (BLOCK + 4));
    for (r, row) in codes.chunks_exact(cols).enumerate() {
        // Row r of matrix r / out; its tile row (r % out) / 128.
        let tile_row = (r / out) * tiles + (r % out) / BLOCK;
        for (j, block) in row.chunks_exact(BLOCK).enumerate() {
            bytes.extend_from_slice(&scale(tile_row * blocks + j).to_le_bytes());
            bytes.extend_from_slice(block);
        }
    }
    bytes
}

/// A paired FP8 weight as the files hold it: its codes and its scales (views of the maps, no
/// copy), from which `make` repacks its `FP8_E4M3` tensor.
#[derive(Clone)]
pub struct Fp8Source {
    name: String,
    shape: Vec<usize>,
    codes: (Arc<MappedFile>, usize, usize),
    scales: (Arc<MappedFile>, usize, usize),
    scale_format: WeightFormat,
}

impl Fp8Source {
    pub(super) fn new(name: &str, e: &Entry, s: &Entry, files: &[Arc<MappedFile>]) -> Fp8Source {
        Fp8Source {
            name: name.to_string(),
            shape: e.shape.clone(),
            codes: (files[e.file].clone(), e.start as usize, e.len as usize),
            scales: (files[s.file].clone(), s.start as usize, s.len as usize),
            scale_format: s.format.unwrap_or(WeightFormat::F32),
        }
    }

    /// The weight's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The weight's `FP8_E4M3` tensor (the same bytes every time), after re-checking that
    /// neither file changed size (`FileChanged`).
    pub fn make(&self) -> Result<Tensor, LoadError> {
        let ((cm, c0, cl), (sm, s0, sl)) = (&self.codes, &self.scales);
        cm.check_unchanged()?;
        sm.check_unchanged()?;
        let bytes = repack(&self.shape, &cm.bytes()[*c0..c0 + cl], &sm.bytes()[*s0..s0 + sl], self.scale_format);
        Ok(Tensor::owned(self.name.clone(), WeightFormat::FP8_E4M3, self.shape.clone(), bytes, cm.path().clone()))
    }
}
