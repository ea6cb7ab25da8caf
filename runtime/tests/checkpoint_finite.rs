//! The non-finite scan on real checkpoints, when present: every tensor of SmolLM2-135M (the
//! default model, `tools/fetch-model.sh`) and of pymoe-22m (the shared models directory) is
//! finite, and the scan's cost is printed (`--nocapture`): the first use of every tensor
//! (scan included) against a second use (the kept result) and against paging the files in.
//!
//! Must not: download anything; a missing checkpoint skips its test with a note.

use coli_runtime::model::{Checkpoint, LoadOptions};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn scan(path: &Path) {
    let ck = Checkpoint::open(path, &LoadOptions::default()).unwrap();
    let names: Vec<String> = ck.names().map(str::to_string).collect();
    let t0 = Instant::now();
    let mut bytes = 0;
    for n in &names {
        match ck.tensor(n) {
            Ok(t) => bytes += t.bytes().len(),
            Err(coli_runtime::model::LoadError::UnsupportedType { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let first = t0.elapsed();
    let t1 = Instant::now();
    for n in &names {
        let _ = ck.tensor(n);
    }
    let again = t1.elapsed();
    // What reading the pages costs without the scan: one byte per page of a fresh map of each
    // file (the first forward pays this anyway).
    let t2 = Instant::now();
    let mut sum = 0u64;
    for f in files(path) {
        let map = unsafe { memmap2::Mmap::map(&std::fs::File::open(&f).unwrap()) }.unwrap();
        sum += map.iter().step_by(4096).map(|&b| b as u64).sum::<u64>();
    }
    let pages = t2.elapsed();
    println!(
        "{}: {} tensors, {:.1} MB: first use (scan) {:.1} ms ({:.2} GB/s), second use {:.2} ms; \
         paging the files in alone {:.1} ms ({sum})",
        path.display(),
        names.len(),
        bytes as f64 / 1e6,
        first.as_secs_f64() * 1e3,
        bytes as f64 / first.as_secs_f64() / 1e9,
        again.as_secs_f64() * 1e3,
        pages.as_secs_f64() * 1e3
    );
}

/// The tensor files of a checkpoint: the .gguf, or a directory's .safetensors.
fn files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    v
}

#[test]
fn smollm2_is_finite_and_the_scan_is_cheap() {
    let Some(home) = std::env::var_os("HOME") else { return };
    let p = PathBuf::from(home).join(".cache/coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.is_file() {
        eprintln!("note: skipping: {} is absent (tools/fetch-model.sh fetches it)", p.display());
        return;
    }
    scan(&p);
}

#[test]
fn pymoe_is_finite() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = [
        std::env::var_os("COLI_SHARED").map(PathBuf::from),
        Some(root.join("../shared")),
        Some(PathBuf::from("/work/shared")),
    ]
    .into_iter()
    .flatten()
    .map(|s| s.join("models/pymoe-22m"))
    .find(|d| d.is_dir());
    let Some(dir) = dir else {
        eprintln!("note: skipping: pymoe-22m is absent (set COLI_SHARED)");
        return;
    };
    scan(&dir);
}
