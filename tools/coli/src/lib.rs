//! The `coli` product's library half: the command line's flags and what they become (options
//! of `coli_runtime::engine::Engine`), the default model, progress bars and logging, shared by
//! the binary and the end-to-end tests. Must not hold engine logic: that lives in
//! `coli-compiler` and `coli-runtime` (loading a model is `coli_runtime::engine`).

pub mod bench_cmd;
pub mod bench_streams;
pub mod chat_cmd;
pub mod checks;
pub mod compile_cmd;
pub mod default_model;
pub mod dense_args;
pub mod device2_args;
pub mod engine_args;
pub mod exec_cmd;
pub mod kv_args;
pub mod load_args;
pub mod log;
pub mod probe_cmd;
pub mod progress;
pub mod ram_args;
pub mod sampling_args;
pub mod serve;
pub mod speculate_args;
pub mod tier_args;

/// The built-in architecture specs (kept here for the tests that list them).
pub use coli_runtime::engine::specs;
