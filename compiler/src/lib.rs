//! coli's compiler: a RON architecture spec, a checkpoint's bindings and a device profile in;
//! a `Plan` (plain data) out. No GPU, no threads, no I/O beyond reading the files it is given.
//!
//! Stages, each a module, in order: `spec` (read and check a spec, with positions), `lower`
//! (bind symbols, expand layers, resolve tensors: the `ir::Program`), `place` (size the parts,
//! fit layers on devices), `frames` (cut device spans at host steps, transfers), `verify`
//! (the plan's invariants), `plan` (the result, printed by `print` and `dot`).
//! The only door is `compile`. This crate must never depend on ash, shaderc or rayon.

pub mod bind;
pub mod cost;
pub mod diag;
pub mod dot;
pub mod expr;
pub mod frames;
pub mod ids;
pub mod ir;
pub mod limits;
pub mod lower;
pub mod ops;
pub mod place;
pub mod plan;
pub mod print;
pub mod profile;
pub mod schedule;
pub mod spec;
pub mod verify;

pub use bind::{Bindings, Naming, TensorInfo};
pub use diag::{Diagnostic, Diagnostics};
pub use plan::Plan;
pub use profile::{DeviceProfile, DraftRole, Options};
pub use spec::Spec;

/// Compiles `spec` for the checkpoint `bindings` describes, on the devices of `profile`.
/// Every error found is returned, each located in the spec, the profile or the checkpoint.
pub fn compile(
    spec: &Spec,
    bindings: &Bindings,
    profile: &DeviceProfile,
    options: &Options,
) -> Result<Plan, Diagnostics> {
    // 1. The program (the draft's, or the model's); a draft's or its target's residual goes to
    // the host too.
    let mut program = match options.draft {
        DraftRole::Draft => lower::program::build_part(spec, bindings, lower::program::Part::Draft)?,
        DraftRole::None | DraftRole::Target => lower::build_program(spec, bindings)?,
    };
    if options.draft != DraftRole::None {
        program.export = Some(program.residual);
    }
    // 2. Sizes and placement.
    let stored = bindings
        .tensors
        .iter()
        .flatten()
        .filter_map(|(name, t)| cost::Format::from_dtype(&t.dtype).map(|f| (name.clone(), f)))
        .collect();
    let sizer = place::size::Sizer::new(&program, stored, options);
    let placement = place::place(&program, profile, options, &sizer)
        .map_err(|m| Diagnostics::one(Diagnostic::whole(&spec.path, m)))?;
    // 3. Frames.
    let placed = place::op_places(&program, profile, &placement, &sizer);
    let split = place::kv_split::split_ops(&program, &placement, &placed);
    let frames = frames::split_frames(&program, &placed, &split);
    let plan = Plan { program, profile: profile.clone(), options: options.clone(), placement, frames };
    // 4. The invariants.
    let errors = verify::verify(&plan, &sizer);
    if !errors.is_empty() {
        let mut d = Diagnostics::new();
        for e in errors {
            d.push(Diagnostic::whole(&spec.path, format!("internal error (the plan breaks an invariant): {e}")));
        }
        return Err(d);
    }
    Ok(plan)
}
