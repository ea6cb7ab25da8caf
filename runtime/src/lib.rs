//! coli's runtime: checkpoints, the CPU op library, the executor of plans, text and generation.
//!
//! Data flows one way: a checkpoint (`model`) and a compiled program (from `coli-compiler`)
//! make an `exec::Model`; a `exec::Session` runs forwards over it with the op libraries
//! (`cpu`, later `vk`); `generate` drives sessions with a tokenizer (`text`) and a sampler.
//! `engine` puts it together: `Engine::load` from a checkpoint's path to a runnable model.

pub mod bytes;
pub mod cpu;
pub mod engine;
pub mod exec;
pub mod format;
pub mod generate;
pub mod heat;
pub mod model;
pub mod oplib;
pub mod ramcache;
pub mod sample;
pub mod slots;
pub mod speculate;
pub mod store;
pub mod text;
pub mod tier;
pub mod vk;
mod vocab_bridge;
