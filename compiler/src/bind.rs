//! Bindings: what the compiler knows of a checkpoint. Its configuration (a Hugging Face
//! `config.json` or a GGUF's metadata, as JSON values), its tensor table (names, shapes,
//! storage types) and which naming scheme its tensors use.
//!
//! The runtime's checkpoint readers build a `Bindings`; the compiler only reads it. This
//! module does no I/O beyond `Bindings::from_config_json` reading one JSON file.

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The tensor naming scheme of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Naming {
    /// Hugging Face: `model.layers.{i}.self_attn.q_proj.weight`.
    Hf,
    /// GGUF: `blk.{i}.attn_q.weight`.
    Gguf,
}

/// One tensor of the checkpoint as the compiler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Outermost dimension first (`[out, in]` for a Linear weight), for both formats.
    pub shape: Vec<usize>,
    /// The storage type as the checkpoint names it (`BF16`, `Q4_K`, ...), for messages and sizing.
    pub dtype: String,
    /// Bytes of the tensor in the checkpoint.
    pub bytes: u64,
}

/// What a checkpoint says about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Bindings {
    /// The file or directory the bindings were read from (for messages).
    pub source: PathBuf,
    pub naming: Naming,
    /// HF: the keys of `config.json`. GGUF: the metadata keys (`llama.embedding_length`),
    /// without the tokenizer's large arrays.
    pub config: Map<String, Value>,
    /// The tensor table, when the checkpoint's tensors are known (absent for a bare config.json).
    pub tensors: Option<BTreeMap<String, TensorInfo>>,
}

/// Why a configuration file could not become bindings.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: expected a JSON object at the top")]
    NotAnObject { path: PathBuf },
}

impl Bindings {
    /// Bindings from a bare Hugging Face `config.json`: HF naming, no tensor table.
    pub fn from_config_json(path: &std::path::Path) -> Result<Bindings, BindError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| BindError::Read { path: path.to_path_buf(), source })?;
        Bindings::from_config_text(&text, path)
    }

    /// Bindings from the text of a `config.json` (`path` for messages).
    pub fn from_config_text(text: &str, path: &std::path::Path) -> Result<Bindings, BindError> {
        let value: Value =
            serde_json::from_str(text).map_err(|source| BindError::Json { path: path.to_path_buf(), source })?;
        let Value::Object(config) = value else { return Err(BindError::NotAnObject { path: path.to_path_buf() }) };
        Ok(Bindings { source: path.to_path_buf(), naming: Naming::Hf, config, tensors: None })
    }

    /// The architecture named by the checkpoint: HF `architectures[0]` (`LlamaForCausalLM`)
    /// or GGUF `general.architecture` (`llama`).
    pub fn architecture(&self) -> Option<&str> {
        match self.naming {
            Naming::Hf => self.config.get("architectures")?.as_array()?.first()?.as_str(),
            Naming::Gguf => self.config.get("general.architecture")?.as_str(),
        }
    }

    /// These bindings with the keys of their `object` (a wrapper's `text_config`) laid over the
    /// top-level keys (but `architectures`, which stays the wrapper's); a message when the
    /// configuration has no such object.
    pub fn unwrapped(&self, object: &str) -> Result<Bindings, String> {
        let arch = self.architecture().unwrap_or("?");
        let Some(inner) = self.config.get(object).and_then(|v| v.as_object()) else {
            return Err(format!(
                "architecture `{arch}` keeps the text model's keys under `{object}`, which its config.json lacks (or holds as something other than an object)"
            ));
        };
        let mut out = self.clone();
        for (k, v) in inner.iter().filter(|(k, _)| *k != "architectures") {
            out.config.insert(k.clone(), v.clone());
        }
        Ok(out)
    }
}
