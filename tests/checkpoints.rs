//! Checkpoints as they are published, through `coli` run as a process: a model named by its
//! Hugging Face id in a fake hub cache (`HF_HUB_CACHE`, files linked into `blobs/` as the hub
//! lays them out) runs as its directory does, and an id the cache lacks is a clear error
//! saying where it looked.

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
