//! The RAM expert cache: routed experts the CPU computes, held as owned copies within a byte
//! budget (`RamOptions::budget`, the CLI's `--ram-mib`), and read from the checkpoint's files
//! on a miss through an I/O pool (`io.rs`: positioned reads of whole expert tensors, direct I/O
//! where the file system takes it, several in flight), instead of through the memory map. Off,
//! the CPU reads experts from the map as before. By default (`RamBudget::Auto`) the cache is on
//! only when the routed experts do not fit in the memory free at load beside the model's other
//! weights and a reserve (`auto_budget`), with what is left of it as its budget.
//!
//! A step (one MoE layer of one forward, `fetch`): each expert the CPU's pairs name counts its
//! pairs as heat (`heat::Heat`, the tier's, halved every 1024 tokens); the experts held serve from RAM
//! (hits), the others are read at once, all of the layer's misses in flight together, and the
//! step computes from the owned copies. A loaded expert is kept when it fits the budget, else
//! when it is at least as hot as the coldest expert held outside this step's (which it evicts,
//! as many as it needs); otherwise it serves this step only. Exclusive with the device tier:
//! the tier passes `keep` false for an expert it holds or is uploading, packs a promoted expert
//! from its RAM copy when there is one (`held`), and `forget`s it once it serves from a device
//! slot, so no expert is held on a device and in RAM at once.
//!
//! The prefetch (`prefetch.rs`, on unless `RamOptions::prefetch` is false): while a layer's
//! step runs, the next MoE layer's router applied to this layer's MoE input guesses the
//! experts the next layer will route to (its top-k over the rows, at most as many as the
//! budget holds), and those not held are put in flight on the I/O pool after this step's own
//! misses (`Inflight`, one per layer). The next layer's step takes its early reads: a miss
//! among them waits for its read in flight (never read twice), one whose early read failed is
//! read again (so a real error is reported by the step that needs the bytes), the others read
//! as before; early reads it did not route to are kept only where the budget has room to
//! spare, else dropped. A forward starts with none in flight (`begin_forward`). The guesses
//! only move reads earlier: the bytes, so every number computed, are the same either way.
//!
//! Pins (`RamOptions::pin`, the CLI's `--ram-pin-mib`): the warm start of the RAM level. At
//! startup the routing history (the tier's, `Warm`) seeds the heat and its hottest experts that
//! no device slot holds are read (all in flight together) and held as pinned, within the pin's
//! bytes and the budget: pinned experts count in the budget and are never evicted; only a
//! device slot taking one (exclusive caching, `forget`) lets its copy go.
//!
//! The books (`Books`): the bytes held are the sum of the entries' buffers, checked by
//! `check_books`; entries are shared (`Arc`), so an eviction during a step frees the copy when
//! the step drops it.
//!
//! Must not: read experts through the memory map (the weight store does that without a
//! cache), hold an expert a device tier slot holds, or return bytes that are not the file's
//! (a short read is a typed error, `io::IoError::Truncated`).

pub mod budget;
pub mod io;
mod pin;
pub mod prefetch;
mod report;
pub use report::TierShare;
mod spans;
#[cfg(test)]
mod tests;

use crate::cpu::experts::{pair_expert, routed_experts, ExpertMats, Routed};
use crate::cpu::Precision;
use crate::format::{FormatError, Matrix, WeightFormat};
use crate::heat::Heat;
use crate::store::weights::WeightStore;
pub use budget::{auto_budget, reserve, Memory};
use coli_compiler::cost::human;
use coli_compiler::ir::{ExpertWeights, Op, Program};
use io::{AlignedBuf, IoError, IoPool, Pending, Request};
use prefetch::{NextRouter, PrefetchStats};
use spans::layer_spans;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How the RAM level's budget is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RamBudget {
    /// No cache: the CPU reads routed experts through the files' memory map.
    Off,
    /// From the memory free at load (`auto_budget`): no cache when every routed expert fits.
    Auto,
    /// This many bytes, as asked (`--ram-mib`).
    Bytes(u64),
}

/// The RAM level's options (the CLI's `--ram-mib`, `--no-ram-cache`).
#[derive(Clone, Debug)]
pub struct RamOptions {
    pub budget: RamBudget,
    /// Reader threads of the I/O pool.
    pub readers: usize,
    /// Direct I/O where the file system takes it (else buffered reads).
    pub direct_io: bool,
    /// Read the next layer's likely experts early (the module doc; `--prefetch`). Off by
    /// default: measured, the wrong guesses' reads and evictions cost more than the early
    /// reads saved (docs/BENCHMARKS.md, 2026-12-02).
    pub prefetch: bool,
    /// Bytes of the routing history's hottest experts pinned at startup, within the budget
    /// (the module doc; `--ram-pin-mib`); 0: no pins.
    pub pin: u64,
}

impl Default for RamOptions {
    fn default() -> RamOptions {
        RamOptions { budget: RamBudget::Auto, readers: 4, direct_io: true, prefetch: false, pin: 0 }
    }
}

/// What the pins start from: the routing history's counts per program layer (one per expert),
/// and whether a device slot holds an expert now (`(layer, expert)`; those are not pinned).
pub struct Warm<'a> {
    pub counts: &'a std::collections::BTreeMap<usize, Vec<u64>>,
    pub on_device: &'a dyn Fn(usize, usize) -> bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RamError {
    #[error("RAM expert cache: {0}")]
    Io(#[from] IoError),
    #[error("RAM expert cache: layer {layer}, expert {expert}: {source}")]
    Format { layer: usize, expert: usize, source: FormatError },
    #[error("RAM expert cache: {0}")]
    Bad(String),
}

/// What the cache did, for the per-run line and tests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RamStats {
    /// Routed pairs the CPU computed from an expert held in RAM, and from one read this step.
    pub hit_pairs: u64,
    pub disk_pairs: u64,
    /// Experts read (early reads included), their bytes, and the time the steps waited for
    /// their reads (wall, all in flight; an early read done before its step asks costs none).
    pub loads: u64,
    pub disk_bytes: u64,
    pub read_time: Duration,
    /// Loaded experts kept, evicted to make room, served one step only (no room or too cold),
    /// and dropped because a device slot took them (exclusive caching).
    pub kept: u64,
    pub evictions: u64,
    pub transient: u64,
    pub to_device: u64,
    /// Tokens of the forwards seen.
    pub tokens: u64,
    /// Experts pinned at startup (read before the first step, not in `loads`), their bytes,
    /// and those a device slot took since.
    pub pinned: u64,
    pub pinned_bytes: u64,
    pub unpinned: u64,
    /// The prefetch's guesses and how they served.
    pub prefetch: PrefetchStats,
}

/// Where one role's bytes of one expert lie: a file of the pool, offset and length.
#[derive(Clone, Copy, Debug)]
struct Span {
    file: usize,
    offset: u64,
    len: usize,
}

/// One role's matrix shape (every expert of a layer alike).
#[derive(Clone, Copy, Debug)]
struct Role {
    format: WeightFormat,
    rows: usize,
    cols: usize,
}

/// A MoE layer the cache serves.
struct CacheLayer {
    layer: usize,
    weights: ExpertWeights,
    roles: [Role; 3],
    /// Per expert, gate, up and down.
    spans: Vec<[Span; 3]>,
}

/// One expert held in RAM: its gate, up and down bytes.
pub struct CachedExpert {
    bufs: [AlignedBuf; 3],
}

impl CachedExpert {
    /// Bytes it costs (the buffers allocated).
    pub fn cost(&self) -> usize {
        self.bufs.iter().map(AlignedBuf::capacity).sum()
    }
}

/// A layer's early reads in flight: the experts guessed, those read (three requests each, in
/// order), and the reads.
struct Inflight {
    guessed: Vec<usize>,
    read: Vec<usize>,
    pending: Pending,
}

/// Who holds what, and the heat.
struct Books {
    /// Per (cache layer, expert).
    entries: Vec<Option<Arc<CachedExpert>>>,
    /// Per (cache layer, expert), whether its entry is pinned (never evicted).
    pinned: Vec<bool>,
    /// Per cache layer, its early reads in flight.
    inflight: Vec<Option<Inflight>>,
    held: u64,
    heat: Heat,
    stats: RamStats,
}

/// The cache's books at a moment, for tests: entries, the bytes the books say are held and
/// the sum over the entries, and entries some step still shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BookCheck {
    pub entries: usize,
    pub held: u64,
    pub sum: u64,
    pub shared: usize,
}

/// The experts a step fetched: (expert, its copy), in expert order.
pub struct Fetched {
    t: usize,
    got: Vec<(usize, Arc<CachedExpert>)>,
}

/// The RAM expert cache over the MoE layers whose experts are views of the checkpoint's files.
pub struct RamCache {
    layers: Vec<CacheLayer>,
    /// Program layer -> cache layer.
    index: Vec<Option<usize>>,
    experts: usize,
    budget: u64,
    expert_bytes: usize,
    /// Experts the budget holds.
    fit: usize,
    /// Per cache layer, the guess for the next MoE layer (`None`: prefetch off, or no next).
    next: Vec<Option<NextRouter>>,
    pool: IoPool,
    books: Mutex<Books>,
    line: String,
}

impl RamCache {
    /// The cache for `program`'s routed experts within `opts.budget`, or `None` when off (or
    /// not needed, by `RamBudget::Auto`). A layer whose experts are not views of the files
    /// (quantized or re-laid at load) stays with the weight store. The map's pages of the
    /// experts served are advised away.
    /// With `warm` and `opts.pin` > 0 the history's hottest experts are pinned (the module doc).
    pub fn new(
        program: &Program,
        ws: &WeightStore,
        opts: &RamOptions,
        warm: Option<Warm>,
    ) -> Result<Option<RamCache>, RamError> {
        if opts.budget == RamBudget::Off {
            return Ok(None);
        }
        let mut files: Vec<PathBuf> = Vec::new();
        let mut layers = Vec::new();
        let mut index = vec![None; program.layers.len()];
        let mut skipped = Vec::new();
        let mut served = Vec::new();
        for op in program.layers.iter().flat_map(|l| &l.ops) {
            let Op::RoutedExperts { layer, experts, weights, .. } = op else { continue };
            let l = layer.0 as usize;
            // Shared experts beside the routed ones are not the cache's (the CPU runs them).
            let spans = if weights.shared.is_some() { None } else { layer_spans(ws, weights, *experts, &mut files) };
            match spans {
                Some((roles, spans, tensors)) => {
                    index[l] = Some(layers.len());
                    layers.push(CacheLayer { layer: l, weights: weights.clone(), roles, spans });
                    served.push(tensors);
                }
                None => skipped.push(layer.0),
            }
        }
        if layers.is_empty() {
            return Ok(None);
        }
        let experts = layers.iter().map(|l| l.spans.len()).max().unwrap_or(0);
        let expert_bytes = layers
            .iter()
            .flat_map(|l| &l.spans)
            .map(|s| s.iter().map(|x| (x.offset as usize % io::ALIGN + x.len).div_ceil(io::ALIGN) * io::ALIGN).sum())
            .max()
            .unwrap_or(0);
        let total: usize = layers.iter().map(|l| l.spans.len()).sum();
        let all = (total * expert_bytes) as u64;
        let (budget, rule) = match opts.budget {
            RamBudget::Bytes(b) => (b, "as asked, --ram-mib".to_string()),
            _ => {
                let Some(mem) = Memory::now() else { return Ok(None) };
                let other = (ws.bytes() as u64).saturating_sub(all);
                match auto_budget(all, other, expert_bytes as u64, mem) {
                    Some(b) => (
                        b,
                        format!(
                            "from free memory: {} free less the other weights' {} and a reserve of {}",
                            human(mem.available),
                            human(other),
                            human(reserve(mem))
                        ),
                    ),
                    None => return Ok(None),
                }
            }
        };
        let advised: usize = served.iter().flatten().map(|t| t.advise_not_needed()).sum();
        let pool = IoPool::new(&files, opts.readers, opts.direct_io)?;
        let fit = (budget / expert_bytes.max(1) as u64) as usize;
        let mut line = format!(
            "RAM expert cache: budget {} ({rule}) = {} experts of {} (of {total} routed experts, {} in all); misses read from disk by {} readers, {}; the map's pages of the experts advised away ({})",
            human(budget),
            fit.min(total),
            human(expert_bytes as u64),
            human(all),
            pool.readers(),
            if pool.direct() { "direct I/O" } else { "buffered reads" },
            human(advised as u64),
        );
        if !skipped.is_empty() {
            line.push_str(&format!(
                "; experts of {} are not views of the files (quantized or re-laid at load) and stay in the weight store",
                coli_compiler::print::layer_ranges(&skipped)
            ));
        }
        let n = layers.len();
        let mut next: Vec<Option<NextRouter>> = (0..n).map(|_| None).collect();
        if opts.prefetch {
            let moe: Vec<usize> = (0..program.layers.len()).filter(|&l| has_moe(program, l)).collect();
            for pair in moe.windows(2) {
                let (Some(t), Some(u)) = (index[pair[0]], index[pair[1]]) else { continue };
                let (this, then) = (&program.layers[pair[0]].ops, &program.layers[pair[1]].ops);
                next[t] = NextRouter::new(this, then, u);
            }
            let guessing = next.iter().flatten().count();
            line.push_str(&format!("; prefetch of the next layer's experts on {guessing} layers"));
        } else {
            line.push_str("; no prefetch");
        }
        let cache = RamCache {
            layers,
            index,
            experts,
            budget,
            expert_bytes,
            fit,
            next,
            pool,
            books: Mutex::new(Books {
                entries: vec![None; n * experts],
                pinned: vec![false; n * experts],
                inflight: (0..n).map(|_| None).collect(),
                held: 0,
                heat: Heat::new(n, experts),
                stats: RamStats::default(),
            }),
            line,
        };
        let pins = match warm {
            Some(w) if opts.pin > 0 => {
                let t0 = Instant::now();
                let (count, bytes) = cache.pin(&w, opts.pin.min(budget))?;
                format!(
                    "; pinned: {count} of the history's hottest experts, {} (of {} asked, --ram-pin-mib), read in {:.2} s",
                    human(bytes),
                    human(opts.pin),
                    t0.elapsed().as_secs_f64()
                )
            }
            _ if opts.pin > 0 => "; no pins: no routing history".to_string(),
            _ => "; no pins".to_string(),
        };
        Ok(Some(RamCache { line: format!("{}{pins}", cache.line), ..cache }))
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic under the lock left the books as they stood between two whole updates.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The startup line: the budget, how many experts of which size fit, and the rule.
    pub fn line(&self) -> &str {
        &self.line
    }

    pub fn stats(&self) -> RamStats {
        self.books().stats.clone()
    }

    /// Bytes one expert costs in RAM (its three buffers, page-aligned).
    pub fn expert_bytes(&self) -> usize {
        self.expert_bytes
    }

    /// Whether the cache serves layer `layer`'s routed experts.
    pub fn serves(&self, layer: usize) -> bool {
        self.index.get(layer).is_some_and(Option::is_some)
    }

    /// Whether expert `e` of layer `layer` is held now.
    pub fn holds(&self, layer: usize, e: usize) -> bool {
        let Some(t) = self.index.get(layer).copied().flatten() else { return false };
        self.books().entries.get(t * self.experts + e).is_some_and(Option::is_some)
    }

    /// Expert `e` of layer `layer` as held now, without counting a routing: what a promotion
    /// to a device packs from (the tier then `forget`s it).
    pub fn held(&self, layer: usize, e: usize) -> Option<Fetched> {
        let t = self.index.get(layer).copied().flatten()?;
        let c = self.books().entries.get(t * self.experts + e)?.clone()?;
        Some(Fetched { t, got: vec![(e, c)] })
    }

    /// A forward of `n` rows starts: the heat ages, and early reads left from a forward that
    /// stopped part way are dropped.
    pub fn begin_forward(&self, n: usize) {
        let mut b = self.books();
        let stale: u64 = b.inflight.iter_mut().filter_map(Option::take).map(|f| f.read.len() as u64).sum();
        b.stats.prefetch.unused += stale;
        b.heat.tokens(n);
        b.stats.tokens += n as u64;
    }

    /// Drops expert `e` of layer `layer` (a device slot serves it now: exclusive caching).
    pub fn forget(&self, layer: usize, e: usize) {
        let Some(t) = self.index.get(layer).copied().flatten() else { return };
        let mut b = self.books();
        let i = t * self.experts + e;
        if let Some(c) = b.entries.get_mut(i).and_then(Option::take) {
            b.held -= c.cost() as u64;
            b.stats.to_device += 1;
            if std::mem::take(&mut b.pinned[i]) {
                b.stats.unpinned += 1;
            }
        }
    }

    /// The books now (entries, bytes held, their sum, entries a step still shares).
    pub fn check_books(&self) -> BookCheck {
        let b = self.books();
        let live = b.entries.iter().flatten();
        BookCheck {
            entries: live.clone().count(),
            held: b.held,
            sum: live.clone().map(|c| c.cost() as u64).sum(),
            shared: live.filter(|c| Arc::strong_count(c) > 1).count(),
        }
    }

    /// The experts `want` names for layer `layer` (expert, its pairs this step): the held ones
    /// from RAM, the rest read from disk all at once; each read one kept as the module doc
    /// says when `keep(expert)`.
    pub fn fetch(
        &self,
        layer: usize,
        want: &[(usize, usize)],
        keep: &dyn Fn(usize) -> bool,
    ) -> Result<Fetched, RamError> {
        self.fetch_then(layer, want, keep, &|| {})
    }

    /// `fetch`, running `meanwhile` once the step's reads are in flight (before waiting for
    /// them): what starts the next layer's early reads behind this step's own.
    fn fetch_then(
        &self,
        layer: usize,
        want: &[(usize, usize)],
        keep: &dyn Fn(usize) -> bool,
        meanwhile: &dyn Fn(),
    ) -> Result<Fetched, RamError> {
        let t = self
            .index
            .get(layer)
            .copied()
            .flatten()
            .ok_or_else(|| RamError::Bad(format!("layer {layer} is not cached")))?;
        let cl = &self.layers[t];
        let mut got = Vec::with_capacity(want.len());
        let mut misses = Vec::new();
        let mut now = Vec::new();
        let early = {
            let mut b = self.books();
            let early = b.inflight[t].take();
            for &(e, pairs) in want {
                if e >= cl.spans.len() {
                    return Err(RamError::Bad(format!("layer {layer}: routed to expert {e} of {}", cl.spans.len())));
                }
                for _ in 0..pairs {
                    b.heat.route(t, e);
                }
                match &b.entries[t * self.experts + e] {
                    Some(c) => {
                        got.push((e, c.clone()));
                        b.stats.hit_pairs += pairs as u64;
                    }
                    None => {
                        misses.push(e);
                        if !early.as_ref().is_some_and(|f| f.read.contains(&e)) {
                            now.push(e);
                        }
                        b.stats.disk_pairs += pairs as u64;
                    }
                }
            }
            if let Some(f) = &early {
                let p = &mut b.stats.prefetch;
                p.used += f.guessed.iter().filter(|e| want.iter().any(|w| w.0 == **e)).count() as u64;
                p.misses += misses.len() as u64;
                p.covered += (misses.len() - now.len()) as u64;
            }
            early
        };
        let pending = if now.is_empty() { None } else { Some(self.pool.submit(&self.requests(t, &now))?) };
        meanwhile();
        if misses.is_empty() && early.is_none() {
            got.sort_by_key(|g| g.0);
            return Ok(Fetched { t, got });
        }
        let t0 = Instant::now();
        // The early reads: those the step needs (a failed one read again now), and the rest.
        let mut read: Vec<(usize, Arc<CachedExpert>)> = Vec::with_capacity(misses.len());
        let mut spare = Vec::new();
        let mut again = Vec::new();
        if let Some(f) = early {
            let mut bufs = f.pending.wait_each().into_iter();
            for &e in &f.read {
                let (Some(g), Some(u), Some(d)) = (bufs.next(), bufs.next(), bufs.next()) else { break };
                let needed = misses.contains(&e);
                match (g, u, d) {
                    (Ok(g), Ok(u), Ok(d)) => {
                        let c = (e, Arc::new(CachedExpert { bufs: [g, u, d] }));
                        if needed {
                            read.push(c);
                        } else {
                            spare.push(c);
                        }
                    }
                    _ => {
                        // Counted as covered above: the step reads it itself after all.
                        let p = &mut self.books().stats.prefetch;
                        p.failed += 1;
                        if needed {
                            p.covered -= 1;
                            again.push(e);
                        }
                    }
                }
            }
        }
        if !again.is_empty() {
            let bufs = self.pool.read_all(&self.requests(t, &again))?;
            read.extend(self.experts_of(&again, bufs)?);
        }
        if let Some(p) = pending {
            read.extend(self.experts_of(&now, p.wait()?)?);
        }
        let took = t0.elapsed();
        let step: Vec<usize> = want.iter().map(|w| w.0).collect();
        let mut b = self.books();
        b.stats.read_time += took;
        let loads: Vec<usize> = now.iter().chain(&again).copied().collect();
        self.count_reads(&mut b, t, &loads);
        for (e, c) in read {
            if keep(e) {
                self.admit(&mut b, t, e, &c, &step);
            } else {
                b.stats.transient += 1;
            }
            got.push((e, c));
        }
        for (e, c) in spare {
            b.stats.prefetch.unused += 1;
            let cost = c.cost() as u64;
            if keep(e) && b.held + cost <= self.budget && b.entries[t * self.experts + e].is_none() {
                b.entries[t * self.experts + e] = Some(c);
                b.held += cost;
                b.stats.kept += 1;
            }
        }
        got.sort_by_key(|g| g.0);
        Ok(Fetched { t, got })
    }

    /// The reads of experts `es` of cache layer `t` (gate, up, down each).
    fn requests(&self, t: usize, es: &[usize]) -> Vec<Request> {
        let cl = &self.layers[t];
        es.iter()
            .flat_map(|&e| cl.spans[e].iter().map(|s| Request { file: s.file, offset: s.offset, len: s.len }))
            .collect()
    }

    /// Experts `es` read (their expert count and bytes in the stats).
    fn count_reads(&self, b: &mut Books, t: usize, es: &[usize]) {
        b.stats.loads += es.len() as u64;
        b.stats.disk_bytes += self.requests(t, es).iter().map(|r| r.len as u64).sum::<u64>();
    }

    /// The copies of experts `es` from their buffers (three each, in order).
    fn experts_of(&self, es: &[usize], bufs: Vec<AlignedBuf>) -> Result<Vec<(usize, Arc<CachedExpert>)>, RamError> {
        let mut bufs = bufs.into_iter();
        es.iter()
            .map(|&e| match (bufs.next(), bufs.next(), bufs.next()) {
                (Some(g), Some(u), Some(d)) => Ok((e, Arc::new(CachedExpert { bufs: [g, u, d] }))),
                _ => Err(RamError::Bad("the I/O pool returned fewer buffers than asked".into())),
            })
            .collect()
    }

    /// Keeps `c` (expert `e` of cache layer `t`) if it fits, evicting the coldest held experts
    /// outside `step` that are no hotter than it.
    fn admit(&self, b: &mut Books, t: usize, e: usize, c: &Arc<CachedExpert>, step: &[usize]) {
        let cost = c.cost() as u64;
        let heat = b.heat.get(t, e);
        while b.held + cost > self.budget {
            let mut coldest: Option<(usize, f32)> = None;
            for (i, x) in b.entries.iter().enumerate() {
                let (xt, xe) = (i / self.experts, i % self.experts);
                if x.is_none() || b.pinned[i] || (xt == t && step.contains(&xe)) {
                    continue;
                }
                let h = b.heat.get(xt, xe);
                if coldest.is_none_or(|(_, ch)| h < ch) {
                    coldest = Some((i, h));
                }
            }
            match coldest {
                Some((i, h)) if h <= heat => {
                    if let Some(old) = b.entries[i].take() {
                        b.held -= old.cost() as u64;
                        b.stats.evictions += 1;
                    }
                }
                _ => {
                    b.stats.transient += 1;
                    return;
                }
            }
        }
        b.entries[t * self.experts + e] = Some(c.clone());
        b.held += cost;
        b.stats.kept += 1;
    }

    /// Expert `e`'s matrices out of `f` (biases from the weight store); `None` when the step
    /// did not fetch it.
    pub fn mats<'a>(
        &'a self,
        ws: &'a WeightStore,
        f: &'a Fetched,
        e: usize,
    ) -> Result<Option<ExpertMats<'a>>, RamError> {
        let Ok(i) = f.got.binary_search_by_key(&e, |g| g.0) else { return Ok(None) };
        let cl = &self.layers[f.t];
        let c = &f.got[i].1;
        let m = |r: usize| {
            let Role { format, rows, cols } = cl.roles[r];
            Matrix::new(format, rows, cols, c.bufs[r].bytes()).map_err(|source| RamError::Format {
                layer: cl.layer,
                expert: e,
                source,
            })
        };
        let bias = |b: &Option<coli_compiler::ir::ExpertBias>| b.as_ref().map(|b| ws.expert_bias(b, e));
        Ok(Some(ExpertMats {
            gate: m(0)?,
            up: m(1)?,
            down: m(2)?,
            gate_bias: bias(&cl.weights.gate_bias),
            up_bias: bias(&cl.weights.up_bias),
            down_bias: bias(&cl.weights.down_bias),
        }))
    }

    /// The matrices of every expert `f` holds, indexed by expert (`None`: not fetched).
    pub fn table<'a>(&'a self, ws: &'a WeightStore, f: &'a Fetched) -> Result<Vec<Option<ExpertMats<'a>>>, RamError> {
        let mut out = vec![None; self.experts];
        for &(e, _) in &f.got {
            out[e] = self.mats(ws, f, e)?;
        }
        Ok(out)
    }

    /// Runs a `RoutedExperts` op of a layer the cache serves on the CPU: every pair's expert
    /// fetched (`fetch`), then `cpu::experts::routed_experts` over the owned copies.
    pub fn run(
        &self,
        ws: &WeightStore,
        op: &Op,
        rows: Routed,
        out: &mut [f32],
        precision: Precision,
    ) -> Result<(), RamError> {
        let Op::RoutedExperts { layer, glu, weights, .. } = op else {
            return Err(RamError::Bad("not a routed-experts op".into()));
        };
        let all: Vec<(usize, usize)> = (0..rows.n).flat_map(|r| (0..rows.top_k).map(move |k| (r, k))).collect();
        let want = pairs_per_expert(rows.routing, rows.top_k, &all);
        let l = layer.0 as usize;
        let t = self.index.get(l).copied().flatten();
        let early = || {
            if let Some(t) = t {
                self.prefetch_next(t, ws, &rows, precision);
            }
        };
        let f = self.fetch_then(l, &want, &|_| true, &early)?;
        let table = self.table(ws, &f)?;
        let expert = |e: usize| table.get(e).copied().flatten().unwrap_or_else(|| ExpertMats::of(ws, weights, e));
        routed_experts(rows, *glu, precision, &expert, out);
        Ok(())
    }
}

/// Whether layer `l` of `program` has routed experts.
fn has_moe(program: &Program, l: usize) -> bool {
    program.layers[l].ops.iter().any(|op| matches!(op, Op::RoutedExperts { .. }))
}

/// (expert, pairs) of `pairs` ((row, rank)) in a routing of `top_k`, in expert order.
pub fn pairs_per_expert(routing: &[f32], top_k: usize, pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut m: std::collections::BTreeMap<usize, usize> = Default::default();
    for &(r, k) in pairs {
        *m.entry(pair_expert(routing, top_k, r, k)).or_default() += 1;
    }
    m.into_iter().collect()
}
