//! Lowering: a checked spec and a checkpoint's bindings to the `ir::Program` (this module's
//! `program`), with symbol binding in `symbols`. Placement and frames are `place` and
//! `frames`' business; this module must not know about devices.

mod flow;
pub mod program;
pub mod symbols;
mod weights;

pub use program::build_program;
