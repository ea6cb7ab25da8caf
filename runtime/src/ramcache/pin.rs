//! The RAM level's warm start (the module doc's pins): the routing history's hottest experts
//! that no device slot holds, read at startup and held pinned, never evicted.
//!
//! Must not: decide what the cache keeps after startup (`RamCache::fetch` does), or pin past
//! the room it is given.

use super::{RamCache, RamError, Warm};

impl RamCache {
    /// Pins the history's hottest experts no device holds within `room` bytes: 1. seeds the
    /// heat from the counts; 2. orders the named experts by seeded heat (hottest first, then by
    /// layer and expert); 3. reads those that fit, all in flight together, and holds them
    /// pinned. Returns (experts pinned, their bytes).
    pub(super) fn pin(&self, w: &Warm, room: u64) -> Result<(u64, u64), RamError> {
        let mut b = self.books();
        let mut named = Vec::new();
        for (t, cl) in self.layers.iter().enumerate() {
            let Some(c) = w.counts.get(&cl.layer) else { continue };
            b.heat.seed(t, c);
            let experts = cl.spans.len().min(c.len());
            named.extend((0..experts).filter(|&e| c[e] > 0 && !(w.on_device)(cl.layer, e)).map(|e| (t, e)));
        }
        named.sort_by(|x, y| b.heat.get(y.0, y.1).total_cmp(&b.heat.get(x.0, x.1)).then(x.cmp(y)));
        drop(b);
        let per = room / self.expert_bytes.max(1) as u64;
        named.truncate(per as usize);
        // Each layer's experts in one read of all (the pool takes them in flight together).
        let mut got = Vec::with_capacity(named.len());
        for (t, _) in self.layers.iter().enumerate() {
            let es: Vec<usize> = named.iter().filter(|x| x.0 == t).map(|x| x.1).collect();
            if es.is_empty() {
                continue;
            }
            let bufs = self.pool.read_all(&self.requests(t, &es))?;
            got.extend(self.experts_of(&es, bufs)?.into_iter().map(|(e, c)| (t, e, c)));
        }
        let mut b = self.books();
        for (t, e, c) in got {
            let i = t * self.experts + e;
            b.held += c.cost() as u64;
            b.stats.pinned += 1;
            b.stats.pinned_bytes += c.cost() as u64;
            b.entries[i] = Some(c);
            b.pinned[i] = true;
        }
        Ok((b.stats.pinned, b.stats.pinned_bytes))
    }

    /// Whether expert `e` of layer `layer` is pinned now.
    pub fn is_pinned(&self, layer: usize, e: usize) -> bool {
        let Some(t) = self.index.get(layer).copied().flatten() else { return false };
        self.books().pinned.get(t * self.experts + e).copied().unwrap_or(false)
    }
}
