//! coli's compiler: a RON architecture spec, a checkpoint's bindings and a device profile in;
//! a `Plan` (plain data) out. No GPU, no threads, no I/O beyond reading the files it is given.
//!
//! Stages, each a module: `spec` (read and check a spec, with positions), `lower` (bind
//! symbols, expand layers, resolve tensors: the `ir::Program`), `plan` (the result).
//! The only door is `compile`. This crate must never depend on ash, shaderc or rayon.

pub mod bind;
pub mod cost;
pub mod diag;
pub mod dot;
pub mod expr;
pub mod ir;
pub mod lower;
pub mod ops;
pub mod plan;
pub mod print;
pub mod profile;
pub mod spec;

pub use bind::{Bindings, Naming, TensorInfo};
pub use diag::{Diagnostic, Diagnostics};
pub use plan::Plan;
pub use profile::{DeviceProfile, Options};
pub use spec::Spec;

/// Compiles `spec` for the checkpoint `bindings` describes, on the devices of `profile`.
/// Every error found is returned, each located in the spec, the profile or the checkpoint.
pub fn compile(spec: &Spec, bindings: &Bindings, profile: &DeviceProfile, options: &Options) -> Result<Plan, Diagnostics> {
    let program = lower::build_program(spec, bindings)?;
    Ok(Plan { program, profile: profile.clone(), options: options.clone() })
}
