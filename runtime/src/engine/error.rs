//! `EngineError`: everything that can stop a load or a run the engine drives, each with its
//! context (the checkpoint's path, the device, the numbers that disagree). Bad input is one of
//! these, never a panic. The messages name no command-line flag: a front end adds its own.

use super::generation::GenerationConfigError;
use crate::exec::ExecError;
use crate::generate::GenerateError;
use crate::model::hub::HubError;
use crate::model::LoadError;
use crate::text::TextError;
use crate::vk::VkError;
use coli_compiler::Diagnostics;
use std::path::PathBuf;

/// Why a model did not load, or a prompt or a run was refused.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint could not be opened (its messages carry the path).
    #[error(transparent)]
    Checkpoint(#[from] LoadError),
    /// A Hugging Face id that names no checkpoint in the cache.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The checkpoint's `generation_config.json` is malformed.
    #[error(transparent)]
    GenerationConfig(#[from] GenerationConfigError),
    /// A GGUF names a pre-tokenizer whose split rules are unknown.
    #[error("{}: {source}", path.display())]
    PreTokenizer {
        path: PathBuf,
        #[source]
        source: TextError,
    },
    /// The spec file, or the plan compiled from it, has errors.
    #[error("{0}")]
    Spec(Diagnostics),
    /// Without a spec file, the checkpoint must name its architecture.
    #[error("{path}: the checkpoint does not name its architecture; give a spec")]
    NoArchitecture { path: PathBuf },
    /// No built-in spec serves the checkpoint's architecture.
    #[error("{path}: no built-in spec serves architecture {arch:?} (served: {served}); give a spec")]
    NoBuiltinSpec { path: PathBuf, arch: String, served: String },
    /// The model's own context is shorter than `EngineOptions::min_model_context`.
    #[error("the model's context of {max} positions is too small for {need} positions")]
    ContextTooSmall { need: usize, max: usize },
    /// A Vulkan device was required and could not be opened.
    #[error("{0}")]
    NoDevice(VkError),
    /// A Vulkan device was required and runs none of the model (why, in words).
    #[error("{0}")]
    DeviceUnused(String),
    /// The second device was required and could not be opened.
    #[error("the second device: {0}")]
    SecondDevice(VkError),
    /// The program's weights could not be resolved, or an op has no CPU implementation.
    #[error("{path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: Box<ExecError>,
    },
    /// A session's device state could not be made.
    #[error("device: {0}")]
    Session(VkError),
    /// The draft model could not join a session.
    #[error("{0}")]
    Draft(crate::exec::ExecError),
    /// A text prompt, but no tokenizer (why there is none).
    #[error("a text prompt needs a tokenizer: {0}")]
    NoTokenizer(String),
    /// The chat template is missing or failed to render.
    #[error("{0}")]
    Chat(TextError),
    /// The prompt text could not be encoded.
    #[error(transparent)]
    Encode(TextError),
    /// A prompt id past the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab { id: u32, vocab: usize },
    /// The RAM expert cache could not open the checkpoint's files for its reads.
    #[error(transparent)]
    RamCache(#[from] crate::ramcache::RamError),
    /// The generation loop stopped on an error.
    #[error(transparent)]
    Generate(#[from] GenerateError),
}
