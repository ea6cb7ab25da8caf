//! Speculative decoding by the checkpoint's multi-token prediction layer (DeepSeek-V3's, GLM-5's, Qwen3.5's MTP) as
//! a draft model: the draft layer's logits against a reference written from transformers' own
//! modules (tests/fixtures/deepseek_v3_mtp, tools/fixtures_mtp.py), and generation with the
//! draft giving the same tokens as without, on the CPU and on the Vulkan device (the draft layer
//! on the device too, guessing as the CPU's does), with the drafts' acceptance counted. Checkpoints and specs without a
//! draft are refused with messages that say so.

mod common;

use coli_compiler::{compile, DeviceProfile, DraftRole, Options};
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Model, Session};
use coli_runtime::generate::{GenerateError, GenerateOptions, Generation};
use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::sample::{Sampler, SamplerConfig};
use coli_runtime::slots::{Event, Finish, Request, Slots};
use coli_runtime::speculate::Speculation;
use coli_runtime::vk::VkOptions;
use common::{fixture_dir, ids, matrix, max_abs, max_abs_diff, read_json};

/// Of the largest |logit| of the reference (transformers' float32 against coli's float32 in
/// another summation order, as the other oracle tests).
const TOLERANCE: f32 = 1e-4;
const CONTEXT: usize = 96;

/// The fixtures with an MTP layer: DeepSeek-V3's, V3.2's and GLM-5's (GLM-MoE-DSA: its MTP
/// layer sparse with an indexer of its own), MiMo-V2-Flash's (`model.mtp.layers.0.*`: a
/// sliding-window layer with sinks and a dense FFN), Qwen3-Next's and Qwen3.5-MoE's (`mtp.*`: a
/// full-attention layer under `mtp.layers.0.` after Gated DeltaNet and attention layers; the
/// model's state recurrent, so a partly accepted draft replays its forward).
const FIXTURES: [&str; 6] = [
    "deepseek_v3_mtp",
    "deepseek_v32_mtp",
    "glm_moe_dsa_mtp",
    "mimo_v2_flash_mtp",
    "qwen3_next_mtp",
    "qwen3_5_moe_mtp",
];

fn program(ckpt: &Checkpoint, role: DraftRole) -> coli_compiler::ir::Program {
    let arch = ckpt.bindings().architecture().unwrap().to_string();
    let spec = coli_runtime::engine::specs::for_architecture(&arch).unwrap();
    let o = Options { draft: role, context: CONTEXT, ..Options::default() };
    compile(&spec, &ckpt.bindings(), &DeviceProfile::cpu_only(), &o).unwrap().program
}

#[test]
fn the_draft_layer_matches_its_reference() {
    for name in FIXTURES {
        draft_layer_matches(name, &fixture_dir(name));
    }
    // GLM-5's as llama.cpp's converter writes it: the MTP block counted in `block_count`, its
    // own tensors under `blk.2.nextn.*` (tools/make_gguf_mixers.py).
    draft_layer_matches("glm_moe_dsa_mtp", &fixture_dir("gguf_mixers").join("glm-dsa-mtp.gguf"));
    // Qwen3.5's as llama.cpp's qwen35moe lays it out (`blk.2.*`, `blk.2.nextn.*`).
    draft_layer_matches("qwen3_5_moe_mtp", &fixture_dir("gguf_mixers").join("qwen35moe-mtp.gguf"));
    // DeepSeek-V3.2's the same way (`deepseek32`: an indexer in the MTP block too).
    draft_layer_matches("deepseek_v32_mtp", &fixture_dir("gguf_mixers").join("deepseek32-mtp.gguf"));
    // Qwen3.5 as its published vision-language wrapper lays it out: the model under
    // `model.language_model.`, the MTP layer still under `mtp.`.
    let dir = common::qwen3_5_moe_as_wrapper("qwen3_5_moe_mtp", true);
    draft_layer_matches("qwen3_5_moe_mtp", &dir);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The model's and the draft's logits of `path` against the oracle of fixture `name`.
fn draft_layer_matches(name: &str, path: &std::path::Path) {
    let oracle = read_json(&fixture_dir(name).join("mtp.json"));
    let prompt = ids(&oracle["prompt"]);
    let ckpt = Checkpoint::open(path, &LoadOptions::default()).unwrap();
    let target = Model::load(&ckpt, program(&ckpt, DraftRole::Target), &mut |_, _| {}).unwrap();
    let draft = Model::load(&ckpt, program(&ckpt, DraftRole::Draft), &mut |_, _| {}).unwrap();
    assert_eq!(draft.program.layers.len(), 1, "one draft layer");
    let hidden = target.program.dims.hidden;

    // The model's rows, against transformers'.
    let mut s = Session::new(&target, CONTEXT);
    let logits = s.forward(&prompt, LogitRows::All).unwrap();
    let want = matrix(&oracle["logits"]);
    let got: Vec<Vec<f32>> = logits.chunks(want[0].len()).map(<[f32]>::to_vec).collect();
    let err = max_abs_diff(&got, &want);
    let name = format!("{name} ({})", path.file_name().unwrap().to_string_lossy());
    eprintln!("{name}, model: max |difference| {err:.3e} of max |logit| {}", max_abs(&want));
    assert!(err <= TOLERANCE * max_abs(&want));
    assert_eq!(s.exported().len(), prompt.len() * hidden, "the residual of every row comes back");

    // The draft's rows: position i reads the model's row i and the token at i + 1.
    let n = prompt.len() - 1;
    let rows = s.exported()[..n * hidden].to_vec();
    let want = matrix(&oracle["mtp_logits"]);
    for chunk in [n, 5, 1] {
        let mut d = Session::new(&draft, CONTEXT);
        let mut got = Vec::new();
        for (k, t) in prompt[1..].chunks(chunk).enumerate() {
            let from = k * chunk;
            let l = d.forward_from(t, &rows[from * hidden..(from + t.len()) * hidden], LogitRows::All).unwrap();
            got.extend(l.chunks(want[0].len()).map(<[f32]>::to_vec));
        }
        let err = max_abs_diff(&got, &want);
        eprintln!("{name}, draft, chunks of {chunk}: max |difference| {err:.3e} of max |logit| {}", max_abs(&want));
        assert!(err <= TOLERANCE * max_abs(&want), "{name}, chunks of {chunk}: {err}");
    }
    // Input rows that do not match the tokens are refused.
    let mut d = Session::new(&draft, CONTEXT);
    assert!(d.forward_from(&prompt[1..3], &rows[..hidden], LogitRows::Last).is_err());
    assert!(Session::new(&target, CONTEXT).forward_from(&prompt[..1], &rows[..hidden], LogitRows::Last).is_err());
}

fn engine(name: &str, device: bool, draft: bool) -> Engine {
    let req = EngineOptions {
        device: if device { DeviceRequest::Vulkan(VkOptions::default()) } else { DeviceRequest::Cpu },
        compile: Options { context: CONTEXT, chunk_rows: 8, ..Options::default() },
        draft,
        ..EngineOptions::default()
    };
    Engine::load(&fixture_dir(name), &req).unwrap()
}

fn generate(engine: &Engine, prompt: &[u32], speculation: Speculation, sampler: SamplerConfig) -> Generation {
    let mut s = engine.session().unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 40,
        chunk_rows: 8,
        record_logits: true,
        stop_at_eos: false,
        speculation,
        ..GenerateOptions::default()
    };
    let mut sampler = Sampler::new(sampler).unwrap();
    let g = engine.generate(&mut s, &mut sampler, prompt, &opts, &mut |_| {}).unwrap();
    assert_eq!(s.pos(), prompt.len() + g.generated.len(), "the session holds every fed token, no rejected draft");
    assert!(s.take_notice().is_none(), "no device failure");
    g
}

fn same_with_and_without(what: &str, name: &str, engine: &Engine) -> Generation {
    let prompt = ids(&read_json(&fixture_dir(name).join("mtp.json"))["prompt"]);
    let spec = Speculation::Mtp { max_draft: 3 };
    for sampler in [
        SamplerConfig::greedy(),
        SamplerConfig { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 11, ..SamplerConfig::default() },
    ] {
        let plain = generate(engine, &prompt, Speculation::Off, sampler);
        let fast = generate(engine, &prompt, spec, sampler);
        let st = fast.speculation;
        eprintln!("{what}: {}", st.summary(&spec).unwrap_or_else(|| "nothing drafted".into()));
        assert_eq!(fast.generated, plain.generated, "{what}: the draft changed the output");
        assert!(st.drafted > 0 && st.accepted <= st.drafted);
        let err = max_abs_diff(&fast.logits, &plain.logits);
        assert!(err <= TOLERANCE * max_abs(&plain.logits), "{what}: {err}");
        if sampler.temperature == 0.0 {
            return fast;
        }
    }
    unreachable!()
}

#[test]
fn the_draft_changes_nothing_on_the_cpu() {
    for name in FIXTURES {
        let g = same_with_and_without(&format!("{name} on the cpu"), name, &engine(name, false, true));
        assert!(g.speculation.accepted > 0, "{name}: some of the draft layer's guesses are right");
    }
}

#[test]
fn the_draft_changes_nothing_on_the_device() {
    for name in FIXTURES {
        let e = engine(name, true, true);
        if e.device().is_none() {
            eprintln!("no Vulkan device: {}", e.device_note());
            return;
        }
        assert!(e.draft_on_device(), "{}", e.device_note());
        let on_device = same_with_and_without(&format!("{name} on the device"), name, &e);
        // The draft's guesses on the device are the CPU's: as many drafted and accepted.
        let on_cpu = same_with_and_without(&format!("{name} on the cpu"), name, &engine(name, false, true));
        assert_eq!(on_device.speculation, on_cpu.speculation, "{name}");
    }
}

#[test]
fn without_a_draft_model_it_says_so() {
    // The engine loaded without its draft.
    let e = engine("deepseek_v3_mtp", false, false);
    let mut s = e.session().unwrap();
    let opts = GenerateOptions { speculation: Speculation::Mtp { max_draft: 2 }, ..GenerateOptions::default() };
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let r = coli_runtime::generate::generate(&mut s, None, &mut sampler, &[1, 2, 3], &opts, &mut |_| {});
    assert!(matches!(r, Err(GenerateError::NoDraft)));
    // A spec without a draft, and a checkpoint whose configuration counts no MTP layer.
    let req = EngineOptions { draft: true, ..EngineOptions::default() };
    let err = Engine::load(&fixture_dir("llama"), &req).err().unwrap().to_string();
    assert!(err.contains("has no draft model"), "{err}");
    let none = common::patched_fixture("deepseek_v3_mtp", |c| c["num_nextn_predict_layers"] = 0.into());
    let err = Engine::load(&none, &req).err().unwrap().to_string();
    assert!(err.contains("no draft layers"), "{err}");
    let _ = std::fs::remove_dir_all(&none);
    // The fixture of the model alone declares an MTP layer its file does not hold.
    let err = Engine::load(&fixture_dir("deepseek_v3"), &req).err().unwrap().to_string();
    assert!(err.contains("model.layers.3.enorm.weight"), "{err}");
}

/// Every request of `reqs` through `slots` at once, to its end; each one's finish by index.
fn through_slots(engine: &Engine, reqs: &[Request]) -> Vec<Finish> {
    let mut slots = Slots::new(engine, reqs.len(), CONTEXT, 8).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        slots.admit(i as u64, r.clone()).unwrap();
    }
    let mut done: Vec<Option<Finish>> = vec![None; reqs.len()];
    while done.iter().any(Option::is_none) {
        for (id, e) in slots.step() {
            match e {
                Event::Done(f) => done[id as usize] = Some(f),
                Event::Failed(e) => panic!("{e}"),
                Event::Text(_) => {}
            }
        }
    }
    done.into_iter().map(Option::unwrap).collect()
}

#[test]
fn slots_draft_alone_and_keep_the_draft_in_step_while_batched() {
    for (name, device) in [("deepseek_v3_mtp", false), ("glm_moe_dsa_mtp", false), ("deepseek_v3_mtp", true)] {
        let e = engine(name, device, true);
        if device && e.device().is_none() {
            eprintln!("no Vulkan device: {}", e.device_note());
            return;
        }
        let prompt = ids(&read_json(&fixture_dir(name).join("mtp.json"))["prompt"]);
        let spec = Speculation::Mtp { max_draft: 2 };
        // Two requests: the shorter ends first, then the other decodes alone and drafts from a
        // draft that followed the batched steps.
        let reqs = |s: Speculation| {
            let r = |p: &[u32], n| Request { speculation: s, stop_at_eos: false, ..Request::greedy(p.to_vec(), n) };
            vec![r(&prompt, 40), r(&prompt[3..], 12)]
        };
        let plain = through_slots(&e, &reqs(Speculation::Off));
        let fast = through_slots(&e, &reqs(spec));
        for (p, f) in plain.iter().zip(&fast) {
            assert_eq!(f.generated, p.generated, "{name}: the draft changed the output");
        }
        let st = fast[0].speculation;
        eprintln!("{name} through slots: {}", st.summary(&spec).unwrap_or_default());
        assert!(st.drafted > 0 && st.accepted > 0, "{name}: the request decoding alone drafted");
    }
}

/// A prompt longer than the rows a draft lets wait runs through it as it arrives (in chunks of
/// any size); the first guess after it is the one a draft run over the whole prompt at once
/// makes.
#[test]
fn a_long_prompt_runs_through_the_draft_as_it_arrives() {
    let name = "deepseek_v3_mtp";
    let base = ids(&read_json(&fixture_dir(name).join("mtp.json"))["prompt"]);
    let prompt: Vec<u32> = base.iter().cycle().take(90).copied().collect();
    let mut history = prompt.clone();
    history.push(7);
    let e = engine(name, false, true);
    let mut guesses = Vec::new();
    for chunk in [90, 8, 1] {
        let mut s = e.session().unwrap();
        for c in prompt.chunks(chunk) {
            s.forward(c, LogitRows::Last).unwrap();
        }
        guesses.push(s.draft_tokens(7, 1).unwrap());
    }
    // The draft over every row in one forward.
    let ckpt = Checkpoint::open(&fixture_dir(name), &LoadOptions::default()).unwrap();
    let target = Model::load(&ckpt, program(&ckpt, DraftRole::Target), &mut |_, _| {}).unwrap();
    let draft = Model::load(&ckpt, program(&ckpt, DraftRole::Draft), &mut |_, _| {}).unwrap();
    let mut s = Session::new(&target, CONTEXT);
    s.forward(&prompt, LogitRows::Last).unwrap();
    let logits = Session::new(&draft, CONTEXT).forward_from(&history[1..], s.exported(), LogitRows::Last).unwrap();
    let want = common::argmax(&logits);
    for (chunk, g) in [90, 8, 1].iter().zip(&guesses) {
        assert_eq!(g, &vec![want], "chunks of {chunk}");
    }
}
