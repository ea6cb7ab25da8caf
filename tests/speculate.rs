//! Speculative decoding with the n-gram draft against decoding one token a forward, through
//! `generate::generate`: on a prompt that repeats itself, drafts made at nearly every step, the generated tokens are identical, greedy and sampled (the same seed), on the CPU
//! for attention, MoE, MLA, Gated DeltaNet and compressed-KV (DeepSeek V4) fixtures (the recurrent one steps back by
//! running the kept tokens again), and on the Vulkan device. The logits of the kept rows stay
//! within `TOLERANCE` of the largest |logit| of the one-token-a-forward run's (a draft's rows
//! run as a prompt chunk: the same math, another summation order). The same through
//! `slots` (what `coli chat` and `coli serve` drive): a request decoding alone drafts, and
//! its tokens and finish are those without drafts.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::Session;
use coli_runtime::generate::{generate, GenerateOptions, Generation};
use coli_runtime::sample::{Sampler, SamplerConfig};
use coli_runtime::slots::{Event, Finish, Request, Slots};
use coli_runtime::speculate::{NgramOptions, Speculation};
use coli_runtime::vk::VkOptions;
use common::{fixture_dir, ids, load_model, max_abs, max_abs_diff, read_json};

const TOLERANCE: f32 = 1e-4;
const CONTEXT: usize = 160;

/// The fixture's oracle prompt three times over: the draft has something to look up.
fn prompt(name: &str) -> Vec<u32> {
    let p = ids(&read_json(&fixture_dir(name).join("oracle.json"))["prompt_ids"]);
    p.iter().chain(&p).chain(&p).copied().collect()
}

fn run(engine: &Engine, prompt: &[u32], spec: Speculation, sampler: SamplerConfig) -> Generation {
    let mut s = match engine.device() {
        Some(d) => Session::on_device(engine.model(), d, CONTEXT).unwrap(),
        None => Session::new(engine.model(), CONTEXT),
    };
    let opts = GenerateOptions {
        max_new_tokens: 48,
        chunk_rows: 16,
        record_logits: true,
        stop_at_eos: false,
        speculation: spec,
        ..GenerateOptions::default()
    };
    let mut sampler = Sampler::new(sampler).unwrap();
    let g = generate(&mut s, None, &mut sampler, prompt, &opts, &mut |_| {}).unwrap();
    assert_eq!(s.pos(), prompt.len() + g.generated.len(), "the session holds every fed token, no rejected draft");
    assert!(s.take_notice().is_none(), "no device failure");
    g
}

/// Runs `prompt` with and without the draft; returns the speculative run's generation. The
/// draft matches single tokens too, so it drafts at nearly every step, mostly wrong on
/// random weights: rejections at every depth, acceptances where the output loops.
fn same_with_and_without(what: &str, engine: &Engine, prompt: &[u32], sampler: SamplerConfig) -> Generation {
    let spec = Speculation::Ngram(NgramOptions { max_draft: 4, min_match: 1, max_match: 3 });
    let plain = run(engine, prompt, Speculation::Off, sampler);
    let fast = run(engine, prompt, spec, sampler);
    let st = fast.speculation;
    eprintln!("{what}: {}", st.summary(&spec).unwrap_or_else(|| "nothing drafted".into()));
    assert_eq!(fast.generated, plain.generated, "{what}: the draft changed the output");
    assert_eq!(plain.speculation.verifies, 0);
    assert!(st.drafted > 0, "{what}: a repeated prompt gives drafts");
    assert!(st.accepted <= st.drafted);
    let max = max_abs(&plain.logits);
    let err = max_abs_diff(&fast.logits, &plain.logits);
    eprintln!("{what}: max |logit difference| {err:.3e} (max |logit| {max})");
    assert!(err <= TOLERANCE * max, "{what}: {err} > {}", TOLERANCE * max);
    fast
}

#[test]
fn the_draft_changes_nothing_on_the_cpu() {
    let mut accepted = 0;
    for name in ["olmoe", "llama", "deepseek_v3", "qwen3_next", "glm_moe_dsa", "deepseek_v4_compressed"] {
        let engine = load_model(&fixture_dir(name));
        let p = prompt(name);
        let g = same_with_and_without(name, &engine, &p, SamplerConfig::greedy());
        accepted += g.speculation.accepted;
        if name == "qwen3_next" && g.speculation.accepted < g.speculation.drafted {
            assert!(g.speculation.replays > 0, "a recurrent layer steps back by running the kept tokens again");
        }
        let sampled =
            SamplerConfig { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 7, ..SamplerConfig::default() };
        same_with_and_without(&format!("{name} sampled"), &engine, &p, sampled);
    }
    assert!(accepted > 0, "some drafts are right");
}

#[test]
fn the_draft_changes_nothing_on_the_device() {
    for name in ["olmoe", "qwen3_next"] {
        let req = EngineOptions {
            device: DeviceRequest::Vulkan(VkOptions::default()),
            compile: Options { context: CONTEXT, chunk_rows: 16, ..Options::default() },
            ..EngineOptions::default()
        };
        let engine = Engine::load(&fixture_dir(name), &req).unwrap();
        if engine.device().is_none() {
            eprintln!("no Vulkan device: {}", engine.device_note());
            return;
        }
        same_with_and_without(&format!("{name} on the device"), &engine, &prompt(name), SamplerConfig::greedy());
    }
}

/// `req` through one slot to its end.
fn through_a_slot(engine: &Engine, req: Request) -> Finish {
    let mut slots = Slots::new(engine, 1, CONTEXT, 16).unwrap();
    slots.admit(0, req).unwrap();
    loop {
        for (_, e) in slots.step() {
            match e {
                Event::Done(f) => return f,
                Event::Failed(e) => panic!("{e}"),
                Event::Text(_) => {}
            }
        }
    }
}

#[test]
fn a_slot_decoding_alone_drafts_with_the_same_tokens() {
    let spec = Speculation::Ngram(NgramOptions { max_draft: 4, min_match: 1, max_match: 3 });
    for (name, device) in [("olmoe", false), ("qwen3_next", false), ("olmoe", true), ("qwen3_next", true)] {
        let req = EngineOptions {
            device: if device { DeviceRequest::Vulkan(VkOptions::default()) } else { DeviceRequest::Cpu },
            compile: Options { context: CONTEXT, chunk_rows: 16, ..Options::default() },
            ..EngineOptions::default()
        };
        let engine = Engine::load(&fixture_dir(name), &req).unwrap();
        if device && engine.device().is_none() {
            eprintln!("no Vulkan device: {}", engine.device_note());
            return;
        }
        let base = Request { stop_at_eos: false, ..Request::greedy(prompt(name), 40) };
        let plain = through_a_slot(&engine, base.clone());
        let fast = through_a_slot(&engine, Request { speculation: spec, ..base });
        let what = format!("{name}{}", if device { " on the device" } else { "" });
        eprintln!("{what} through a slot: {}", fast.speculation.summary(&spec).unwrap_or_default());
        assert_eq!(fast.generated, plain.generated, "{what}: the draft changed the output");
        assert_eq!((fast.reason, fast.prompt_tokens), (plain.reason, plain.prompt_tokens));
        assert!(fast.speculation.drafted > 0 && plain.speculation.drafted == 0, "{what}");
    }
}
