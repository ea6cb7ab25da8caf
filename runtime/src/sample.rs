//! Picking the next token from logits: greedy, or temperature sampling narrowed by top-k,
//! top-p and min-p, after a repetition penalty over recent tokens. Deterministic for a seed
//! (a small built-in xoshiro256** generator, no `rand` dependency).
//!
//! The order follows Hugging Face's `generate`: repetition penalty (positive logits divided,
//! negative multiplied), temperature, then top-k, top-p and min-p on the scaled
//! probabilities. This module sees only a logits slice and a list of recent ids; it knows
//! nothing of tokenizers or models, and it never panics on bad values (NaN logits count as
//! impossible; bad settings are a [`SampleError`] at construction). Tokens less likely than
//! 1e-12 times the best are never drawn (they would be, in total, less than 1e-7 of the time
//! for a 100k vocabulary); this keeps each draw a linear pass plus a sort of the plausible few.

/// Sampling settings. `Default` is llama.cpp-like sampling; [`SamplerConfig::greedy`] is
/// argmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1
    /// disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables.
    pub min_p: f32,
    /// > 1 discourages repeating the `recent` tokens; 1 disables.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repetition_penalty: 1.0, seed: 0 }
    }
}

impl SamplerConfig {
    /// Always the most likely token (ties: the lowest id).
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, seed: 0 }
    }
}

/// A setting out of range, or logits that allow no choice.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("temperature must be finite and >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be finite and > 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("no logits to sample from")]
    Empty,
}

/// xoshiro256**, seeded through splitmix64.
#[derive(Debug, Clone)]
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A sampler: its settings, its random state, and scratch space reused between calls.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    logits: Vec<f32>,
    cand: Vec<(f32, u32)>,
    seen: Vec<u32>,
}

impl Sampler {
    /// Checks the settings and seeds the generator.
    pub fn new(cfg: SamplerConfig) -> Result<Self, SampleError> {
        if !cfg.temperature.is_finite() || cfg.temperature < 0.0 {
            return Err(SampleError::Temperature(cfg.temperature));
        }
        if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return Err(SampleError::TopP(cfg.top_p));
        }
        if !(0.0..=1.0).contains(&cfg.min_p) {
            return Err(SampleError::MinP(cfg.min_p));
        }
        if !cfg.repetition_penalty.is_finite() || cfg.repetition_penalty <= 0.0 {
            return Err(SampleError::RepetitionPenalty(cfg.repetition_penalty));
        }
        Ok(Sampler { cfg, rng: Rng::new(cfg.seed), logits: Vec::new(), cand: Vec::new(), seen: Vec::new() })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token id from `logits` (one per vocabulary id), penalizing the ids in
    /// `recent` (each once, however often it appears). Ids in `recent` beyond the logits are
    /// ignored.
    pub fn sample(&mut self, logits: &[f32], recent: &[u32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::Empty);
        }
        let pen = self.cfg.repetition_penalty;
        let greedy = self.cfg.temperature == 0.0 || self.cfg.top_k == 1;
        if greedy && (pen == 1.0 || recent.is_empty()) {
            // Nothing to change in the logits: no copy (NaN never wins either way).
            return Ok(argmax(logits));
        }
        self.logits.clear();
        self.logits.extend(logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l }));
        if pen != 1.0 && !recent.is_empty() {
            self.seen.clear();
            self.seen.extend_from_slice(recent);
            self.seen.sort_unstable();
            self.seen.dedup();
            for &id in &self.seen {
                if let Some(l) = self.logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / pen } else { *l * pen };
                }
            }
        }
        if greedy {
            return Ok(argmax(&self.logits));
        }
        let inv_t = 1.0 / self.cfg.temperature;
        self.cand.clear();
        self.cand.extend(
            self.logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite() || **l > 0.0)
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if self.cand.is_empty() {
            // Every logit is -inf (or NaN): nothing is more likely than anything else.
            return Ok(argmax(&self.logits));
        }
        // Most likely first; ties by lower id so results do not depend on sort internals.
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = self.cfg.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, order);
            self.cand.truncate(k);
        }

        // Softmax over the survivors, relative to the best (so the best has weight 1).
        let max = self.cand.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f64;
        for c in self.cand.iter_mut() {
            c.0 = if max.is_infinite() { f32::from(c.0 == max) } else { (c.0 - max).exp() };
            total += f64::from(c.0);
        }
        // Tokens below NEGLIGIBLE of the best one hold < vocab * NEGLIGIBLE of the mass
        // together; leaving them out spares sorting the whole vocabulary for every token.
        if self.cand.len() > 64 {
            self.cand.retain(|c| c.0 >= NEGLIGIBLE);
        }
        self.cand.sort_unstable_by(order);
        let mut keep = self.cand.len();
        if self.cfg.top_p < 1.0 {
            let mut cum = 0.0f64;
            for (i, c) in self.cand.iter().enumerate() {
                cum += f64::from(c.0) / total;
                if cum >= f64::from(self.cfg.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.cfg.min_p > 0.0 {
            // Weights are relative to the best token, so min_p compares against 1 directly.
            keep = keep.min(self.cand.iter().take_while(|c| c.0 >= self.cfg.min_p).count().max(1));
        }
        self.cand.truncate(keep);
        let total: f64 = self.cand.iter().map(|c| f64::from(c.0)).sum();
        let mut r = self.rng.next_f64() * total;
        for c in &self.cand {
            r -= f64::from(c.0);
            if r < 0.0 {
                return Ok(c.1);
            }
        }
        Ok(self.cand[self.cand.len() - 1].1)
    }
}

/// Relative weight below which a token is dropped before sorting (see `Sampler::sample`).
const NEGLIGIBLE: f32 = 1e-12;

/// The index of the largest value (the first one on ties; NaN never wins; 0 when every value
/// is NaN). Two passes a vector unit takes lanes at a time: the largest value, in independent
/// lanes (NaN fails every comparison, so it never enters one), then its first position.
fn argmax(v: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let best = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    v.iter().position(|&x| x == best).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
        SamplerConfig { temperature, top_k, top_p, min_p, repetition_penalty: 1.0, seed }
    }

    /// Logits whose softmax (at temperature 1) is `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut h = vec![0; logits.len()];
        for _ in 0..n {
            h[s.sample(logits, &[]).unwrap() as usize] += 1;
        }
        h
    }

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]).unwrap(), 1);
        assert_eq!(s.sample(&[5.0, 5.0, 1.0], &[]).unwrap(), 0);
        assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[]).unwrap(), 1);
        assert_eq!(s.sample(&[], &[]), Err(SampleError::Empty));
    }

    /// The index of the largest value, one comparison at a time: what `argmax` must equal.
    fn argmax_serial(v: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[best] || (v[best].is_nan() && !x.is_nan()) {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_is_the_serial_scan_with_nans_infinities_and_ties() {
        let mut rng = Rng::new(7);
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0];
        for len in [1usize, 2, 15, 16, 17, 33, 100, 50_304] {
            for round in 0..20 {
                let v: Vec<f32> = (0..len)
                    .map(|_| match rng.next_u64() % 8 {
                        0 => specials[(rng.next_u64() % 6) as usize],
                        // Few distinct values: ties everywhere.
                        1..=3 if round % 2 == 0 => (rng.next_u64() % 4) as f32,
                        _ => rng.next_f64() as f32 * 10.0 - 5.0,
                    })
                    .collect();
                assert_eq!(argmax(&v), argmax_serial(&v), "len {len} round {round}");
            }
        }
        for v in [vec![f32::NAN; 40], vec![f32::NEG_INFINITY; 40], vec![f32::NAN, f32::NEG_INFINITY, 1.0]] {
            assert_eq!(argmax(&v), argmax_serial(&v));
        }
    }

    #[test]
    fn greedy_with_a_penalty_picks_among_the_penalized_logits() {
        let mut c = SamplerConfig::greedy();
        c.repetition_penalty = 2.0;
        let mut s = Sampler::new(c).unwrap();
        // 3.0 halves to 1.5, below 2.9; without recent ids the penalty changes nothing.
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[1]).unwrap(), 3);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[1]).unwrap(), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
        let want = argmax(&logits);
        let mut s = Sampler::new(cfg(1.5, 1, 1.0, 0.0, 9)).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&logits, &[]).unwrap(), want);
        }
    }

    #[test]
    fn a_seed_repeats_and_seeds_differ() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.7).sin()).collect();
        let run = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, seed)).unwrap();
            (0..200).map(|_| s.sample(&logits, &[]).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn follows_the_distribution() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 1)).unwrap();
        let n = 20_000;
        let h = histogram(&mut s, &logits_of(&probs), n);
        for (c, p) in h.iter().zip(probs) {
            let f = *c as f32 / n as f32;
            assert!((f - p).abs() < 0.015, "{h:?}");
        }
    }

    #[test]
    fn top_p_and_min_p_exclude_the_tail() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let logits = logits_of(&probs);
        // top_p 0.75: 0.5 + 0.3 reaches it, so only ids 0 and 1 remain (5:3).
        let mut s = Sampler::new(cfg(1.0, 0, 0.75, 0.0, 2)).unwrap();
        let h = histogram(&mut s, &logits, 8000);
        assert_eq!((h[2], h[3]), (0, 0), "{h:?}");
        assert!((h[0] as f32 / 8000.0 - 0.625).abs() < 0.03, "{h:?}");
        // min_p 0.2: tokens below 0.2 * 0.5 = 0.1 go (id 3 only).
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.2, 3)).unwrap();
        let h = histogram(&mut s, &logits, 8000);
        assert_eq!(h[3], 0, "{h:?}");
        assert!(h[2] > 0, "{h:?}");
        // top_k 2 keeps ids 0 and 1.
        let mut s = Sampler::new(cfg(1.0, 2, 1.0, 0.0, 4)).unwrap();
        let h = histogram(&mut s, &logits, 4000);
        assert_eq!((h[2], h[3]), (0, 0), "{h:?}");
    }

    #[test]
    fn large_vocabulary_nucleus_is_exact() {
        // 50k tokens decaying slowly: thousands are non-negligible.
        let logits: Vec<f32> = (0..50_000).map(|i| -(i as f32) * 0.01).rev().collect();
        let probs: Vec<f64> = {
            let w: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
            let t: f64 = w.iter().sum();
            w.iter().map(|x| x / t).collect()
        };
        // The nucleus by brute force: ids sorted by probability, smallest prefix reaching 0.5.
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let mut cum = 0.0;
        let size = order
            .iter()
            .take_while(|&&i| {
                let before = cum;
                cum += probs[i];
                before < 0.5
            })
            .count();
        let nucleus: std::collections::HashSet<u32> = order[..size].iter().map(|&i| i as u32).collect();
        let mut s = Sampler::new(cfg(1.0, 0, 0.5, 0.0, 11)).unwrap();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..600 {
            let id = s.sample(&logits, &[]).unwrap();
            assert!(nucleus.contains(&id), "{id} outside the {size}-token nucleus");
            seen.insert(id);
        }
        assert!(seen.len() > size / 2, "{} of {size} nucleus ids drawn", seen.len());
    }

    #[test]
    fn temperature_sharpens() {
        let logits = logits_of(&[0.6, 0.4]);
        let mut cold = Sampler::new(cfg(0.25, 0, 1.0, 0.0, 5)).unwrap();
        let h = histogram(&mut cold, &logits, 4000);
        // (0.6^4) / (0.6^4 + 0.4^4) ≈ 0.835
        assert!((h[0] as f32 / 4000.0 - 0.835).abs() < 0.03, "{h:?}");
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut s = Sampler::new(SamplerConfig { repetition_penalty: 2.0, ..SamplerConfig::greedy() }).unwrap();
        // id 0: 3.0 -> 1.5 (< 2.0 of id 1); repeated ids count once.
        assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[0, 0, 0]).unwrap(), 1);
        // id 1: -0.5 -> -1.0 (< -0.8 of id 2), id 0 untouched at -2.0.
        assert_eq!(s.sample(&[-2.0, -0.5, -0.8], &[1, 99]).unwrap(), 2);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(matches!(Sampler::new(cfg(-1.0, 0, 1.0, 0.0, 0)), Err(SampleError::Temperature(_))));
        assert!(matches!(Sampler::new(cfg(1.0, 0, 0.0, 0.0, 0)), Err(SampleError::TopP(_))));
        assert!(matches!(Sampler::new(cfg(1.0, 0, 1.0, 1.5, 0)), Err(SampleError::MinP(_))));
        let bad = SamplerConfig { repetition_penalty: 0.0, ..SamplerConfig::default() };
        assert!(matches!(Sampler::new(bad), Err(SampleError::RepetitionPenalty(_))));
        // All -inf: still an answer, no panic.
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert!(s.sample(&[f32::NEG_INFINITY; 3], &[]).unwrap() < 3);
    }
}
