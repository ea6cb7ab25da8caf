//! Checkpoints as they are published, through `coli` run as a process: a model named by its
//! Hugging Face id in a fake hub cache (`HF_HUB_CACHE`, files linked into `blobs/` as the hub
//! lays them out) runs as its directory does, and an id the cache lacks is a clear error
//! saying where it looked; a checkpoint's `generation_config.json` ends generation at its EOS
//! ids and gives the sampling defaults (the flags winning), and a malformed one is a clear
//! error.

mod common;

use common::*;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn coli_in(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .current_dir(root())
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_HOME")
        .output()
        .expect("coli runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A directory of this test process's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("coli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A hub cache (in a scratch directory named `name`) holding `tests/fixtures/<fixture>` as
/// `org/<fixture>` at commit `c0ffee`.
fn fake_cache(name: &str, fixture: &str) -> Scratch {
    let cache = Scratch::new(name);
    let repo = cache.path().join(format!("models--org--{fixture}"));
    let snap = repo.join("snapshots/c0ffee");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "c0ffee").unwrap();
    for (i, e) in std::fs::read_dir(fixture_dir(fixture)).unwrap().enumerate() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name == "oracle.json" {
            continue;
        }
        let blob = format!("b{i:03}");
        std::fs::copy(e.path(), repo.join("blobs").join(&blob)).unwrap();
        symlink(format!("../../blobs/{blob}"), snap.join(&name)).unwrap();
    }
    cache
}

#[test]
fn a_hub_id_runs_the_cached_snapshot() {
    let cache = fake_cache("hub-runs", "llama");
    let run = |model: &str| {
        let o = coli_in(
            cache.path(),
            &["exec", "--device", "cpu", "--model", model, "--prompt-ids", "33,104,49", "-n", "6"],
        );
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let want = run(fixture_dir("llama").to_str().unwrap());
    assert!(!want.trim().is_empty());
    assert_eq!(run("org/llama"), want);
    assert_eq!(run("org/llama@c0ffee"), want);
}

#[test]
fn a_hub_id_not_in_the_cache_is_a_clear_error() {
    let cache = fake_cache("hub-absent", "llama");
    let o = coli_in(cache.path(), &["exec", "--model", "org/absent", "--prompt-ids", "1"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("--model org/absent: org/absent is not in the Hugging Face cache"), "{e}");
    assert!(e.contains("models--org--absent") && !e.contains("panicked"), "{e}");
    let o = coli_in(cache.path(), &["exec", "--model", "org/llama@v9", "--prompt-ids", "1"]);
    assert!(stderr(&o).contains("no revision \"v9\""), "{}", stderr(&o));
}

/// A copy of `tests/fixtures/<fixture>` (no oracle) in a scratch directory, with
/// `generation_config.json` replaced by `gen` (when given).
fn fixture_copy(name: &str, fixture: &str, gen: Option<&str>) -> Scratch {
    let d = Scratch::new(name);
    for e in std::fs::read_dir(fixture_dir(fixture)).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "oracle.json" {
            std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    if let Some(g) = gen {
        std::fs::write(d.path().join("generation_config.json"), g).unwrap();
    }
    d
}

/// The ids `coli exec` prints for the llama fixture's oracle prompt (no tokenizer: ids out).
fn exec_ids(model: &Path, extra: &[&str]) -> Vec<u32> {
    let prompt = "33,104,49,287,196,85,211,194,291,49,295,104,85,28";
    let mut args = vec!["exec", "--device", "cpu", "--model", model.to_str().unwrap(), "--prompt-ids", prompt];
    args.extend(extra);
    let o = coli_in(Path::new("/nonexistent"), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.trim().split(',').map(|x| x.parse().unwrap()).collect()
}

#[test]
fn generation_config_eos_ids_end_generation() {
    let greedy = ids(&read_json(&fixture_dir("llama").join("oracle.json"))["greedy"]);
    let stock = fixture_copy("gen-stock", "llama", None);
    assert_eq!(exec_ids(stock.path(), &["-n", "8"]), greedy[..8], "the stock file's EOS (2) is not among them");
    // The third greedy token made an EOS id (in a list): generation ends on it.
    let gen = format!("{{\"eos_token_id\": [{}, 7], \"bos_token_id\": 1}}", greedy[2]);
    let d = fixture_copy("gen-eos", "llama", Some(&gen));
    assert_eq!(exec_ids(d.path(), &["-n", "8"]), greedy[..3]);
    assert_eq!(exec_ids(d.path(), &["-n", "8", "--ignore-eos"]), greedy[..8]);
    // One id, not a list.
    let d = fixture_copy("gen-eos1", "llama", Some(&format!("{{\"eos_token_id\": {}}}", greedy[1])));
    assert_eq!(exec_ids(d.path(), &["-n", "8"]), greedy[..2]);
}

#[test]
fn generation_config_sampling_is_the_default_and_flags_win() {
    let greedy = ids(&read_json(&fixture_dir("llama").join("oracle.json"))["greedy"]);
    // Hot sampling over the whole vocabulary: 8 draws matching greedy would be a miracle.
    let gen = r#"{"do_sample": true, "temperature": 50.0, "top_k": 0, "top_p": 1.0, "eos_token_id": 2}"#;
    let d = fixture_copy("gen-sample", "llama", Some(gen));
    let sampled = exec_ids(d.path(), &["-n", "8", "--ignore-eos"]);
    assert_eq!(sampled.len(), 8);
    assert_ne!(sampled, greedy[..8], "the file's sampling settings were not used");
    assert_eq!(exec_ids(d.path(), &["-n", "8", "--ignore-eos", "--seed", "0"]), sampled, "seeded");
    assert_eq!(exec_ids(d.path(), &["-n", "8", "--ignore-eos", "--temperature", "0"]), greedy[..8], "the flag wins");
    // Without do_sample, the file's temperature does not make coli sample (as transformers).
    let d = fixture_copy("gen-nosample", "llama", Some(r#"{"temperature": 50.0, "top_k": 0}"#));
    assert_eq!(exec_ids(d.path(), &["-n", "8"]), greedy[..8]);
}

#[test]
fn a_malformed_generation_config_is_a_clear_error() {
    for (gen, needle) in [
        (r#"{"eos_token_id": "</s>"}"#, "generation_config.json: eos_token_id is \"</s>\", not a token id"),
        (r#"{"do_sample": true, "top_p": 7}"#, "generation_config.json: top_p is 7; it must be in (0, 1]"),
        (r#"{"eos_token_id": 2"#, "generation_config.json: not valid JSON"),
    ] {
        let d = fixture_copy("gen-bad", "llama", Some(gen));
        let o =
            coli_in(Path::new("/nonexistent"), &["exec", "--model", d.path().to_str().unwrap(), "--prompt-ids", "1"]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains("coli: error:") && e.contains(needle) && !e.contains("panicked"), "{needle}: {e}");
    }
}

/// Appends an F32 tensor of `len` zeros named `name` to a safetensors file.
fn append_tensor(file: &Path, name: &str, len: usize) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header.insert(
        name.to_string(),
        serde_json::json!({"dtype": "F32", "shape": [len], "data_offsets": [data.len(), data.len() + 4 * len]}),
    );
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(data);
    out.extend(vec![0u8; 4 * len]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn tensors_the_spec_does_not_read_are_named_in_a_warning() {
    // Biases the configuration does not switch on: the spec reads none of them, so the run is
    // the same model, but the checkpoint holds something it does not explain.
    let d = fixture_copy("unread", "llama", None);
    append_tensor(&d.path().join("model.safetensors"), "model.layers.1.self_attn.q_proj.bias", 64);
    let o = coli_in(
        Path::new("/nonexistent"),
        &["exec", "--model", d.path().to_str().unwrap(), "--prompt-ids", "1", "-n", "1"],
    );
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("1 tensors of") && e.contains("not read by the llama spec (model.layers.1.self_attn.q_proj.bias)"),
        "{e}"
    );
    // The fixture as it is warns of nothing.
    let o = coli_in(
        Path::new("/nonexistent"),
        &["exec", "--model", fixture_dir("llama").to_str().unwrap(), "--prompt-ids", "1", "-n", "1"],
    );
    assert!(!stderr(&o).contains("not read by"), "{}", stderr(&o));
}
