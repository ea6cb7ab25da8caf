//! Checkpoint readers: a Hugging Face safetensors directory (single file or sharded) or a GGUF
//! file, opened by memory-mapping, its tensor table checked against the files, and exposed as
//! `Tensor` views (no copies) plus the `Bindings` the compiler reads. Optionally quantizes
//! float matrices to `I8Row`/`I4G64` at load (`LoadOptions::quantize`), the only case where
//! tensor bytes are copied.
//!
//! Copies quantized at load can be released again (`release_quantized`, when their matrices
//! live on a device only): a released tensor is quantized again from the file when it is next
//! asked for, with the same bytes.
//!
//! Every malformed file is a `LoadError` naming the file (and the tensor, where there is one);
//! nothing here panics on file contents. A weight holding a NaN or an infinity is one too
//! (`NonFinite`), found the first time the tensor is handed out (`file_tensor`). Must not: interpret tensor names beyond the
//! quantize-at-load eligibility rule and the split MLA pair below, or know model architectures.
//!
//! FP8 checkpoints (`fp8.rs`): an `F8_E4M3` weight with its `weight_scale_inv` is handed out in
//! `WeightFormat::FP8_E4M3`, repacked from the file when asked for (an owned copy, kept in block
//! form: the second case where tensor bytes are copied). MXFP4 checkpoints (`mxfp4.rs`): a
//! weight's `X_blocks` with its `X_scales` is the tensor `X` in `WeightFormat::MXFP4`, repacked
//! into GGUF's blocks the same way.
//!
//! A GGUF split into shards (`name-00001-of-0000N.gguf`, `split.rs`) opens from any shard as one
//! checkpoint: one tensor table over the shards, each tensor in its own shard's map, the
//! metadata of shard 1.
//!
//! A GGUF whose MLA layers hold llama.cpp's split `attn_k_b` / `attn_v_b` also has each
//! layer's `attn_kv_b` as a derived tensor, made from the pair on first use
//! (`gguf_transform.rs`): the one place tensor names of a GGUF are read here.
//!
//! A model named by its Hugging Face id (`org/name`) is found in the hub's cache by `hub.rs`,
//! which gives the path `Checkpoint::open` is then handed.
//!
//! Files (`file.rs`): every checkpoint file is checked to be a regular file before it is
//! opened, opened read-only, and mapped read-only. Tensors borrow from the maps; as with any
//! memory-mapped reader, another process truncating or rewriting a file while it is open
//! takes bytes from under them. The file's size is re-checked whenever a tensor is handed out
//! (`FileChanged`), and a read of a page lost in between raises SIGBUS, which the guard
//! (`guard.rs`) turns into a one-line error naming the file and exit code 74.

mod error;
mod file;
pub mod fp8;
pub mod gguf;
mod gguf_transform;
mod guard;
pub mod hub;
pub mod mxfp4;
mod safetensors;
mod split;
mod tensor;

/// An integer tensor (`I32`, `I64`: DeepSeek V4's hash table of expert ids) as an f32 copy,
/// exact for magnitudes below 2^24; `None` for any other dtype.
fn integers_as_f32(name: &str, e: &Entry, map: &Arc<MappedFile>) -> Result<Option<Tensor>, LoadError> {
    if e.dtype != "I32" && e.dtype != "I64" {
        return Ok(None);
    }
    map.check_unchanged()?;
    let (start, len) = (e.start as usize, e.len as usize);
    let raw = &map.bytes()[start..start + len];
    let values: Vec<f32> = if e.dtype == "I64" {
        raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()) as f32).collect()
    } else {
        raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap_or_default()) as f32).collect()
    };
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(Some(Tensor::owned(name.to_string(), WeightFormat::F32, e.shape.clone(), bytes, map.path().clone())))
}

#[cfg(test)]
mod tests;

pub use error::{shown, LoadError};
pub use file::check_regular;
pub(crate) use file::{read_text, MAX_JSON};
pub use gguf::{GgufArray, GgufMetadata, GgufValue};
pub use guard::EXIT_CODE as SIGBUS_EXIT_CODE;
pub use tensor::{tensor_bytes, Tensor};

use crate::format::{first_non_finite, quantize, FormatError, NonFinite, WeightFormat};
use coli_compiler::bind::{Bindings, Naming, TensorInfo};
use file::MappedFile;
use rayon::prelude::*;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// `progress(done, total)` in bytes of work.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How to open a checkpoint.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Quantize eligible float matrices at load to this format (`I8Row` or `I4G64`). Eligible:
    /// 2-D, stored as F32/F16/BF16, columns a multiple of 64, and not an embedding, norm or
    /// router (`quantizable_name`).
    pub quantize: Option<WeightFormat>,
    /// Called with `(bytes done, bytes total)` while quantizing (opening itself is instant).
    pub progress: Option<Progress>,
}

impl fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadOptions")
            .field("quantize", &self.quantize)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Whether quantize-at-load may touch a tensor of this name: not token embeddings (`embed`,
/// `token_embd`), norms (`norm`), or MoE routers (HF `.gate.weight`/`router`, GGUF `ffn_gate_inp`).
pub fn quantizable_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    !["embed", "token_embd", "norm", ".gate.weight", "router", "ffn_gate_inp"].iter().any(|p| n.contains(p))
}

#[derive(Clone, Debug)]
struct Entry {
    shape: Vec<usize>,
    dtype: String,
    format: Option<WeightFormat>,
    file: usize,
    start: u64,
    len: u64,
    /// The first non-finite value, found when the tensor is first handed out.
    non_finite: OnceLock<Option<NonFinite>>,
    /// An FP8 weight's block scale tensor, when the two pair (`fp8::pair_all`).
    scale: Option<String>,
    /// An MXFP4 weight's blocks and scales, or why they do not pair (`mxfp4::pair_all`).
    mxfp4: Option<mxfp4::Pairing>,
}

enum Kind {
    Gguf(GgufMetadata),
    Safetensors { dir: PathBuf, config: Map<String, Value> },
}

/// An open checkpoint: its files mapped, its tensor table checked.
pub struct Checkpoint {
    path: PathBuf,
    kind: Kind,
    files: Vec<Arc<MappedFile>>,
    entries: BTreeMap<String, Entry>,
    quantized: HashMap<String, Tensor>,
    /// Tensors quantized at load whose copies were released, with their load-time format.
    released: HashMap<String, WeightFormat>,
    /// Tensors the file does not hold, made from tensors it does (`gguf_transform.rs`).
    joined: BTreeMap<String, gguf_transform::Joined>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Checkpoint({}, {} tensors, {} quantized at load)",
            self.path.display(),
            self.entries.len(),
            self.quantized.len()
        )
    }
}

impl Checkpoint {
    /// Opens a `.gguf` file (any shard of a split set opens the whole set, `split.rs`), or a
    /// directory holding safetensors (`model.safetensors` or a sharded set with
    /// `model.safetensors.index.json`) and `config.json`. A directory holding no safetensors but
    /// one `.gguf` file (or one split set) opens that; several are `SeveralGguf`.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<Checkpoint, LoadError> {
        let mut ck = if path.is_dir() { Self::open_dir(path)? } else { Self::open_gguf(path)? };
        if let Some(format) = opts.quantize {
            ck.quantize_at_load(format, opts.progress.as_ref())?;
        }
        Ok(ck)
    }

    fn open_gguf(path: &Path) -> Result<Checkpoint, LoadError> {
        let map = MappedFile::open(path)?;
        let (meta, tensors) = gguf::parse(path, map.bytes())?;
        let given = split::Shard { map, meta, tensors };
        let shards = match split::shard_set(path, &given.meta)? {
            Some(set) => split::open_shards(path, given, &set)?,
            None => vec![given],
        };
        let is_split = shards.len() > 1;
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for (file, shard) in shards.iter().enumerate() {
            for t in &shard.tensors {
                let e = Entry {
                    shape: t.shape.clone(),
                    dtype: t.dtype.to_string(),
                    format: t.format,
                    file,
                    start: t.start,
                    len: t.len,
                    non_finite: OnceLock::new(),
                    scale: None,
                    mxfp4: None,
                };
                if let Some(old) = entries.insert(t.name.clone(), e) {
                    let here = shard.map.path();
                    return Err(match is_split && old.file != file {
                        true => split::duplicate(&t.name, shards[old.file].map.path(), here),
                        false => LoadError::DuplicateTensor { path: here.to_path_buf(), name: t.name.clone() },
                    });
                }
            }
        }
        let mut shards = shards.into_iter();
        let Some(first) = shards.next() else {
            return Err(LoadError::NotACheckpoint { path: path.to_path_buf() });
        };
        if is_split {
            split::check_total(first.map.path(), &first.meta, entries.len(), shards.len() + 1)?;
        }
        let meta = first.meta;
        let joined = gguf_transform::find(path, &meta, &entries)?;
        let files = std::iter::once(first.map).chain(shards.map(|s| s.map)).map(Arc::new).collect();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            kind: Kind::Gguf(meta),
            files,
            entries,
            quantized: HashMap::new(),
            released: HashMap::new(),
            joined,
        })
    }

    fn open_dir(dir: &Path) -> Result<Checkpoint, LoadError> {
        let Some(shards) = safetensors::shard_files(dir)? else {
            let ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|source| LoadError::Io { path: dir.to_path_buf(), source })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
                .collect();
            return match split::single_in(&ggufs) {
                Some(one) => Self::open_gguf(&one),
                None if ggufs.is_empty() => Err(LoadError::NotACheckpoint { path: dir.to_path_buf() }),
                None => {
                    let mut files: Vec<String> =
                        ggufs.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
                    files.sort();
                    Err(LoadError::SeveralGguf { path: dir.to_path_buf(), files })
                }
            };
        };
        let config_path = dir.join("config.json");
        let text = file::read_text(&config_path, file::MAX_JSON)?;
        let config = match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(LoadError::BadHeader { path: config_path, msg: "config.json is not a JSON object".into() })
            }
            Err(source) => {
                return Err(LoadError::InvalidJson { path: config_path, what: "model configuration", source })
            }
        };
        let mut files = Vec::new();
        let mut entries = BTreeMap::new();
        for (file, (shard, expected)) in shards.into_iter().enumerate() {
            let map = MappedFile::open(&shard)?;
            let tensors = safetensors::parse(&shard, map.bytes())?;
            let names: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
            if let Some(name) = expected.iter().find(|n| !names.contains(n.as_str())) {
                let msg = format!("the shard index puts tensor {name} in this file, which lacks it");
                return Err(LoadError::BadHeader { path: shard, msg });
            }
            for t in tensors {
                let e = Entry {
                    shape: t.shape,
                    dtype: t.dtype,
                    format: t.format,
                    file,
                    start: t.start,
                    len: t.len,
                    non_finite: OnceLock::new(),
                    scale: None,
                    mxfp4: None,
                };
                if entries.insert(t.name.clone(), e).is_some() {
                    return Err(LoadError::DuplicateTensor { path: shard, name: t.name });
                }
            }
            files.push(Arc::new(map));
        }
        fp8::pair_all(&mut entries);
        mxfp4::pair_all(&mut entries);
        let kind = Kind::Safetensors { dir: dir.to_path_buf(), config };
        Ok(Checkpoint {
            path: dir.to_path_buf(),
            kind,
            files,
            entries,
            quantized: HashMap::new(),
            released: HashMap::new(),
            joined: BTreeMap::new(),
        })
    }

    /// The file or directory this checkpoint was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory holding `config.json`, `tokenizer.json` and the like (safetensors only).
    pub fn dir(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Safetensors { dir, .. } => Some(dir),
            Kind::Gguf(_) => None,
        }
    }

    pub fn naming(&self) -> Naming {
        match self.kind {
            Kind::Gguf(_) => Naming::Gguf,
            Kind::Safetensors { .. } => Naming::Hf,
        }
    }

    /// The GGUF metadata (tokenizer arrays included), for GGUF checkpoints.
    pub fn gguf_metadata(&self) -> Option<&GgufMetadata> {
        match &self.kind {
            Kind::Gguf(m) => Some(m),
            Kind::Safetensors { .. } => None,
        }
    }

    /// Whether the checkpoint has a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name) || self.joined.contains_key(name)
    }

    /// Every tensor name (the derived ones after the file's), each part sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().chain(self.joined.keys()).map(String::as_str)
    }

    /// The tensors of the checkpoint's files that reading `name` reads: itself, an FP8
    /// weight's scale, an MXFP4 weight's blocks and scales, a joined tensor's parts.
    pub fn file_tensors_of(&self, name: &str) -> Vec<&str> {
        let mut out = Vec::new();
        if let Some(j) = self.joined.get(name) {
            out.extend(j.parts());
        }
        if let Some((k, e)) = self.entries.get_key_value(name) {
            out.push(k.as_str());
            out.extend(e.scale.as_deref());
            if let Some(Ok((blocks, scales))) = &e.mxfp4 {
                out.extend([blocks.as_str(), scales.as_str()]);
            }
        }
        out
    }

    /// The tensor `name`: a view of the mapped file, an FP8 weight's repack, or the tensor
    /// quantized at load (quantized again from the file when its copy was released).
    pub fn tensor(&self, name: &str) -> Result<Tensor, LoadError> {
        if let Some(t) = self.quantized.get(name) {
            return Ok(t.clone());
        }
        if let Some(&format) = self.released.get(name) {
            return quantize_tensor(&self.file_tensor(name)?, format);
        }
        self.file_tensor(name)
    }

    /// The names of the tensors quantized at load whose copies the checkpoint holds.
    pub fn quantized_names(&self) -> Vec<String> {
        self.quantized.keys().cloned().collect()
    }

    /// The load-time format of `name` when it was quantized at load (its copy held or released).
    pub fn quantized_to(&self, name: &str) -> Option<WeightFormat> {
        self.quantized.get(name).map(|t| t.format).or_else(|| self.released.get(name).copied())
    }

    /// Drops the checkpoint's copies of the tensors of `names` quantized at load (a name not
    /// quantized is ignored); each is quantized again from the file when next asked for. The
    /// memory returns once no other holder (the weight store) keeps the copy. Returns how many
    /// copies were dropped.
    pub fn release_quantized<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> usize {
        let mut n = 0;
        for name in names {
            if let Some(t) = self.quantized.remove(name) {
                self.released.insert(name.to_string(), t.format);
                n += 1;
            }
        }
        n
    }

    /// The tensor `name` as the file holds it (a view of the map; for a paired FP8 weight its
    /// `FP8_E4M3` repack), whether or not it was quantized at load. Its first use scans it for NaN and infinities (`NonFinite`; every
    /// element of a float format, the scales and mins of a block format) and re-checks the
    /// file's size (`FileChanged`).
    pub fn file_tensor(&self, name: &str) -> Result<Tensor, LoadError> {
        if let Some(j) = self.joined.get(name) {
            return j.tensor(name, |part| self.file_tensor(part));
        }
        let Some(e) = self.entries.get(name) else {
            return Err(LoadError::NoSuchTensor { path: self.path.clone(), name: name.to_string() });
        };
        let map = &self.files[e.file];
        let path = map.path();
        if let Some(scale) = &e.scale {
            return self.fp8_tensor(name, e, scale);
        }
        match &e.mxfp4 {
            Some(Ok(_)) => return self.mxfp4_tensor(name, e),
            Some(Err(problem)) => {
                let problem = Box::new(problem.clone());
                return Err(LoadError::Mxfp4 { path: path.to_path_buf(), name: name.to_string(), problem });
            }
            None => {}
        }
        let Some(format) = e.format else {
            if e.dtype == fp8::DTYPE {
                let problem = fp8::pair(&self.entries, name, e).err();
                let problem = problem.unwrap_or(fp8::Fp8Problem::Shape { shape: e.shape.clone() });
                return Err(LoadError::Fp8 {
                    path: path.to_path_buf(),
                    name: name.to_string(),
                    problem: Box::new(problem),
                });
            }
            if let Some(t) = integers_as_f32(name, e, map)? {
                return Ok(t);
            }
            return Err(LoadError::UnsupportedType {
                path: path.to_path_buf(),
                name: name.to_string(),
                dtype: e.dtype.clone(),
            });
        };
        map.check_unchanged()?;
        let t = Tensor::mapped(
            name.to_string(),
            format,
            e.shape.clone(),
            map.clone(),
            e.start as usize,
            e.len as usize,
            path.clone(),
        );
        // Scanned once, in parallel, on first use: the pages are read now rather than by the
        // first forward.
        if let Some(found) = *e.non_finite.get_or_init(|| first_non_finite(format, t.bytes(), t.cols())) {
            return Err(LoadError::NonFinite { path: path.to_path_buf(), name: name.to_string(), found });
        }
        Ok(t)
    }

    /// A paired FP8 weight repacked into `FP8_E4M3` rows (the same bytes every time), scanned
    /// for NaN codes and non-finite scales on first use.
    fn fp8_tensor(&self, name: &str, e: &Entry, scale: &str) -> Result<Tensor, LoadError> {
        let Some(src) = self.fp8_source(name) else {
            return Err(LoadError::NoSuchTensor { path: self.path.clone(), name: scale.to_string() });
        };
        let t = src.make()?;
        if let Some(found) = *e.non_finite.get_or_init(|| first_non_finite(t.format, t.bytes(), t.cols())) {
            return Err(LoadError::NonFinite { path: t.source().to_path_buf(), name: name.to_string(), found });
        }
        Ok(t)
    }

    /// A paired MXFP4 weight repacked into GGUF's `MXFP4` blocks (the same bytes every time),
    /// its scales scanned on first use.
    fn mxfp4_tensor(&self, name: &str, e: &Entry) -> Result<Tensor, LoadError> {
        let Some(src) = self.mxfp4_source(name) else {
            return Err(LoadError::NoSuchTensor { path: self.path.clone(), name: name.to_string() });
        };
        let t = src.make()?;
        if let Some(found) = *e.non_finite.get_or_init(|| first_non_finite(t.format, t.bytes(), t.cols())) {
            return Err(LoadError::NonFinite { path: t.source().to_path_buf(), name: name.to_string(), found });
        }
        Ok(t)
    }

    /// How to make the paired MXFP4 weight `name` (the `X` of `X_blocks`) again from the files
    /// (`None` for any other tensor).
    pub fn mxfp4_source(&self, name: &str) -> Option<mxfp4::Mxfp4Source> {
        let e = self.entries.get(name)?;
        let Some(Ok((blocks, scales))) = &e.mxfp4 else { return None };
        let (b, s) = (self.entries.get(blocks)?, self.entries.get(scales)?);
        Some(mxfp4::Mxfp4Source::new(name, e, b, s, &self.files))
    }

    /// How to make the paired FP8 weight `name` again from the files (`None` for any other
    /// tensor). Its tensor must have been read once (`tensor`), which checks it.
    pub fn fp8_source(&self, name: &str) -> Option<fp8::Fp8Source> {
        let e = self.entries.get(name)?;
        let s = self.entries.get(e.scale.as_deref()?)?;
        Some(fp8::Fp8Source::new(name, e, s, &self.files))
    }

    /// What the compiler needs to know: configuration, naming, and the tensor table (after
    /// quantize-at-load, the quantized tensors' dtype and bytes).
    pub fn bindings(&self) -> Bindings {
        let config = match &self.kind {
            Kind::Gguf(m) => m.to_config_json(),
            Kind::Safetensors { config, .. } => config.clone(),
        };
        let tensors = self
            .entries
            .iter()
            .map(|(name, e)| {
                let info = match (self.quantized.get(name), self.released.get(name)) {
                    (Some(t), _) => TensorInfo {
                        shape: t.shape.clone(),
                        dtype: t.format.name().to_string(),
                        bytes: t.bytes().len() as u64,
                    },
                    (None, Some(&f)) => TensorInfo {
                        shape: e.shape.clone(),
                        dtype: f.name().to_string(),
                        bytes: tensor_bytes(f, &e.shape).unwrap_or(0) as u64,
                    },
                    // FP8 weights as repacked: 1 byte an element and an f32 per 128.
                    (None, None) if e.scale.is_some() => TensorInfo {
                        shape: e.shape.clone(),
                        dtype: WeightFormat::FP8_E4M3.name().to_string(),
                        bytes: tensor_bytes(WeightFormat::FP8_E4M3, &e.shape).unwrap_or(0) as u64,
                    },
                    // MXFP4 weights as repacked: 17 bytes per 32 elements.
                    (None, None) if matches!(e.mxfp4, Some(Ok(_))) => TensorInfo {
                        shape: e.shape.clone(),
                        dtype: WeightFormat::MXFP4.name().to_string(),
                        bytes: tensor_bytes(WeightFormat::MXFP4, &e.shape).unwrap_or(0) as u64,
                    },
                    (None, None) => TensorInfo { shape: e.shape.clone(), dtype: e.dtype.clone(), bytes: e.len },
                };
                (name.clone(), info)
            })
            .chain(self.joined.iter().map(|(name, j)| {
                let bytes = tensor_bytes(j.format, &j.shape).unwrap_or(0) as u64;
                (name.clone(), TensorInfo { shape: j.shape.clone(), dtype: j.format.name().to_string(), bytes })
            }))
            .collect();
        Bindings { source: self.path.clone(), naming: self.naming(), config, tensors: Some(tensors) }
    }

    fn quantize_at_load(&mut self, target: WeightFormat, progress: Option<&Progress>) -> Result<(), LoadError> {
        if !matches!(target, WeightFormat::I8Row | WeightFormat::I4G64) {
            return Err(LoadError::BadQuantizeTarget { format: target });
        }
        let todo: Vec<String> = self
            .entries
            .iter()
            .filter(|(name, e)| {
                e.shape.len() == 2
                    && e.shape[1] > 0
                    && e.shape[1] % 64 == 0
                    && matches!(e.format, Some(WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16))
                    && quantizable_name(name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        let total: u64 = todo.iter().map(|n| self.entries[n].len).sum();
        let mut done = 0u64;
        for name in todo {
            let t = self.tensor(&name)?;
            let q = quantize_tensor(&t, target)?;
            done += self.entries[&name].len;
            self.quantized.insert(name, q);
            if let Some(p) = progress {
                p(done, total);
            }
        }
        Ok(())
    }
}

/// Quantizes a 2-D float tensor to `target`, a block of rows at a time (bounded f32 scratch).
/// The same input gives the same bytes (a released copy made again is bit for bit the old).
pub(crate) fn quantize_tensor(t: &Tensor, target: WeightFormat) -> Result<Tensor, LoadError> {
    let m = t.as_matrix();
    let err = |source| LoadError::Format { path: t.source().to_path_buf(), name: t.name.clone(), source };
    let out_row = target.row_bytes(m.cols).map_err(err)?;
    const ROWS: usize = 256;
    let chunks: Vec<Result<Vec<u8>, FormatError>> = (0..m.rows.div_ceil(ROWS))
        .into_par_iter()
        .map(|c| {
            let (r0, r1) = (c * ROWS, ((c + 1) * ROWS).min(m.rows));
            let mut f = vec![0f32; (r1 - r0) * m.cols];
            for (r, o) in (r0..r1).zip(f.chunks_exact_mut(m.cols)) {
                crate::format::dequant_row(m.format, m.row(r), o);
            }
            quantize(target, &f, m.cols)
        })
        .collect();
    let mut bytes = Vec::with_capacity(m.rows * out_row);
    for c in chunks {
        bytes.extend_from_slice(&c.map_err(err)?);
    }
    Ok(Tensor::owned(t.name.clone(), target, t.shape.clone(), bytes, Arc::new(t.source().to_path_buf())))
}
