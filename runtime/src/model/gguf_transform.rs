//! GGUF tensors that llama.cpp's converter split, re-laid or transformed, made back into the
//! tensors the specs read, under names of their own (the file's own tensors stay as they are).
//!
//! - Multi-head latent attention (`deepseek2`, `kimi-linear`): the converter splits each
//!   layer's `kv_b_proj` (`[heads * (nope + v), kv_lora]`, per head the key rows then the value
//!   rows) into `blk.N.attn_k_b.weight` (the key rows of each head transposed:
//!   `[heads, kv_lora, nope]`, outermost first) and `blk.N.attn_v_b.weight`
//!   (`[heads, v, kv_lora]`). A GGUF holding such a pair and no `blk.N.attn_kv_b.weight` (the
//!   name files from before the split use) gets a derived tensor of that name.
//! - Linear attention's decay (`ssm_a`, Gated DeltaNet and KDA): the converter stores
//!   `-exp(A_log)`; `blk.N.ssm_a_log` is `ln(-ssm_a)`, of `ssm_a`'s shape, in F32 (an entry at
//!   or above 0 is an error naming the tensor).
//! - Short convolutions (`ssm_conv1d*`): the converter squeezes `[channels, 1, kernel]` to
//!   `[channels, kernel]` (Qwen3-Next, Qwen3.5) or lays it `[1, channels, 1, kernel]` (Kimi
//!   Linear); `X.kernel` beside `X.weight` is the same bytes as `[channels, 1, kernel]` (a
//!   convolution of another shape gets none).
//! - Qwen3.5 (`qwen35`, `qwen35moe`): the converter re-lays every value-head dimension of a
//!   Gated DeltaNet from grouped by key head (value head `kh * r + t`, r value heads per key
//!   head) to tiled (`t * key_heads + kh`, ggml's broadcast). `blk.N.attn_qkv.grouped` (the
//!   value rows after the q and k rows), `attn_gate.grouped`, `ssm_beta.grouped`,
//!   `ssm_alpha.grouped`, `ssm_dt.grouped` (from `ssm_dt.bias`), `ssm_out.grouped` (columns)
//!   hold them grouped again, as do that file's `ssm_a_log` and `ssm_conv1d.kernel`; the head
//!   counts come from `{arch}.ssm.group_count`, `.time_step_rank`, `.state_size` and
//!   `.inner_size` (a file lacking one gets no grouped tensors, and the spec names what is
//!   missing).
//!
//! A derived tensor is made on first use (an owned copy). The joined `attn_kv_b` is in its parts'
//! float format when that is F32, F16 or BF16 (bit for bit), otherwise dequantized to F32; a
//! re-laid tensor keeps its part's format, any format, where each head is whole rows or whole
//! blocks of each row (the bytes move as they are), otherwise it is dequantized to F32;
//! `ssm_a_log` is F32. Its parts are read through the checkpoint, so their NaN scan and size
//! checks apply. Parts whose shapes do not fit are a `LoadError::Shape` when the file
//! is opened. Must not: change a tensor the file holds, or derive a name the file holds.

use super::gguf::GgufMetadata;
use super::{Entry, LoadError, Tensor};
use crate::format::WeightFormat;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// A tensor the file does not hold, made from tensors it does.
#[derive(Debug)]
pub(super) struct Joined {
    recipe: Recipe,
    /// The derived tensor's shape, outermost first.
    pub(super) shape: Vec<usize>,
    /// The format it is made in.
    pub(super) format: WeightFormat,
    made: OnceLock<Tensor>,
}

impl Joined {
    /// The file's tensors it is made from.
    pub(super) fn parts(&self) -> Vec<&str> {
        match &self.recipe {
            Recipe::KvB { k_b, v_b } => vec![k_b, v_b],
            Recipe::Relaid { of, .. } => vec![of],
        }
    }
}

#[derive(Debug)]
enum Recipe {
    /// MLA: the per-head key part (`[heads, kv_lora, nope]`) and value part (`[heads, v, kv_lora]`).
    KvB { k_b: String, v_b: String },
    /// One tensor, its value heads grouped again (`heads`), then `ln(-x)` when `log_neg`, under
    /// the derived shape.
    Relaid { of: String, heads: Option<Tiled>, log_neg: bool },
}

/// Where a tensor holds tiled value heads: along its first dimension, or its last (`cols`),
/// `key_heads * per_key` heads of `width` entries from `start`.
#[derive(Clone, Copy, Debug)]
struct Tiled {
    cols: bool,
    start: usize,
    key_heads: usize,
    per_key: usize,
    width: usize,
}

/// Qwen3.5's Gated DeltaNet geometry, from the file's metadata: key heads, value heads, key
/// head width, value head width.
fn tiled_geometry(meta: &GgufMetadata) -> Option<(usize, usize, usize, usize)> {
    let arch = meta.get_str("general.architecture")?;
    if !matches!(arch, "qwen35" | "qwen35moe") {
        return None;
    }
    let get = |k: &str| meta.get_u64(&format!("{arch}.ssm.{k}")).and_then(|v| usize::try_from(v).ok());
    let (nk, nv, dk, inner) = (get("group_count")?, get("time_step_rank")?, get("state_size")?, get("inner_size")?);
    (nk > 0 && nv > 0 && nv.is_multiple_of(nk) && inner.is_multiple_of(nv)).then_some((nk, nv, dk, inner / nv))
}

/// Every derived tensor of a GGUF's tensor table, by name.
pub(super) fn find(
    path: &Path,
    meta: &GgufMetadata,
    entries: &BTreeMap<String, Entry>,
) -> Result<BTreeMap<String, Joined>, LoadError> {
    let mut out = BTreeMap::new();
    let geometry = tiled_geometry(meta);
    let shape_err = |name: &str, shape: &[usize], what| LoadError::Shape {
        path: path.to_path_buf(),
        name: name.to_string(),
        shape: shape.to_vec(),
        what,
    };
    for (name, e) in entries {
        if let Some(layer) = name.strip_prefix("blk.").and_then(|r| r.strip_suffix(".attn_k_b.weight")) {
            if let Some((joined, j)) = kv_b(path, layer, name, e, entries)? {
                out.insert(joined, j);
            }
            continue;
        }
        let Some(format) = e.format else { continue };
        let Some((block, tail)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else { continue };
        let tiled = |cols, start, width| {
            geometry.map(|(nk, nv, _, _)| Tiled { cols, start, key_heads: nk, per_key: nv / nk, width })
        };
        let (dk_nk, dv) = geometry.map_or((0, 0), |(nk, _, dk, dv)| (2 * nk * dk, dv));
        let relaid = |heads, log_neg| Recipe::Relaid { of: name.clone(), heads, log_neg };
        let (derived, recipe, shape, format) = match tail {
            "ssm_a" => ("ssm_a_log", relaid(tiled(false, 0, 1), true), e.shape.clone(), WeightFormat::F32),
            "ssm_conv1d.weight" | "ssm_conv1d_q.weight" | "ssm_conv1d_k.weight" | "ssm_conv1d_v.weight" => {
                // Another layout is none the converters of the served architectures write.
                let (channels, kernel) = match e.shape[..] {
                    [c, k] | [1, c, 1, k] => (c, k),
                    _ => continue,
                };
                let heads = if tail == "ssm_conv1d.weight" { tiled(false, dk_nk, dv) } else { None };
                let stem = &tail[..tail.len() - ".weight".len()];
                let kept = heads.map_or(format, |h| kept_or_f32(format, &e.shape, &h));
                (stem, relaid(heads, false), vec![channels, 1, kernel], kept)
            }
            "attn_qkv.weight" | "attn_gate.weight" | "ssm_beta.weight" | "ssm_alpha.weight" | "ssm_dt.bias"
            | "ssm_out.weight" => {
                let heads = match tail {
                    "attn_qkv.weight" => tiled(false, dk_nk, dv),
                    "attn_gate.weight" => tiled(false, 0, dv),
                    "ssm_out.weight" => tiled(true, 0, dv),
                    _ => tiled(false, 0, 1),
                };
                let Some(heads) = heads else { continue };
                let stem = tail.split('.').next().unwrap_or(tail);
                (stem, relaid(Some(heads), false), e.shape.clone(), kept_or_f32(format, &e.shape, &heads))
            }
            _ => continue,
        };
        let suffix = match (derived, tail) {
            ("ssm_a_log", _) => "",
            (_, t) if t.starts_with("ssm_conv1d") => ".kernel",
            _ => ".grouped",
        };
        let derived = format!("blk.{block}.{derived}{suffix}");
        if entries.contains_key(&derived) {
            continue;
        }
        if let Recipe::Relaid { heads: Some(t), .. } = &recipe {
            let axis = if t.cols { e.shape.last().copied() } else { e.shape.first().copied() };
            if axis.is_none_or(|n| n < t.start + t.key_heads * t.per_key * t.width) {
                let what = "is too small for the value heads the file's ssm metadata gives";
                return Err(shape_err(name, &e.shape, what));
            }
        }
        out.insert(derived, Joined { recipe, shape, format, made: OnceLock::new() });
    }
    Ok(out)
}

/// The format a tensor's value heads can be re-laid in byte for byte: its own where whole heads
/// are whole rows (the first dimension of a 2-D or larger tensor, or of a vector of single
/// elements) or whole blocks of each row (the last dimension), else F32.
fn kept_or_f32(f: WeightFormat, shape: &[usize], h: &Tiled) -> WeightFormat {
    let bs = f.block_size();
    let whole = match h.cols {
        false => shape.len() >= 2 || bs == 1,
        true => h.width.is_multiple_of(bs) && h.start.is_multiple_of(bs),
    };
    if whole && f != WeightFormat::I8Row {
        f
    } else {
        WeightFormat::F32
    }
}

/// A float format kept bit for bit, any other made F32.
fn float_or_f32(f: WeightFormat) -> WeightFormat {
    match f {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => f,
        _ => WeightFormat::F32,
    }
}

/// The derived `attn_kv_b` of layer `layer` from its `attn_k_b` (`name`, `k`) and `attn_v_b`.
fn kv_b(
    path: &Path,
    layer: &str,
    name: &str,
    k: &Entry,
    entries: &BTreeMap<String, Entry>,
) -> Result<Option<(String, Joined)>, LoadError> {
    let joined = format!("blk.{layer}.attn_kv_b.weight");
    let v_name = format!("blk.{layer}.attn_v_b.weight");
    let Some(v) = entries.get(&v_name) else { return Ok(None) };
    if entries.contains_key(&joined) {
        return Ok(None);
    }
    let (ks, vs) = (&k.shape, &v.shape);
    if ks.len() != 3 || vs.len() != 3 {
        let (bad, shape) = if ks.len() != 3 { (name.to_string(), ks) } else { (v_name, vs) };
        let what = "is not 3-D, as llama.cpp's split MLA key and value parts are";
        return Err(LoadError::Shape { path: path.to_path_buf(), name: bad, shape: shape.clone(), what });
    }
    let (heads, latent, nope, v_dim) = (ks[0], ks[1], ks[2], vs[1]);
    if vs[0] != heads || vs[2] != latent {
        let what = "does not pair with its layer's attn_k_b ([heads, kv_lora, nope]) as [heads, v, kv_lora]";
        return Err(LoadError::Shape { path: path.to_path_buf(), name: v_name, shape: vs.clone(), what });
    }
    let format = match (k.format, v.format) {
        (Some(a), Some(b)) if a == b => float_or_f32(a),
        _ => WeightFormat::F32,
    };
    let Some(rows) = heads.checked_mul(nope + v_dim) else {
        let what = "is too large to join with its layer's attn_v_b";
        return Err(LoadError::Shape { path: path.to_path_buf(), name: name.to_string(), shape: ks.clone(), what });
    };
    let recipe = Recipe::KvB { k_b: name.to_string(), v_b: v_name };
    Ok(Some((joined, Joined { recipe, shape: vec![rows, latent], format, made: OnceLock::new() })))
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
        let t = match &self.recipe {
            Recipe::KvB { k_b, v_b } => {
                let (k, v) = (part(k_b)?, part(v_b)?);
                let source = Arc::new(k.source().to_path_buf());
                self.owned(name, join_kv_b(&k, &v)?, source)
            }
            Recipe::Relaid { of, heads, log_neg } => {
                let t = part(of)?;
                let source = Arc::new(t.source().to_path_buf());
                // The part's bytes where the derived format is its own, else its values as F32;
                // then the value heads grouped by whole rows or blocks, then ln(-x).
                let mut bytes = match self.format == t.format {
                    true => t.bytes().to_vec(),
                    false => t.to_f32_vec()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
                };
                if let Some(h) = heads {
                    bytes = group_heads(&bytes, self.format, &t.shape, h);
                }
                if *log_neg {
                    let x: Vec<f32> =
                        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                    if x.iter().any(|a| a.is_nan() || *a >= 0.0) {
                        let what = "has an entry at or above 0, so it is not llama.cpp's -exp(A_log)";
                        let (path, shape) = ((*source).clone(), t.shape);
                        return Err(LoadError::Shape { path, name: of.clone(), shape, what });
                    }
                    bytes = x.iter().flat_map(|a| (-*a).ln().to_le_bytes()).collect();
                }
                Tensor::owned(name.to_string(), self.format, self.shape.clone(), bytes, source)
            }
        };
        Ok(self.made.get_or_init(|| t).clone())
    }

    /// `x` in the derived tensor's format.
    fn owned(&self, name: &str, x: Vec<f32>, source: Arc<std::path::PathBuf>) -> Tensor {
        let bytes: Vec<u8> = match self.format {
            WeightFormat::F16 => x.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
            WeightFormat::BF16 => x.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
            _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        Tensor::owned(name.to_string(), self.format, self.shape.clone(), bytes, source)
    }
}

/// Per head the transposed key rows, then the value rows.
fn join_kv_b(k: &Tensor, v: &Tensor) -> Result<Vec<f32>, LoadError> {
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
    Ok(kv)
}

/// `bytes` (a tensor of `shape` in `format`) with its tiled value heads grouped by key head
/// again: grouped head `kh * per_key + t` is tiled head `t * key_heads + kh`. A head is `width`
/// rows of the first dimension, or `width` elements (whole blocks) of each row's last.
fn group_heads(bytes: &[u8], format: WeightFormat, shape: &[usize], h: &Tiled) -> Vec<u8> {
    let heads = h.key_heads * h.per_key;
    let tiled_of = |j: usize| (j % h.per_key) * h.key_heads + j / h.per_key;
    let (bs, bb) = (format.block_size().max(1), format.block_bytes());
    let (rows, bytes_of) = match h.cols {
        // One "row" of everything; a unit is one row of the first dimension.
        false => {
            let unit = bytes.len() / shape.first().copied().unwrap_or(1).max(1);
            (1, Box::new(move |n: usize| n * unit) as Box<dyn Fn(usize) -> usize>)
        }
        // Each row of the last dimension; a unit is one element (whole blocks of them).
        true => {
            let last = shape.last().copied().unwrap_or(1).max(1);
            let rows = (shape.iter().product::<usize>() / last).max(1);
            (rows, Box::new(move |n: usize| n / bs * bb) as Box<dyn Fn(usize) -> usize>)
        }
    };
    let row_bytes = bytes.len() / rows;
    let (start, chunk) = (bytes_of(h.start), bytes_of(h.width));
    let mut out = bytes.to_vec();
    if row_bytes == 0 {
        return out;
    }
    for (row_in, row_out) in bytes.chunks(row_bytes).zip(out.chunks_mut(row_bytes)) {
        for j in 0..heads {
            let (to, from) = (start + j * chunk, start + tiled_of(j) * chunk);
            row_out[to..to + chunk].copy_from_slice(&row_in[from..from + chunk]);
        }
    }
    out
}
