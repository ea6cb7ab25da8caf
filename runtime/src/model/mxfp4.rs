//! MXFP4 checkpoints in safetensors (gpt-oss as OpenAI publishes it: `quantization_config`
//! `quant_method: "mxfp4"`): a weight `X` is stored as two U8 tensors, `X_blocks` [.., rows,
//! G, 16] and `X_scales` [.., rows, G], row `r`'s elements `32 g ..+ 32` in block `g`: byte
//! `j` holds element `2j` in its low nibble and `2j + 1` in its high nibble (E2M1 codes), and
//! the scale byte `s` (E8M0) stands for `2^(s - 127)`. The rows are the matrix's outputs and the
//! blocks run along its inputs: `X` is the matrix `[.., rows, 32 G]`, out-by-in (transformers
//! transposes it into its float layout, `[.., in, out]`, when it dequantizes; the compiler and
//! the weight store know that a block-format tensor behind an input-major weight is stored
//! out-major).
//!
//! At open each `X_blocks` is paired with its `X_scales` (`pair_all`) and `X` joins the tensor
//! table as an `MXFP4` tensor of shape `[.., rows, 32 G]`; when asked for it is repacked
//! (`repack`) into `WeightFormat::MXFP4` rows, GGUF's block: the same scale byte (GGUF's
//! `2^(e - 128)` times its doubled levels is the same value), then 16 bytes whose byte `i`
//! holds element `i` low and element `i + 16` high. The same bytes every time; `Mxfp4Source`
//! makes them again from the maps alone. A blocks tensor whose scales are missing or
//! mis-shaped, or that is not U8 `[.., rows, G, 16]`, still opens, and `X` is a
//! `LoadError::Mxfp4` naming it when asked for.
//!
//! Must not: dequantize (the codes stay codes), or know which tensors a model reads.

use super::file::MappedFile;
use super::{Entry, LoadError, Tensor};
use crate::format::WeightFormat;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The suffixes naming a weight's codes and its scales, and their safetensors dtype.
pub const BLOCKS_SUFFIX: &str = "_blocks";
pub const SCALES_SUFFIX: &str = "_scales";
pub const DTYPE: &str = "U8";
/// Elements per block, and bytes of a block in the file (without its scale) and in GGUF's form.
const BLOCK: usize = 32;
const PACKED: usize = 16;
const GGUF_BLOCK: usize = 17;

/// Why an MXFP4 weight cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mxfp4Problem {
    #[error("its blocks tensor {blocks} has type {dtype}, not U8")]
    BlocksType { blocks: String, dtype: String },
    #[error("its blocks tensor {blocks} has shape {shape:?}, not [.., rows, groups, 16] (16 bytes per 32 elements)")]
    BlocksShape { blocks: String, shape: Vec<usize> },
    #[error("its blocks {blocks} have no scale tensor {scales} (one E8M0 scale per 32 elements)")]
    MissingScales { blocks: String, scales: String },
    #[error("its scale tensor {scales} has type {dtype}, not U8 (E8M0)")]
    ScalesType { scales: String, dtype: String },
    #[error("its scale tensor {scales} has shape {got:?}, not {want:?} (one scale per 32-element block of {blocks})")]
    ScalesShape { blocks: String, scales: String, got: Vec<usize>, want: Vec<usize> },
}

/// A weight's MXFP4 pair as the table holds it: the names of its blocks and its scales, or why
/// they do not pair.
pub type Pairing = Result<(String, String), Mxfp4Problem>;

/// The weight a blocks tensor stands for (`X` for `X_blocks`), if its name says it is one.
pub fn weight_name(blocks: &str) -> Option<&str> {
    blocks.strip_suffix(BLOCKS_SUFFIX).filter(|w| !w.is_empty())
}

/// The shape of the matrix a U8 blocks tensor holds (`[.., rows, G, 16]` ->
/// `[.., rows, 32 G]`), if it is one.
fn weight_shape(e: &Entry) -> Option<Vec<usize>> {
    let n = e.shape.len();
    if e.dtype != DTYPE || n < 3 || e.shape[n - 1] != PACKED || e.shape[n - 2] == 0 {
        return None;
    }
    let mut shape = e.shape[..n - 1].to_vec();
    shape[n - 2] = shape[n - 2].checked_mul(BLOCK)?;
    Some(shape)
}

/// Checks `X_blocks` against `X_scales`; `Ok` with the shape of `X` when they pair.
pub(super) fn pair(entries: &BTreeMap<String, Entry>, blocks: &str, e: &Entry) -> Result<Vec<usize>, Mxfp4Problem> {
    if e.dtype != DTYPE {
        return Err(Mxfp4Problem::BlocksType { blocks: blocks.to_string(), dtype: e.dtype.clone() });
    }
    let Some(shape) = weight_shape(e) else {
        return Err(Mxfp4Problem::BlocksShape { blocks: blocks.to_string(), shape: e.shape.clone() });
    };
    let n = e.shape.len();
    let scales = format!("{}{SCALES_SUFFIX}", weight_name(blocks).unwrap_or(blocks));
    let Some(s) = entries.get(&scales) else {
        return Err(Mxfp4Problem::MissingScales { blocks: blocks.to_string(), scales });
    };
    if s.dtype != DTYPE {
        return Err(Mxfp4Problem::ScalesType { scales, dtype: s.dtype.clone() });
    }
    let want = e.shape[..n - 1].to_vec();
    if s.shape != want {
        return Err(Mxfp4Problem::ScalesShape { blocks: blocks.to_string(), scales, got: s.shape.clone(), want });
    }
    Ok(shape)
}

/// Adds `X` for every `X_blocks` to the table (unless the table has an `X` already): an
/// `MXFP4` entry over the blocks' bytes when it pairs with `X_scales`, else one without a
/// format whose pairing says why (read by `Checkpoint::file_tensor`; it keeps the matrix's
/// shape and dtype when the blocks have one, so the compiler binds it and loading the weight
/// is the error that names the problem).
pub(super) fn pair_all(entries: &mut BTreeMap<String, Entry>) {
    let found: Vec<(String, Entry)> = entries
        .iter()
        .filter_map(|(name, e)| Some((name, weight_name(name)?, e)))
        .filter(|(_, weight, _)| !entries.contains_key(*weight))
        .map(|(blocks, weight, e)| {
            let paired = pair(entries, blocks, e);
            let scales = format!("{weight}{SCALES_SUFFIX}");
            let mut w = e.clone();
            w.non_finite = Default::default();
            match paired {
                Ok(shape) => {
                    w.shape = shape;
                    w.dtype = WeightFormat::MXFP4.name().to_string();
                    w.format = Some(WeightFormat::MXFP4);
                    w.mxfp4 = Some(Ok((blocks.clone(), scales)));
                }
                Err(problem) => {
                    if let Some(shape) = weight_shape(e) {
                        w.shape = shape;
                        w.dtype = WeightFormat::MXFP4.name().to_string();
                    }
                    w.format = None;
                    w.mxfp4 = Some(Err(problem));
                }
            }
            (weight.to_string(), w)
        })
        .collect();
    entries.extend(found);
}

/// `MXFP4` rows (GGUF's blocks) of a paired weight: `blocks` its codes ([.., rows, G, 16]),
/// `scales` its E8M0 bytes ([.., rows, G]), both row-major.
pub fn repack(blocks: &[u8], scales: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(scales.len() * GGUF_BLOCK);
    for (b, &s) in blocks.chunks_exact(PACKED).zip(scales) {
        // Element k is nibble k % 2 of byte k / 2.
        let nib = |k: usize| (b[k / 2] >> (4 * (k % 2))) & 15;
        out.push(s);
        out.extend((0..PACKED).map(|i| nib(i) | (nib(i + PACKED) << 4)));
    }
    out
}

/// A paired MXFP4 weight as the files hold it: its blocks and its scales (views of the maps,
/// no copy), from which `make` repacks its `MXFP4` tensor.
#[derive(Clone)]
pub struct Mxfp4Source {
    name: String,
    shape: Vec<usize>,
    blocks: (Arc<MappedFile>, usize, usize),
    scales: (Arc<MappedFile>, usize, usize),
}

impl Mxfp4Source {
    /// `e` the weight's entry (its shape), `b` and `s` its blocks' and scales' entries.
    pub(super) fn new(name: &str, e: &Entry, b: &Entry, s: &Entry, files: &[Arc<MappedFile>]) -> Mxfp4Source {
        Mxfp4Source {
            name: name.to_string(),
            shape: e.shape.clone(),
            blocks: (files[b.file].clone(), b.start as usize, b.len as usize),
            scales: (files[s.file].clone(), s.start as usize, s.len as usize),
        }
    }

    /// The weight's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The weight's `MXFP4` tensor (the same bytes every time), after re-checking that neither
    /// file changed size (`FileChanged`).
    pub fn make(&self) -> Result<Tensor, LoadError> {
        let ((bm, b0, bl), (sm, s0, sl)) = (&self.blocks, &self.scales);
        bm.check_unchanged()?;
        sm.check_unchanged()?;
        let bytes = repack(&bm.bytes()[*b0..b0 + bl], &sm.bytes()[*s0..s0 + sl]);
        Ok(Tensor::owned(self.name.clone(), WeightFormat::MXFP4, self.shape.clone(), bytes, bm.path().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::dequant_row;

    /// The E2M1 values a code selects.
    const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

    #[test]
    fn repacked_blocks_decode_to_the_published_element_order() {
        // Two rows of 64 elements: every code at every position, element k of row r the code
        // (k + 3 r) % 16 (so a swapped nibble or a block taken from the wrong row reads
        // another value), under the scales 2^0, 2^-3, 2^4 and 2^-127.
        let (rows, cols) = (2, 64);
        let code = |r: usize, k: usize| ((k + 3 * r) % 16) as u8;
        let mut blocks = Vec::new();
        for r in 0..rows {
            for j in 0..cols / 2 {
                blocks.push(code(r, 2 * j) | (code(r, 2 * j + 1) << 4));
            }
        }
        let scales = [127u8, 124, 131, 0];
        let packed = repack(&blocks, &scales);
        assert_eq!(packed.len(), rows * 2 * GGUF_BLOCK);
        let row_bytes = 2 * GGUF_BLOCK;
        for r in 0..rows {
            let mut got = vec![0f32; cols];
            dequant_row(WeightFormat::MXFP4, &packed[r * row_bytes..(r + 1) * row_bytes], &mut got);
            for (k, &g) in got.iter().enumerate() {
                let scale = (scales[r * 2 + k / 32] as f32 - 127.0).exp2();
                assert_eq!(g, E2M1[code(r, k) as usize] * scale, "row {r} element {k}");
            }
        }
    }
}
