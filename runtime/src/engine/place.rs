//! Step 3 of a load: the plan's device frames onto the devices (`Chain::load`), compiling the
//! plan again with one layer fewer on a device that refuses a layer at setup, then the host
//! copies of what the devices hold released when `HostCopies` says so.
//!
//! Must not: open devices or read the checkpoint's tensors beyond what `Chain::load` uploads.

use super::{EngineError, HostCopies, Stage};
use crate::exec::chain::{Chain, ChainError, Uploading};
use crate::exec::device::DeviceError;
use crate::exec::weights::device_only_matrices;
use crate::exec::Model;
use crate::model::Checkpoint;
use crate::tier::TierOptions;
use crate::vk::{Context, DeviceKind, VkError};
use coli_compiler::{compile, Bindings, DeviceProfile, Options, Plan, Spec};

/// What the plan is compiled from, for a compile again with fewer layers.
pub(super) struct Compile<'a> {
    pub spec: &'a Spec,
    pub bindings: &'a Bindings,
    pub profile: &'a DeviceProfile,
    pub options: &'a Options,
}

/// Loads `plan`'s device frames on `ctxs` (the primary first), adding to `note` how many layers
/// each holds, or why none runs there. A layer that does not fully reach its device at setup
/// (a refused allocation) is freed whole, and the plan is compiled again with that device's
/// count one lower; `plan` is the plan that ran. `None`: the CPU runs everything.
pub(super) fn load_chain(
    ctxs: &[Context],
    plan: &mut Plan,
    model: &Model,
    from: &Compile,
    tier: &TierOptions,
    note: &mut String,
    progress: &mut dyn FnMut(Stage, usize, usize),
) -> Result<Option<Chain>, EngineError> {
    let Some(primary) = ctxs.first() else { return Ok(None) };
    let name = primary.caps().name.clone();
    let name_of = |k: usize| ctxs.get(k).map_or(name.clone(), |c| c.caps().name.clone());
    let layers = plan.program.dims.layers;
    let mut options = from.options.clone();
    loop {
        let held = |d: usize| plan.placement.fits.get(d).map_or(0, |f| f.layers);
        let attempt = Chain::load(ctxs.to_vec(), plan, model, tier, &mut |what, d, t| progress(stage_of(what), d, t))
            .and_then(|d| {
                d.check_state(model, options.context)?;
                Ok(d)
            });
        match attempt {
            Ok(d) if d.has_device_frames() => {
                let on = if ctxs.len() == 1 {
                    format!("{} of {layers} layers on the device", held(0))
                } else {
                    let on: Vec<String> = (0..ctxs.len()).map(|k| format!("{} on d{k}", held(k))).collect();
                    format!("{} of {layers} layers", on.join(", "))
                };
                *note = format!("{note}; {on}");
                return Ok(Some(d));
            }
            // The trunk on the CPU, the routed experts through the tier on the device.
            Ok(d) if d.tier().is_some() => {
                *note = format!("{note}; 0 of {layers} layers on the device, routed experts through its expert tier");
                return Ok(Some(d));
            }
            Ok(_) => {
                *note = format!("{name} holds none of the layers (the plan keeps everything on the CPU)");
                return Ok(None);
            }
            Err(ChainError { device, error: DeviceError::Vk(e) })
                if matches!(e, VkError::OutOfMemory { .. }) && held(device.0 as usize) > 0 =>
            {
                let (k, n) = (device.0 as usize, held(device.0 as usize));
                tracing::info!(
                    "layer {} did not fit on {device} ({}) at setup ({e}); placing {} layers there",
                    plan.placement.fits[k].first_layer + n - 1,
                    name_of(k),
                    n - 1
                );
                match k {
                    0 => options.device_layers = Some(n - 1),
                    _ => {
                        options.device_layers = Some(held(0));
                        options.second_device_layers = Some(n - 1);
                    }
                }
                *plan = compile(from.spec, from.bindings, from.profile, &options).map_err(EngineError::Spec)?;
            }
            Err(ChainError { device, error }) => {
                *note = format!("{} cannot take this model ({error})", name_of(device.0 as usize));
                return Ok(None);
            }
        }
    }
}

/// Releases the host copies of the matrices only the devices read, when `policy` says so (by
/// default when every device shares the CPU's RAM), adding what was released to `note`.
pub(super) fn release_host_copies(
    policy: HostCopies,
    ctxs: &[Context],
    plan: &Plan,
    model: &mut Model,
    checkpoint: &mut Checkpoint,
    note: &mut String,
) {
    let shared =
        !ctxs.is_empty() && ctxs.iter().all(|c| matches!(c.caps().kind, DeviceKind::Integrated | DeviceKind::Cpu));
    let release = match policy {
        HostCopies::ByDevice => shared,
        HostCopies::Release => true,
        HostCopies::Keep => false,
    };
    if !release {
        return;
    }
    let names = device_only_matrices(plan, &model.program);
    let r = model.weights.release(names.iter().map(String::as_str));
    let in_use = model.weights.sources_in_use();
    let unused: Vec<String> = checkpoint.quantized_names().into_iter().filter(|n| !in_use.contains(n)).collect();
    checkpoint.release_quantized(unused.iter().map(String::as_str));
    *note = format!(
        "{note}; dense weights on the device only: {} host copies released ({}), {} mapped matrices advised away{}",
        r.copies,
        coli_compiler::cost::human(r.bytes as u64),
        r.views,
        if policy == HostCopies::ByDevice { " (a device sharing the CPU's RAM)" } else { "" }
    );
}

/// The engine's stage of a chain's upload.
fn stage_of(what: Uploading) -> Stage {
    match what {
        Uploading::Weights => Stage::Upload,
        Uploading::TierExperts => Stage::WarmStart,
    }
}

/// The draft model's plan (`DraftRole::Draft`) onto the devices the model runs on, beside the
/// model's frames. `None` (the draft then runs on the CPU, as `note` says) where it holds no
/// device frames or does not fit beside the model.
pub(super) fn load_draft_chain(
    ctxs: &[Context],
    plan: &Plan,
    model: &Model,
    tier: &TierOptions,
    note: &mut String,
) -> Option<Chain> {
    // The model's routing history is the model's: the draft's tier starts cold.
    let tier = TierOptions { history: None, ..tier.clone() };
    match Chain::load(ctxs.to_vec(), plan, model, &tier, &mut |_, _, _| {}) {
        Ok(c) if c.has_device_frames() => {
            *note = format!("{note}; the draft layer on the device");
            Some(c)
        }
        Ok(_) => {
            *note = format!("{note}; the draft layer on the CPU");
            None
        }
        Err(e) => {
            *note = format!("{note}; the draft layer on the CPU ({})", e.error);
            None
        }
    }
}
