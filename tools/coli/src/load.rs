//! From a path on the command line to a runnable model: open the checkpoint, pick (or load)
//! the spec, compile the plan, resolve the weights, build the tokenizer. Shared by `coli exec`,
//! `coli bench` and the end-to-end tests, so all of them load models the same way. With a
//! second device asked for, both are opened and probed into one profile (the primary first),
//! and the plan's frames on each load on their own device. With the dense weights on the
//! devices only (`dense_device_only`), the host copies of what the devices hold are released
//! once uploaded (the weight store makes a matrix again from the file if the CPU needs it).

use crate::specs;
use coli_compiler::{compile, DeviceProfile, Options, Plan, Spec};
use coli_runtime::exec::chain::{Chain, ChainError};
use coli_runtime::exec::device::DeviceError;
use coli_runtime::exec::probe::profile_of_devices;
use coli_runtime::exec::weights::device_only_matrices;
use coli_runtime::exec::Model;
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::text::{GgufVocab, Tokenizer};
use coli_runtime::tier::TierOptions;
use coli_runtime::vk::{Context, DeviceKind, DeviceRole, VkError, VkOptions};
use std::path::Path;

/// Everything `coli exec` needs to run.
pub struct Loaded {
    pub checkpoint: Checkpoint,
    pub spec: Spec,
    pub plan: Plan,
    pub model: Model,
    /// `None` when the checkpoint has no tokenizer (ids in, ids out).
    pub tokenizer: Option<Tokenizer>,
    /// Why there is no tokenizer, when there is none.
    pub tokenizer_note: Option<String>,
    /// The devices the plan's device frames run on, when there is one.
    pub device: Option<Chain>,
    /// One line saying where the model runs and why.
    pub device_note: String,
}

/// Where to run.
#[derive(Clone, Debug, Default)]
pub enum DeviceRequest {
    /// The CPU only.
    #[default]
    Cpu,
    /// A Vulkan device, or an error.
    Vulkan(VkOptions),
    /// A Vulkan device when there is one, else the CPU.
    Auto(VkOptions),
}

/// A check of the compiled plan before any weight is read; its error ends the load.
pub type PlanCheck<'a> = &'a dyn Fn(&Plan) -> Result<(), String>;

/// How to load.
pub struct LoadRequest<'a> {
    pub model: &'a Path,
    pub spec: Option<&'a Path>,
    pub load: LoadOptions,
    pub compile: Options,
    pub profile: Option<DeviceProfile>,
    pub device: DeviceRequest,
    /// A second Vulkan device beside the primary one (`device`): its options (its `role` is set
    /// to `Second` here). Ignored when running on the CPU.
    pub second_device: Option<VkOptions>,
    /// The expert tier's options (on a device with routed experts through host steps).
    pub tier: TierOptions,
    /// Release the host copies of the matrices only the devices read, once uploaded; `None`:
    /// when every device opened shares the CPU's RAM (integrated, or a CPU device).
    pub dense_device_only: Option<bool>,
    /// Called with (done, total) while weights resolve.
    pub progress: Option<&'a mut dyn FnMut(usize, usize)>,
    /// Called with the plan before any weight is read: an error ends the load (a run the
    /// plan cannot take, such as more positions than the model's context).
    pub check_plan: Option<PlanCheck<'a>>,
}

impl<'a> LoadRequest<'a> {
    /// The defaults for the checkpoint at `model`: its architecture's built-in spec, CPU only.
    pub fn new(model: &'a Path) -> LoadRequest<'a> {
        LoadRequest {
            model,
            spec: None,
            load: LoadOptions::default(),
            compile: Options::default(),
            profile: None,
            device: DeviceRequest::Cpu,
            second_device: None,
            tier: TierOptions::default(),
            dense_device_only: None,
            progress: None,
            check_plan: None,
        }
    }
}

/// Opens, compiles and loads. Errors are whole sentences for the user.
pub fn load(req: LoadRequest) -> Result<Loaded, String> {
    let checkpoint = Checkpoint::open(req.model, &req.load).map_err(|e| e.to_string())?;
    let bindings = checkpoint.bindings();
    let spec = match req.spec {
        Some(p) => specs::load(p).map_err(|d| d.to_string())?,
        None => {
            let arch = bindings.architecture().ok_or_else(|| {
                format!("{}: the checkpoint does not name its architecture; pass --spec", req.model.display())
            })?;
            specs::for_architecture(arch).ok_or_else(|| {
                format!(
                    "{}: no built-in spec serves architecture {arch:?} (served: {}); pass --spec",
                    req.model.display(),
                    specs::served().join(", ")
                )
            })?
        }
    };
    // 1. The device, and the profile the plan is compiled for.
    let (ctx, vk_opts, required) = match &req.device {
        DeviceRequest::Cpu => (None, None, false),
        DeviceRequest::Vulkan(o) | DeviceRequest::Auto(o) => {
            let required = matches!(req.device, DeviceRequest::Vulkan(_));
            match Context::new(o) {
                // A CPU Vulkan device (Lavapipe) is slower than the CPU op library: `auto`
                // takes GPUs only.
                Ok(c) if !required && c.caps().kind == coli_runtime::vk::DeviceKind::Cpu => {
                    let note =
                        format!("the only Vulkan device is a CPU device ({}); running on the CPU", c.caps().name);
                    return finish(
                        req.model,
                        checkpoint,
                        spec,
                        req.profile.unwrap_or_else(DeviceProfile::cpu_only),
                        &req.compile,
                        &req.tier,
                        req.dense_device_only,
                        req.progress,
                        req.check_plan,
                        Vec::new(),
                        note,
                    );
                }
                Ok(c) => (Some(c), Some(o.clone()), required),
                Err(e) if required => return Err(format!("--device vulkan: {e}")),
                Err(e) => {
                    let note = format!("no Vulkan device ({e}); running on the CPU");
                    return finish(
                        req.model,
                        checkpoint,
                        spec,
                        req.profile.unwrap_or_else(DeviceProfile::cpu_only),
                        &req.compile,
                        &req.tier,
                        req.dense_device_only,
                        req.progress,
                        req.check_plan,
                        Vec::new(),
                        note,
                    );
                }
            }
        }
    };
    // 2. A second device beside it, when asked for.
    let mut second_note = None;
    let second = match (&ctx, &vk_opts, &req.second_device) {
        (Some(_), Some(o), Some(s)) => {
            let opts = VkOptions { role: DeviceRole::Second { primary_name: o.device_name.clone() }, ..s.clone() };
            match Context::new(&opts) {
                Ok(c) => Some((c, opts.memory_cap)),
                Err(e) if required => return Err(format!("the second device: {e}")),
                Err(e) => {
                    second_note = Some(format!("no second device ({e})"));
                    None
                }
            }
        }
        _ => None,
    };
    let mut ctxs: Vec<(Context, Option<u64>)> =
        ctx.into_iter().map(|c| (c, vk_opts.as_ref().and_then(|o| o.memory_cap))).collect();
    ctxs.extend(second);
    let profile = match req.profile {
        Some(p) => p,
        None if ctxs.is_empty() => DeviceProfile::cpu_only(),
        None => profile_of_devices(&ctxs.iter().map(|(c, cap)| (c, *cap)).collect::<Vec<_>>()),
    };
    let mut note = match ctxs.as_slice() {
        [] => "running on the CPU".to_string(),
        [(c, _)] => format!("running on {}", c.describe()),
        [(c, _), (s, _), ..] => {
            let same = if c.physical_index() == s.physical_index() {
                " (a second logical device of the same physical device)"
            } else {
                ""
            };
            format!("running on {} and {}{same}", c.describe(), s.describe())
        }
    };
    if let Some(n) = second_note {
        note = format!("{note}; {n}");
    }
    let ctxs = ctxs.into_iter().map(|(c, _)| c).collect();
    let mut loaded = finish(
        req.model,
        checkpoint,
        spec,
        profile,
        &req.compile,
        &req.tier,
        req.dense_device_only,
        req.progress,
        req.check_plan,
        ctxs,
        note,
    )?;
    if required && loaded.device.is_none() {
        return Err(format!("--device vulkan: {}", loaded.device_note));
    }
    if loaded.device.is_none() && vk_opts.is_some() {
        loaded.device_note = format!("{}; running on the CPU", loaded.device_note);
    }
    Ok(loaded)
}

#[allow(clippy::too_many_arguments)]
fn finish(
    model_path: &Path,
    mut checkpoint: Checkpoint,
    spec: Spec,
    profile: DeviceProfile,
    options: &Options,
    tier: &TierOptions,
    dense_device_only: Option<bool>,
    progress: Option<&mut dyn FnMut(usize, usize)>,
    check_plan: Option<PlanCheck>,
    ctxs: Vec<Context>,
    mut device_note: String,
) -> Result<Loaded, String> {
    let bindings = checkpoint.bindings();
    let mut plan = compile(&spec, &bindings, &profile, options).map_err(|d| d.to_string())?;
    if let Some(check) = check_plan {
        check(&plan)?;
    }
    let mut noop = |_: usize, _: usize| {};
    let progress = progress.unwrap_or(&mut noop);
    let mut model = Model::load(&checkpoint, plan.program.clone(), progress)
        .map_err(|e| format!("{}: {e}", model_path.display()))?;
    let layers = plan.program.dims.layers;
    let device = match ctxs.first() {
        None => None,
        Some(primary) => {
            let name = primary.caps().name.clone();
            let mut options = options.clone();
            // A layer that does not fully reach its device at setup (a refused allocation) is
            // freed whole, and the plan is compiled again with that device's count = that layer.
            loop {
                let held = |d: usize| plan.placement.fits.get(d).map_or(0, |f| f.layers);
                let attempt = Chain::load(ctxs.clone(), &plan, &model, tier, &mut |_, _| {}).and_then(|d| {
                    d.check_state(&model, options.context)?;
                    Ok(d)
                });
                match attempt {
                    Ok(d) if d.has_device_frames() => {
                        let on: Vec<String> = (0..ctxs.len()).map(|k| format!("{} on d{k}", held(k))).collect();
                        let on = if ctxs.len() == 1 {
                            format!("{} of {layers} layers on the device", held(0))
                        } else {
                            format!("{} of {layers} layers", on.join(", "))
                        };
                        device_note = format!("{device_note}; {on}");
                        break Some(d);
                    }
                    Ok(_) => {
                        device_note = format!("{name} holds none of the layers (the plan keeps everything on the CPU)");
                        break None;
                    }
                    Err(ChainError { device, error: DeviceError::Vk(e) })
                        if matches!(e, VkError::OutOfMemory { .. }) && held(device.0 as usize) > 0 =>
                    {
                        let (k, n) = (device.0 as usize, held(device.0 as usize));
                        let dev_name = ctxs.get(k).map_or(name.clone(), |c| c.caps().name.clone());
                        tracing::info!(
                            "layer {} did not fit on {device} ({dev_name}) at setup ({e}); placing {} layers there",
                            plan.placement.fits[k].first_layer + n - 1,
                            n - 1
                        );
                        match k {
                            0 => options.device_layers = Some(n - 1),
                            _ => {
                                options.device_layers = Some(held(0));
                                options.second_device_layers = Some(n - 1);
                            }
                        }
                        plan = compile(&spec, &bindings, &profile, &options).map_err(|d| d.to_string())?;
                    }
                    Err(ChainError { device, error }) => {
                        let dev_name = ctxs.get(device.0 as usize).map_or(name.clone(), |c| c.caps().name.clone());
                        device_note = format!("{dev_name} cannot take this model ({error})");
                        break None;
                    }
                }
            }
        }
    };
    // 3. The dense weights on the devices only: the host copies they hold are released.
    let shared =
        !ctxs.is_empty() && ctxs.iter().all(|c| matches!(c.caps().kind, DeviceKind::Integrated | DeviceKind::Cpu));
    if device.is_some() && dense_device_only.unwrap_or(shared) {
        let names = device_only_matrices(&plan, &model.program);
        let r = model.weights.release(names.iter().map(String::as_str));
        let in_use = model.weights.sources_in_use();
        let unused: Vec<String> = checkpoint.quantized_names().into_iter().filter(|n| !in_use.contains(n)).collect();
        checkpoint.release_quantized(unused.iter().map(String::as_str));
        device_note = format!(
            "{device_note}; dense weights on the device only: {} host copies released ({}), {} mapped matrices advised away{}",
            r.copies,
            coli_compiler::cost::human(r.bytes as u64),
            r.views,
            if dense_device_only.is_none() { " (a device sharing the CPU's RAM)" } else { "" }
        );
    }
    let (tokenizer, tokenizer_note) = match tokenizer_for(&checkpoint) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    };
    Ok(Loaded { checkpoint, spec, plan, model, tokenizer, tokenizer_note, device, device_note })
}

/// The checkpoint's own tokenizer: `tokenizer.json` beside safetensors, or the GGUF's vocabulary.
pub fn tokenizer_for(ckpt: &Checkpoint) -> Result<Tokenizer, String> {
    if let Some(meta) = ckpt.gguf_metadata() {
        let vocab = GgufVocab::from_kv(meta).map_err(|e| format!("{}: {e}", ckpt.path().display()))?;
        return Tokenizer::from_gguf_vocab(&vocab).map_err(|e| format!("{}: {e}", ckpt.path().display()));
    }
    let dir = ckpt.dir().ok_or_else(|| "the checkpoint has no directory to look for tokenizer.json in".to_string())?;
    if !dir.join("tokenizer.json").is_file() {
        return Err(format!("{} has no tokenizer.json", dir.display()));
    }
    Tokenizer::from_hf_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))
}
