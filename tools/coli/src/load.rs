//! From a path on the command line to a runnable model: open the checkpoint, pick (or load)
//! the spec, compile the plan, resolve the weights, build the tokenizer. Shared by `coli exec`,
//! `coli bench` and the end-to-end tests, so all of them load models the same way.

use crate::specs;
use coli_compiler::{compile, DeviceProfile, Options, Plan, Spec};
use coli_runtime::exec::Model;
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::text::{GgufVocab, Tokenizer};
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
}

/// How to load.
pub struct LoadRequest<'a> {
    pub model: &'a Path,
    pub spec: Option<&'a Path>,
    pub load: LoadOptions,
    pub compile: Options,
    pub profile: Option<DeviceProfile>,
    /// Called with (done, total) while weights resolve.
    pub progress: Option<&'a mut dyn FnMut(usize, usize)>,
}

impl<'a> LoadRequest<'a> {
    /// The defaults for the checkpoint at `model`: its architecture's built-in spec, CPU only.
    pub fn new(model: &'a Path) -> LoadRequest<'a> {
        LoadRequest { model, spec: None, load: LoadOptions::default(), compile: Options::default(), profile: None, progress: None }
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
    let profile = req.profile.unwrap_or_else(DeviceProfile::cpu_only);
    let plan = compile(&spec, &bindings, &profile, &req.compile).map_err(|d| d.to_string())?;
    let mut noop = |_: usize, _: usize| {};
    let progress = req.progress.unwrap_or(&mut noop);
    let model = Model::load(&checkpoint, plan.program.clone(), progress).map_err(|e| e.to_string())?;
    let (tokenizer, tokenizer_note) = match tokenizer_for(&checkpoint) {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e)),
    };
    Ok(Loaded { checkpoint, spec, plan, model, tokenizer, tokenizer_note })
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
