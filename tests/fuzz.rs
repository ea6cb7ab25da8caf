//! Fuzzing on the stable toolchain: each target takes its seeds (committed under
//! `tests/fuzz/corpus/<target>/`, made by `tools/make_fuzz_corpus.py`; the spec target's seeds are
//! `graphs/*.ron`), mutates them (bytes flipped, inserted, deleted, repeated, spliced from another
//! seed, truncated; numbers in text replaced by extreme ones) and feeds each input to a reader for
//! a bounded time, failing on any panic (caught per input) or on an input that takes longer than
//! `HANG` (a watchdog ends the process with the target's name). Every input a reader accepts is
//! also driven one step further (a spec is checked, a checkpoint's tensors read and compiled, a
//! tokenizer encodes, a template renders).
//!
//! Knobs (environment, for a longer campaign): `COLI_FUZZ_SECONDS` (per target, default 30),
//! `COLI_FUZZ_SEED` (default fixed, so a CI failure reproduces). A finding is written to
//! `target/fuzz-findings/<target>-<n>` and named in the failure.

use coli_runtime::model::{Checkpoint, LoadOptions};
use coli_runtime::text::{ChatMessage, ChatTemplate, GgufVocab, Tokenizer};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest one input may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(20);

/// A small, seeded generator (xorshift64*): the same seed gives the same campaign.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = if target == "spec" { root().join("graphs") } else { root().join("tests/fuzz/corpus").join(target) };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file() && (target != "spec" || p.extension().is_some_and(|x| x == "ron")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files.iter().map(|p| std::fs::read(p).expect("seed")).collect()
}

/// Numbers that break code which trusts its input.
const EXTREMES: &[&str] = &[
    "0",
    "-1",
    "4294967296",
    "18446744073709551615",
    "1000000000000",
    "1e30",
    "-1e-30",
    "NaN",
    "inf",
    "99999999999999999999",
];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(4) {
        let n = b.len();
        match rng.below(9) {
            0 if n > 0 => {
                let i = rng.below(n);
                b[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                b[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(n + 1);
                b.insert(i, rng.next() as u8);
            }
            3 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                b.drain(i..i + len);
            }
            4 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                let chunk = b[i..i + len].to_vec();
                let at = rng.below(n + 1);
                b.splice(at..at, chunk.iter().copied().cycle().take(len * (1 + rng.below(8))));
            }
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let (i, j) = (rng.below(n + 1), rng.below(other.len()));
                    b.truncate(i);
                    b.extend_from_slice(&other[j..]);
                }
            }
            6 if n > 0 => b.truncate(rng.below(n)),
            7 => {
                // Replace a run of digits by an extreme number.
                let digits: Vec<usize> = (0..n).filter(|&i| b[i].is_ascii_digit()).collect();
                if !digits.is_empty() {
                    let s = digits[rng.below(digits.len())];
                    let e = (s..n).find(|&i| !b[i].is_ascii_digit()).unwrap_or(n);
                    b.splice(s..e, EXTREMES[rng.below(EXTREMES.len())].bytes());
                }
            }
            8 if n >= 8 => {
                // A little-endian word of the binary formats set to an extreme value.
                let i = rng.below(n - 7) & !3;
                let v: u64 = [0, 1, u32::MAX as u64, u64::MAX, 1 << 40, 0x7fff_ffff][rng.below(6)];
                let w = if rng.below(2) == 0 { 4 } else { 8 };
                b[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            _ => {}
        }
    }
    b
}

fn scratch(target: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coli-fuzz-{}-{target}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Runs `target` for the campaign's time over mutations of its seeds.
fn campaign(target: &str, run: impl Fn(&[u8], &Path)) {
    let secs: u64 = std::env::var("COLI_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let seed: u64 = std::env::var("COLI_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_c011);
    let seeds = seeds(target);
    let dir = scratch(target);
    let mut rng = Rng(seed ^ target.bytes().fold(0u64, |h, c| h.rotate_left(5) ^ u64::from(c)) | 1);
    let started = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let (watch, name) = (started.clone(), target.to_string());
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let at = watch.load(Ordering::Relaxed);
        if at == u64::MAX {
            return;
        }
        if at > 0 && epoch.elapsed().as_millis() as u64 > at + HANG.as_millis() as u64 {
            // Written past the test harness's capture, so that the reason reaches the log.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "fuzz {name}: one input ran past {HANG:?} (a hang); it is target/fuzz-findings/{name}-pending"
            );
            std::process::exit(3);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut count, mut accepted_panics) = (0u64, Vec::new());
    let mut inputs: Vec<Vec<u8>> = seeds.clone();
    while Instant::now() < deadline || count < seeds.len() as u64 {
        let input =
            if (count as usize) < inputs.len() { inputs[count as usize].clone() } else { mutate(&mut rng, &seeds) };
        let findings = root().join("target/fuzz-findings");
        std::fs::create_dir_all(&findings).ok();
        let pending = findings.join(format!("{target}-pending"));
        std::fs::write(&pending, &input).ok();
        started.store(epoch.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
        let result = catch_unwind(AssertUnwindSafe(|| run(&input, &dir)));
        started.store(0, Ordering::Relaxed);
        if let Err(e) = result {
            let msg = e.downcast_ref::<String>().cloned().or(e.downcast_ref::<&str>().map(|s| s.to_string()));
            let path = findings.join(format!("{target}-{count}"));
            std::fs::write(&path, &input).ok();
            accepted_panics.push(format!("{}: {}", path.display(), msg.unwrap_or_default()));
        }
        std::fs::remove_file(&pending).ok();
        count += 1;
        if count as usize == inputs.len() {
            inputs.clear();
        }
    }
    started.store(u64::MAX, Ordering::Relaxed);
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("fuzz {target}: {count} inputs in {secs} s, seed {seed}");
    assert!(
        accepted_panics.is_empty(),
        "fuzz {target}: {} panics:\n{}",
        accepted_panics.len(),
        accepted_panics.join("\n")
    );
}

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

#[test]
fn fuzz_spec_reader() {
    campaign("spec", |input, _| {
        let _ = coli_compiler::Spec::parse(&text(input), Path::new("fuzz.ron"));
    });
}

#[test]
fn fuzz_expression_parser() {
    use coli_compiler::expr::{Type, Value};
    campaign("expr", |input, _| {
        let Ok(e) = coli_compiler::expr::parse(&text(input), 0) else { return };
        let ty = |name: &str| match name {
            "mlp_only" => Some(Type::IntList),
            "flag" => Some(Type::Bool),
            _ => Some(Type::Int),
        };
        if e.check(&ty).is_ok() {
            let _ = e.eval(&|name: &str| match name {
                "mlp_only" => Some(Value::IntList(vec![0, 3])),
                "flag" => Some(Value::Bool(true)),
                "i" => Some(Value::Int(0)),
                _ => Some(Value::Int(7)),
            });
        }
    });
}

/// Opens `path` and drives what a run does next: every tensor's bytes and values, the bindings
/// compiled against the spec of the architecture, the tokenizer of a GGUF.
fn drive_checkpoint(path: &Path) {
    let Ok(ck) = Checkpoint::open(path, &LoadOptions::default()) else { return };
    let names: Vec<String> = ck.names().map(str::to_string).collect();
    for n in &names {
        if let Ok(t) = ck.tensor(n) {
            let _ = t.bytes().len();
            if t.numel() <= 1 << 16 {
                let _ = t.to_f32_vec();
            }
        }
    }
    let bindings = ck.bindings();
    if let Some(meta) = ck.gguf_metadata() {
        if let Ok(vocab) = GgufVocab::from_kv(meta) {
            if let Ok(tok) = Tokenizer::from_gguf_vocab(&vocab) {
                let _ = tok.encode("abcd ab<s>", true).map(|ids| tok.decode(&ids));
            }
        }
    }
    let arch = bindings.architecture().unwrap_or_default().to_string();
    if let Some(spec_path) = coli_compiler::spec::spec_for_architecture(&root().join("graphs"), &arch) {
        if let Ok(spec) = coli_compiler::Spec::load(&spec_path) {
            let _ = coli_compiler::compile(
                &spec,
                &bindings,
                &coli_compiler::DeviceProfile::cpu_only(),
                &coli_compiler::Options::default(),
            );
        }
    }
}

#[test]
fn fuzz_gguf_reader() {
    campaign("gguf", |input, dir| {
        let path = dir.join("m.gguf");
        std::fs::write(&path, input).expect("scratch write");
        drive_checkpoint(&path);
    });
}

#[test]
fn fuzz_safetensors_reader() {
    let config = std::fs::read(root().join("tests/fuzz/corpus/safetensors_config/config.json")).expect("seed");
    let weights = std::fs::read(root().join("tests/fuzz/corpus/safetensors/tiny.safetensors")).expect("seed");
    campaign("safetensors", |input, dir| {
        // The mutated input is the weights file, and one time in four the config instead.
        let flip = input.len() % 4 == 0;
        std::fs::write(dir.join("model.safetensors"), if flip { &weights[..] } else { input }).expect("write");
        std::fs::write(dir.join("config.json"), if flip { input } else { &config[..] }).expect("write");
        drive_checkpoint(dir);
    });
}

#[test]
fn fuzz_tokenizer_loading() {
    campaign("tokenizer", |input, dir| {
        std::fs::write(dir.join("tokenizer.json"), input).expect("scratch write");
        if let Ok(tok) = Tokenizer::from_hf_dir(dir) {
            for s in ["abcd ab", "<s>hé\u{1F600}</s>", ""] {
                if let Ok(ids) = tok.encode(s, true) {
                    let _ = tok.decode(&ids);
                    let mut d = tok.stream_decoder(true);
                    for id in ids {
                        let _ = d.push(id);
                    }
                    let _ = d.finish();
                }
            }
            let _ = tok.decode(&[0, 1, u32::MAX]);
        }
    });
}

#[test]
fn fuzz_chat_templates() {
    campaign("chat_template", |input, _| {
        if let Ok(t) = ChatTemplate::new(&text(input), "<s>", "</s>") {
            let msgs = [
                ChatMessage::system("be brief"),
                ChatMessage::user("hi"),
                ChatMessage::assistant("hello"),
                ChatMessage::user("?"),
            ];
            let _ = t.render(&msgs, true);
            let _ = t.render(&msgs[1..2], false);
        }
    });
}
