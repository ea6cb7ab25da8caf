//! Text in and text out: tokenizers, chat templates, streaming decode and stop strings.
//!
//! One [`Tokenizer`] type serves both checkpoint kinds: a Hugging Face directory
//! (`tokenizer.json` plus the optional `tokenizer_config.json` / `generation_config.json`)
//! and a GGUF file's own vocabulary, handed over as a plain [`GgufVocab`] so that this module
//! never reads checkpoint files itself. [`ChatTemplate`] renders the checkpoint's Jinja chat
//! template the way transformers does; [`StreamDecoder`] turns sampled ids into text that is
//! only ever whole UTF-8; [`StopMatcher`] holds back text that may be the start of a stop
//! string. Nothing here touches tensors, devices or sampling (that is `crate::sample`), and
//! nothing here panics on bad input: every failure is a [`TextError`].

mod chat;
mod gguf;
mod hf;
mod jinja_fns;
mod pieces;
mod spm;
mod stop;
mod stream;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
pub use gguf::{check_pre_tokenizer, GgufKv, GgufVocab};
pub use stop::{StopMatcher, StopStep};
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;

use std::path::PathBuf;

/// Everything that can go wrong while loading a vocabulary, encoding, or rendering a template.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// An error reported by the `tokenizers` crate (loading `tokenizer.json`, or encoding).
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    /// `tokenizer.ggml.model` names a vocabulary kind this module does not implement.
    #[error("unsupported GGUF tokenizer model {0:?} (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer whose split rules are not known here.
    #[error("unsupported GGUF pre-tokenizer {0:?} (known: {known})", known = gguf::KNOWN_PRE)]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (missing key, lengths that disagree, a malformed merge...).
    #[error("bad vocabulary: {0}")]
    BadVocab(String),
    /// Chat mode was asked for but the checkpoint ships no chat template and its vocabulary has
    /// no ChatML markers to fall back on.
    #[error("this checkpoint has no chat template (and no <|im_start|>/<|im_end|> tokens for a ChatML fallback); use a raw prompt")]
    NoChatTemplate,
    /// A chat template failed to compile or to render (including `raise_exception`).
    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
}

/// Shorthand for results in this module.
pub type Result<T, E = TextError> = std::result::Result<T, E>;
