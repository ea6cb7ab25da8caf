//! Mutated specs: whatever the compiler accepts, the runtime runs. Each spec under `graphs/` is
//! mutated (two op lines swapped, a line deleted or duplicated, an op moved between the
//! prologue, the layer body and the epilogue, a number changed) by a seeded generator, compiled
//! against the tiny fixture checkpoint of its family (tests/fixtures/), and every mutant the
//! compiler accepts runs a prompt and two decode steps on the CPU. The test asserts that nothing
//! panics (a panic anywhere, compiler or runtime, is a finding), that the compiler refuses a
//! mutant with located diagnostics rather than a broken invariant of its own, and that an
//! accepted mutant either gives finite logits or fails with a clean error.
//!
//! Bounded: `PER_SPEC` mutants per spec (about 200 in all), a few seconds in release.

use coli_compiler::{compile, DeviceProfile, Options, Spec};
use coli_runtime::exec::{ExecError, LogitRows, Model, Session};
use coli_runtime::model::{Checkpoint, LoadOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Mutants per spec.
const PER_SPEC: usize = 25;
/// The generator's seed (a run is reproducible).
const SEED: u64 = 0x5eed_c011;

/// SplitMix64: small, seeded, good enough to pick lines and numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

/// The line indices of the op lists: `(section, first line inside its list, op lines)`.
fn sections(lines: &[&str]) -> Vec<(String, usize, Vec<usize>)> {
    let mut out: Vec<(String, usize, Vec<usize>)> = Vec::new();
    let mut current: Option<usize> = None;
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        for name in ["prologue: [", "layer: [", "epilogue: ["] {
            if t.starts_with(name) && !t.ends_with("],") {
                out.push((name.trim_end_matches(": [").to_string(), i + 1, Vec::new()));
                current = Some(out.len() - 1);
            }
        }
        if t.starts_with("\"") && t.ends_with(": [") {
            out.push((format!("block {}", t.trim_end_matches(": [")), i + 1, Vec::new()));
            current = Some(out.len() - 1);
        } else if t == "]," || t == "}," {
            current = None;
        } else if let Some(c) = current {
            if t.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && t.contains('(') {
                out[c].2.push(i);
            }
        }
    }
    out
}

/// The byte ranges of the numbers of `line` (inside strings too: `"1e-6"`, `"2048"`).
fn numbers(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'));
        if starts {
            let s = i;
            while i < b.len()
                && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || (b[i] == b'-' && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            out.push((s, i));
        } else {
            i += 1;
        }
    }
    out
}

const NUMBERS: &[&str] =
    &["0", "1", "2", "3", "7", "-1", "0.0", "-1e-5", "1e-30", "1e30", "1e39", "4097", "65536", "1e400"];

/// One mutant of `text`: its description and its text; `None` when the draw did not apply.
fn mutate(text: &str, rng: &mut Rng) -> Option<(String, String)> {
    let mut lines: Vec<&str> = text.lines().collect();
    let secs = sections(&lines);
    let ops: Vec<usize> = secs.iter().flat_map(|s| s.2.iter().copied()).collect();
    let desc = match rng.below(6) {
        0 => {
            let (a, b) = (*rng.pick(&ops)?, *rng.pick(&ops)?);
            if a == b {
                return None;
            }
            lines.swap(a, b);
            format!("swap lines {} and {}", a + 1, b + 1)
        }
        1 => {
            let a = *rng.pick(&ops)?;
            lines.remove(a);
            format!("delete op line {}", a + 1)
        }
        2 => {
            let a = rng.below(lines.len());
            lines.remove(a);
            format!("delete line {}", a + 1)
        }
        3 => {
            let a = *rng.pick(&ops)?;
            lines.insert(a, lines[a]);
            format!("duplicate line {}", a + 1)
        }
        4 => {
            let a = *rng.pick(&ops)?;
            let (name, first, _) = rng.pick(&secs)?.clone();
            let line = lines.remove(a);
            let at = if first > a { first - 1 } else { first };
            // At the start or the end of the section's list.
            let at = if rng.below(2) == 0 {
                at
            } else {
                let len = secs.iter().find(|s| s.0 == name).map_or(0, |s| s.2.len());
                (at + len).min(lines.len())
            };
            lines.insert(at, line);
            format!("move line {} to the {name}", a + 1)
        }
        _ => {
            let candidates: Vec<(usize, (usize, usize))> =
                lines.iter().enumerate().flat_map(|(i, l)| numbers(l).into_iter().map(move |r| (i, r))).collect();
            let &(i, (s, e)) = rng.pick(&candidates)?;
            let n = rng.pick(NUMBERS)?;
            let changed = format!("{}{n}{}", &lines[i][..s], &lines[i][e..]);
            let desc = format!("line {}: `{}` -> `{n}`", i + 1, &lines[i][s..e]);
            let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            out[i] = changed;
            return Some((desc, out.join("\n")));
        }
    };
    Some((desc, lines.join("\n")))
}

/// How a mutant ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Refused,
    Failed,
    Ran,
}

/// The last panic's message and place, written by the hook.
static PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Compiles `text` for the checkpoint and runs what the compiler accepts; a panic inside is
/// caught by the caller. `Err` describes logits that are not finite.
fn run_mutant(text: &str, path: &Path, ckpt: &Checkpoint) -> Result<Outcome, String> {
    let Ok(spec) = Spec::parse(text, path) else { return Ok(Outcome::Refused) };
    let plan = match compile(&spec, &ckpt.bindings(), &DeviceProfile::cpu_only(), &Options::default()) {
        Ok(plan) => plan,
        // A broken plan invariant is the compiler's bug, not the mutant's.
        Err(d) if d.iter().any(|e| e.message.contains("internal error")) => return Err(d.to_string()),
        Err(_) => return Ok(Outcome::Refused),
    };
    let Ok(model) = Model::load(ckpt, plan.program.clone(), &mut |_, _| {}) else { return Ok(Outcome::Failed) };
    let vocab = plan.program.dims.vocab.max(1) as u32;
    let prompt: Vec<u32> = [1u32, 7, 3, 7, 2].iter().map(|t| t % vocab).collect();
    let mut s = Session::new(&model, 64);
    let check = |l: Result<Vec<f32>, ExecError>, what: &str| -> Result<bool, String> {
        match l {
            Err(_) => Ok(false),
            Ok(l) if l.iter().all(|x| x.is_finite()) => Ok(true),
            Ok(l) => {
                Err(format!("{what}: {} of {} logits not finite", l.iter().filter(|x| !x.is_finite()).count(), l.len()))
            }
        }
    };
    if !check(s.forward(&prompt, LogitRows::All), "the prompt")? {
        return Ok(Outcome::Failed);
    }
    for step in 0..2 {
        if !check(s.forward(&[(step + 4) % vocab], LogitRows::Last), "a decode step")? {
            return Ok(Outcome::Failed);
        }
    }
    Ok(Outcome::Ran)
}

#[test]
fn mutated_specs_compile_to_plans_that_run_or_are_refused_cleanly() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut specs: Vec<PathBuf> = std::fs::read_dir(root.join("graphs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ron"))
        .collect();
    specs.sort();
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg} at {at}"));
    }));
    let mut rng = Rng(SEED);
    let mut findings = Vec::new();
    let mut counts = [0usize; 3];
    for path in &specs {
        let family = path.file_stem().unwrap().to_string_lossy().to_string();
        let dir = root.join("tests/fixtures").join(&family);
        assert!(dir.is_dir(), "{family}: no fixture checkpoint at {}", dir.display());
        let ckpt = Checkpoint::open(&dir, &LoadOptions::default()).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        // The spec itself runs.
        assert_eq!(run_mutant(&text, path, &ckpt), Ok(Outcome::Ran), "{family}: the unmutated spec");
        let mut made = 0;
        while made < PER_SPEC {
            let Some((desc, mutant)) = mutate(&text, &mut rng) else { continue };
            made += 1;
            match catch_unwind(AssertUnwindSafe(|| run_mutant(&mutant, path, &ckpt))) {
                Ok(Ok(o)) => counts[o as usize] += 1,
                Ok(Err(e)) => findings.push(format!("{family}: {desc}: {e}")),
                Err(_) => {
                    let m = PANIC.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
                    findings.push(format!("{family}: {desc}: panicked: {m}"));
                }
            }
        }
    }
    let _ = std::panic::take_hook();
    eprintln!("mutants: {} refused, {} failed cleanly, {} ran", counts[0], counts[1], counts[2]);
    assert!(findings.is_empty(), "{} mutants went wrong:\n{}", findings.len(), findings.join("\n"));
    // Not vacuous: both kinds occur.
    assert!(counts[0] > 0 && counts[2] > 0, "{counts:?}");
}
