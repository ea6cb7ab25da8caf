//! The RAM expert cache (`coli_runtime::ramcache`) end to end on the tiny MoE fixtures: the
//! CPU computes routed experts from owned copies read from the checkpoint file, against the
//! plain CPU path (experts through the memory map):
//! - a budget of a few experts reads from disk every step: the same logits bit for bit and
//!   the same greedy tokens, the per-run line reports the disk's share;
//! - with the device tier on (Lavapipe), and with the trunk on the CPU (`device_layers: 0`):
//!   the same tokens, and no expert held both on the device and in RAM (exclusive caching);
//! - a checkpoint truncated behind the cache is a typed error, never wrong numbers;
//! - the prefetch of the next layer's experts on and off: the same logits bit for bit and the
//!   same tokens, and the per-run line's prefetch numbers sane (guessed > 0, used <= guessed);
//! - a stress run (one row a step, a cache of two experts) reads and evicts all along, and the
//!   books balance at the end (bytes held = the sum of the entries, none still shared);
//! - pins: the history's hottest experts are held before the first step, stay held under a
//!   budget two experts above them (every other expert read and evicted all along), and the
//!   logits are the plain CPU's bit for bit.

mod common;

use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::exec::{ExecError, LogitRows, Session};
use coli_runtime::ramcache::io::IoError;
use coli_runtime::ramcache::{RamBudget, RamError, RamOptions};
use coli_runtime::tier::history::History;
use coli_runtime::tier::TierOptions;
use coli_runtime::vk::VkOptions;
use common::*;
use std::path::{Path, PathBuf};

const CONTEXT: usize = 256;

fn prompt(dir: &Path) -> Vec<u32> {
    ids(&read_json(&dir.join("oracle.json"))["prompt_ids"])
}

fn ram(budget: u64) -> RamOptions {
    RamOptions { budget: RamBudget::Bytes(budget), readers: 3, direct_io: true, prefetch: true, pin: 0 }
}

/// The CPU with a RAM cache of `budget` bytes, the prefetch on or off.
fn load_prefetch(dir: &Path, budget: u64, prefetch: bool) -> Engine {
    let opts = EngineOptions { ram: RamOptions { prefetch, ..ram(budget) }, ..EngineOptions::default() };
    Engine::load(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The CPU with a RAM cache of `budget` bytes.
fn load_ram(dir: &Path, budget: u64) -> Engine {
    let opts = EngineOptions { ram: ram(budget), ..EngineOptions::default() };
    Engine::load(dir, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Bytes of one expert in the cache of `dir`'s model.
fn expert_bytes(dir: &Path) -> u64 {
    load_ram(dir, 0).model().ram_cache().expect("a cache").expert_bytes() as u64
}

fn books_balance(l: &Engine) {
    let b = l.model().ram_cache().unwrap().check_books();
    assert_eq!(b.held, b.sum, "bytes held = the sum of the entries: {b:?}");
    assert_eq!(b.shared, 0, "no step still holds an entry: {b:?}");
}

#[test]
fn a_budget_of_a_few_experts_reads_from_disk_every_step_and_matches_the_cpu() {
    for name in ["olmoe", "qwen3_moe", "mixtral"] {
        let dir = fixture_dir(name);
        let p = prompt(&dir);
        let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
        let each = expert_bytes(&dir);
        let l = load_ram(&dir, 3 * each);
        let line = l.ram_line().unwrap().to_string();
        assert!(line.contains("= 3 experts of"), "{name}: {line}");
        let got = run_greedy(&l, &p, 5, 8, CONTEXT, true);
        assert_eq!(got.toks, want.toks, "{name}: greedy tokens");
        assert_eq!(max_abs_diff(&got.rows, &want.rows), 0.0, "{name}: the same bytes give the same logits");
        let s = l.model().ram_cache().unwrap().stats();
        // Every forward (2 prompt chunks, 8 steps) runs 2 MoE layers of top-k pairs over more
        // experts than fit: each reads from disk.
        assert!(s.loads >= 10 && s.disk_pairs > 0 && s.disk_bytes >= s.loads * each / 2, "{name}: {s:?}");
        assert!(s.evictions > 0 && s.hit_pairs > 0, "{name}: {s:?}");
        let summary = l.ram_summary().unwrap();
        assert!(summary.contains("disk") && summary.contains("per token"), "{summary}");
        books_balance(&l);
    }
}

#[test]
fn the_prefetch_changes_where_bytes_come_from_never_the_numbers() {
    for name in ["olmoe", "qwen3_moe"] {
        let dir = fixture_dir(name);
        let p = prompt(&dir);
        let each = expert_bytes(&dir);
        let off = load_prefetch(&dir, 3 * each, false);
        let want = run_greedy(&off, &p, 1, 12, CONTEXT, true);
        let on = load_prefetch(&dir, 3 * each, true);
        let got = run_greedy(&on, &p, 1, 12, CONTEXT, true);
        assert_eq!(got.toks, want.toks, "{name}: greedy tokens");
        assert_eq!(max_abs_diff(&got.rows, &want.rows), 0.0, "{name}: the same logits bit for bit");
        let s = on.model().ram_cache().unwrap().stats();
        let q = &s.prefetch;
        assert!(q.guessed > 0 && q.used <= q.guessed && q.read + q.held == q.guessed, "{name}: {s:?}");
        assert!(q.covered <= q.misses && q.covered > 0 && q.failed == 0, "{name}: {s:?}");
        assert_eq!(off.model().ram_cache().unwrap().stats().prefetch.guessed, 0, "{name}: off guesses nothing");
        let line = on.ram_summary().unwrap();
        assert!(line.contains("prefetch:") && line.contains("precision"), "{line}");
        assert!(off.ram_summary().unwrap().ends_with("no prefetch"));
        books_balance(&on);
    }
}

fn load_tier(dir: &Path, budget: u64, device_layers: Option<usize>) -> Engine {
    Engine::load(dir, &tier_options(budget, device_layers)).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn tier_options(budget: u64, device_layers: Option<usize>) -> EngineOptions {
    EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options {
            context: CONTEXT,
            chunk_rows: 8,
            resident_experts: false,
            device_layers,
            ..Options::default()
        },
        tier: TierOptions { max_experts: Some(3), warm_start: false, deterministic: true, ..TierOptions::default() },
        ram: ram(budget),
        ..EngineOptions::default()
    }
}

/// No expert is both serving from a device slot and held in RAM.
fn exclusive(l: &Engine) {
    let r = l.model().ram_cache().unwrap();
    let d = l.device().unwrap();
    for layer in 0..l.plan().program.layers.len() {
        for e in 0..8 {
            let on_device = d.with_tier(|t| t.is_resident(layer, e)).unwrap();
            assert!(!(on_device && r.holds(layer, e)), "l{layer}.e{e} on the device and in RAM");
        }
    }
}

#[test]
fn with_the_device_tier_the_cpus_pairs_come_from_ram_and_disk_and_match_the_cpu() {
    for (name, device_layers) in [("olmoe", None), ("qwen3_moe", None), ("olmoe", Some(0)), ("qwen3_moe", Some(0))] {
        let dir = fixture_dir(name);
        let p = prompt(&dir);
        let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
        let l = load_tier(&dir, 3 * expert_bytes(&dir), device_layers);
        let d = l.device().unwrap_or_else(|| panic!("{name}: {}", l.device_note()));
        if device_layers == Some(0) {
            assert!(!d.has_device_frames(), "{name}: the trunk on the CPU");
        }
        let got = run_greedy(&l, &p, 5, 8, CONTEXT, true);
        assert!(got.on_device, "{name}: {:?}", got.notice);
        assert_eq!(got.toks, want.toks, "{name} {device_layers:?}: greedy tokens");
        assert!(max_abs_diff(&got.rows, &want.rows) <= 1e-4 * max_abs(&want.rows), "{name} {device_layers:?}");
        let s = l.model().ram_cache().unwrap().stats();
        let t = d.with_tier(|t| t.stats().clone()).unwrap();
        assert!(t.device > 0 && s.disk_pairs > 0, "{name}: tier {t:?}, ram {s:?}");
        assert_eq!(
            t.routed - t.device,
            s.hit_pairs + s.disk_pairs,
            "{name}: the CPU's pairs all went through the cache"
        );
        assert!(s.to_device > 0, "{name}: promoted experts moved from RAM to the device: {s:?}");
        exclusive(&l);
        let summary = l.ram_summary().unwrap();
        assert!(summary.contains("device tier") && summary.contains("RAM cache"), "{summary}");
        books_balance(&l);
    }
}

/// `src`'s safetensors file rewritten with every routed expert's tensor after all the others
/// (so a truncation cuts experts only), with its config, in `dst`: its path, and where the
/// experts start in it.
fn experts_last(src: &Path, dst: &Path) -> (PathBuf, u64) {
    std::fs::create_dir_all(dst).unwrap();
    for f in ["config.json", "generation_config.json", "oracle.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").collect();
    names.sort_by_key(|k| (k.contains(".experts."), (*k).clone()));
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    let mut experts_at = None;
    for k in names {
        if k.contains(".experts.") && experts_at.is_none() {
            experts_at = Some(out_data.len() as u64);
        }
        let mut t = header[k].clone();
        let off = &t["data_offsets"];
        let (a, b) = (off[0].as_u64().unwrap() as usize, off[1].as_u64().unwrap() as usize);
        let at = out_data.len();
        out_data.extend_from_slice(&data[a..b]);
        t["data_offsets"] = serde_json::json!([at, out_data.len()]);
        out_header.insert(k.clone(), t);
    }
    let mut h = serde_json::to_vec(&out_header).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&out_data);
    let path = dst.join("model.safetensors");
    std::fs::write(&path, &file).unwrap();
    (path, 8 + h.len() as u64 + experts_at.unwrap())
}

#[test]
fn a_checkpoint_truncated_behind_the_cache_is_a_typed_error() {
    let dir = fixture_dir("olmoe");
    let tmp = std::env::temp_dir().join(format!("coli-ram-truncated-{}", std::process::id()));
    let (file, experts_at) = experts_last(&dir, &tmp);
    let p = prompt(&dir);
    // The rewritten file runs as the fixture does.
    let want = run_greedy(&load_model(&dir), &p, 5, 2, CONTEXT, false);
    let l = load_ram(&tmp, 0);
    let got = run_greedy(&l, &p, 5, 2, CONTEXT, false);
    assert_eq!(got.toks, want.toks);
    // Cut the file a quarter into its experts: every read of a later expert fails.
    let whole = std::fs::read(&file).unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    let cut = experts_at + (len - experts_at) / 4;
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(cut).unwrap();
    let mut s = Session::new(l.model(), CONTEXT);
    for _ in 0..2 {
        match s.forward(&p, LogitRows::Last) {
            Err(ExecError::RamCache(RamError::Io(IoError::Truncated { end, want, .. }))) => {
                assert!(end < want && end == cut, "the file ends at {end}, cut at {cut}; a read to {want}");
            }
            other => panic!("expected a truncated read, got {:?}", other.map(|l| l.len())),
        }
        assert_eq!(s.pos(), 0, "a failed forward leaves no position behind");
    }
    // The file whole again: the same session runs on, and gives the plain CPU's tokens.
    std::fs::write(&file, &whole).unwrap();
    let vocab = l.plan().program.dims.vocab;
    let logits = s.forward(&p, LogitRows::All).unwrap();
    assert_eq!(logits.len(), p.len() * vocab);
    assert_eq!(argmax(&logits[logits.len() - vocab..]), want.toks[0]);
    books_balance(&l);
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_stress_run_reads_and_evicts_all_along_and_the_books_balance() {
    let dir = fixture_dir("olmoe");
    let l = load_ram(&dir, 2 * expert_bytes(&dir));
    let prompt: Vec<u32> = (0..120).map(|i| (i * 37 + 11) % 100).collect();
    let want = run_greedy(&load_model(&dir), &prompt, 1, 0, CONTEXT, false);
    let got = run_greedy(&l, &prompt, 1, 0, CONTEXT, false);
    assert_eq!(max_abs_diff(&got.rows, &want.rows), 0.0);
    let s = l.model().ram_cache().unwrap().stats();
    assert!(s.loads > 120 && s.evictions > 20 && s.transient > 100 && s.tokens == 120, "{s:?}");
    assert_eq!(s.hit_pairs + s.disk_pairs, 120 * 2 * 2, "every pair of 2 layers, top 2: {s:?}");
    let b = l.model().ram_cache().unwrap().check_books();
    assert!(b.entries <= 2 && b.held <= 2 * l.model().ram_cache().unwrap().expert_bytes() as u64, "{b:?}");
    books_balance(&l);
}

/// By default the budget comes from the free memory: a tiny model's experts fit, so there is
/// no cache (the map serves them); `RamBudget::Off` never makes one whatever the budget rule.
#[test]
fn the_default_budget_leaves_a_model_that_fits_to_the_map() {
    let dir = fixture_dir("olmoe");
    let l = Engine::load(&dir, &EngineOptions::default()).unwrap();
    assert!(l.ram_line().is_none(), "{:?}", l.ram_line());
    let off = EngineOptions {
        ram: RamOptions { budget: RamBudget::Off, ..RamOptions::default() },
        ..EngineOptions::default()
    };
    assert!(Engine::load(&dir, &off).unwrap().ram_line().is_none());
}

/// The MoE layers of `l`'s program (the layers the RAM cache serves).
fn moe_layers(l: &Engine) -> Vec<usize> {
    let r = l.model().ram_cache().unwrap();
    (0..l.plan().program.layers.len()).filter(|&i| r.serves(i)).collect()
}

#[test]
fn pinned_experts_are_loaded_first_never_evicted_and_change_no_logit() {
    let dir = fixture_dir("olmoe");
    let each = expert_bytes(&dir);
    let moe = moe_layers(&load_ram(&dir, 0));
    assert_eq!(moe.len(), 2, "{moe:?}");
    // A history: l(a).e3 and l(b).e2 the hottest of their layers (seeded at 32), l(a).e5 at 16.
    let mut h = History::new(8);
    h.add(moe[0], &[0, 0, 0, 100, 0, 50, 0, 0]);
    h.add(moe[1], &[0, 0, 80, 0, 0, 0, 0, 1]);
    let tmp = std::env::temp_dir().join(format!("coli-ram-pins-{}.coli_usage", std::process::id()));
    std::fs::write(&tmp, h.to_text()).unwrap();
    let opts = EngineOptions {
        ram: RamOptions { pin: 2 * each, prefetch: false, ..ram(4 * each) },
        tier: TierOptions { history: Some(tmp.clone()), ..TierOptions::default() },
        ..EngineOptions::default()
    };
    let l = Engine::load(&dir, &opts).unwrap();
    let r = l.model().ram_cache().unwrap();
    let line = l.ram_line().unwrap();
    assert!(line.contains("pinned: 2 of the history's hottest experts"), "{line}");
    // Before any step: the two hottest held and pinned, read at startup (not a step's load).
    let s = r.stats();
    assert_eq!((s.pinned, s.pinned_bytes, s.loads, s.hit_pairs), (2, 2 * each, 0, 0), "{s:?}");
    assert!(r.is_pinned(moe[0], 3) && r.is_pinned(moe[1], 2), "the hottest of each layer");
    assert!(!r.holds(moe[0], 5), "the third fits no pin");
    // One row a step: every other expert passes through the two free experts' room.
    let prompt: Vec<u32> = (0..120).map(|i| (i * 37 + 11) % 100).collect();
    let want = run_greedy(&load_model(&dir), &prompt, 1, 4, CONTEXT, true);
    let got = run_greedy(&l, &prompt, 1, 4, CONTEXT, true);
    assert_eq!(got.toks, want.toks);
    assert_eq!(max_abs_diff(&got.rows, &want.rows), 0.0, "pins move bytes, never numbers");
    let s = r.stats();
    assert!(s.evictions > 10 && s.transient > 100 && s.hit_pairs > 0, "pressure all along: {s:?}");
    assert!(r.is_pinned(moe[0], 3) && r.is_pinned(moe[1], 2) && r.holds(moe[0], 3) && r.holds(moe[1], 2));
    assert_eq!(s.unpinned, 0);
    let b = r.check_books();
    assert!(b.entries <= 4 && b.held <= 4 * each, "{b:?}");
    books_balance(&l);
    assert!(l.ram_summary().unwrap().contains("(2 pinned)"));
    // Without a history there is nothing to pin, and the line says so.
    let none = EngineOptions { tier: TierOptions::default(), ..opts };
    assert!(Engine::load(&dir, &none).unwrap().ram_line().unwrap().ends_with("no pins: no routing history"));
    // With the device tier (Lavapipe): a pinned expert the tier promotes moves up, so none is
    // held in both places, and the tokens stay the CPU's.
    let mut t = tier_options(4 * each, None);
    t.ram.pin = 2 * each;
    t.tier.history = Some(tmp.clone());
    let l = Engine::load(&dir, &t).unwrap();
    let p = self::prompt(&dir);
    let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
    let got = run_greedy(&l, &p, 5, 8, CONTEXT, true);
    assert!(got.on_device, "{:?}", got.notice);
    assert_eq!(got.toks, want.toks);
    assert_eq!(l.model().ram_cache().unwrap().stats().pinned, 2);
    exclusive(&l);
    books_balance(&l);
    std::fs::remove_file(&tmp).unwrap();
}
