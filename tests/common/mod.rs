//! Helpers shared by the end-to-end tests: fixture paths, JSON readers, comparisons.
#![allow(dead_code)]

use coli::load::{load, LoadRequest, Loaded};
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

pub fn load_model(path: &Path) -> Loaded {
    load(LoadRequest::new(path)).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
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
    a.iter().zip(b).flat_map(|(x, y)| {
        assert_eq!(x.len(), y.len(), "row widths differ");
        x.iter().zip(y).map(|(p, q)| (p - q).abs())
    }).fold(0.0, f32::max)
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
