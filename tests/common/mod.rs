//! Helpers shared by the end-to-end tests: fixture paths, JSON readers, comparisons.
#![allow(dead_code)]

use coli_runtime::engine::{Engine, EngineOptions};
use coli_runtime::exec::{LogitRows, Session};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture_dir(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

/// A model under `../shared/models/` (beside the checkout), or `None` with a note.
pub fn shared_model(name: &str) -> Option<PathBuf> {
    let base = std::env::var_os("COLI_SHARED").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"));
    let p = base.join("models").join(name);
    if p.is_dir() {
        Some(p)
    } else {
        eprintln!("note: {} is absent; skipping", p.display());
        None
    }
}

/// The default model in the user's cache (CI fetches it with tools/fetch-model.sh).
pub fn default_model_path() -> Option<PathBuf> {
    let p = coli::default_model::path();
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("note: {} is absent (run tools/fetch-model.sh); skipping", p.display());
        None
    }
}

pub fn load_model(path: &Path) -> Engine {
    Engine::load(path, &EngineOptions::default()).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

pub fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

pub fn matrix(v: &Value) -> Vec<Vec<f32>> {
    v.as_array().unwrap().iter().map(floats).collect()
}

pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "row counts differ");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "row widths differ");
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// What `run_greedy` saw: logits of every prompt row (and, when asked, of every decode step
/// after them), the greedy tokens, the session's notice, and whether it ended on a device.
pub struct Run {
    pub rows: Vec<Vec<f32>>,
    pub toks: Vec<u32>,
    pub notice: Option<String>,
    pub on_device: bool,
}

/// Runs `prompt` in chunks of `chunk` (on `l`'s device when it has one, else the CPU, with a
/// context of `context`), then `steps` greedy tokens; `step_rows`: the decode steps' logits
/// join `rows`.
pub fn run_greedy(l: &Engine, prompt: &[u32], chunk: usize, steps: usize, context: usize, step_rows: bool) -> Run {
    let mut s = match l.device() {
        Some(d) => Session::on_device(l.model(), d, context).unwrap(),
        None => Session::new(l.model(), context),
    };
    let vocab = l.plan().program.dims.vocab;
    let mut rows = Vec::new();
    for c in prompt.chunks(chunk) {
        rows.extend(s.forward(c, LogitRows::All).unwrap().chunks_exact(vocab).map(|r| r.to_vec()));
    }
    let mut last = rows.last().unwrap().clone();
    let mut toks = Vec::new();
    for _ in 0..steps {
        let id = argmax(&last);
        toks.push(id);
        last = s.forward(&[id], LogitRows::Last).unwrap_or_else(|e| panic!("{e}; notice: {:?}", s.take_notice()));
        if step_rows {
            rows.push(last.clone());
        }
    }
    Run { rows, toks, notice: s.take_notice(), on_device: s.on_a_device() }
}

/// The largest |value| of `rows`.
pub fn max_abs(rows: &[Vec<f32>]) -> f32 {
    rows.iter().flatten().fold(0f32, |m, v| m.max(v.abs()))
}

/// A fixture's oracle (`oracle.json` with `prompt` and `logits`): the prompt, every row's
/// logits and the largest |logit|.
pub fn oracle_logits(path: &Path) -> (Vec<u32>, Vec<Vec<f32>>, f32) {
    let o = read_json(path);
    let want = matrix(&o["logits"]);
    let max = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    (ids(&o["prompt"]), want, max)
}

/// Every row's logits of `prompt` through `s`, `chunk` rows a forward.
pub fn logit_rows(s: &mut Session, prompt: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let mut got = Vec::new();
    for c in prompt.chunks(chunk) {
        let l = s.forward(c, LogitRows::All).unwrap();
        got.extend(l.chunks_exact(l.len() / c.len()).map(|r| r.to_vec()));
    }
    got
}

/// `path` on the Vulkan device against the CPU: for each (precision, chunk, bound) the
/// prompt's logits of both, within `bound` of the largest |logit| (nothing when no device).
pub fn device_matches_cpu(
    path: &Path,
    what: &str,
    prompt: &[u32],
    cases: &[(coli_runtime::cpu::Precision, usize, f32)],
) {
    let req = EngineOptions {
        device: coli_runtime::engine::DeviceRequest::Vulkan(coli_runtime::vk::VkOptions::default()),
        compile: coli_compiler::Options { context: 64, chunk_rows: 16, ..coli_compiler::Options::default() },
        ..EngineOptions::default()
    };
    let dev = Engine::load(path, &req).unwrap();
    let Some(device) = dev.device() else {
        eprintln!("no Vulkan device: {}", dev.device_note());
        return;
    };
    let cpu = load_model(path);
    for &(precision, chunk, rel) in cases {
        let mut c = Session::new(cpu.model(), 64);
        c.set_precision(precision);
        let mut g = Session::on_device(dev.model(), device, 64).unwrap();
        g.set_precision(precision);
        let want = logit_rows(&mut c, prompt, chunk);
        let got = logit_rows(&mut g, prompt, chunk);
        let max = max_abs(&want);
        let err = max_abs_diff(&got, &want);
        eprintln!("{what} device {precision:?} chunk {chunk}: max |device - cpu| = {err:.3e} (max |logit| {max})");
        assert!(err <= rel * max, "{what} {precision:?} chunk {chunk}: max |device - cpu| = {err} > {}", rel * max);
    }
}

/// `path` on the Vulkan device (context 64, chunks of 16) with the host copies of the device's
/// matrices kept or released.
pub fn load_on_vulkan(path: &Path, host_copies: coli_runtime::engine::HostCopies) -> Engine {
    let req = EngineOptions {
        device: coli_runtime::engine::DeviceRequest::Vulkan(coli_runtime::vk::VkOptions::default()),
        compile: coli_compiler::Options { context: 64, chunk_rows: 16, ..coli_compiler::Options::default() },
        host_copies,
        ..EngineOptions::default()
    };
    Engine::load(path, &req).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// Logits of every prompt row of fixture `name`, whole and in chunks of 1 and 3, and its
/// greedy continuation against its transformers oracle, within 1e-4 of the largest |logit|;
/// greedy ids identical. Returns the largest error seen.
pub fn matches_oracle(name: &str) -> f32 {
    matches_oracle_at(name, &fixture_dir(name))
}

/// `matches_oracle` for fixture `name`'s oracle with the checkpoint in `dir` (a re-laid-out copy).
pub fn matches_oracle_at(name: &str, dir: &Path) -> f32 {
    let oracle = read_json(&fixture_dir(name).join("oracle.json"));
    let loaded = load_model(dir);
    let prompt = ids(&oracle["prompt_ids"]);
    let want = matrix(&oracle["logits"]);
    let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let tol = 1e-4 * max;
    let mut worst = 0f32;
    for chunk in [prompt.len(), 1, 3] {
        let got = logit_rows(&mut Session::new(loaded.model(), 256), &prompt, chunk);
        let err = max_abs_diff(&got, &want);
        eprintln!("{name}: chunk {chunk}: max |logit - oracle| = {err:.3e} (bound {tol:.3e}, max |logit| {max})");
        assert!(err <= tol, "{name}: chunk {chunk}: max |logit - oracle| = {err} > {tol}");
        worst = worst.max(err);
    }
    let greedy = ids(&oracle["greedy"]);
    let greedy_logits = matrix(&oracle["greedy_logits"]);
    let mut s = Session::new(loaded.model(), 256);
    let mut last = s.forward(&prompt, LogitRows::Last).unwrap();
    let mut got = Vec::new();
    for (i, _) in greedy.iter().enumerate() {
        let err = max_abs_diff(&[last.clone()], &greedy_logits[i..i + 1]);
        assert!(err <= tol, "{name}: greedy step {i}: max |logit - oracle| = {err} > {tol}");
        worst = worst.max(err);
        let id = argmax(&last);
        got.push(id);
        last = s.forward(&[id], LogitRows::Last).unwrap();
    }
    eprintln!("{name}: greedy: max |logit - oracle| over prompt and decode = {worst:.3e}");
    assert_eq!(got, greedy, "{name}: greedy tokens differ from transformers'");
    worst
}

/// A copy of fixture `name` (its configuration with `patch` applied, its weights as they are)
/// in a directory of its own under the temporary directory; the caller removes it.
pub fn patched_fixture(name: &str, patch: impl Fn(&mut Value)) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let src = fixture_dir(name);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("coli-patched-{}-{n}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = read_json(&src.join("config.json"));
    patch(&mut config);
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    dir
}

/// A Qwen3.5 fixture (`name`) as the published vision-language wrapper lays it out: the text keys under
/// `text_config`, the decoder's tensors under `model.language_model.` (`lm_head.` unchanged).
pub fn qwen3_5_moe_as_wrapper(name: &str, nest: bool) -> PathBuf {
    let dir = patched_fixture(name, |c| {
        let text = c.clone();
        let mut top = serde_json::json!({
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "vision_config": {"depth": 1},
        });
        if nest {
            top["text_config"] = text;
        }
        *c = top;
    });
    // Safetensors: 8 bytes of header length, the JSON header, the data (offsets from its end).
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let renamed: serde_json::Map<_, _> = header
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), v),
            None => (k, v),
        })
        .collect();
    let mut head = serde_json::to_vec(&renamed).unwrap();
    while head.len() % 8 != 0 {
        head.push(b' ');
    }
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&head);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, out).unwrap();
    dir
}

/// The names of the layer ops `l`'s plan runs in host frames (`host`) or in device frames.
pub fn layer_ops(l: &Engine, host: bool) -> Vec<&'static str> {
    use coli_compiler::frames::op_of;
    use coli_compiler::ids::{Part, Place};
    let p = &l.plan().program;
    let ops = l.plan().frames.iter().filter(|f| (f.place == Place::Host) == host).flat_map(|f| &f.ops);
    ops.filter(|id| matches!(id.part, Part::Layer(_))).map(|&id| coli_runtime::oplib::op_name(op_of(p, id))).collect()
}

/// Six greedy decode steps after `prompt` on `engine`'s device (a session of 256 positions):
/// the session, the prompt's last logits, each step's logits, the device's submit count before
/// each step, and the submits the last step took. Where a test's injected fault falls.
#[allow(dead_code)]
pub fn decode_six_on_device<'e>(engine: &'e Engine, prompt: &[u32]) -> (Session<'e>, DecodeSubmits) {
    let d = engine.device().expect("a device");
    let mut s = Session::on_device(engine.model(), d, 256).unwrap();
    let first = s.forward(prompt, LogitRows::Last).unwrap();
    let mut last = first.clone();
    let (mut starts, mut steps) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        starts.push(d.ctx.submits());
        last = s.forward(&[argmax(&last)], LogitRows::Last).unwrap();
        steps.push(last.clone());
    }
    let per_step = d.ctx.submits() - starts[5];
    (s, DecodeSubmits { first, steps, starts, per_step })
}

/// What `decode_six_on_device` saw.
#[allow(dead_code)]
pub struct DecodeSubmits {
    pub first: Vec<f32>,
    pub steps: Vec<Vec<f32>>,
    pub starts: Vec<u64>,
    pub per_step: u64,
}
