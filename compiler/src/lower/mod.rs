//! Lowering: a checked spec and a checkpoint's bindings to the `ir::Program` (this module's
//! `program`), with symbol binding in `symbols`, numbers in `numbers`, weights in `weights` and
//! data flow in `flow`. Placement and frames are `place` and `frames`' business; this module
//! must not know about devices.

mod attention;
mod flow;
mod hyper;
mod numbers;
pub mod program;
mod route;
pub mod symbols;
mod weights;

pub use program::build_program;
