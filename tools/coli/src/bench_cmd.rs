//! `coli bench`: prompt and decode tokens/s of a model on synthetic token ids, repeated, with
//! the median reported (llama-bench style: `-p` prompt tokens, `-n` decode tokens). Prints one
//! line per test and the kernel level, so a number in docs/BENCHMARKS.md says what ran.
//! `-d`, `-p` and `-n` are checked against the context (`--ctx`, else the model's) before any
//! weight is read.

use crate::checks;
use crate::engine_args::{heading, message, DeviceArgs, ModelArgs, DEFAULT_CHUNK};
use crate::tier_args::TierArgs;
use clap::Args;
use coli_compiler::Options;
use coli_runtime::engine::{Engine, EngineError, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::model::LoadOptions;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens per prompt test.
    #[arg(short = 'p', long, default_value_t = 128, value_parser = checks::tokens, help_heading = heading::BENCHMARK)]
    pub prompt: usize,
    /// Decode tokens per decode test.
    #[arg(short = 'n', long, default_value_t = 64, value_parser = checks::tokens, help_heading = heading::BENCHMARK)]
    pub decode: usize,
    /// Context already filled before the tests (llama-bench's `-d`): the prompt test runs after
    /// this many tokens, which are not timed, and the decode test right after it.
    #[arg(short = 'd', long, default_value_t = 0, help_heading = heading::BENCHMARK)]
    pub depth: usize,
    /// Repetitions (the median is reported).
    #[arg(short = 'r', long, default_value_t = 3, value_parser = checks::reps, help_heading = heading::BENCHMARK)]
    pub reps: usize,
    /// With `-d` and a KV split: fill the context with the same model placed without the split
    /// (the split's host part makes a long fill take minutes), then run the timed tests with
    /// the split over that context.
    #[arg(long, help_heading = heading::BENCHMARK)]
    pub fill_unsplit: bool,
    /// Context length (default: -d + -p + -n + 8, within the model's context); the tests must
    /// fit it.
    #[arg(long, value_parser = checks::context, help_heading = heading::GENERATION)]
    pub ctx: Option<usize>,
    /// Prompt rows per forward.
    #[arg(long, default_value_t = DEFAULT_CHUNK, value_parser = checks::rows, help_heading = heading::GENERATION)]
    pub chunk: usize,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub second: crate::device2_args::SecondDeviceArgs,
    #[command(flatten)]
    pub dense: crate::dense_args::DenseArgs,
    #[command(flatten)]
    pub tier: TierArgs,
    #[command(flatten)]
    pub ram: crate::ram_args::RamArgs,
    /// Routed experts on the CPU (no expert tier), for comparison.
    #[arg(long, help_heading = heading::EXPERT_TIER)]
    pub no_expert_tier: bool,
    /// Also measure aggregate decode of N sequences at once (a list: 4,16,64), each after a
    /// short prompt of its own, their `-n` decode steps batched into one forward a step, as
    /// `coli serve`'s slots run them.
    #[arg(long, value_delimiter = ',', help_heading = heading::BENCHMARK)]
    pub streams: Vec<usize>,
    #[command(flatten)]
    pub kv: crate::kv_args::KvSplitArgs,
    /// Device time per kernel (timestamp queries) and host time per phase of the frames' runs,
    /// of the last repetition's prompt and decode steps, every device's (the second's named
    /// "d1 ..."); the tok/s then include the queries' small cost.
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub profile: bool,
    /// Print each compute pipeline's driver statistics (registers, shared memory, spills:
    /// whatever the driver reports through VK_KHR_pipeline_executable_properties) to stderr
    /// when it is created, one line a pipeline, for every device; a device without the
    /// extension says so in one line.
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub pipeline_stats: bool,
    /// Prompt GEMMs in f32 tiles even where the device has cooperative matrices (comparison).
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub no_coopmat: bool,
    /// Byte arithmetic for 8-bit dot products even where the device has a packed integer
    /// dot product (comparison).
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub no_int_dot: bool,
    /// Dense products of at most this many rows take the GEMV instead of the tiled GEMMs
    /// (comparison; default 31).
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub gemv_rows: Option<usize>,
    /// Routed-expert products of at most this many rows take per-pair GEMVs instead of the
    /// grouped GEMMs (comparison; default 64).
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub moe_gemv_rows: Option<usize>,
    /// Routed-expert GEMVs of at most this many rows run one per (row, rank) pair, more one per
    /// expert over its pairs (comparison; default 8).
    #[arg(long, help_heading = heading::DIAGNOSTICS)]
    pub moe_pair_rows: Option<usize>,
}

fn session(e: &Engine, ctx: usize) -> Result<Session<'_>, String> {
    e.session_with_context(ctx).map_err(message)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The positions a bench's tests take and the context they run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Positions {
    /// `-d + -p + -n + 1`: the depth, the prompt test, the decode test after its first token.
    need: usize,
    /// The context the plan is compiled for (`--ctx`, else `need + 7`).
    compile: usize,
    /// The sessions' context (`--ctx`, else `need`).
    session: usize,
}

/// Checks `-d`, `-p` and `-n` against `--ctx` (or, without it, the most positions a context
/// holds; the model's own context is checked on its plan), without wrapping.
fn positions(a: &BenchArgs) -> Result<Positions, String> {
    let (d, p, n) = (a.depth, a.prompt, a.decode);
    let streams = if a.streams.is_empty() { 0 } else { crate::bench_streams::positions(n) };
    let need = checks::sum(&[d, p, n, 1]).map(|x| x.max(streams)).filter(|&x| x <= checks::MAX_POSITIONS).ok_or_else(
        || {
            format!(
                "-d {d} + -p {p} + -n {n} take more positions than a context holds ({}); lower -d, -p or -n",
                checks::MAX_POSITIONS
            )
        },
    )?;
    match a.ctx {
        Some(c) if need > c => Err(format!(
            "the context of {c} positions (--ctx) is too small for -d {d} + -p {p} + -n {n} (+1: {need} positions); raise --ctx or lower -d, -p or -n"
        )),
        Some(c) => Ok(Positions { need, compile: c, session: c }),
        None => Ok(Positions { need, compile: need.saturating_add(7).min(checks::MAX_POSITIONS), session: need }),
    }
}

pub fn run(a: BenchArgs) -> Result<(), String> {
    let pos = positions(&a)?;
    let path = a.model.resolve()?;
    // Without --ctx the tests must fit the model's context: checked on the plan, before any
    // weight is read.
    let load = |kv: &crate::kv_args::KvSplitArgs| {
        Engine::load(&path, &options(&a, &path, kv, pos)).map_err(|e| match e {
            EngineError::ContextTooSmall { max, .. } => format!(
                "the model's context of {max} positions is too small for -d {} + -p {} + -n {} (+1: {} positions); lower them, or run past it with --ctx",
                a.depth, a.prompt, a.decode, pos.need
            ),
            e => message(e),
        })
    };
    let engine = load(&a.kv)?;
    // The filler: the same model without a KV split (`--fill-unsplit`).
    let filler = if a.fill_unsplit && a.depth > 0 && engine.kv_split().is_some() {
        Some(load(&crate::kv_args::KvSplitArgs { no_kv_split: true, ..Default::default() })?)
    } else {
        None
    };
    if a.fill_unsplit && filler.is_none() {
        tracing::warn!(
            "--fill-unsplit: no KV split on a device with a depth (-d) to fill; the context is filled as usual"
        );
    }
    measure(&a, &path, &engine, filler.as_ref(), pos.session)
}

/// The engine options of the bench's flags, with `kv` for the KV split.
fn options(a: &BenchArgs, path: &std::path::Path, kv: &crate::kv_args::KvSplitArgs, pos: Positions) -> EngineOptions {
    let coopmat = if a.no_coopmat { coli_runtime::vk::CoopMatUse::Off } else { coli_runtime::vk::CoopMatUse::Auto };
    let int_dot = if a.no_int_dot { coli_runtime::vk::IntDotUse::Off } else { coli_runtime::vk::IntDotUse::Auto };
    let vk = coli_runtime::vk::VkOptions {
        profile: a.profile,
        pipeline_stats: a.pipeline_stats,
        coopmat,
        int_dot,
        gemv_rows: a.gemv_rows,
        moe_gemv_rows: a.moe_gemv_rows,
        moe_pair_rows: a.moe_pair_rows,
        ..a.device.vk_options()
    };
    EngineOptions {
        spec: a.model.spec.clone(),
        load: LoadOptions { quantize: a.model.quantize.map(|q| q.format()), ..LoadOptions::default() },
        compile: a.second.apply(kv.apply(Options {
            context: pos.compile,
            chunk_rows: a.chunk,
            device_layers: a.device.device_layers,
            expert_tier: !a.no_expert_tier,
            resident_experts: !a.tier.sized(),
            ..Options::default()
        })),
        second_device: a.second.options(&vk),
        device: a.device.request(vk),
        // The bench reads a history only when given one, and never writes it.
        tier: a.tier.options(path, false),
        ram: a.ram.options(),
        host_copies: a.dense.host_copies(),
        min_model_context: a.ctx.is_none().then_some(pos.need),
        ..EngineOptions::default()
    }
}

fn measure(
    a: &BenchArgs,
    path: &std::path::Path,
    loaded: &Engine,
    filler: Option<&Engine>,
    ctx: usize,
) -> Result<(), String> {
    let vocab = u32::try_from(loaded.plan().program.dims.vocab)
        .map_err(|_| format!("a vocabulary of {} ids does not fit 32-bit ids", loaded.plan().program.dims.vocab))?;
    // Deterministic ids spread over the vocabulary (avoiding the first few specials when
    // there are more).
    let (first, span) = if vocab > 10 { (10, vocab - 10) } else { (0, vocab.max(1)) };
    let id = |i: u32| first + (i.wrapping_mul(7919)) % span;
    // Positions fit 32 bits (`positions`), so every index does.
    let ids_of = |n: usize, from: u32| -> Result<Vec<u32>, String> {
        let n = u32::try_from(n).map_err(|_| format!("{n} tokens do not fit 32-bit positions"))?;
        Ok((0..n).map(|i| id(i.wrapping_add(from))).collect())
    };
    let ids = ids_of(a.prompt, 0)?;
    let fill_ids = ids_of(a.depth, 1_000_003)?;
    let chunk = a.chunk;
    // A session with the depth's tokens already in its context (filled by the unsplit twin
    // when there is one).
    let fill = |s: &mut Session| -> Result<(), String> {
        for c in fill_ids.chunks(chunk) {
            s.forward(c, LogitRows::Last).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let filled = |s: &mut Session| -> Result<(), String> {
        match filler {
            Some(f) => {
                let mut twin = session(f, ctx)?;
                fill(&mut twin)?;
                s.adopt_context(&twin).map_err(|e| e.to_string())
            }
            None => fill(s),
        }
    };
    let reps = a.reps;
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // Every device's profile: the kernels and phases of device i > 0 named "d<i> ...".
    let prof_ctx: Option<Vec<_>> = loaded.device().map(|d| d.devices().iter().map(|m| m.ctx.clone()).collect());
    let take = || {
        let (mut dev, mut host) = (Vec::new(), Vec::new());
        for (i, c) in prof_ctx.iter().flatten().enumerate() {
            let name = |(k, n, t): (String, u64, f64)| (if i == 0 { k } else { format!("d{i} {k}") }, n, t);
            dev.extend(c.take_profile().into_iter().map(name));
            host.extend(c.take_host_profile().into_iter().map(name));
        }
        dev.sort_by(|a, b| b.2.total_cmp(&a.2));
        host.sort_by(|a, b| b.2.total_cmp(&a.2));
        (dev, host)
    };
    let (mut prompt_prof, mut decode_prof) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    // Without a depth, one session serves every test, forgetting its positions before each
    // (as a server's slot does), so the device is not left idle while sessions are made
    // between repetitions (a GPU's clocks drop within tenths of a second of idling).
    let mut reused = if a.depth == 0 { Some(session(loaded, ctx)?) } else { None };
    for rep in 0..reps {
        let last = rep + 1 == reps;
        let mut fresh;
        let s = match reused.as_mut() {
            Some(s) => {
                s.truncate(0);
                s
            }
            None => {
                fresh = session(loaded, ctx)?;
                filled(&mut fresh)?;
                &mut fresh
            }
        };
        take();
        let t = Instant::now();
        for c in ids.chunks(chunk) {
            s.forward(c, LogitRows::Last).map_err(|e| e.to_string())?;
        }
        pp.push(ids.len() as f64 / t.elapsed().as_secs_f64());
        if last {
            prompt_prof = take();
        }
        // At a depth the decode test goes on in the prompt test's session (one fill a
        // repetition: a long context is expensive to fill); without, from position 0.
        if a.depth == 0 {
            s.truncate(0);
        }
        s.forward(&ids[..1], LogitRows::Last).map_err(|e| e.to_string())?;
        take();
        let t = Instant::now();
        for i in 0..a.decode {
            s.forward(&[ids[(i + 1) % ids.len()]], LogitRows::Last).map_err(|e| e.to_string())?;
        }
        tg.push(a.decode as f64 / t.elapsed().as_secs_f64());
        if last {
            decode_prof = take();
        }
    }
    let p = &loaded.plan().program;
    println!("{}", loaded.device_note());
    if let Some(k) = loaded.kv_split() {
        println!("{k}");
    }
    if filler.is_some() {
        println!("context of {} positions filled without the KV split, the timed tests with it", a.depth);
    }
    if let Some(st) = loaded.device().and_then(|d| d.kv_split_stats()) {
        println!(
            "kv split, all repetitions: {} layer steps, {} with a host part, {} (row, position) pairs on the host",
            st.steps, st.host_steps, st.host_positions
        );
    }
    if let Some(t) = loaded.tier_line() {
        println!("{t}");
    }
    if let Some(r) = loaded.ram_line() {
        println!("{r}");
    }
    println!(
        "model {} ({}, {} layers, hidden {}, vocab {}), host cpu ({} threads, kernels {})",
        path.display(),
        p.family,
        p.dims.layers,
        p.dims.hidden,
        p.dims.vocab,
        rayon::current_num_threads(),
        coli_runtime::format::kernel_level()
    );
    if let Some(line) = loaded.device().and_then(|d| d.tier_summary()) {
        println!("{line} (all repetitions)");
    }
    if let Some(line) = loaded.ram_summary() {
        println!("{line} (all repetitions)");
    }
    let at = if a.depth > 0 { format!(" @ d{}", a.depth) } else { String::new() };
    println!("pp{}{at}: {:.1} tok/s (median of {reps})", a.prompt, median(pp));
    println!("tg{}{at}: {:.1} tok/s (median of {reps})", a.decode, median(tg));
    for &n in &a.streams {
        if n == 0 {
            return Err("--streams: a level of 0 streams".into());
        }
        let run = crate::bench_streams::run_level(loaded, n, a.decode, ctx, &id, &mut || drop(take()))?;
        println!(
            "tg{} x {n} streams: {:.1} tok/s aggregate ({:.1} a stream)",
            a.decode,
            run.tok_s,
            run.tok_s / n as f64
        );
        if a.profile && prof_ctx.is_some() {
            let (dev, host) = take();
            let steps = a.decode as f64;
            report("device", &format!("{n} streams' decode (per step, mean of {})", a.decode), &dev, steps);
            report("host", &format!("{n} streams' decode (per step), phases of the frames' runs"), &host, steps);
        }
    }
    if a.profile {
        match &prof_ctx {
            None => println!("profile: no device ran (--device cpu, or none found)"),
            Some(_) if prompt_prof.0.is_empty() && decode_prof.0.is_empty() => {
                println!("profile: the device's queue has no timestamps")
            }
            Some(_) => {
                report("device", &format!("prompt of {} (the last repetition)", a.prompt), &prompt_prof.0, 1.0);
                report("host", &format!("prompt of {}, phases of the frames' runs", a.prompt), &prompt_prof.1, 1.0);
                report("device", &format!("decode (per token, mean of {})", a.decode), &decode_prof.0, a.decode as f64);
                report(
                    "host",
                    &format!("decode (per token, mean of {}), phases of the frames' runs", a.decode),
                    &decode_prof.1,
                    a.decode as f64,
                );
            }
        }
    }
    Ok(())
}

/// Device time per kernel (or host time per phase of the frames' runs), largest first: count,
/// time each and in all per `per` (1 for a prompt, the steps for decode), share.
fn report(side: &str, what: &str, prof: &[(String, u64, f64)], per: f64) {
    let total: f64 = prof.iter().map(|p| p.2).sum();
    println!("{side} time, {what}: {:.1} us", total / per * 1e6);
    for (k, cnt, t) in prof {
        println!(
            "  {k:44} {:7.1} x {:8.2} us = {:9.1} us ({:4.1}%)",
            *cnt as f64 / per,
            t / *cnt as f64 * 1e6,
            t / per * 1e6,
            100.0 * t / total.max(1e-12)
        );
    }
}
