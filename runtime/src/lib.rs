//! coli's runtime: checkpoints, the CPU op library, the executor of plans, text and generation.

pub mod format;
pub mod model;
pub mod sample;
pub mod text;
