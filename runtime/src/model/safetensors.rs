//! Hugging Face safetensors reader: one file's header, and a directory's shard set (a single
//! `model.safetensors`, or the shards named by `model.safetensors.index.json`).
//!
//! File layout: u64 little-endian header length `N`, `N` bytes of JSON mapping each tensor name
//! to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the byte after
//! the header; an optional `__metadata__` entry of strings), then the data.
//!
//! Every tensor is checked against the file: its range inside the data section and apart from
//! every other tensor's, and its byte length against shape times dtype size (for every dtype
//! whose size is known). Types coli does not compute with (I8, F8_E5M2, ...) are listed with
//! their name and refused only when asked for; F8_E4M3 weights are paired with their block
//! scales later (`fp8.rs`). Must not: copy tensor data.

use super::file::{read_text, regular_if_present, MAX_JSON};
use super::LoadError;
use crate::format::WeightFormat;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor of a safetensors file, checked against it.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: String,
    /// `None` for dtypes coli does not compute with.
    pub format: Option<WeightFormat>,
    /// Absolute byte range in the file.
    pub start: u64,
    pub len: u64,
}

fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        _ => return None,
    })
}

fn dtype_format(dtype: &str) -> Option<WeightFormat> {
    match dtype {
        "F32" => Some(WeightFormat::F32),
        "F16" => Some(WeightFormat::F16),
        "BF16" => Some(WeightFormat::BF16),
        _ => None,
    }
}

/// Parses the header of the safetensors file `path` whose bytes are `buf` (the whole file).
pub fn parse(path: &Path, buf: &[u8]) -> Result<Vec<StTensor>, LoadError> {
    let p = || path.to_path_buf();
    let file_len = buf.len() as u64;
    let Some(n) = buf.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())) else {
        return Err(LoadError::TruncatedHeader { path: p(), offset: 0, what: "header length".into() });
    };
    if n > MAX_HEADER {
        return Err(LoadError::BadHeader { path: p(), msg: format!("header length {n} exceeds {MAX_HEADER}") });
    }
    if 8 + n > file_len {
        return Err(LoadError::TruncatedHeader {
            path: p(),
            offset: file_len,
            what: format!("a JSON header of {n} bytes"),
        });
    }
    let header: Value = serde_json::from_slice(&buf[8..8 + n as usize]).map_err(|source| LoadError::InvalidJson {
        path: p(),
        what: "safetensors header",
        source,
    })?;
    let Value::Object(entries) = header else {
        return Err(LoadError::BadHeader { path: p(), msg: "the JSON header is not an object".into() });
    };
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, v) in entries {
        if name == "__metadata__" {
            continue;
        }
        let bad = |msg: &str| LoadError::BadHeader { path: p(), msg: format!("tensor {name}: {msg}") };
        let dtype = v.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no string \"dtype\""))?.to_string();
        let shape = v
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect::<Option<Vec<usize>>>()
            })
            .ok_or_else(|| bad("no \"shape\" array of sizes"))?;
        let offsets = v
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
            .filter(|o| o.len() == 2 && o[0] <= o[1])
            .ok_or_else(|| bad("no \"data_offsets\" [begin, end] with begin <= end"))?;
        let (begin, end) = (offsets[0], offsets[1]);
        if end > data_len {
            // In u128: an end offset near 2^64 is reported as written, not wrapped.
            return Err(LoadError::TensorPastEnd { path: p(), name, end: data_start as u128 + end as u128, file_len });
        }
        let len = end - begin;
        if let Some(size) = dtype_size(&dtype) {
            let expected = shape.iter().try_fold(size, |a, &d| a.checked_mul(d as u64));
            if expected != Some(len) {
                let Some(expected) = expected else {
                    return Err(LoadError::RaggedTensor { path: p(), name, shape, dtype });
                };
                return Err(LoadError::TensorSize { path: p(), name, shape, dtype, expected, found: len });
            }
        }
        let format = dtype_format(&dtype);
        tensors.push(StTensor { name, shape, dtype, format, start: data_start + begin, len });
    }
    check_overlaps(path, &tensors)?;
    Ok(tensors)
}

/// No two tensors share a byte: a range that overlaps another would let one tensor read the
/// other's bytes. Empty tensors take no bytes and overlap nothing.
fn check_overlaps(path: &Path, tensors: &[StTensor]) -> Result<(), LoadError> {
    let mut order: Vec<&StTensor> = tensors.iter().filter(|t| t.len > 0).collect();
    order.sort_by_key(|t| (t.start, t.len));
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.start + a.len > b.start {
            return Err(LoadError::Overlap {
                path: path.to_path_buf(),
                name: a.name.clone(),
                range: (a.start, a.start + a.len),
                other: b.name.clone(),
                other_range: (b.start, b.start + b.len),
            });
        }
    }
    Ok(())
}

/// A shard file and the tensor names the index assigns to it (empty for a single file).
pub type Shard = (PathBuf, Vec<String>);

/// The files of a safetensors checkpoint directory, or `None` when it has none.
pub fn shard_files(dir: &Path) -> Result<Option<Vec<Shard>>, LoadError> {
    let index = dir.join("model.safetensors.index.json");
    if regular_if_present(&index)? {
        let text = read_text(&index, MAX_JSON)?;
        let json: Value = serde_json::from_str(&text).map_err(|source| LoadError::InvalidJson {
            path: index.clone(),
            what: "shard index",
            source,
        })?;
        let Some(map) = json.get("weight_map").and_then(Value::as_object) else {
            return Err(LoadError::BadHeader { path: index, msg: "no \"weight_map\" object".into() });
        };
        let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, file) in map {
            let Some(file) = file.as_str().filter(|f| !f.contains('/') && !f.contains('\\') && !f.starts_with('.'))
            else {
                return Err(LoadError::BadHeader {
                    path: index,
                    msg: format!("tensor {name}: shard {file} is not a file name in the directory"),
                });
            };
            shards.entry(file.to_string()).or_default().push(name.clone());
        }
        for (file, names) in &shards {
            if !regular_if_present(&dir.join(file))? {
                return Err(LoadError::MissingShard { path: index, name: names[0].clone(), shard: file.clone() });
            }
        }
        return Ok(Some(shards.into_iter().map(|(f, names)| (dir.join(f), names)).collect()));
    }
    let single = dir.join("model.safetensors");
    if regular_if_present(&single)? {
        return Ok(Some(vec![(single, Vec::new())]));
    }
    Ok(None)
}
