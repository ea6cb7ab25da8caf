//! The checkpoint's own tokenizer: the GGUF's vocabulary, or `tokenizer.json` beside
//! safetensors. A checkpoint without one still runs (ids in, ids out); why it has none is kept
//! as a `NoTokenizer` for the messages; a GGUF naming a pre-tokenizer whose split rules are
//! unknown is refused outright (`check_gguf_pre`), before the weights are read.

use crate::model::Checkpoint;
use crate::text::{GgufVocab, TextError, Tokenizer};
use std::path::PathBuf;

/// Why a checkpoint has no usable tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum NoTokenizer {
    #[error("{path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: TextError,
    },
    #[error("the checkpoint has no directory to look for tokenizer.json in")]
    NoDirectory,
    #[error("{dir} has no tokenizer.json")]
    NoFile { dir: PathBuf },
}

/// Refuses a GGUF whose byte-level vocabulary names a pre-tokenizer whose split rules are not
/// known: every prompt would be cut wrongly. Checked before any weight is read.
pub fn check_gguf_pre(ckpt: &Checkpoint) -> Result<(), TextError> {
    match ckpt.gguf_metadata() {
        Some(m) => crate::text::check_pre_tokenizer(
            m.get_str("tokenizer.ggml.model").unwrap_or(""),
            m.get_str("tokenizer.ggml.pre"),
        ),
        None => Ok(()),
    }
}

/// The tokenizer `ckpt` carries.
pub fn for_checkpoint(ckpt: &Checkpoint) -> Result<Tokenizer, NoTokenizer> {
    if let Some(meta) = ckpt.gguf_metadata() {
        let unreadable = |source| NoTokenizer::Unreadable { path: ckpt.path().to_path_buf(), source };
        let vocab = GgufVocab::from_kv(meta).map_err(unreadable)?;
        return Tokenizer::from_gguf_vocab(&vocab).map_err(unreadable);
    }
    let dir = ckpt.dir().ok_or(NoTokenizer::NoDirectory)?;
    if !dir.join("tokenizer.json").is_file() {
        return Err(NoTokenizer::NoFile { dir: dir.to_path_buf() });
    }
    Tokenizer::from_hf_dir(dir).map_err(|source| NoTokenizer::Unreadable { path: dir.to_path_buf(), source })
}
