//! The balancer of a hybrid step: which of the host pool's pairs the CPU computes instead of the
//! device. The device reads a pool expert over the bus for every step that routes to it; where
//! the CPU computes the same pairs from RAM sooner (many cores beside a discrete GPU), the step
//! ends sooner with some of them on the CPU, and where it does not, they stay on the device.
//!
//! `Balance::Adaptive` (the default) follows the measured times: after each step with pool
//! pairs, the CPU's share of them goes up by an eighth while the devices' batch outlasted the
//! CPU's share of the step by a tenth, down by an eighth while the CPU's share outlasted the
//! batch by a tenth. Small steps (decode, a few verify rows) and big ones (prompt chunks) keep
//! shares of their own: their balance differs. Whole experts move, those with the fewest pairs
//! first, so each expert's weights are read once, on one side. A side with no pairs in a step
//! is taken at its last measured time (the device's submission costs it even for one pair), not
//! at zero: else a share of every pool pair would always move back, and decode on a host pool
//! would keep paying for a device batch of a pair or two.
//!
//! Must not: move a pair whose expert is not in the pool, or follow times in deterministic mode
//! (`Adaptive` then moves nothing; a `Fixed` share follows the routing alone, so it repeats).

use std::collections::BTreeMap;
use std::time::Duration;

/// How the tier shares the host pool's pairs with the CPU (`TierOptions::balance`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Balance {
    /// Every pool pair on the device.
    Off,
    /// The CPU's share follows the measured times (the default; nothing moves in
    /// deterministic mode or where the RAM cache serves the layer).
    Adaptive,
    /// This share (0 to 1) of each step's pool pairs on the CPU, whatever the times (for
    /// measurements and tests; where the RAM cache serves the layer, none).
    Fixed(f32),
}

/// Rows up to which a step is small.
const SMALL_ROWS: usize = 8;
/// A share's change a step.
const STEP: f64 = 0.125;
/// How much longer one side must take than the other before the share moves.
const SLACK: f64 = 1.1;

pub(super) struct Balancer {
    mode: Balance,
    deterministic: bool,
    /// The CPU's share of pool pairs in small and in big steps.
    share: [f64; 2],
    /// The last measured time of each side (device batch, CPU share) that had pairs, per kind.
    last: [[Option<f64>; 2]; 2],
}

impl Balancer {
    pub fn new(mode: Balance, deterministic: bool) -> Balancer {
        Balancer { mode, deterministic, share: [0.0; 2], last: [[None; 2]; 2] }
    }

    fn kind(n: usize) -> usize {
        usize::from(n > SMALL_ROWS)
    }

    /// The share of pool pairs the CPU takes in a step of `n` rows.
    pub fn share(&self, n: usize) -> f64 {
        match self.mode {
            Balance::Off => 0.0,
            Balance::Fixed(s) if s.is_finite() => f64::from(s).clamp(0.0, 1.0),
            Balance::Fixed(_) => 0.0,
            Balance::Adaptive if self.deterministic => 0.0,
            Balance::Adaptive => self.share[Self::kind(n)],
        }
    }

    /// After a step of `n` rows that had pool pairs: the devices' batch against the CPU's share
    /// (`None`: that side had no pairs; its last measured time stands in).
    pub fn update(&mut self, n: usize, batch: Option<Duration>, cpu: Option<Duration>) {
        if self.mode != Balance::Adaptive || self.deterministic {
            return;
        }
        let kind = Self::kind(n);
        let last = &mut self.last[kind];
        let mut side = |t: Option<Duration>, i: usize| match t {
            Some(t) => {
                last[i] = Some(t.as_secs_f64());
                t.as_secs_f64()
            }
            None => last[i].unwrap_or(0.0),
        };
        let (b, c) = (side(batch, 0), side(cpu, 1));
        let s = &mut self.share[kind];
        if b > c * SLACK {
            *s = (*s + STEP).min(1.0);
        } else if c > b * SLACK {
            *s = (*s - STEP).max(0.0);
        }
    }
}

/// Moves `share` of the step's pool pairs (those of `dev`, `(row, rank, slot)`, whose slot is
/// `in_pool`) to `cpu` (`(row, rank)`), whole experts (`expert_of(row, rank)`), the fewest
/// pairs first, until the moved pairs reach the share (rounded). Returns the pool's pairs
/// before the move and how many moved.
pub(super) fn move_pool_pairs(
    share: f64,
    expert_of: impl Fn(usize, usize) -> usize,
    in_pool: impl Fn(usize) -> bool,
    dev: &mut Vec<(usize, usize, usize)>,
    cpu: &mut Vec<(usize, usize)>,
) -> (usize, usize) {
    let mut per: BTreeMap<usize, usize> = BTreeMap::new();
    for &(r, k, s) in dev.iter() {
        if in_pool(s) {
            *per.entry(expert_of(r, k)).or_default() += 1;
        }
    }
    let total: usize = per.values().sum();
    let want = (share * total as f64).round() as usize;
    if want == 0 {
        return (total, 0);
    }
    let mut order: Vec<(usize, usize)> = per.into_iter().collect();
    order.sort_by_key(|&(e, c)| (c, e));
    let mut chosen = Vec::new();
    let mut moved = 0;
    for (e, c) in order {
        if moved >= want {
            break;
        }
        moved += c;
        chosen.push(e);
    }
    dev.retain(|&(r, k, s)| {
        let go = in_pool(s) && chosen.contains(&expert_of(r, k));
        if go {
            cpu.push((r, k));
        }
        !go
    });
    (total, moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_share_follows_the_slower_side_in_eighths_apart_for_small_and_big_steps() {
        let mut b = Balancer::new(Balance::Adaptive, false);
        assert_eq!(b.share(1), 0.0);
        // The device's batch outlasts the CPU: the CPU takes more of the pool's pairs.
        b.update(1, Some(10 * MS), Some(5 * MS));
        b.update(1, Some(10 * MS), Some(5 * MS));
        assert_eq!(b.share(1), 0.25);
        assert_eq!(b.share(512), 0.0, "big steps keep their own share");
        // Within a tenth of each other: no change; the CPU slower: back down.
        b.update(1, Some(10 * MS), Some(10 * MS));
        assert_eq!(b.share(1), 0.25);
        b.update(1, Some(5 * MS), Some(10 * MS));
        assert_eq!(b.share(1), 0.125);
        for _ in 0..20 {
            b.update(512, Some(10 * MS), Some(1 * MS));
        }
        assert_eq!(b.share(512), 1.0, "at most every pool pair");
        for _ in 0..20 {
            b.update(512, Some(1 * MS), Some(10 * MS));
        }
        assert_eq!(b.share(512), 0.0, "at least none");
    }

    #[test]
    fn a_side_without_pairs_counts_at_its_last_measured_time() {
        let mut b = Balancer::new(Balance::Adaptive, false);
        // Nothing measured on the CPU yet: the device's batch is slower than nothing.
        b.update(1, Some(2 * MS), None);
        assert_eq!(b.share(1), 0.125);
        for _ in 0..10 {
            b.update(1, Some(2 * MS), Some(1 * MS));
        }
        assert_eq!(b.share(1), 1.0);
        // Every pool pair on the CPU, the device idle: its last batch (2 ms) against the CPU's
        // 1.5 ms, so the share stays; a CPU slower than that batch gives some back.
        b.update(1, None, Some(3 * MS / 2));
        assert_eq!(b.share(1), 1.0);
        b.update(1, None, Some(3 * MS));
        assert_eq!(b.share(1), 0.875);
    }

    #[test]
    fn deterministic_runs_and_fixed_shares_ignore_the_times() {
        let mut d = Balancer::new(Balance::Adaptive, true);
        d.update(1, Some(10 * MS), Some(1 * MS));
        assert_eq!(d.share(1), 0.0);
        let mut f = Balancer::new(Balance::Fixed(0.5), true);
        f.update(1, Some(10 * MS), Some(1 * MS));
        assert_eq!(f.share(1), 0.5);
        assert_eq!(Balancer::new(Balance::Fixed(7.0), false).share(1), 1.0);
        assert_eq!(Balancer::new(Balance::Fixed(f32::NAN), false).share(1), 0.0);
        assert_eq!(Balancer::new(Balance::Off, false).share(1), 0.0);
    }

    #[test]
    fn whole_pool_experts_move_fewest_pairs_first() {
        // Slots 0-1 on the device, 2-3 in the pool; the expert is the slot here.
        let pairs = vec![(0, 0, 0), (0, 1, 2), (1, 0, 2), (1, 1, 3), (2, 0, 1), (2, 1, 2)];
        let run = |share: f64| {
            let (mut dev, mut cpu) = (pairs.clone(), vec![(9, 9)]);
            let r = move_pool_pairs(
                share,
                |r, k| pairs.iter().find(|p| (p.0, p.1) == (r, k)).unwrap().2,
                |s| s >= 2,
                &mut dev,
                &mut cpu,
            );
            (r, dev, cpu)
        };
        let (r, dev, cpu) = run(0.0);
        assert_eq!((r, dev.len(), cpu.len()), ((4, 0), 6, 1));
        // A quarter of 4 pool pairs: expert 3 (one pair) before expert 2 (three).
        let (r, dev, cpu) = run(0.25);
        assert_eq!(r, (4, 1));
        assert_eq!(cpu, vec![(9, 9), (1, 1)]);
        assert_eq!(dev.len(), 5);
        // Half: expert 3, then expert 2 whole (past the share, never half an expert).
        let (r, dev, cpu) = run(0.5);
        assert_eq!(r, (4, 4));
        assert_eq!(cpu, vec![(9, 9), (0, 1), (1, 0), (1, 1), (2, 1)]);
        assert_eq!(dev, vec![(0, 0, 0), (2, 0, 1)], "device slots' pairs stay");
    }
}
