//! The prefetch's books on the tiny OLMoE fixture (2 MoE layers of 8 experts, top 2): a guess
//! is counted, the next layer's step counts what it used and what the early reads covered, an
//! expert in flight is waited for and never read twice, the budget holds with early reads
//! about, and a failed early read is read again by the step that needs it.

use super::io::{IoPool, Request};
use super::{Inflight, RamBudget, RamCache, RamOptions};
use crate::cpu::experts::Routed;
use crate::cpu::Precision;
use crate::engine::{Engine, EngineOptions};
use std::path::Path;

fn engine(budget_experts: u64) -> Engine {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
    let probe = RamOptions { budget: RamBudget::Bytes(0), readers: 2, direct_io: true, prefetch: true, pin: 0 };
    let one = Engine::load(&dir, &EngineOptions { ram: probe.clone(), ..EngineOptions::default() })
        .unwrap()
        .model()
        .ram_cache()
        .unwrap()
        .expert_bytes() as u64;
    let ram = RamOptions { budget: RamBudget::Bytes(budget_experts * one), ..probe };
    Engine::load(&dir, &EngineOptions { ram, ..EngineOptions::default() }).unwrap()
}

/// Starts the guess for layer 1 from `n` rows of a fixed pattern (as layer 0's MoE input).
fn guess_layer1(l: &Engine, n: usize) {
    let r = l.model().ram_cache().unwrap();
    let hidden = l.model().program.dims.hidden;
    let x: Vec<f32> = (0..n * hidden).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let rows = Routed { x: &x, n, hidden, routing: &[], top_k: 2 };
    r.prefetch_next(0, &l.model().weights, &rows, Precision::Exact);
}

/// The experts in flight for cache layer 1: (guessed, read early).
fn inflight(r: &RamCache) -> (Vec<usize>, Vec<usize>) {
    let b = r.books();
    let f = b.inflight[1].as_ref().expect("a guess in flight");
    (f.guessed.clone(), f.read.clone())
}

#[test]
fn a_guess_is_counted_and_the_next_step_takes_its_reads_in_flight() {
    let l = engine(4);
    let r = l.model().ram_cache().unwrap();
    assert!(r.next[0].is_some() && r.next[1].is_none(), "layer 0 guesses for layer 1, the last for none");
    guess_layer1(&l, 1);
    let (guessed, read) = inflight(r);
    assert_eq!(guessed.len(), 2, "one row, top 2");
    assert_eq!(read, guessed, "nothing held yet: every guess read early");
    let s = r.stats();
    assert_eq!((s.prefetch.guessed, s.prefetch.read, s.prefetch.held, s.loads), (2, 2, 0, 2), "{s:?}");
    // Layer 1 routes to the first guess and to an expert not guessed.
    let other = (0..8).find(|e| !guessed.contains(e)).unwrap();
    let want = [(guessed[0].min(other), 1), (guessed[0].max(other), 1)];
    let f = r.fetch(1, &want, &|_| true).unwrap();
    assert_eq!(f.got.len(), 2);
    let s = r.stats();
    let p = &s.prefetch;
    assert_eq!((p.used, p.misses, p.covered, p.unused), (1, 2, 1, 1), "{s:?}");
    assert_eq!(s.loads, 3, "the covered expert is not read twice: {s:?}");
    assert!(r.books().inflight[1].is_none(), "the step took its early reads");
    // The bytes are the file's: the same as a fresh read of each expert.
    for &(e, _) in &want {
        let fresh = r.pool.read_all(&r.requests(1, &[e])).unwrap();
        let (_, c) = f.got.iter().find(|g| g.0 == e).unwrap();
        for (a, b) in c.bufs.iter().zip(&fresh) {
            assert_eq!(a.bytes(), b.bytes(), "expert {e}");
        }
    }
    drop(f);
    // Guessing again: the experts now held are not read.
    guess_layer1(&l, 1);
    let s = r.stats();
    assert!(s.prefetch.held >= 1 && s.prefetch.guessed == 4, "{s:?}");
    let c = r.check_books();
    assert_eq!(c.held, c.sum);
}

#[test]
fn the_budget_holds_with_early_reads_about() {
    let l = engine(2);
    let r = l.model().ram_cache().unwrap();
    for round in 0..6 {
        // Many rows guess many experts; at most as many as the budget holds are read.
        guess_layer1(&l, 16 + round);
        let (guessed, _) = inflight(r);
        assert!(guessed.len() <= 2, "capped at the budget's experts: {guessed:?}");
        let want = [(round % 8, 1), ((round + 3) % 8, 2)];
        drop(r.fetch(1, &want, &|_| true).unwrap());
        let c = r.check_books();
        assert!(c.held <= 2 * r.expert_bytes() as u64 && c.held == c.sum, "{c:?}");
        assert_eq!(c.shared, 0);
    }
    let s = r.stats();
    assert!(s.prefetch.guessed >= 6 && s.prefetch.used <= s.prefetch.guessed, "{s:?}");
    assert!(s.prefetch.covered <= s.prefetch.misses, "{s:?}");
}

#[test]
fn a_failed_early_read_is_read_again_by_the_step() {
    let l = engine(4);
    let r = l.model().ram_cache().unwrap();
    // An early read that fails: a pool over a short file, read past its end.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("short.bin");
    std::fs::write(&p, [0u8; 16]).unwrap();
    let broken = IoPool::new(std::slice::from_ref(&p), 1, false).unwrap();
    let bad = Request { file: 0, offset: 0, len: 4096 };
    let pending = broken.submit(&[bad, bad, bad]).unwrap();
    r.books().inflight[1] = Some(Inflight { guessed: vec![5], read: vec![5], pending });
    let f = r.fetch(1, &[(5, 1)], &|_| true).unwrap();
    let s = r.stats();
    assert_eq!((s.prefetch.failed, s.prefetch.covered, s.loads), (1, 0, 1), "read again, counted once: {s:?}");
    let fresh = r.pool.read_all(&r.requests(1, &[5])).unwrap();
    assert_eq!(f.got[0].1.bufs[2].bytes(), fresh[2].bytes(), "the real read's bytes");
}

#[test]
fn a_forward_starts_with_nothing_in_flight_and_off_means_no_guess() {
    let l = engine(4);
    let r = l.model().ram_cache().unwrap();
    guess_layer1(&l, 1);
    r.begin_forward(1);
    assert!(r.books().inflight.iter().all(Option::is_none));
    assert_eq!(r.stats().prefetch.unused, 2, "the stale early reads count as unused");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
    let ram = RamOptions { budget: RamBudget::Bytes(1 << 20), readers: 1, direct_io: true, prefetch: false, pin: 0 };
    let off = Engine::load(&dir, &EngineOptions { ram, ..EngineOptions::default() }).unwrap();
    let r = off.model().ram_cache().unwrap();
    assert!(r.next.iter().all(Option::is_none));
    assert!(r.summary(None).ends_with("no prefetch"), "{}", r.summary(None));
}
