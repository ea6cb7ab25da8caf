//! `coli compile`: compiles an architecture spec for a checkpoint and a device profile, and
//! prints the plan (text, or Graphviz with `--format dot`), or its schedule (`--schedule`).
//!
//! `coli compile graphs/olmoe.ron --model <config.json | model dir | model.gguf>
//! [--profile p.ron] [--format text|dot|schedule] [--schedule] [options]`; `coli compile graphs/olmoe.ron` alone uses
//! the spec's default configuration; `coli compile --model <checkpoint>` alone finds the spec
//! that serves the checkpoint's architecture under `--graphs` (default `graphs`), else among
//! the specs built into the runtime (`coli_runtime::engine::specs`). `--config`, `--context`
//! and `--chunk-rows` are the older spellings of `--model`, `--ctx` and `--chunk`.
//! This file only parses arguments, reads inputs and prints; it must not hold compiler logic.

use crate::engine_args::{heading, DEFAULT_CHUNK};
use coli_compiler::bind::Bindings;
use coli_compiler::cost::Format;
use coli_compiler::schedule::{print, Schedule};
use coli_compiler::spec::{spec_for_architecture, Spec};
use coli_compiler::{compile, DeviceProfile, Options};
use coli_runtime::engine::specs;
use std::path::{Path, PathBuf};

/// Arguments of `coli compile`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompileArgs {
    /// The architecture spec (`graphs/olmoe.ron`). Absent: the spec under `--graphs` that
    /// serves the checkpoint's architecture.
    #[arg(help_heading = heading::MODEL)]
    pub spec: Option<PathBuf>,
    /// The checkpoint: a `config.json`, a model directory or a `.gguf` file. Absent: the
    /// spec's `default_config`.
    #[arg(short = 'm', long, visible_alias = "config", help_heading = heading::MODEL)]
    pub model: Option<PathBuf>,
    /// Where to look for specs when none is given.
    #[arg(long, default_value = "graphs", help_heading = heading::MODEL)]
    pub graphs: PathBuf,
    /// Weight format assumed when only a config.json is given (`bf16`, `q4_k`, ...).
    #[arg(long, help_heading = heading::MODEL)]
    pub assume_format: Option<Format>,
    /// Context length the KV cache is sized for (default: 8192, what `exec`, `serve` and `chat`
    /// compile for).
    #[arg(long, visible_alias = "context", value_parser = crate::checks::context, help_heading = heading::GENERATION)]
    pub ctx: Option<usize>,
    /// Prompt rows per forward (one prompt chunk).
    #[arg(long, visible_alias = "chunk-rows", default_value_t = DEFAULT_CHUNK, value_parser = crate::checks::rows, help_heading = heading::GENERATION)]
    pub chunk: usize,
    /// A device profile (`graphs/profiles/*.ron`, or what `coli probe` prints). Absent: CPU only.
    #[arg(long, help_heading = heading::DEVICES)]
    pub profile: Option<PathBuf>,
    /// Keep the dense part on the CPU.
    #[arg(long, help_heading = heading::DEVICES)]
    pub dense_on_cpu: bool,
    /// Force the number of layers on the primary device instead of the most that fit.
    #[arg(long, help_heading = heading::DEVICES)]
    pub device_layers: Option<usize>,
    /// Force the number of layers on the second device (a profile with two devices).
    #[arg(long, help_heading = heading::DEVICES)]
    pub device2_layers: Option<usize>,
    /// Format matrices are uploaded to devices in (default: as stored).
    #[arg(long, help_heading = heading::DEVICES)]
    pub upload_format: Option<Format>,
    /// Run routed experts on the CPU instead of through the device expert tier.
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_expert_tier: bool,
    #[command(flatten)]
    pub kv: crate::kv_args::KvSplitArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, help_heading = heading::OUTPUT)]
    pub format: OutputFormat,
    /// Print the schedule (each frame's kernel calls, fused as the runtime runs them) instead
    /// of the plan; the same as `--format schedule`.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub schedule: bool,
    /// The plan of the checkpoint's draft model (its multi-token prediction layer, which
    /// `--speculate mtp` runs) instead of the model's.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub draft: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// The plan's text form.
    Text,
    /// Graphviz.
    Dot,
    /// The schedule: each frame's kernel calls.
    Schedule,
}

/// Runs `coli compile`; the plan goes to stdout. Errors are printable messages.
pub fn run(args: CompileArgs) -> Result<(), String> {
    use std::io::Write;
    let text = compile_to_string(&args)?;
    match std::io::stdout().write_all(text.as_bytes()) {
        // A reader that stopped early (`| head`) is not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write the plan: {e}")),
        _ => Ok(()),
    }
}

/// Does what `run` does and returns the output instead of printing it.
pub fn compile_to_string(args: &CompileArgs) -> Result<String, String> {
    if let Some(s) = &args.spec {
        crate::checks::spec_path(s, "the spec argument")?;
    }
    if let Some(c) = args.model.as_deref().filter(|c| !c.exists()) {
        return Err(format!(
            "no checkpoint at {}: pass a config.json, a .gguf file or a model directory (--model)",
            c.display()
        ));
    }
    // 1. The checkpoint's bindings and the spec.
    let (spec, bindings) = match (&args.spec, &args.model) {
        (Some(spec_path), config) => {
            let spec = Spec::load(spec_path).map_err(|d| d.to_string())?;
            let config = match config {
                Some(c) => c.clone(),
                None => spec.default_config().ok_or_else(|| {
                    format!("{}: the spec names no default configuration; give --model", spec_path.display())
                })?,
            };
            (spec, read_bindings(&config)?)
        }
        (None, Some(config)) => {
            let bindings = read_bindings(config)?;
            let arch = bindings
                .architecture()
                .ok_or_else(|| format!("{}: the checkpoint names no architecture", config.display()))?
                .to_string();
            let spec = match spec_for_architecture(&args.graphs, &arch) {
                Some(path) => Spec::load(&path).map_err(|d| d.to_string())?,
                // No spec file there serves it: the specs built into the binary.
                None => specs::for_architecture(&arch).ok_or_else(|| {
                    let served = specs::served().join(", ");
                    format!(
                        "no spec under {} or built in serves architecture `{arch}` (served: {served})",
                        args.graphs.display()
                    )
                })?,
            };
            (spec, bindings)
        }
        (None, None) => return Err("give a spec, a --model, or both".into()),
    };
    // 2. The profile and options.
    let profile = match &args.profile {
        Some(p) => DeviceProfile::load(p).map_err(|d| d.to_string())?,
        None => DeviceProfile::cpu_only(),
    };
    let options = options(args);
    // 3. Compile and print.
    let plan = compile(&spec, &bindings, &profile, &options).map_err(|d| d.to_string())?;
    Ok(match (args.schedule, args.format) {
        (true, _) | (_, OutputFormat::Schedule) => print(&Schedule::build(&plan.program, &plan.frames)),
        (_, OutputFormat::Text) => plan.to_string(),
        (_, OutputFormat::Dot) => plan.to_dot(),
    })
}

fn options(args: &CompileArgs) -> Options {
    let d = Options::default();
    args.kv.apply(Options {
        dense_on_device: !args.dense_on_cpu,
        expert_tier: !args.no_expert_tier,
        device_layers: args.device_layers,
        second_device_layers: args.device2_layers,
        context: args.ctx.unwrap_or(crate::load_args::DEFAULT_CONTEXT),
        chunk_rows: args.chunk,
        assumed_format: args.assume_format.unwrap_or(d.assumed_format),
        upload_format: args.upload_format.or(d.upload_format),
        draft: if args.draft { coli_compiler::DraftRole::Draft } else { d.draft },
        ..d
    })
}

/// Bindings of a `config.json` (read here), or of a model directory or GGUF file (read by the
/// runtime's checkpoint reader).
fn read_bindings(path: &Path) -> Result<Bindings, String> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        return Bindings::from_config_json(path).map_err(|e| e.to_string());
    }
    checkpoint_bindings(path)
}

/// A model directory (config.json + safetensors) or a `.gguf` file, read by the runtime's
/// checkpoint reader: its configuration and its tensor table.
fn checkpoint_bindings(path: &Path) -> Result<Bindings, String> {
    let ckpt = coli_runtime::model::Checkpoint::open(path, &Default::default()).map_err(|e| e.to_string())?;
    Ok(ckpt.bindings())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(spec: Option<&str>, model: Option<&str>) -> CompileArgs {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        CompileArgs {
            spec: spec.map(|s| root.join(s)),
            model: model.map(|c| root.join(c)),
            profile: None,
            format: OutputFormat::Text,
            schedule: false,
            draft: false,
            graphs: root.join("graphs"),
            dense_on_cpu: false,
            no_expert_tier: false,
            device_layers: None,
            device2_layers: None,
            ctx: None,
            chunk: DEFAULT_CHUNK,
            assume_format: None,
            upload_format: None,
            kv: Default::default(),
        }
    }

    #[test]
    fn a_spec_alone_uses_its_default_config() {
        let out = compile_to_string(&args(Some("graphs/olmoe.ron"), None)).unwrap();
        assert!(out.starts_with("plan olmoe for profile cpu-only\n"), "{out}");
        assert!(out.contains("program olmoe: hidden 2048, vocab 50304, layers 16"));
    }

    #[test]
    fn a_config_alone_finds_its_spec_and_options_reach_the_plan() {
        let mut a = args(None, Some("graphs/configs/qwen3-30b-a3b.json"));
        a.profile = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/profiles/h200.ron"));
        a.device_layers = Some(5);
        a.format = OutputFormat::Dot;
        let out = compile_to_string(&a).unwrap();
        assert!(out.starts_with("digraph plan {"), "{}", &out[..200]);
        a.format = OutputFormat::Text;
        let out = compile_to_string(&a).unwrap();
        assert!(out.contains("placement: prologue host, l0..l4 d0, l5..l47 host, head host"), "{out}");
    }

    #[test]
    fn the_schedule_prints_each_frames_calls() {
        let mut a = args(Some("graphs/olmoe.ron"), None);
        a.profile = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs/profiles/h200.ron"));
        a.schedule = true;
        let out = compile_to_string(&a).unwrap();
        assert!(out.starts_with("frame 0 on "), "{}", &out[..200]);
        assert!(out.contains(" = matmul rms_norm("), "{out}");
        assert!(out.contains("lm_head.weight") && out.contains("[tail]"), "{out}");
        a.schedule = false;
        a.format = OutputFormat::Schedule;
        assert_eq!(compile_to_string(&a).unwrap(), out);
    }

    #[test]
    fn errors_are_messages() {
        let e = compile_to_string(&args(None, None)).unwrap_err();
        assert!(e.contains("give a spec"));
        // DeepSeek-V3's configuration names its experts `n_routed_experts`: OLMoE's spec says where.
        let e =
            compile_to_string(&args(Some("graphs/olmoe.ron"), Some("graphs/configs/deepseek-v3.json"))).unwrap_err();
        assert!(e.contains("olmoe.ron:") && e.contains("symbol `experts` has no value"), "{e}");
    }
}
