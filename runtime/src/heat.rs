//! Heat per routed expert and the rule that trades a resident for a newcomer: the expert
//! tier's (`tier`), which the RAM expert cache (`ramcache`) counts its experts with too.
//!
//! Heat is one per routing (a (row, rank) pair naming the expert), halved every
//! `HALVING_TOKENS` tokens, so it follows what the user is doing now. A routing history seeds
//! it: a layer's hottest expert of the history starts at `SEED_HOTTEST` and the others in
//! proportion, so an expert of a new workload displaces the history's coldest residents after
//! a few dozen routings of its own. The rule (`beats`): a candidate takes the place of the
//! coldest resident when it is hotter by a margin of 25% plus four routings, so two experts of
//! about the same heat do not trade places back and forth.
//!
//! Must not: know about devices or slots (`tier::slots`), about files (`tier::history`), or
//! about what holds the experts.

/// Tokens between two halvings of every heat.
pub const HALVING_TOKENS: usize = 1024;
/// The heat a layer's hottest expert of the history starts at.
pub const SEED_HOTTEST: f32 = 32.0;

/// Whether a candidate of heat `candidate` should evict a resident of heat `resident`.
pub fn beats(candidate: f32, resident: f32) -> bool {
    candidate > 1.25 * resident + 4.0
}

/// Heat of every expert of every tier layer (layer-major).
#[derive(Clone, Debug)]
pub struct Heat {
    experts: usize,
    h: Vec<f32>,
    /// Tokens since the last halving.
    tokens: usize,
}

impl Heat {
    pub fn new(layers: usize, experts: usize) -> Heat {
        Heat { experts, h: vec![0.0; layers * experts], tokens: 0 }
    }

    /// One routing of expert `e` of layer `l`.
    pub fn route(&mut self, l: usize, e: usize) {
        self.h[l * self.experts + e] += 1.0;
    }

    pub fn get(&self, l: usize, e: usize) -> f32 {
        self.h[l * self.experts + e]
    }

    /// `n` tokens went by: every heat halves once per `HALVING_TOKENS` crossed.
    pub fn tokens(&mut self, n: usize) {
        self.tokens += n;
        while self.tokens >= HALVING_TOKENS {
            self.tokens -= HALVING_TOKENS;
            self.h.iter_mut().for_each(|v| *v *= 0.5);
        }
    }

    /// Seeds layer `l` from its history counts: the hottest at `SEED_HOTTEST`, the others in
    /// proportion (a layer without counts stays cold).
    pub fn seed(&mut self, l: usize, counts: &[u64]) {
        let max = counts.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return;
        }
        for (e, &c) in counts.iter().enumerate().take(self.experts) {
            self.h[l * self.experts + e] = SEED_HOTTEST * c as f32 / max as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_quarter_and_four_routings() {
        assert!(!beats(9.0, 4.0));
        assert!(beats(9.1, 4.0));
        assert!(!beats(4.0, 0.0));
        assert!(beats(4.5, 0.0));
    }

    #[test]
    fn heat_counts_routings_and_halves_every_period() {
        let mut h = Heat::new(2, 3);
        for _ in 0..8 {
            h.route(1, 2);
        }
        h.route(0, 0);
        assert_eq!(h.get(1, 2), 8.0);
        h.tokens(HALVING_TOKENS - 1);
        assert_eq!(h.get(1, 2), 8.0);
        h.tokens(1);
        assert_eq!(h.get(1, 2), 4.0);
        assert_eq!(h.get(0, 0), 0.5);
        h.tokens(2 * HALVING_TOKENS);
        assert_eq!(h.get(1, 2), 1.0);
    }

    #[test]
    fn a_seed_puts_the_hottest_at_32_and_the_rest_in_proportion() {
        let mut h = Heat::new(1, 4);
        h.seed(0, &[10, 0, 5, 40]);
        assert_eq!((h.get(0, 3), h.get(0, 0), h.get(0, 2), h.get(0, 1)), (32.0, 8.0, 4.0, 0.0));
        // A newcomer needs more than 1.25 x 4 + 4 routings to displace expert 2.
        assert!(!beats(9.0, h.get(0, 2)));
    }
}
