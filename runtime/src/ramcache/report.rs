//! The RAM cache's per-run line: the routed pairs by where their expert came from, the disk's
//! bytes and rate, what the cache holds and did, and the prefetch's numbers.
//!
//! Must not: change the books (it reads them under the lock).

use super::RamCache;
use coli_compiler::cost::human;

/// What a device tier served, for the per-run line: pairs from its device slots and from its
/// host pool, of all routed pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierShare {
    pub device: u64,
    pub pool: u64,
    pub routed: u64,
}

impl RamCache {
    /// The per-run line: the routed pairs by where their expert came from (`device`: what a
    /// device tier served, when there is one), the bytes read from disk and the read rate.
    pub fn summary(&self, device: Option<TierShare>) -> String {
        let b = self.books();
        let s = &b.stats;
        let cpu = s.hit_pairs + s.disk_pairs;
        let TierShare { device: dev, pool, routed } = device.unwrap_or(TierShare { device: 0, pool: 0, routed: cpu });
        let pct = |x: u64| if routed == 0 { 0.0 } else { 100.0 * x as f64 / routed as f64 };
        let secs = s.read_time.as_secs_f64();
        let rate = if secs > 0.0 { s.disk_bytes as f64 / secs } else { 0.0 };
        let per_token = s.disk_bytes.checked_div(s.tokens).unwrap_or(0);
        let held = b.entries.iter().flatten().count();
        let pinned = b.pinned.iter().filter(|p| **p).count();
        let mut line = String::from("experts run: ");
        if device.is_some() {
            line.push_str(&format!("device tier {dev} ({:.1}%), host pool {pool} ({:.1}%), ", pct(dev), pct(pool)));
        }
        line.push_str(&format!(
            "RAM cache {} ({:.1}%), disk {} ({:.1}%) of {routed} routed pairs | disk: {} experts read, {} ({} per token), {:.1} ms waiting on reads, {}/s, {} | RAM: {held} experts held ({pinned} pinned), {} of {}, {} kept, {} evicted, {} served once, {} moved to a device",
            s.hit_pairs,
            pct(s.hit_pairs),
            s.disk_pairs,
            pct(s.disk_pairs),
            s.loads,
            human(s.disk_bytes),
            human(per_token),
            secs * 1e3,
            human(rate as u64),
            if self.pool.direct() { "direct I/O" } else { "buffered" },
            human(b.held),
            human(self.budget),
            s.kept,
            s.evictions,
            s.transient,
            s.to_device,
        ));
        if self.next.iter().all(Option::is_none) {
            line.push_str(" | no prefetch");
            return line;
        }
        let p = &s.prefetch;
        let of = |x: u64, n: u64| if n == 0 { 0.0 } else { 100.0 * x as f64 / n as f64 };
        line.push_str(&format!(
            " | prefetch: {} experts guessed ({} held, {} read early), {} used by the next layer (precision {:.1}%), {} of its {} misses covered ({:.1}%), {} early reads unused, {} failed",
            p.guessed,
            p.held,
            p.read,
            p.used,
            of(p.used, p.guessed),
            p.covered,
            p.misses,
            of(p.covered, p.misses),
            p.unused,
            p.failed,
        ));
        line
    }
}
