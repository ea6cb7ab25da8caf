//! The one loop that executes a schedule for a `Step`: each frame's calls in order, a host
//! frame on the CPU (`exec::host`), a device frame on its device (`exec::device`) with its
//! uploads before and downloads after. A run on the CPU alone is the schedule of one host
//! frame (`Schedule::host_only`); a device plan's schedule interleaves both.
//!
//! Must not: decide what a call computes (the schedule did) or recover from a device failure
//! (the session does, by running the CPU's schedule).

use super::chain::{Chain, ChainState};
use super::step::{HostRows, Step};
use super::{ExecError, Model};
use coli_compiler::ids::Place;
use coli_compiler::schedule::Schedule;

/// Runs `schedule` for `step`: host frames on the CPU, device frames on `chain`'s devices (a
/// schedule with device frames needs the chain it was built for) with each sequence's state,
/// in the order of the step's sequences (one for a step of one sequence).
pub(crate) fn forward(
    schedule: &Schedule,
    model: &Model,
    host: &mut HostRows,
    step: &Step,
    mut chain: Option<(&Chain, &mut [&mut ChainState])>,
) -> Result<(), ExecError> {
    if let Some((c, st)) = chain.as_mut() {
        c.begin_forward(st, host, step)?;
    }
    if let Some(r) = model.ram_cache() {
        r.begin_forward(step.tokens.len());
    }
    let tier = chain.as_ref().and_then(|(c, _)| c.tier());
    for f in &schedule.frames {
        match f.place {
            Place::Host => {
                let t0 = std::time::Instant::now();
                super::host::run_frame(&f.calls, model, host, step, tier)?;
                if let Some((c, _)) = &chain {
                    c.ctx.note_host("host frames", t0);
                }
            }
            Place::Device(d) => {
                let Some((c, st)) = chain.as_mut() else { return Err(ExecError::NoDevice(f.frame.0)) };
                c.run_device_frame(d, model, st, f, host, step)?;
            }
        }
    }
    Ok(())
}
