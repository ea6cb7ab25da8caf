//! The runtime as a library: `Engine::load` takes a checkpoint's path and `EngineOptions` to a
//! runnable model (checkpoint, spec, devices, plan, weights, device frames, tokenizer), and
//! hands out `Session`s and runs generations over it, so every front end (the `coli` command
//! line, the tests, another program) loads models the same way.
//!
//! The load, in order: open the checkpoint (a Hugging Face id such as `org/name` that is not
//! a path is looked for in the hub's cache, `model::hub`); the spec (a given file, else the built-in one
//! serving the checkpoint's architecture, `specs`); open the devices and probe their profile
//! (`devices`); compile the plan; resolve the weights; load the device frames, one layer fewer
//! on a device that refuses a layer at setup; the RAM expert cache when it has a budget
//! (`ramcache`); release the host copies of what the devices hold when asked (`place`); build
//! the tokenizer (`tokenizer`). Beside the checkpoint, its
//! `generation_config.json` (`generation`) gives stop ids and sampling defaults.
//!
//! Must not: parse flags, print, or read environment variables (front ends do; the one
//! exception is the hub cache's location, read by `model::hub` when `EngineOptions::hub_cache`
//! is `None`, as the hub's own tools read it); panic on bad input (every failure is an
//! `EngineError`).

mod devices;
mod error;
pub mod generation;
mod options;
mod place;
mod prompt;
pub mod specs;
pub mod tokenizer;

pub use error::EngineError;
pub use generation::GenerationDefaults;
pub use options::{DeviceRequest, EngineOptions, HostCopies, Stage};
pub use prompt::Prompt;
pub use tokenizer::NoTokenizer;

use crate::exec::chain::Chain;
use crate::exec::{Model, Session};
use crate::generate::{generate, GenerateOptions, Generation};
use crate::model::{hub, Checkpoint};
use crate::sample::Sampler;
use crate::text::{ChatMessage, Tokenizer};
use coli_compiler::place::kv_split::KvSplit;
use coli_compiler::{compile, DraftRole, Options, Plan, Spec};
use std::path::{Path, PathBuf};

/// A model loaded and ready to run: its checkpoint, spec, plan, weights, the devices its
/// device frames run on (when any), and its tokenizer (when it carries one).
///
/// Loading the default model (SmolLM2-135M-Instruct, fetched by `tools/fetch-model.sh`) and
/// answering a chat prompt:
///
/// ```
/// use coli_runtime::engine::{Engine, EngineOptions, Prompt};
/// use coli_runtime::generate::GenerateOptions;
/// use coli_runtime::sample::{Sampler, SamplerConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let cache = std::env::var_os("XDG_CACHE_HOME")
/// #     .map(std::path::PathBuf::from)
/// #     .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
/// #     .unwrap_or_else(|| std::path::PathBuf::from(".cache"));
/// # let path = cache.join("coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
/// # if !path.is_file() {
/// #     eprintln!("note: {} is absent (run tools/fetch-model.sh); skipping", path.display());
/// #     return Ok(());
/// # }
/// let engine = Engine::load(&path, &EngineOptions::default())?;
/// let mut session = engine.session()?;
/// let question = "What is the capital of France? Answer in one sentence.";
/// let prompt = engine.prompt_ids(&Prompt::Chat { system: None, user: question })?;
/// let mut sampler = Sampler::new(SamplerConfig::greedy())?;
/// let opts = GenerateOptions { max_new_tokens: 24, ..GenerateOptions::default() };
/// let mut text = String::new();
/// let g = engine.generate(&mut session, &mut sampler, &prompt, &opts, &mut |t| text.push_str(t))?;
/// assert!(text.contains("Paris"), "{text}");
/// println!("{text} ({:.1} tok/s)", g.decode_tokens_per_sec());
/// # Ok(())
/// # }
/// ```
pub struct Engine {
    path: PathBuf,
    // The fields drop in this order: the device frames last, after the weights they mirror.
    checkpoint: Checkpoint,
    spec: Spec,
    plan: Plan,
    model: Model,
    /// The checkpoint's draft model (`EngineOptions::draft`).
    draft: Option<Model>,
    tokenizer: Result<Tokenizer, NoTokenizer>,
    generation: GenerationDefaults,
    device: Option<Chain>,
    /// The draft model's device frames, where the model runs on devices and the draft's plan
    /// loaded there (else the draft runs on the CPU).
    draft_device: Option<Chain>,
    device_note: String,
}

impl Engine {
    /// Loads the checkpoint at `path` as `opts` says (see the module doc for the steps).
    pub fn load(path: &Path, opts: &EngineOptions) -> Result<Engine, EngineError> {
        Engine::load_with_progress(path, opts, &mut |_, _, _| {})
    }

    /// `load`, calling `progress(stage, done, total)` while weights are read and uploaded.
    pub fn load_with_progress(
        path: &Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(Stage, usize, usize),
    ) -> Result<Engine, EngineError> {
        // 1. The checkpoint (a hub id found in the cache first) and the spec.
        let found = hub::locate(path, opts.hub_cache.as_deref())?;
        let mut checkpoint = Checkpoint::open(&found, &opts.load)?;
        tokenizer::check_gguf_pre(&checkpoint)
            .map_err(|source| EngineError::PreTokenizer { path: path.to_path_buf(), source })?;
        let generation = match checkpoint.dir() {
            Some(dir) => GenerationDefaults::read(dir)?,
            None => GenerationDefaults::default(),
        };
        let bindings = checkpoint.bindings();
        let spec = match &opts.spec {
            Some(p) => specs::load(p).map_err(EngineError::Spec)?,
            None => {
                let arch =
                    bindings.architecture().ok_or_else(|| EngineError::NoArchitecture { path: path.to_path_buf() })?;
                specs::for_architecture(arch).ok_or_else(|| EngineError::NoBuiltinSpec {
                    path: path.to_path_buf(),
                    arch: arch.to_string(),
                    served: specs::served().join(", "),
                })?
            }
        };
        // 2. The devices and the profile; the plan, checked before any weight is read.
        let opened = devices::open(opts)?;
        let mut note = opened.note;
        let mut options = opts.compile.clone();
        if opts.draft {
            options.draft = DraftRole::Target;
        }
        let mut plan = compile(&spec, &bindings, &opened.profile, &options).map_err(EngineError::Spec)?;
        let draft_plan = if opts.draft {
            let o = Options { draft: DraftRole::Draft, ..options.clone() };
            Some(compile(&spec, &bindings, &opened.profile, &o).map_err(EngineError::Spec)?)
        } else {
            None
        };
        if let Some(need) = opts.min_model_context {
            let max = plan.program.dims.max_context;
            if need > max {
                return Err(EngineError::ContextTooSmall { need, max });
            }
        }
        // 3. The weights, then the device frames and the host copies.
        let mut model = Model::load(&checkpoint, plan.program.clone(), &mut |d, t| progress(Stage::ReadWeights, d, t))
            .map_err(|e| EngineError::Model { path: path.to_path_buf(), source: Box::new(e) })?;
        let draft = match &draft_plan {
            Some(p) => Some(
                Model::load(&checkpoint, p.program.clone(), &mut |d, t| progress(Stage::ReadWeights, d, t))
                    .map_err(|e| EngineError::Model { path: path.to_path_buf(), source: Box::new(e) })?,
            ),
            None => None,
        };
        let from = place::Compile { spec: &spec, bindings: &bindings, profile: &opened.profile, options: &options };
        let device = place::load_chain(&opened.ctxs, &mut plan, &model, &from, &opts.tier, &mut note, progress)?;
        let draft_device = match (&draft_plan, &draft, &device) {
            (Some(p), Some(m), Some(_)) => place::load_draft_chain(&opened.ctxs, p, m, &opts.tier, &mut note),
            _ => None,
        };
        // Before any host copy is released: the cache finds the experts' bytes in the files.
        // Pins start from the tier's routing history, after what the tier's slots hold.
        let history = match (&opts.tier.history, opts.ram.pin) {
            (Some(p), pin) if pin > 0 => match crate::tier::history::History::load(p, model.program.layers.len()) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!("RAM expert cache: {e}; no pins");
                    None
                }
            },
            _ => None,
        };
        let on_device =
            |l: usize, e: usize| device.as_ref().and_then(|d| d.with_tier(|t| t.is_resident(l, e))).unwrap_or(false);
        let warm = history.as_ref().map(|h| crate::ramcache::Warm { counts: &h.layers, on_device: &on_device });
        let ram = crate::ramcache::RamCache::new(&model.program, &model.weights, &opts.ram, warm)?;
        model.set_ram_cache(ram);
        if device.is_some() {
            place::release_host_copies(opts.host_copies, &opened.ctxs, &plan, &mut model, &mut checkpoint, &mut note);
        } else if opened.opened {
            if opts.device.required() {
                return Err(EngineError::DeviceUnused(note));
            }
            note = format!("{note}; running on the CPU");
        }
        // 4. The tokenizer.
        let tokenizer = tokenizer::for_checkpoint(&checkpoint);
        Ok(Engine {
            path: path.to_path_buf(),
            checkpoint,
            spec,
            plan,
            model,
            draft,
            tokenizer,
            generation,
            device,
            draft_device,
            device_note: note,
        })
    }

    /// The checkpoint's path, as given to `load` (a hub id stays one; `checkpoint().path()` is
    /// where it was found).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The plan that runs (compiled again with fewer device layers when a device refused one).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// `None` when the checkpoint carries no tokenizer (ids in, ids out).
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref().ok()
    }

    /// What the checkpoint's `generation_config.json` asks of generation (empty without one):
    /// its EOS ids end every generation `generate` runs; its sampling settings are a front
    /// end's defaults (`GenerationDefaults::sampler`).
    pub fn generation_defaults(&self) -> &GenerationDefaults {
        &self.generation
    }

    /// Why there is no tokenizer, when there is none.
    pub fn tokenizer_note(&self) -> Option<&NoTokenizer> {
        self.tokenizer.as_ref().err()
    }

    /// The devices the plan's device frames run on; `None`: the CPU runs everything.
    pub fn device(&self) -> Option<&Chain> {
        self.device.as_ref()
    }

    /// One line saying where the model runs and why (layers per device, host copies released).
    pub fn device_note(&self) -> &str {
        &self.device_note
    }

    /// The expert tier's line (its budget and slots, or why there is none), on a device.
    pub fn tier_line(&self) -> Option<&str> {
        self.device.as_ref().and_then(|d| d.tier_line())
    }

    /// The RAM expert cache's startup line (its budget, how many experts fit, the rule), when
    /// there is a cache.
    pub fn ram_line(&self) -> Option<&str> {
        self.model.ram_cache().map(|r| r.line())
    }

    /// The per-run line of the routed pairs by where their expert came from (device tier, RAM
    /// cache, disk), with the bytes read from disk and the read rate; `None` without a cache.
    pub fn ram_summary(&self) -> Option<String> {
        let r = self.model.ram_cache()?;
        let tier = self.device.as_ref().and_then(|d| {
            d.with_tier(|t| {
                let s = t.stats();
                crate::ramcache::TierShare { device: s.device - s.pool, pool: s.pool, routed: s.routed }
            })
        });
        Some(r.summary(tier))
    }

    /// The KV split of the device layers, when they run on a device and split.
    pub fn kv_split(&self) -> Option<&KvSplit> {
        self.device.as_ref().and(self.plan.placement.kv_split.as_ref())
    }

    /// `family, N layers, hidden H, vocab V`, for a line about the model.
    pub fn summary(&self) -> String {
        let p = &self.plan.program;
        format!("{}, {} layers, hidden {}, vocab {}", p.family, p.dims.layers, p.dims.hidden, p.dims.vocab)
    }

    /// The context a session gets by default: the plan's, within the model's own.
    pub fn default_context(&self) -> usize {
        self.plan.options.context.min(self.plan.program.dims.max_context).max(1)
    }

    /// A new sequence of `default_context` positions, on the devices when there are any.
    pub fn session(&self) -> Result<Session<'_>, EngineError> {
        self.session_with_context(self.default_context())
    }

    /// A new sequence of at most `context` positions (the device's KV mirrors cap it at the
    /// plan's context), on the devices when there are any.
    pub fn session_with_context(&self, context: usize) -> Result<Session<'_>, EngineError> {
        let mut s = match &self.device {
            Some(d) => Session::on_device(&self.model, d, context).map_err(EngineError::Session)?,
            None => Session::new(&self.model, context),
        };
        if let Some(draft) = &self.draft {
            let context = s.max_context();
            let d = match &self.draft_device {
                Some(c) => Session::on_device(draft, c, context).map_err(EngineError::Session)?,
                None => Session::new(draft, context),
            };
            s.attach_draft(d).map_err(EngineError::Draft)?;
        }
        Ok(s)
    }

    /// The checkpoint's draft model, when the engine loaded it (`EngineOptions::draft`).
    pub fn draft(&self) -> Option<&Model> {
        self.draft.as_ref()
    }

    /// Whether the draft model's sessions run its plan's device frames.
    pub fn draft_on_device(&self) -> bool {
        self.draft_device.is_some()
    }

    /// Whether the model keeps a recurrent state (Gated DeltaNet, KDA, short convolutions): a
    /// session of it goes back only to the positions whose state it kept.
    pub fn keeps_recurrent_state(&self) -> bool {
        let recurrent = |o: &coli_compiler::ir::Op| matches!(o, coli_compiler::ir::Op::LinearAttention { .. });
        self.plan.program.layers.iter().any(|l| l.ops.iter().any(recurrent))
    }

    /// Where a later conversation may leave `ids` (the encoded `messages`, as a front end
    /// renders them with the chat template): the end of the leading system messages (where
    /// their rendering alone, encoded, parts from `ids`). Only for a model with a recurrent state
    /// (`keeps_recurrent_state`; an attention cache goes back anywhere); empty when the
    /// messages start with no system message, the template refuses them alone, or the
    /// rendering differs.
    pub fn branch_points(&self, messages: &[ChatMessage], ids: &[u32]) -> Vec<usize> {
        if !self.keeps_recurrent_state() {
            return Vec::new();
        }
        let Some(tok) = self.tokenizer.as_ref().ok() else { return Vec::new() };
        let Ok(template) = tok.chat_template() else { return Vec::new() };
        template.system_end(tok, messages, ids).into_iter().collect()
    }

    /// The ids of `prompt`, every one checked against the vocabulary.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        let ids = prompt.encode(self.tokenizer.as_ref())?;
        let vocab = self.plan.program.dims.vocab;
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(EngineError::TokenOutOfVocab { id, vocab });
        }
        Ok(ids)
    }

    /// Generates from `prompt` after what `session` holds (`generate::generate` with this
    /// model's tokenizer, and `generation_config.json`'s EOS ids among the stop ids);
    /// `on_text` receives the text as it becomes safe to show (nothing without a tokenizer).
    pub fn generate(
        &self,
        session: &mut Session<'_>,
        sampler: &mut Sampler,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, EngineError> {
        let mut opts = opts.clone();
        opts.stop_ids.extend(&self.generation.eos_ids);
        Ok(generate(session, self.tokenizer(), sampler, prompt, &opts, on_text)?)
    }
}
