//! The expert tier's host pool (`TierOptions::host_pool`) end to end on the Vulkan device the
//! machine has (Lavapipe in CI), against the CPU path: a few device slots and a pool for more
//! experts, so the device computes pairs from its slots and from the pool:
//! - the pool in imported host memory (where the device has `VK_EXT_external_memory_host`) and
//!   forced into the driver's host-visible memory: logits within the tier tests' tolerance
//!   (1e-4 of the largest |logit|), the same greedy tokens, pairs served from the pool > 0,
//!   pool experts moved up to the device;
//! - with the RAM cache, the trunk on the device and on the CPU (`device_layers: 0`): the same
//!   tokens, and no expert both in a slot (device or pool) and in RAM;
//! - a stress run (one row a step, many moves between the device and the pool) matches the CPU
//!   and, the model dropped, leaves no memory held (every imported block freed);
//! - a budget too small for one expert: no pool, and the tier's line says why;
//! - no device slot (`max_experts: Some(0)`) and a pool of every expert: the same tokens, every
//!   device pair from the pool, and a second run with the tier's pair table kept the same;
//! - the balancer's fixed shares give the CPU the pool's pairs (all, or some, whole experts)
//!   with the same tokens, and none where the RAM cache serves the layer.

mod common;

use coli_compiler::ir::Op;
use coli_compiler::Options;
use coli_runtime::engine::{DeviceRequest, Engine, EngineOptions};
use coli_runtime::ramcache::{RamBudget, RamOptions};
use coli_runtime::tier::{Balance, PoolBudget, TierOptions, TierStats};
use coli_runtime::vk::{MemoryUse, VkOptions};
use common::*;
use std::path::Path;

const CONTEXT: usize = 256;

fn options(pool: PoolBudget, import: bool, ram: RamOptions) -> EngineOptions {
    EngineOptions {
        device: DeviceRequest::Vulkan(VkOptions::default()),
        compile: Options { context: CONTEXT, chunk_rows: 8, resident_experts: false, ..Options::default() },
        tier: TierOptions {
            max_experts: Some(3),
            deterministic: true,
            host_pool: pool,
            host_pool_import: import,
            promotions_per_token: 4,
            ..TierOptions::default()
        },
        ram,
        ..EngineOptions::default()
    }
}

fn no_ram() -> RamOptions {
    RamOptions { budget: RamBudget::Off, ..RamOptions::default() }
}

fn load(dir: &Path, o: &EngineOptions) -> Engine {
    let l = Engine::load(dir, o).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(l.device().is_some(), "{}: {}", dir.display(), l.device_note());
    l
}

fn stats(l: &Engine) -> TierStats {
    l.device().and_then(|d| d.with_tier(|t| t.stats().clone())).expect("a tier")
}

/// `l`'s greedy run of `p` on the device against the CPU's `want`: the same tokens, logits
/// within the tier tests' tolerance (1e-4 of the largest |logit|).
fn matches_cpu(l: &Engine, p: &[u32], want: &Run, what: &str) -> Run {
    let got = run_greedy(l, p, 5, 8, CONTEXT, true);
    assert!(got.on_device, "{what}: {:?}", got.notice);
    assert_eq!(got.toks, want.toks, "{what}: greedy tokens");
    let diff = max_abs_diff(&got.rows, &want.rows);
    assert!(diff <= 1e-4 * max_abs(&want.rows), "{what}: {diff}");
    got
}

/// Bytes of one expert in the tier's slots.
fn expert_bytes(dir: &Path) -> u64 {
    let l = load(dir, &options(PoolBudget::Off, true, no_ram()));
    l.device().unwrap().with_tier(|t| t.expert_bytes()).unwrap() as u64
}

#[test]
fn pairs_from_the_host_pool_match_the_cpu_imported_or_not() {
    let mut moved_up = 0;
    for name in ["olmoe", "qwen3_moe"] {
        let dir = fixture_dir(name);
        let p = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
        let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
        let each = expert_bytes(&dir);
        for import in [true, false] {
            let l = load(&dir, &options(PoolBudget::Bytes(6 * each), import, no_ram()));
            let line = l.tier_line().unwrap().to_string();
            assert!(line.contains("host pool: budget") && line.contains("= 6 experts of"), "{name}: {line}");
            let mem = l.device().unwrap().with_tier(|t| (t.pool_slots(), t.pool_memory())).unwrap();
            // Lavapipe has VK_EXT_external_memory_host; a device without it says so.
            let imports = line.contains("imported with VK_EXT_external_memory_host");
            assert!(imports || !import || line.contains("lacks VK_EXT_external_memory_host"), "{line}");
            let used = if imports { MemoryUse::PoolImport } else { MemoryUse::Pool };
            assert_eq!(mem, (6, Some(used)), "{name}: {line}");
            if !import {
                assert!(line.contains("import off"), "{line}");
            }
            matches_cpu(&l, &p, &want, &format!("{name}, import {import}"));
            let s = stats(&l);
            assert!(s.pool > 0 && s.device > s.pool, "{name}: {s:?}");
            moved_up += s.pool_promotions;
            let summary = l.device().unwrap().with_tier(|t| t.summary()).unwrap();
            assert!(summary.contains("from the host pool"), "{summary}");
            eprintln!("{name}, import {import}: {line}\n{summary}");
        }
    }
    assert!(moved_up > 0, "pool experts moved up to the device");
}

#[test]
fn the_host_pool_and_the_ram_cache_hold_different_experts() {
    let dir = fixture_dir("olmoe");
    let p = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
    let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
    let each = expert_bytes(&dir);
    for device_layers in [None, Some(0)] {
        let ram = RamOptions { budget: RamBudget::Bytes(1 << 20), readers: 2, ..RamOptions::default() };
        let mut o = options(PoolBudget::Bytes(4 * each), true, ram);
        o.compile.device_layers = device_layers;
        let l = load(&dir, &o);
        assert_eq!(l.device().unwrap().has_device_frames(), device_layers.is_none(), "the trunk's place");
        pool_and_ram(&l, &p, &want);
    }
}

fn pool_and_ram(l: &Engine, p: &[u32], want: &Run) {
    matches_cpu(l, p, want, "pool and RAM");
    let r = l.model().ram_cache().unwrap();
    let d = l.device().unwrap();
    let mut in_pool = 0;
    for layer in 0..l.plan().program.layers.len() {
        for e in 0..8 {
            let (dev, pool) = d.with_tier(|t| (t.is_resident(layer, e), t.in_host_pool(layer, e))).unwrap();
            in_pool += usize::from(pool);
            assert!(!(dev && r.holds(layer, e)), "l{layer}.e{e} in a slot and in RAM");
        }
    }
    assert!(in_pool > 0 && stats(l).pool > 0, "{:?}", stats(l));
    let summary = l.ram_summary().unwrap();
    assert!(summary.contains("host pool") && summary.contains("RAM cache"), "{summary}");
    let b = r.check_books();
    assert_eq!((b.held, b.shared), (b.sum, 0), "{b:?}");
}

#[test]
fn a_host_pool_too_small_for_one_expert_is_off_and_says_why() {
    let dir = fixture_dir("olmoe");
    let each = expert_bytes(&dir);
    let l = load(&dir, &options(PoolBudget::Bytes(each - 1), true, no_ram()));
    let line = l.tier_line().unwrap();
    assert!(line.contains("host pool off: its budget of") && line.contains("holds no expert of"), "{line}");
    assert_eq!(l.device().unwrap().with_tier(|t| t.pool_slots()).unwrap(), 0);
    let none = load(&dir, &options(PoolBudget::Off, true, no_ram()));
    assert!(none.tier_line().unwrap().contains("no host pool"));
}

/// `PoolBudget::Auto` on this machine (free memory far above the fixture's experts): the pool
/// holds every expert the device slots leave, and the tier's line says the rule.
#[test]
fn an_automatic_pool_holds_every_expert_the_device_leaves() {
    let dir = fixture_dir("olmoe");
    let l = load(&dir, &options(PoolBudget::Auto, true, no_ram()));
    let line = l.tier_line().unwrap();
    assert!(line.contains("from free memory") && line.contains("every expert the device leaves"), "{line}");
    let moe: Vec<(usize, usize)> = (l.plan().program.layers.iter().flat_map(|x| &x.ops))
        .filter_map(|op| match op {
            Op::RoutedExperts { layer, experts, .. } => Some((layer.0 as usize, *experts)),
            _ => None,
        })
        .collect();
    let total: usize = moe.iter().map(|m| m.1).sum();
    let d = l.device().unwrap();
    assert_eq!(d.with_tier(|t| t.pool_slots()).unwrap(), total - 3, "the device holds 3, the pool the rest: {line}");
    // Every expert in a slot after the warm start, all but the device's 3 in the pool's.
    let mut in_pool = 0;
    for (layer, n) in moe {
        for e in 0..n {
            let (slot, pool) = d.with_tier(|t| (t.is_resident(layer, e), t.in_host_pool(layer, e))).unwrap();
            assert!(slot, "layer {layer} expert {e} in no slot: {line}");
            in_pool += pool as usize;
        }
    }
    assert_eq!(in_pool, total - 3, "{line}");
}

/// `--tier-experts 0` with a pool: no device slot, every expert in host memory the device
/// reads over the bus (the prompt's experts on the device, as the device's own memory could not
/// hold them); the same tokens as the CPU, every device pair from the pool, none moved up.
#[test]
fn a_tier_of_no_device_slots_serves_every_expert_from_the_pool() {
    let dir = fixture_dir("olmoe");
    let p = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
    let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
    // Steps of 8 rows (the prompt's chunks) and of one (decode).
    let mut o = options(PoolBudget::Auto, true, no_ram());
    o.tier.max_experts = Some(0);
    let l = load(&dir, &o);
    let line = l.tier_line().unwrap().to_string();
    assert!(line.contains("= 0 experts of") && line.contains("every expert the device leaves"), "{line}");
    let got = matches_cpu(&l, &p, &want, "no device slot");
    let s = stats(&l);
    assert!(s.pool > 0 && s.device == s.pool && s.pool_promotions == 0, "{s:?}");
    // The run line counts the device's bytes apart from the pool's experts.
    let (summary, pooled) = l.device().unwrap().with_tier(|t| (t.summary(), t.pool_slots())).unwrap();
    assert!(summary.contains("(0 B of ") && summary.contains(&format!(", {pooled} in the host pool)")), "{summary}");
    // A second run of the same engine reuses the tier's pair table: the same rows.
    let again = run_greedy(&l, &p, 5, 8, CONTEXT, true);
    assert_eq!((again.toks, again.rows), (got.toks, got.rows), "the kept table");
    // Without a pool, no device slot is no tier.
    let mut o = options(PoolBudget::Off, true, no_ram());
    o.tier.max_experts = Some(0);
    let l = Engine::load(&dir, &o).unwrap();
    assert!(l.tier_line().is_none_or(|t| t.contains("expert tier off")), "{:?}", l.tier_line());
}

#[test]
fn a_stress_run_moves_experts_between_the_levels_and_leaves_no_memory_held() {
    let dir = fixture_dir("olmoe");
    let each = expert_bytes(&dir);
    let mut o = options(PoolBudget::Bytes(5 * each), true, no_ram());
    o.tier.promotions_per_token = 64;
    let l = load(&dir, &o);
    let ctx = l.device().unwrap().ctx.clone();
    let prompt: Vec<u32> = (0..120).map(|i| (i * 37 + 11) % 100).collect();
    let want = run_greedy(&load_model(&dir), &prompt, 1, 0, CONTEXT, false);
    let got = run_greedy(&l, &prompt, 1, 0, CONTEXT, false);
    assert!(got.on_device, "{:?}", got.notice);
    assert!(max_abs_diff(&got.rows, &want.rows) <= 1e-4 * max_abs(&want.rows));
    let s = stats(&l);
    assert!(s.pool > 20 && s.pool_promotions > 0 && s.evictions > 0 && s.failed == 0, "{s:?}");
    drop(l);
    ctx.trim();
    let m = ctx.memory_stats();
    assert_eq!((m.used_bytes, m.blocks), (0, 0), "every buffer and block freed: {m:?}");
}

#[test]
fn the_balancer_gives_the_pools_pairs_to_the_cpu_with_the_same_tokens() {
    let dir = fixture_dir("olmoe");
    let p = ids(&read_json(&dir.join("oracle.json"))["prompt_ids"]);
    let want = run_greedy(&load_model(&dir), &p, 5, 8, CONTEXT, true);
    let each = expert_bytes(&dir);
    let run = |share: f32, ram: RamOptions| {
        let mut o = options(PoolBudget::Bytes(6 * each), true, ram);
        o.tier.balance = Balance::Fixed(share);
        let l = load(&dir, &o);
        matches_cpu(&l, &p, &want, &format!("share {share}"));
        let summary = l.device().unwrap().with_tier(|t| t.summary()).unwrap();
        assert!(summary.contains("of the pool's by the balancer"), "{summary}");
        stats(&l)
    };
    let all = run(1.0, no_ram());
    assert!(all.pool == 0 && all.balanced > 0 && all.device > 0, "every pool pair on the CPU: {all:?}");
    let half = run(0.5, no_ram());
    assert!(half.pool > 0 && half.balanced > 0, "some of each: {half:?}");
    let none = run(0.0, no_ram());
    assert_eq!(none.balanced, 0, "{none:?}");
    // Where the RAM cache serves the layer, a pool expert's host copy would come from disk.
    let ram = RamOptions { budget: RamBudget::Bytes(1 << 20), readers: 2, ..RamOptions::default() };
    let cached = run(1.0, ram);
    assert!(cached.balanced == 0 && cached.pool > 0, "{cached:?}");
}
