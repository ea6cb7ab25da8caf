//! The tier's host pool (the module doc of `tier`): its slots after the primary's device
//! slots, the clause of the tier's line that sizes it, and the step that moves its experts up
//! into device slots.
//!
//! Must not: allocate device memory (the pool's pages are host memory, `side.rs`), or let an
//! expert hold two slots at once.

use super::side::{DeviceSide, SlotShape};
use super::{ExpertTier, PoolBudget, MAX_PENDING};
use crate::cpu::experts::pair_expert;
use crate::heat::beats;
use crate::ramcache::budget::{reserve, Memory};
use crate::vk::{MemoryUse, VkError};
use coli_compiler::cost::human;

/// The tier line's clause without a pool: the default, and why.
pub(super) const NO_POOL: &str = "no host pool (off unless --host-pool-mib N or auto: its RAM stays the RAM cache's)";

impl ExpertTier {
    /// Slots of the host pool (0: no pool), and the memory they are in.
    pub fn pool_slots(&self) -> usize {
        self.sides.first().map_or(0, DeviceSide::pool_slots)
    }

    pub fn pool_memory(&self) -> Option<MemoryUse> {
        self.sides.first().and_then(|s| s.pool_memory)
    }

    /// Bytes one expert takes in a slot.
    pub fn expert_bytes(&self) -> usize {
        self.expert_bytes
    }

    /// Whether expert `e` of layer `layer` serves from the host pool now.
    pub fn in_host_pool(&self, layer: usize, e: usize) -> bool {
        let Some(t) = self.index.get(layer).copied().flatten() else { return false };
        self.slots.serving(t, e).is_some_and(|s| self.in_pool(s))
    }

    /// The host pool's global slots, when there is a pool (the primary's last pages).
    pub(super) fn pool_range(&self) -> Option<std::ops::Range<usize>> {
        let p = self.sides.first()?;
        (p.pool_slots() > 0).then(|| p.first + p.pool_from..p.first + p.slots())
    }

    /// Whether global slot `s` is a host pool slot.
    pub(super) fn in_pool(&self, s: usize) -> bool {
        self.sides.first().is_some_and(|p| p.in_pool(s))
    }

    /// Step 6 of `run`: each pool expert the step's `dev_pairs` read, hottest first, takes the
    /// coldest device slot it beats; that slot's expert takes the pool slot it left. Each move
    /// is two promotions of the rate.
    pub(super) fn promote_from_pool(
        &mut self,
        t: usize,
        routing: &[f32],
        top_k: usize,
        dev_pairs: &[(usize, usize, usize)],
    ) {
        let Some(pool) = self.pool_range() else { return };
        let mut up: Vec<(usize, usize)> = dev_pairs
            .iter()
            .filter(|p| pool.contains(&p.2))
            .map(|&(r, k, s)| (pair_expert(routing, top_k, r, k), s))
            .collect();
        up.sort_unstable();
        up.dedup();
        up.sort_by(|a, b| self.heat.get(t, b.0).total_cmp(&self.heat.get(t, a.0)).then(a.cmp(b)));
        let device = self.sides[0].first..pool.start;
        for (i, &(e, ps)) in up.iter().enumerate() {
            if self.rate_left < 2 || self.pending.len() + 2 > MAX_PENDING {
                self.stats.skipped += (up.len() - i) as u64;
                return;
            }
            let heat = &self.heat;
            let Some((d, h)) = self.slots.coldest_in(device.clone(), |l, x| heat.get(l, x)) else { return };
            if !beats(self.heat.get(t, e), h) {
                continue;
            }
            self.slots.abandon(ps);
            if let Some((ol, oe)) = self.slots.replace(d, t, e) {
                self.slots.replace(ps, ol, oe);
                self.pending.push(ps);
            }
            self.pending.push(d);
            self.rate_left -= 2;
            self.stats.pool_promotions += 1;
        }
    }
}

/// What the host pool is asked for: its budget, and what an automatic budget leaves to the
/// rest of the host's memory.
pub(super) struct PoolAsk {
    pub budget: PoolBudget,
    /// Bytes of the weights besides the routed experts (the host keeps them).
    pub other: u64,
    /// The RAM cache's least: top-k experts a MoE layer, for the pairs of experts neither the
    /// device nor the pool holds.
    pub floor: u64,
    /// Imported pages where the device can (`TierOptions::host_pool_import`).
    pub import: bool,
}

/// `PoolBudget::Auto`'s rule: every expert the device slots leave (`left` bytes) where they fit
/// in the free memory less the `other` weights and the reserve (`ramcache::budget::reserve`);
/// else that room less the RAM cache's `floor`. Returns the budget and the rule's words.
pub fn auto_pool_budget(left: u64, other: u64, floor: u64, mem: Memory) -> (u64, String) {
    let room = mem.available.saturating_sub(other + reserve(mem));
    let words = format!(
        "from free memory: {} free less the other weights' {} and a reserve of {}",
        human(mem.available),
        human(other),
        human(reserve(mem))
    );
    if left <= room {
        (left, format!("{words}: every expert the device leaves"))
    } else {
        (room.saturating_sub(floor), format!("{words} and the RAM cache's floor of {}", human(floor)))
    }
}

/// Adds the host pool to the primary's side as `ask` says, for at most `left` experts (those
/// the device's slots leave): imported pages when `ask.import` and the device has
/// `VK_EXT_external_memory_host`, else the driver's host-visible memory. Returns the clause of
/// the tier's line: the budget, experts of which size, the memory and the rule, or why none;
/// `None` when no pool was asked for.
pub(super) fn host_pool(
    side: &mut DeviceSide,
    ask: PoolAsk,
    shape: &SlotShape,
    left: usize,
) -> Result<Option<String>, VkError> {
    let one = shape.expert_bytes as u64;
    let (budget, rule) = match ask.budget {
        PoolBudget::Off => return Ok(None),
        PoolBudget::Bytes(b) => (b, "as asked, --host-pool-mib".to_string()),
        PoolBudget::Auto => match Memory::now() {
            Some(mem) => auto_pool_budget(left as u64 * one, ask.other, ask.floor, mem),
            None => {
                return Ok(Some("host pool off: the system does not say its free memory (--host-pool-mib auto)".into()))
            }
        },
    };
    if left == 0 {
        return Ok(Some("host pool off: every expert fits the device".into()));
    }
    if budget < one {
        return Ok(Some(format!(
            "host pool off: its budget of {} ({rule}) holds no expert of {}",
            human(budget),
            human(one)
        )));
    }
    let (memory, how) = match (ask.import, side.ctx.imports_host_memory()) {
        (true, true) => (MemoryUse::PoolImport, "the process's pages imported with VK_EXT_external_memory_host"),
        (true, false) => {
            (MemoryUse::Pool, "the driver's host-visible memory (the device lacks VK_EXT_external_memory_host)")
        }
        (false, _) => (MemoryUse::Pool, "the driver's host-visible memory (import off)"),
    };
    let mut added = side.add_pool(budget, shape, left, memory)?;
    let mut how = how;
    if added == 0 && memory == MemoryUse::PoolImport {
        // The driver refused the import: its own host-visible memory instead.
        added = side.add_pool(budget, shape, left, MemoryUse::Pool)?;
        how = "the driver's host-visible memory (the import was refused)";
    }
    if added == 0 {
        return Ok(Some(format!("host pool off: the driver refused its memory ({how})")));
    }
    Ok(Some(format!(
        "host pool: budget {} ({rule}) = {added} experts of {} in {how}, read by the device over the bus",
        human(budget),
        human(one)
    )))
}

#[cfg(test)]
mod auto_tests {
    use super::auto_pool_budget;
    use crate::ramcache::budget::Memory;

    const GIB: u64 = 1 << 30;

    #[test]
    fn an_automatic_pool_takes_what_the_device_leaves_where_it_fits() {
        let mem = Memory { available: 60 * GIB, total: 64 * GIB };
        // 60 GiB free less 10 of other weights and a reserve of 5: 45 GiB of room.
        let (b, rule) = auto_pool_budget(30 * GIB, 10 * GIB, 2 * GIB, mem);
        assert_eq!(b, 30 * GIB, "every expert the device leaves");
        assert!(rule.contains("every expert the device leaves"), "{rule}");
        // 80 GiB left over 45 of room: the room less the RAM cache's floor.
        let (b, rule) = auto_pool_budget(80 * GIB, 10 * GIB, 2 * GIB, mem);
        assert_eq!(b, 43 * GIB);
        assert!(rule.contains("from free memory") && rule.contains("floor of 2.0 GiB"), "{rule}");
        // Other weights beyond the free memory: no room at all.
        assert_eq!(auto_pool_budget(80 * GIB, 70 * GIB, 2 * GIB, mem).0, 0);
    }
}
