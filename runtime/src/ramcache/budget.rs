//! The RAM level's budget by `RamBudget::Auto`: the host's free memory (`/proc/meminfo`), the
//! reserve left to everything else, and the rule that sizes the cache from them.

/// The host's memory at a moment (`/proc/meminfo`), what `RamBudget::Auto` plans from.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// Bytes a new allocation can take without swapping (`MemAvailable`).
    pub available: u64,
    /// Bytes of RAM in all (`MemTotal`).
    pub total: u64,
}

impl Memory {
    /// Now, or `None` where the system does not say (then `Auto` leaves the cache off).
    pub fn now() -> Option<Memory> {
        Memory::parse(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }

    /// From the text of `/proc/meminfo`.
    pub fn parse(meminfo: &str) -> Option<Memory> {
        let field = |name: &str| {
            let line = meminfo.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib << 10)
        };
        Some(Memory { available: field("MemAvailable:")?, total: field("MemTotal:")? })
    }
}

/// Memory `auto_budget` leaves to everything else (the KV cache, activations, the system):
/// 1 GiB and a sixteenth of the RAM.
pub fn reserve(mem: Memory) -> u64 {
    (1 << 30) + mem.total / 16
}

/// `RamBudget::Auto`'s rule: no cache (`None`) when the routed experts (`experts` bytes in all)
/// fit beside the `other` weights and the reserve in the free memory (the memory map serves
/// them, read once); else a budget of what is free less the other weights and the reserve, at
/// least one expert (`one`).
pub fn auto_budget(experts: u64, other: u64, one: u64, mem: Memory) -> Option<u64> {
    let room = mem.available.saturating_sub(other + reserve(mem));
    (experts > room).then_some(room.max(one))
}

#[cfg(test)]
mod auto_tests {
    use super::{auto_budget, reserve, Memory};

    const GIB: u64 = 1 << 30;

    #[test]
    fn meminfo_is_read_in_kib() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n";
        let m = Memory::parse(text).unwrap();
        assert_eq!((m.total, m.available), (24_576_000 << 10, 20_480_000 << 10));
        assert!(Memory::parse("MemTotal: 12 kB\n").is_none(), "no MemAvailable: no plan");
    }

    #[test]
    fn a_cache_only_when_the_experts_do_not_fit() {
        let mem = Memory { available: 60 * GIB, total: 64 * GIB };
        assert_eq!(reserve(mem), 5 * GIB);
        // 40 GiB of experts beside 10 GiB of other weights fit in 60 GiB less 5: the map serves them.
        assert_eq!(auto_budget(40 * GIB, 10 * GIB, GIB / 100, mem), None);
        // 90 GiB do not: the cache takes what is free less the rest and the reserve.
        assert_eq!(auto_budget(90 * GIB, 10 * GIB, GIB / 100, mem), Some(45 * GIB));
        // Other weights beyond the free memory still leave one expert's room.
        assert_eq!(auto_budget(90 * GIB, 70 * GIB, 7 << 20, mem), Some(7 << 20));
    }
}
