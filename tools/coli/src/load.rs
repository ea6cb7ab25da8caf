//! From a path on the command line to a runnable model: open the checkpoint, pick (or load)
//! the spec, compile the plan, resolve the weights, build the tokenizer. Shared by `coli exec`,
//! `coli bench` and the end-to-end tests, so all of them load models the same way.

use crate::specs;
use coli_compiler::{compile, DeviceProfile, Options, Plan, Spec};
use coli_runtime::exec::device::{DeviceError, DeviceModel};
use coli_runtime::exec::probe::profile_of;
use coli_runtime::exec::Model;
use coli_runtime::vk::{Context, VkError, VkOptions};
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::text::{GgufVocab, Tokenizer};
use coli_runtime::tier::TierOptions;
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
    /// The device the plan's device frames run on, when there is one.
    pub device: Option<DeviceModel>,
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

/// How to load.
pub struct LoadRequest<'a> {
    pub model: &'a Path,
    pub spec: Option<&'a Path>,
    pub load: LoadOptions,
    pub compile: Options,
    pub profile: Option<DeviceProfile>,
    pub device: DeviceRequest,
    /// The expert tier's options (on a device with routed experts through host steps).
    pub tier: TierOptions,
    /// Called with (done, total) while weights resolve.
    pub progress: Option<&'a mut dyn FnMut(usize, usize)>,
}

impl<'a> LoadRequest<'a> {
    /// The defaults for the checkpoint at `model`: its architecture's built-in spec, CPU only.
    pub fn new(model: &'a Path) -> LoadRequest<'a> {
        LoadRequest { model, spec: None, load: LoadOptions::default(), compile: Options::default(), profile: None, device: DeviceRequest::Cpu, tier: TierOptions::default(), progress: None }
    }
}

/// Opens, compiles and loads. Errors are whole sentences for the user.
pub fn load(req: LoadRequest) -> Result<Loaded, String> {
    let checkpoint = Checkpoint::open(req.model, &req.load).map_err(|e| e.to_string())?;
    let bindings = checkpoint.bindings();
    let spec = match req.spec {
        Some(p) => specs::load(p).map_err(|d| d.to_string())?,
        None => {
            let arch = bindings.architecture().ok_or_else(|| format!("{}: the checkpoint does not name its architecture; pass --spec", req.model.display()))?;
            specs::for_architecture(arch).ok_or_else(|| {
                format!("{}: no built-in spec serves architecture {arch:?} (served: {}); pass --spec", req.model.display(), specs::served().join(", "))
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
                    let note = format!("the only Vulkan device is a CPU device ({}); running on the CPU", c.caps().name);
                    return finish(req.model, checkpoint, spec, req.profile.unwrap_or_else(DeviceProfile::cpu_only), &req.compile, &req.tier, req.progress, None, note);
                }
                Ok(c) => (Some(c), Some(o.clone()), required),
                Err(e) if required => return Err(format!("--device vulkan: {e}")),
                Err(e) => {
                    let note = format!("no Vulkan device ({e}); running on the CPU");
                    return finish(req.model, checkpoint, spec, req.profile.unwrap_or_else(DeviceProfile::cpu_only), &req.compile, &req.tier, req.progress, None, note);
                }
            }
        }
    };
    let profile = match (&ctx, req.profile) {
        (_, Some(p)) => p,
        (Some(c), None) => profile_of(c, vk_opts.as_ref().and_then(|o| o.memory_cap)),
        (None, None) => DeviceProfile::cpu_only(),
    };
    let note = match &ctx {
        Some(c) => format!("running on {}", c.describe()),
        None => "running on the CPU".to_string(),
    };
    let mut loaded = finish(req.model, checkpoint, spec, profile, &req.compile, &req.tier, req.progress, ctx, note)?;
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
    checkpoint: Checkpoint,
    spec: Spec,
    profile: DeviceProfile,
    options: &Options,
    tier: &TierOptions,
    progress: Option<&mut dyn FnMut(usize, usize)>,
    ctx: Option<Context>,
    mut device_note: String,
) -> Result<Loaded, String> {
    let bindings = checkpoint.bindings();
    let mut plan = compile(&spec, &bindings, &profile, options).map_err(|d| d.to_string())?;
    let mut noop = |_: usize, _: usize| {};
    let progress = progress.unwrap_or(&mut noop);
    let model = Model::load(&checkpoint, plan.program.clone(), progress).map_err(|e| format!("{}: {e}", model_path.display()))?;
    let layers = plan.program.dims.layers;
    let device = match ctx {
        None => None,
        Some(ctx) => {
            let name = ctx.caps().name.clone();
            // A layer that does not fully reach the device at setup (a refused allocation) is
            // freed whole, and the plan is compiled again with N = that layer.
            loop {
                let n = plan.placement.fits.first().map_or(0, |f| f.layers);
                let attempt = DeviceModel::load_with(ctx.clone(), &plan, &model, tier, &mut |_, _| {}).and_then(|d| {
                    d.new_state(&model, options.context)?;
                    Ok(d)
                });
                match attempt {
                    Ok(d) if d.has_device_frames() => {
                        device_note = format!("{device_note}; {n} of {layers} layers on the device");
                        break Some(d);
                    }
                    Ok(_) => {
                        device_note = format!("{name} holds none of the layers (the plan keeps everything on the CPU)");
                        break None;
                    }
                    Err(DeviceError::Vk(e)) if matches!(e, VkError::OutOfMemory { .. }) && n > 0 => {
                        eprintln!("coli: layer {} did not fit on {name} at setup ({e}); placing {} layers", n - 1, n - 1);
                        let fewer = Options { device_layers: Some(n - 1), ..options.clone() };
                        plan = compile(&spec, &bindings, &profile, &fewer).map_err(|d| d.to_string())?;
                    }
                    Err(e) => {
                        device_note = format!("{name} cannot take this model ({e})");
                        break None;
                    }
                }
            }
        }
    };
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
