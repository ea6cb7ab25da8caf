//! Several requests at once through `coli_runtime::slots`, against each request run alone:
//! - interleaved greedy requests (more than the slots, so some wait) give exactly the tokens
//!   each gives alone through `run_greedy` (a separate loop over `Session::forward`), on the
//!   CPU, and on the Vulkan device with the expert tier serving part of the routed experts;
//! - a batched forward (one token for each of several sessions) gives each session the logits
//!   it gets alone, within `BATCH_TOLERANCE` of the largest |logit|; on the Vulkan device
//!   (attention, MLA, routed experts in the frames and through the tier), within
//!   `DEVICE_TOLERANCE` of what each session gets alone on the CPU;
//! - 8 requests at once on the device (batched decode steps) give exactly the tokens each gives
//!   alone, also where the plan cannot batch (a recurrent layer on the device: one forward each);
//! - a batched decode step on the device is recorded once for its sessions in their order and
//!   replayed after (counted by `Chain::replay_stats`), within `DEVICE_TOLERANCE` of the CPU; a
//!   session that leaves (dropped) takes its recordings with it, one that joins makes new ones;
//! - prefix reuse: a request that extends a finished one takes that prefix from the cache
//!   (asserted from the cached-token count) and gives the tokens a fresh session gives; a
//!   recurrent model goes back to a kept state, at a request's mark (a shared system prompt's
//!   end) exactly;
//! - a device lost in a batched decode step: every request of the step finishes on the CPU
//!   with the tokens the CPU gives;
//! - a request cancelled mid-prompt frees its slot, and bad requests are refused with typed
//!   errors while the others run on.
//!
//! Tokens are compared exactly: greedy decoding over the same forwards.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use coli_runtime::generate::StopReason;
use coli_runtime::slots::{AdmitError, Event, Finish, Request, Slots};
use coli_runtime::tier::TierOptions;
use coli_runtime::vk::{FaultInjection, VkOptions};
use common::{fixture_dir, run_greedy};
use std::collections::HashMap;

const CONTEXT: usize = 64;

fn prompts() -> Vec<Vec<u32>> {
    (0..6u32).map(|k| (0..3 + 2 * k as usize).map(|i| (i as u32 * 37 + k * 101 + 5) % 250).collect()).collect()
}

/// Runs every request through `n` slots (admitting as slots free up), and returns each one's
/// finish, by request index.
fn run_all(engine: &Engine, n: usize, requests: &[Request], chunk: usize) -> Vec<Finish> {
    let mut slots = Slots::new(engine, n, CONTEXT, chunk).unwrap();
    let mut waiting: Vec<(u64, Request)> =
        requests.iter().cloned().enumerate().map(|(i, r)| (i as u64, r)).rev().collect();
    let mut done: HashMap<u64, Finish> = HashMap::new();
    while done.len() < requests.len() {
        while slots.free() > 0 {
            let Some((id, r)) = waiting.pop() else { break };
            slots.admit(id, r).unwrap();
        }
        for (id, e) in slots.step() {
            match e {
                Event::Done(f) => {
                    done.insert(id, f);
                }
                Event::Failed(e) => panic!("request {id} failed: {e}"),
                Event::Text(_) => {}
            }
        }
    }
    (0..requests.len() as u64).map(|i| done.remove(&i).unwrap()).collect()
}

fn alone(engine: &Engine, prompt: &[u32], steps: usize) -> Vec<u32> {
    run_greedy(engine, prompt, 4, steps, CONTEXT, false).toks
}

fn check_interleaved(engine: &Engine, what: &str) {
    let steps = 5;
    let requests: Vec<Request> = prompts().into_iter().map(|p| Request::greedy(p, steps)).collect();
    let got = run_all(engine, 3, &requests, 4);
    for (r, f) in requests.iter().zip(&got) {
        assert_eq!(f.generated, alone(engine, &r.prompt, steps), "{what}: prompt {:?}", r.prompt);
        assert_eq!((f.reason, f.prompt_tokens), (StopReason::MaxTokens, r.prompt.len()));
    }
}

#[test]
fn interleaved_requests_give_what_each_gives_alone_on_the_cpu() {
    // Attention with RoPE, MoE, MLA, Gated DeltaNet's recurrent state, sliding windows with sinks,
    // DeepSeek Sparse Attention's index keys (GLM's shared selections).
    for name in ["olmoe", "llama", "deepseek_v3", "qwen3_next", "gpt_oss", "glm_moe_dsa"] {
        let engine = common::load_model(&fixture_dir(name));
        check_interleaved(&engine, name);
    }
}

/// Tolerance of a batched forward against one forward per session: the rows meet the same
/// weights in other GEMM tiles, so sums may round differently.
const BATCH_TOLERANCE: f32 = 1e-4;

#[test]
fn a_batched_forward_gives_each_session_its_own_logits() {
    for name in ["olmoe", "qwen3_next"] {
        let engine = common::load_model(&fixture_dir(name));
        let prompts = prompts();
        let mut alone = Vec::new();
        let mut batched: Vec<Session> = Vec::new();
        for p in &prompts[..4] {
            let mut s = Session::new(engine.model(), CONTEXT);
            s.forward(p, LogitRows::Last).unwrap();
            let mut t = Session::new(engine.model(), CONTEXT);
            t.forward(p, LogitRows::Last).unwrap();
            alone.push(t);
            batched.push(s);
        }
        let next = [7u32, 70, 140, 210];
        for step in 0..3 {
            let want: Vec<Vec<f32>> =
                alone.iter_mut().zip(next).map(|(s, t)| s.forward(&[t + step], LogitRows::Last).unwrap()).collect();
            let tokens: Vec<u32> = next.iter().map(|t| t + step).collect();
            let mut refs: Vec<&mut Session> = batched.iter_mut().collect();
            let got = Session::forward_batch(&mut refs, &tokens).unwrap();
            let bound = BATCH_TOLERANCE * common::max_abs(&want);
            let err = common::max_abs_diff(&got, &want);
            assert!(err <= bound, "{name} step {step}: max |batched - alone| = {err} > {bound}");
        }
        assert!(batched.iter().zip(&alone).all(|(b, a)| b.pos() == a.pos()));
        let mut refs: Vec<&mut Session> = batched.iter_mut().collect();
        assert!(Session::forward_batch(&mut refs, &[1, 2]).is_err(), "one token per session");
    }
}

#[test]
fn interleaved_requests_give_what_each_gives_alone_through_the_expert_tier() {
    let opts = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows: 4, resident_experts: false, ..Options::default() },
        tier: TierOptions { max_experts: Some(3), deterministic: true, ..TierOptions::default() },
        ..EngineOptions::default()
    };
    let engine = match Engine::load(&fixture_dir("olmoe"), &opts) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("note: no Vulkan device ({e}); skipping");
            return;
        }
    };
    let d = engine.device().expect("on the device");
    assert!(d.tier_line().unwrap_or_default().starts_with("expert tier on"), "{:?}", d.tier_line());
    check_interleaved(&engine, "olmoe through the tier");
    let routed = d.with_tier(|t| (t.stats().routed, t.stats().device)).unwrap();
    assert!(routed.1 > 0 && routed.1 < routed.0, "the tier served part of the pairs: {routed:?}");
}

/// Tolerance of the device's batched forward against the CPU, as the device's other
/// comparisons with the CPU (tests/vulkan.rs).
const DEVICE_TOLERANCE: f32 = 1e-4;

/// `name`'s fixture on the Vulkan device, prompts in chunks of `chunk_rows` (`None`: no device).
fn on_vulkan(name: &str, chunk_rows: usize, tier: Option<TierOptions>) -> Option<Engine> {
    let opts = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows, resident_experts: tier.is_none(), ..Options::default() },
        tier: tier.unwrap_or_default(),
        ..EngineOptions::default()
    };
    match Engine::load(&fixture_dir(name), &opts) {
        Ok(e) if e.device().is_some() => Some(e),
        Ok(e) => {
            eprintln!("note: {name} not on a device ({}); skipping", e.device_note());
            None
        }
        Err(e) => {
            eprintln!("note: no Vulkan device ({e}); skipping");
            None
        }
    }
}

fn tier3() -> Option<TierOptions> {
    Some(TierOptions { max_experts: Some(3), deterministic: true, ..TierOptions::default() })
}

/// For each `(prompt, context)`, a session of `engine`'s model on the CPU and one on its
/// device, each fed the prompt.
fn fed_on_both<'e>(engine: &'e Engine, prompts: &[(Vec<u32>, usize)]) -> (Vec<Session<'e>>, Vec<Session<'e>>) {
    let mut cpu = Vec::new();
    let mut dev = Vec::new();
    for (p, ctx) in prompts {
        let mut c = Session::new(engine.model(), *ctx);
        c.forward(p, LogitRows::Last).unwrap();
        let mut d = engine.session_with_context(*ctx).unwrap();
        d.forward(p, LogitRows::Last).unwrap();
        cpu.push(c);
        dev.push(d);
    }
    (cpu, dev)
}

/// One decode step of `tokens` (one a session): each CPU session alone against the device
/// sessions in one batched forward, within `DEVICE_TOLERANCE` of the largest CPU logit; returns
/// the error.
fn batched_step_against_cpu(cpu: &mut [Session], dev: &mut [Session], tokens: &[u32], what: &str) -> f32 {
    let want: Vec<Vec<f32>> =
        cpu.iter_mut().zip(tokens).map(|(s, &t)| s.forward(&[t], LogitRows::Last).unwrap()).collect();
    let mut refs: Vec<&mut Session> = dev.iter_mut().collect();
    let got = Session::forward_batch(&mut refs, tokens).unwrap();
    let bound = DEVICE_TOLERANCE * common::max_abs(&want);
    let err = common::max_abs_diff(&got, &want);
    assert!(err <= bound, "{what}: max |device batched - cpu| = {err} > {bound}");
    err
}

#[test]
fn a_batched_forward_on_the_device_gives_each_session_what_the_cpu_gives() {
    // Attention with RoPE, MLA, experts resident in the frames, experts through the tier,
    // sliding windows with sinks, DeepSeek Sparse Attention's indexer per sequence over its own
    // index-key mirror; Gated DeltaNet (Qwen3-Next, Qwen3.5) and KDA (Kimi Linear) per sequence
    // over its own recurrent state, the sequences at different positions; Inkling's short
    // convolutions over each sequence's ring and its relative logits over each one's rows;
    // DeepSeek V4's hyper-connections over the streams of every sequence's rows, and its
    // attention over each sequence's own compressed entries.
    let cases = [
        ("llama", None),
        ("deepseek_v3", None),
        ("olmoe", None),
        ("olmoe", tier3()),
        ("gpt_oss", None),
        ("deepseek_v32", None),
        ("qwen3_next", None),
        ("qwen3_5_moe", None),
        ("kimi_linear", None),
        ("inkling", None),
        ("deepseek_v4", None),
        ("deepseek_v4_compressed", None),
    ];
    for (name, tier) in cases {
        let what = format!("{name}{}", if tier.is_some() { " through the tier" } else { "" });
        let Some(engine) = on_vulkan(name, 8, tier) else { return };
        let prompts: Vec<Vec<u32>> =
            (0..6u32).map(|k| (0..2 + 3 * k as usize).map(|i| (i as u32 * 29 + k * 53 + 3) % 250).collect()).collect();
        let with_ctx: Vec<(Vec<u32>, usize)> = prompts.iter().map(|p| (p.clone(), CONTEXT)).collect();
        let (mut cpu, mut dev) = fed_on_both(&engine, &with_ctx);
        assert!(dev.iter().all(|d| d.on_a_device() && d.batches()), "{what}: device sessions that batch");
        for step in 0..4u32 {
            let tokens: Vec<u32> = (0..prompts.len() as u32).map(|i| (i * 41 + step * 7 + 1) % 250).collect();
            let err = batched_step_against_cpu(&mut cpu, &mut dev, &tokens, &format!("{what} step {step}"));
            eprintln!("{what} step {step}: max |device batched - cpu| = {err:.3e}");
        }
        assert!(dev.iter_mut().all(|s| s.on_a_device() && s.take_notice().is_none()), "{what}: still on the device");
        assert!(dev.iter().zip(&cpu).all(|(d, c)| d.pos() == c.pos()));
    }
}

/// Sessions of different contexts in one batched step: a sliding window's mirror is a ring of
/// the window and a chunk where that is shorter than the context (4 + 8 rows here), the whole
/// context otherwise (12 positions), so the step's sequences attend over mirrors of both kinds
/// (gpt-oss's sliding layers; DeepSeek V4's compressed attention over its window's rows), and
/// the indexers score each sequence's positions at its own context's stride (DeepSeek V3.2's
/// and V4's compressor's: a step stopped on the device, "a stride of 4 under 6 positions", when
/// they took the first sequence's): each within the bound above of the CPU, on the device.
/// Prompt chunks of several sessions in one forward (`forward_batch_rows`: feeds of 1 to 8 rows
/// beside one-token decode feeds, the sessions at different positions): each session's last
/// row within `DEVICE_TOLERANCE` of what it gets alone on the CPU, for every family the
/// batched decode step covers; a feed past the chain's rows, an empty one and a count that
/// does not match are refused with nothing moved.
#[test]
fn prompt_chunks_of_several_sessions_in_one_forward_give_what_each_gives_alone() {
    let cases = [
        ("llama", None),
        ("deepseek_v3", None),
        ("olmoe", tier3()),
        ("gpt_oss", None),
        ("deepseek_v32", None),
        ("qwen3_next", None),
        ("kimi_linear", None),
        ("inkling", None),
        ("deepseek_v4_compressed", None),
    ];
    for (name, tier) in cases {
        let Some(engine) = on_vulkan(name, 8, tier) else { return };
        let prompts: Vec<(Vec<u32>, usize)> = (0..4usize)
            .map(|k| ((0..1 + 2 * k).map(|i| (i as u32 * 23 + k as u32 * 41 + 7) % 250).collect(), CONTEXT))
            .collect();
        let (mut cpu, mut dev) = fed_on_both(&engine, &prompts);
        for step in 0..3usize {
            // Sessions 0 and 2 feed a chunk of 8, 5 or 2 rows, 1 and 3 one token.
            let feeds: Vec<Vec<u32>> = (0..4usize)
                .map(|i| {
                    let len = if i % 2 == 0 { 8 - 3 * step } else { 1 };
                    (0..len).map(|j| ((i * 37 + step * 11 + j * 5 + 2) % 250) as u32).collect()
                })
                .collect();
            let want: Vec<Vec<f32>> =
                cpu.iter_mut().zip(&feeds).map(|(s, f)| s.forward(f, LogitRows::Last).unwrap()).collect();
            let mut refs: Vec<&mut Session> = dev.iter_mut().collect();
            let views: Vec<&[u32]> = feeds.iter().map(|f| &f[..]).collect();
            let got = Session::forward_batch_rows(&mut refs, &views).unwrap();
            let bound = DEVICE_TOLERANCE * common::max_abs(&want);
            let err = common::max_abs_diff(&got, &want);
            assert!(err <= bound, "{name} step {step}: max |device batched - cpu| = {err} > {bound}");
        }
        for (s, c) in dev.iter_mut().zip(&cpu) {
            assert!(s.on_a_device(), "{name}: {:?}", s.take_notice());
            assert_eq!(s.pos(), c.pos());
        }
        let pos: Vec<usize> = dev.iter().map(|s| s.pos()).collect();
        let mut refs: Vec<&mut Session> = dev.iter_mut().collect();
        let long = [1u32; 9];
        for (feeds, why) in [
            (vec![&[1u32][..], &long[..], &[2], &[3]], "a feed longer than the chain's rows"),
            (vec![&[1u32][..], &[], &[2], &[3]], "an empty feed"),
            (vec![&[1u32][..]], "one feed per session"),
        ] {
            let e = Session::forward_batch_rows(&mut refs, &feeds).unwrap_err().to_string();
            assert!(e.contains(why), "{name}: {e}");
        }
        assert_eq!(refs.iter().map(|s| s.pos()).collect::<Vec<_>>(), pos, "{name}: nothing moved");
    }
}

#[test]
fn a_batched_step_over_sessions_of_different_contexts_gives_what_the_cpu_gives() {
    for name in ["gpt_oss", "deepseek_v4_compressed", "deepseek_v32"] {
        let Some(engine) = on_vulkan(name, 8, None) else { return };
        let contexts = [12, CONTEXT, 12, CONTEXT, CONTEXT];
        // Past the ring's 12 rows where the context has room.
        let prompts: Vec<(Vec<u32>, usize)> = contexts
            .iter()
            .enumerate()
            .map(|(k, &ctx)| {
                let len = if ctx == 12 { 3 + k } else { 15 + 3 * k };
                ((0..len).map(|i| (i as u32 * 31 + k as u32 * 17 + 5) % 250).collect(), ctx)
            })
            .collect();
        let (mut cpu, mut dev) = fed_on_both(&engine, &prompts);
        for step in 0..4u32 {
            let tokens: Vec<u32> = (0..contexts.len() as u32).map(|i| (i * 37 + step * 11 + 2) % 250).collect();
            batched_step_against_cpu(&mut cpu, &mut dev, &tokens, &format!("{name} step {step}"));
        }
        for s in dev.iter_mut() {
            assert!(s.on_a_device(), "{name}: {:?}", s.take_notice());
        }
    }
}

#[test]
fn eight_requests_at_once_on_the_device_give_what_each_gives_alone() {
    let steps = 6;
    // qwen3_next and kimi_linear keep a recurrent state per sequence on the device, Inkling a
    // ring of short-convolution inputs and relative logits per sequence.
    let models = [
        ("llama", None),
        ("olmoe", tier3()),
        ("deepseek_v3", None),
        ("qwen3_next", None),
        ("kimi_linear", None),
        ("inkling", None),
    ];
    for (name, tier) in models {
        let Some(engine) = on_vulkan(name, 4, tier) else { return };
        let batches = engine.session_with_context(CONTEXT).unwrap().batches();
        assert!(batches, "{name}: its device sessions batch");
        let requests: Vec<Request> = (0..8u32)
            .map(|k| (0..1 + 2 * k as usize).map(|i| (i as u32 * 31 + k * 67 + 9) % 250).collect())
            .map(|p| Request::greedy(p, steps))
            .collect();
        let got = run_all(&engine, 8, &requests, 4);
        for (r, f) in requests.iter().zip(&got) {
            assert_eq!(f.generated, alone(&engine, &r.prompt, steps), "{name}: prompt {:?}", r.prompt);
        }
    }
}

/// Qwen3-Next too: each sequence's recurrent state goes back to the host's, which the CPU
/// continues from.
#[test]
fn a_device_lost_in_a_batched_step_finishes_every_request_on_the_cpu() {
    for name in ["llama", "qwen3_next"] {
        lost_in_a_batched_step(name);
    }
}

fn lost_in_a_batched_step(name: &str) {
    let dir = fixture_dir(name);
    let steps = 6;
    let requests: Vec<Request> = (0..4u32)
        .map(|k| (0..2 + k as usize).map(|i| (i as u32 * 13 + k * 71 + 2) % 250).collect())
        .map(|p| Request::greedy(p, steps))
        .collect();
    // Each prompt is one forward (one submission): the 7th submission is a batched decode step.
    let fault = FaultInjection { fail_submit: Some(7), fail_alloc: None };
    let opts = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions { fault: Some(fault), ..VkOptions::default() }),
        compile: Options { context: CONTEXT, chunk_rows: 4, ..Options::default() },
        ..EngineOptions::default()
    };
    let engine = match Engine::load(&dir, &opts) {
        Ok(e) if e.device().is_some() => e,
        _ => {
            eprintln!("note: no Vulkan device; skipping");
            return;
        }
    };
    let mut slots = Slots::new(&engine, 4, CONTEXT, 4).unwrap();
    for (i, r) in requests.iter().enumerate() {
        slots.admit(i as u64, r.clone()).unwrap();
    }
    let mut done: HashMap<u64, Finish> = HashMap::new();
    while done.len() < requests.len() {
        for (id, e) in slots.step() {
            match e {
                Event::Done(f) => drop(done.insert(id, f)),
                Event::Failed(e) => panic!("request {id} failed: {e}"),
                Event::Text(_) => {}
            }
        }
    }
    assert!(!slots.on_devices(), "{name}: the device failed");
    let notices = slots.take_notices();
    assert!(notices.iter().any(|n| n.contains("continue on the CPU")), "{name}: {notices:?}");
    let cpu = common::load_model(&dir);
    for (i, r) in requests.iter().enumerate() {
        let want = run_greedy(&cpu, &r.prompt, 4, steps, CONTEXT, false).toks;
        assert_eq!(done[&(i as u64)].generated, want, "{name}: prompt {:?}", r.prompt);
    }
}

#[test]
fn a_request_that_extends_a_finished_one_reuses_its_prefix() {
    let engine = common::load_model(&fixture_dir("olmoe"));
    let mut slots = Slots::new(&engine, 2, CONTEXT, 4).unwrap();
    let first: Vec<u32> = (0..9).map(|i| (i * 13 + 2) % 250).collect();
    assert_eq!(slots.admit(1, Request::greedy(first.clone(), 4)).unwrap(), 0);
    let f = drain(&mut slots, 1);
    // The next turn: the first prompt, its answer, and more.
    let mut second = first.clone();
    second.extend_from_slice(&f.generated);
    second.extend_from_slice(&[7, 8, 9]);
    let cached = slots.admit(2, Request::greedy(second.clone(), 4)).unwrap();
    // Everything the slot ran: the prompt and the answer but its last token (never run).
    assert_eq!(cached, first.len() + f.generated.len() - 1);
    let g = drain(&mut slots, 2);
    assert_eq!(g.cached_tokens, cached);
    assert_eq!(g.generated, alone(&engine, &second, 4));
    // The same prompt again: all but its last position comes from the cache.
    assert_eq!(slots.admit(3, Request::greedy(second.clone(), 4)).unwrap(), second.len() - 1);
    assert_eq!(drain(&mut slots, 3).generated, g.generated);
    // An unrelated prompt takes the other slot (nothing shared) and starts at 0.
    assert_eq!(slots.admit(4, Request::greedy(vec![200, 201], 2)).unwrap(), 0);
}

#[test]
fn a_recurrent_model_reuses_a_prefix_it_can_continue_from() {
    let cpu = common::load_model(&fixture_dir("qwen3_next"));
    recurrent_prefixes(&cpu, &cpu);
    let opts = EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows: 4, ..Options::default() },
        ..EngineOptions::default()
    };
    match Engine::load(&fixture_dir("qwen3_next"), &opts) {
        // The states on the device: each forward from a kept state uploads it again.
        Ok(e) if e.device().is_some() => recurrent_prefixes(&e, &cpu),
        _ => eprintln!("note: no Vulkan device; the device half skipped"),
    }
}

/// Gated DeltaNet keeps one state per layer: the next turn continues from it; a prompt that
/// leaves the cached ids midway starts from the latest state kept within the shared prefix
/// (the end of a prompt chunk), else at 0. Tokens as `reference` gives each prompt alone.
fn recurrent_prefixes(engine: &Engine, reference: &Engine) {
    let mut slots = Slots::new(engine, 1, CONTEXT, 4).unwrap();
    let first: Vec<u32> = (0..7).map(|i| (i * 19 + 3) % 250).collect();
    slots.admit(1, Request::greedy(first.clone(), 3)).unwrap();
    let f = drain(&mut slots, 1);
    let mut second = first.clone();
    second.extend_from_slice(&f.generated);
    second.push(42);
    let cached = slots.admit(2, Request::greedy(second.clone(), 3)).unwrap();
    assert_eq!(cached, first.len() + f.generated.len() - 1);
    assert_eq!(drain(&mut slots, 2).generated, alone(reference, &second, 3));
    // Chunks of 4: the states at 4 and 7 (the first prompt's chunks) were kept. Six tokens in
    // common go back to 4; four as well; three to 0.
    for (id, shared, cached) in [(3, 6, 4), (4, 4, 4), (5, 3, 0)] {
        let mut other = first[..shared].to_vec();
        other.extend_from_slice(&[99, 98]);
        assert_eq!(slots.admit(id, Request::greedy(other.clone(), 3)).unwrap(), cached, "{shared} shared");
        let f = drain(&mut slots, id);
        assert_eq!(f.cached_tokens, cached);
        assert_eq!(f.generated, alone(reference, &other, 3), "{shared} shared");
        // Run the first prompt again (its chunks' states kept again) for the next case.
        slots.admit(id + 10, Request::greedy(first.clone(), 1)).unwrap();
        drain(&mut slots, id + 10);
    }
    // A mark (the end of a shared system prompt, `Request::marks`) ends a chunk, so a prompt
    // that shares exactly that much starts there: chunks of 4 with a mark at 6 keep the states
    // at 4, 6 and 9. Without the mark (first) the same pair goes back to 4.
    let system: Vec<u32> = (0..6).map(|i| (i * 23 + 5) % 250).collect();
    let with = |tail: &[u32], marks: &[usize]| {
        let mut r = Request::greedy([&system[..], tail].concat(), 3);
        r.marks = marks.to_vec();
        r
    };
    for (id, marks, cached) in [(40, vec![], 4), (30, vec![6], 6)] {
        slots.admit(id, with(&[11, 12, 13], &marks)).unwrap();
        drain(&mut slots, id);
        let other = with(&[14, 15], &marks);
        assert_eq!(slots.admit(id + 1, other.clone()).unwrap(), cached, "marks {marks:?}");
        let f = drain(&mut slots, id + 1);
        assert_eq!(f.cached_tokens, cached);
        assert_eq!(f.generated, alone(reference, &other.prompt, 3), "marks {marks:?}");
    }
    // What prefix reuse holds: the kept states are part of the slot's cache.
    let (cache, kept) = slots.cache_bytes();
    assert!(kept > 0 && kept < cache, "{kept} of {cache} bytes kept");
}

/// `ChatTemplate::system_end`: conversations that share a system prompt share the ids up to
/// that position (so a slot's state kept there serves the next one), and a conversation without
/// a system message has none; `Engine::branch_points` gives it only for a model with a recurrent
/// state (the default model has none).
#[test]
fn the_end_of_a_shared_system_prompt_is_where_conversations_branch() {
    let Some(path) = common::default_model_path() else { return };
    let engine = common::load_model(&path);
    let tok = engine.tokenizer().expect("the default model has a tokenizer");
    let template = tok.chat_template().unwrap();
    use coli_runtime::text::ChatMessage;
    let sys = ChatMessage::system("You answer in one short sentence.");
    let encode = |m: &[ChatMessage]| tok.encode(&template.render(m, true).unwrap(), false).unwrap();
    let a = [sys.clone(), ChatMessage::user("What is the capital of France?")];
    let b = [sys.clone(), ChatMessage::user("Name a prime number.")];
    let (ia, ib) = (encode(&a), encode(&b));
    let end = template.system_end(tok, &a, &ia).expect("a system prompt ends somewhere");
    assert_eq!(template.system_end(tok, &b, &ib), Some(end));
    let shared = ia.iter().zip(&ib).take_while(|(x, y)| x == y).count();
    assert!(end <= shared && end < ia.len(), "end {end}, shared {shared}, {} ids", ia.len());
    assert_eq!(template.system_end(tok, &a[1..], &encode(&a[1..])), None, "no system message");
    assert_eq!(template.system_end(tok, &a[..1], &encode(&a[..1])), None, "nothing after it");
    assert!(!engine.keeps_recurrent_state() && engine.branch_points(&a, &ia).is_empty());
    let recurrent = common::load_model(&fixture_dir("qwen3_next"));
    assert!(recurrent.keeps_recurrent_state());
}

fn drain(slots: &mut Slots, id: u64) -> Finish {
    loop {
        for (i, e) in slots.step() {
            assert_eq!(i, id);
            match e {
                Event::Done(f) => return f,
                Event::Failed(e) => panic!("{e}"),
                Event::Text(_) => {}
            }
        }
    }
}

#[test]
fn cancelled_and_bad_requests_leave_the_others_running() {
    let engine = common::load_model(&fixture_dir("olmoe"));
    let mut slots = Slots::new(&engine, 2, CONTEXT, 2).unwrap();
    let vocab = engine.plan().program.dims.vocab;
    assert_eq!(slots.admit(9, Request::greedy(Vec::new(), 3)), Err(AdmitError::EmptyPrompt));
    assert_eq!(
        slots.admit(9, Request::greedy(vec![1; CONTEXT + 1], 3)),
        Err(AdmitError::PromptTooLong { prompt: CONTEXT + 1, context: CONTEXT })
    );
    assert_eq!(
        slots.admit(9, Request::greedy(vec![1, vocab as u32], 3)),
        Err(AdmitError::TokenOutOfVocab { id: vocab as u32, vocab })
    );
    let mut bad = Request::greedy(vec![1, 2], 3);
    bad.sampler.top_p = 0.0;
    assert!(matches!(slots.admit(9, bad), Err(AdmitError::Sampler(_))));
    let keep: Vec<u32> = (0..7).collect();
    slots.admit(1, Request::greedy(keep.clone(), 3)).unwrap();
    slots.admit(2, Request::greedy((10..30).collect(), 3)).unwrap();
    assert_eq!(slots.admit(3, Request::greedy(vec![5], 3)), Err(AdmitError::Busy));
    slots.step();
    assert!(slots.cancel(2));
    assert!(!slots.cancel(2));
    assert_eq!(slots.running(), vec![1]);
    assert_eq!(drain(&mut slots, 1).generated, alone(&engine, &keep, 3));
    assert_eq!(slots.free(), 2);
}

/// Each session's prompt on the CPU and on the device (`contexts[k]` positions each).
fn paired<'e>(engine: &'e Engine, contexts: &[usize], seed: u32) -> (Vec<Session<'e>>, Vec<Session<'e>>) {
    let (mut cpu, mut dev) = (Vec::new(), Vec::new());
    for (k, &ctx) in contexts.iter().enumerate() {
        let len = if ctx < CONTEXT { 3 + k } else { 13 + 3 * k };
        let p: Vec<u32> = (0..len).map(|i| (i as u32 * 23 + k as u32 * 19 + seed) % 250).collect();
        let mut c = Session::new(engine.model(), ctx);
        c.forward(&p, LogitRows::Last).unwrap();
        let mut d = engine.session_with_context(ctx).unwrap();
        d.forward(&p, LogitRows::Last).unwrap();
        cpu.push(c);
        dev.push(d);
    }
    (cpu, dev)
}

/// One batched decode step of `dev` against one forward each of `cpu`, within
/// `DEVICE_TOLERANCE`.
fn batched_step(what: &str, step: u32, cpu: &mut [&mut Session], dev: &mut [&mut Session]) {
    let tokens: Vec<u32> = (0..cpu.len() as u32).map(|i| (i * 43 + step * 13 + 4) % 250).collect();
    let want: Vec<Vec<f32>> =
        cpu.iter_mut().zip(&tokens).map(|(s, &t)| s.forward(&[t], LogitRows::Last).unwrap()).collect();
    let got = Session::forward_batch(dev, &tokens).unwrap();
    let bound = DEVICE_TOLERANCE * common::max_abs(&want);
    let err = common::max_abs_diff(&got, &want);
    assert!(err <= bound, "{what} step {step}: max |device batched - cpu| = {err} > {bound}");
}

/// A batched decode step is recorded once for its sessions in their order and replayed at the
/// steps after (`exec::device::ReplayStats`), each within the bound above of the CPU: attention
/// with RoPE, MLA, sliding windows (a ring in the sessions of a short context), DeepSeek Sparse
/// Attention's indexer, Gated DeltaNet's recurrent states, Inkling's relative logits, three
/// frames a step around the tier's host steps. DeepSeek V4's KV compressor closes windows fixed
/// when recorded: its frames are recorded at every step and none kept.
#[test]
fn a_batched_decode_step_replays_its_recording_and_gives_what_the_cpu_gives() {
    let cases = [
        ("llama", None),
        ("deepseek_v3", None),
        ("gpt_oss", None),
        ("deepseek_v32", None),
        ("qwen3_next", None),
        ("inkling", None),
        ("olmoe", tier3()),
        ("deepseek_v4_compressed", None),
    ];
    for (name, tier) in cases {
        let Some(engine) = on_vulkan(name, 8, tier) else { return };
        let chain = engine.device().unwrap();
        let (mut cpu, mut dev) = paired(&engine, &[12, CONTEXT, CONTEXT], 7);
        let before = chain.replay_stats();
        let steps = 5;
        for step in 0..steps {
            let mut c: Vec<&mut Session> = cpu.iter_mut().collect();
            let mut d: Vec<&mut Session> = dev.iter_mut().collect();
            batched_step(name, step, &mut c, &mut d);
        }
        let s = chain.replay_stats();
        let (recorded, replayed) = (s.recorded - before.recorded, s.replayed - before.replayed);
        if name == "deepseek_v4_compressed" {
            assert_eq!((recorded, replayed), (0, 0), "{name}: not replayed ({s:?})");
            continue;
        }
        assert!(recorded > 0, "{name}: the step's frames recorded for replay ({s:?})");
        assert_eq!(replayed, recorded * (steps as u64 - 1), "{name}: replayed at every later step ({s:?})");
        assert!(dev.iter_mut().all(|s| s.on_a_device() && s.take_notice().is_none()), "{name}: on the device");
    }
}

/// A session leaving the batch (dropped) takes the recordings naming it with it, and one
/// joining makes a new one; sessions leaving without dropping keep theirs (at most two orders
/// of sessions kept, the oldest dropped for a third): every step within the bound of the CPU.
#[test]
fn a_batched_recording_follows_the_sessions_that_leave_and_join() {
    for name in ["llama", "deepseek_v3", "gpt_oss"] {
        let Some(engine) = on_vulkan(name, 8, None) else { return };
        let chain = engine.device().unwrap();
        let (mut cpu, mut dev) = paired(&engine, &[CONTEXT, 12, CONTEXT], 3);
        let s0 = chain.replay_stats();
        let mut step = 0;
        let mut run = |cpu: &mut [Session], dev: &mut [Session], pick: &[usize]| {
            let mut c: Vec<&mut Session> =
                cpu.iter_mut().enumerate().filter(|(i, _)| pick.contains(i)).map(|x| x.1).collect();
            let mut d: Vec<&mut Session> =
                dev.iter_mut().enumerate().filter(|(i, _)| pick.contains(i)).map(|x| x.1).collect();
            batched_step(name, step, &mut c, &mut d);
            step += 1;
        };
        run(&mut cpu, &mut dev, &[0, 1, 2]);
        run(&mut cpu, &mut dev, &[0, 1, 2]);
        let s1 = chain.replay_stats();
        let per_step = s1.recorded - s0.recorded;
        assert!(per_step > 0 && s1.replayed - s0.replayed == per_step, "{name}: recorded, then replayed ({s1:?})");
        // The last session leaves for good: its recordings go with it.
        drop((cpu.pop(), dev.pop()));
        let s2 = chain.replay_stats();
        assert_eq!(s2.dropped - s1.dropped, per_step, "{name}: the leaver's recordings dropped ({s2:?})");
        // Another joins: the new order is recorded, then replayed.
        let (c3, d3) = paired(&engine, &[CONTEXT], 11);
        cpu.extend(c3);
        dev.extend(d3);
        run(&mut cpu, &mut dev, &[0, 1, 2]);
        run(&mut cpu, &mut dev, &[0, 1, 2]);
        let s3 = chain.replay_stats();
        assert_eq!((s3.recorded - s2.recorded, s3.replayed - s2.replayed), (per_step, per_step), "{name}: {s3:?}");
        // Two sessions alone (the three kept), then the three again: replayed.
        run(&mut cpu, &mut dev, &[0, 2]);
        run(&mut cpu, &mut dev, &[0, 1, 2]);
        let s4 = chain.replay_stats();
        assert_eq!((s4.recorded - s3.recorded, s4.replayed - s3.replayed), (per_step, per_step), "{name}: {s4:?}");
        // A third order pushes the oldest (the pair) out.
        run(&mut cpu, &mut dev, &[1, 2]);
        let s5 = chain.replay_stats();
        assert_eq!((s5.recorded - s4.recorded, s5.dropped - s4.dropped), (per_step, per_step), "{name}: {s5:?}");
        assert!(dev.iter_mut().all(|s| s.on_a_device() && s.take_notice().is_none()), "{name}: on the device");
    }
}
