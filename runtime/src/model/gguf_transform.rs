//! GGUF tensors that llama.cpp's converter splits, joined back into the tensor the specs read.
//!
//! Multi-head latent attention: the converter splits each layer's `kv_b_proj`
//! (`[heads * (nope + v), kv_lora]`, per head the key rows then the value rows) into
//! `blk.N.attn_k_b.weight` (the key rows of each head transposed: `[heads, kv_lora, nope]`,
//! outermost first) and `blk.N.attn_v_b.weight` (`[heads, v, kv_lora]`). A GGUF holding such a pair and no
//! `blk.N.attn_kv_b.weight` (the name files from before the split use) gets a derived tensor of
//! that name: per head the transposed key rows, then the value rows, as the MLA op reads it.
//!
//! The derived tensor is made on first use (an owned copy): in the parts' own float format when
//! both are F32, F16 or BF16 (bit for bit), otherwise dequantized to F32. Its parts are read
//! through the checkpoint, so their NaN scan and size checks apply. A pair whose shapes do not
//! fit each other is a `LoadError::Shape` when the file is opened. Must not: know any other
//! tensor name, or change a tensor the file holds.

use super::{Entry, LoadError, Tensor};
use crate::format::WeightFormat;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// A tensor the file does not hold, made from tensors it does.
#[derive(Debug)]
pub(super) struct Joined {
    /// The per-head key part (`[heads, kv_lora, nope]`) and value part (`[heads, v, kv_lora]`).
    k_b: String,
    v_b: String,
    /// `[heads * (nope + v), kv_lora]`.
    pub(super) shape: Vec<usize>,
    /// The format it is made in.
    pub(super) format: WeightFormat,
    made: OnceLock<Tensor>,
}

impl Joined {
    /// The file's tensors it is made from.
    pub(super) fn parts(&self) -> [&str; 2] {
        [&self.k_b, &self.v_b]
    }
}

/// Every derived tensor of a GGUF's tensor table, by name.
pub(super) fn find(path: &Path, entries: &BTreeMap<String, Entry>) -> Result<BTreeMap<String, Joined>, LoadError> {
    let mut out = BTreeMap::new();
    for (name, k) in entries {
        let Some(layer) = name.strip_prefix("blk.").and_then(|r| r.strip_suffix(".attn_k_b.weight")) else {
            continue;
        };
        let joined = format!("blk.{layer}.attn_kv_b.weight");
        let Some(v) = entries.get(&format!("blk.{layer}.attn_v_b.weight")) else { continue };
        if entries.contains_key(&joined) {
            continue;
        }
        let (ks, vs) = (&k.shape, &v.shape);
        if ks.len() != 3 || vs.len() != 3 {
            let (bad, shape) =
                if ks.len() != 3 { (name.clone(), ks) } else { (format!("blk.{layer}.attn_v_b.weight"), vs) };
            let what = "is not 3-D, as llama.cpp's split MLA key and value parts are";
            return Err(LoadError::Shape { path: path.to_path_buf(), name: bad, shape: shape.clone(), what });
        }
        let (heads, latent, nope, v_dim) = (ks[0], ks[1], ks[2], vs[1]);
        if vs[0] != heads || vs[2] != latent {
            let what = "does not pair with its layer's attn_k_b ([heads, kv_lora, nope]) as [heads, v, kv_lora]";
            return Err(LoadError::Shape {
                path: path.to_path_buf(),
                name: format!("blk.{layer}.attn_v_b.weight"),
                shape: vs.clone(),
                what,
            });
        }
        let format = match (k.format, v.format) {
            (Some(a), Some(b)) if a == b && matches!(a, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16) => {
                a
            }
            _ => WeightFormat::F32,
        };
        let rows = heads.checked_mul(nope + v_dim);
        let Some(rows) = rows else {
            let what = "is too large to join with its layer's attn_v_b";
            return Err(LoadError::Shape { path: path.to_path_buf(), name: name.clone(), shape: ks.clone(), what });
        };
        let j = Joined {
            k_b: name.clone(),
            v_b: format!("blk.{layer}.attn_v_b.weight"),
            shape: vec![rows, latent],
            format,
            made: OnceLock::new(),
        };
        out.insert(joined, j);
    }
    Ok(out)
}

impl Joined {
    /// The derived tensor `name`, its parts read through `part` (made once).
    pub(super) fn tensor(
        &self,
        name: &str,
        part: impl Fn(&str) -> Result<Tensor, LoadError>,
    ) -> Result<Tensor, LoadError> {
        if let Some(t) = self.made.get() {
            return Ok(t.clone());
        }
        let (k, v) = (part(&self.k_b)?, part(&self.v_b)?);
        let (heads, latent, nope, v_dim) = (k.shape[0], k.shape[1], k.shape[2], v.shape[1]);
        let (kf, vf) = (k.to_f32_vec()?, v.to_f32_vec()?);
        let mut kv = vec![0f32; heads * (nope + v_dim) * latent];
        for h in 0..heads {
            let base = h * (nope + v_dim) * latent;
            for d in 0..nope {
                for c in 0..latent {
                    kv[base + d * latent + c] = kf[(h * latent + c) * nope + d];
                }
            }
            let vb = &vf[h * v_dim * latent..(h + 1) * v_dim * latent];
            kv[base + nope * latent..base + (nope + v_dim) * latent].copy_from_slice(vb);
        }
        let bytes: Vec<u8> = match self.format {
            WeightFormat::F16 => kv.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
            WeightFormat::BF16 => kv.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
            _ => kv.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let source = Arc::new(k.source().to_path_buf());
        let t = Tensor::owned(name.to_string(), self.format, self.shape.clone(), bytes, source);
        Ok(self.made.get_or_init(|| t).clone())
    }
}
