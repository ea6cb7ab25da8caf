//! The `coli` product's library half: the glue between the command line and the crates
//! (built-in specs, the default model, loading), shared by the binary and the end-to-end tests.
//! Must not hold engine logic: that lives in `coli-compiler` and `coli-runtime`.

pub mod bench_cmd;
pub mod checks;
pub mod compile_cmd;
pub mod default_model;
pub mod dense_args;
pub mod device2_args;
pub mod exec_cmd;
pub mod kv_args;
pub mod load;
pub mod log;
pub mod probe_cmd;
pub mod progress;
pub mod specs;
pub mod tier_args;
