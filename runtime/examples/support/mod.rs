//! What the benchmark examples share: a best-of-rounds timer and deterministic test values.
//! Must not: be used by tests; the examples only print.

use std::time::{Duration, Instant};

/// Best time per call of `f` over five rounds of at least `min` each (after one call to warm).
pub fn time(min: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let (start, mut calls) = (Instant::now(), 0u32);
        while start.elapsed() < min {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed() / calls);
    }
    best
}

/// `n` values in [-1, 1], the same for the same `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}
