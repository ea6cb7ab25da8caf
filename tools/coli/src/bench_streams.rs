//! `coli bench --streams N,...`: aggregate decode tokens/s of N sequences at once, each with a
//! short prompt of its own, their decode steps batched into one forward per step
//! (`Session::forward_batch`, what `coli serve`'s slots run), and, with `--profile`, the
//! batched step's device kernels and host phases.

use coli_runtime::engine::Engine;
use coli_runtime::exec::{LogitRows, Session};
use std::time::Instant;

/// Prompt tokens of each stream before its decode steps.
const PROMPT: usize = 8;

/// One level's result: streams, aggregate tok/s, the profile of its last step set.
pub struct StreamRun {
    pub streams: usize,
    pub tok_s: f64,
}

/// Runs `steps` batched decode steps of `streams` fresh sessions of `ctx` positions (ids from
/// `id`), after one untimed warm-up step; returns the aggregate tokens/s.
pub fn run_level(
    engine: &Engine,
    streams: usize,
    steps: usize,
    ctx: usize,
    id: &dyn Fn(u32) -> u32,
    before_timing: &mut dyn FnMut(),
) -> Result<StreamRun, String> {
    let mut sessions = Vec::with_capacity(streams);
    for s in 0..streams {
        let mut session = engine.session_with_context(ctx).map_err(crate::engine_args::message)?;
        let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| id(s as u32 * 1009 + i)).collect();
        session.forward(&prompt, LogitRows::Last).map_err(|e| e.to_string())?;
        sessions.push(session);
    }
    let mut tokens: Vec<u32> = (0..streams as u32).map(|s| id(s * 31 + 7)).collect();
    let mut step = |tokens: &mut Vec<u32>| -> Result<(), String> {
        let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
        Session::forward_batch(&mut refs, tokens).map_err(|e| e.to_string())?;
        for t in tokens.iter_mut() {
            *t = id(*t + 1);
        }
        Ok(())
    };
    step(&mut tokens)?;
    before_timing();
    let t = Instant::now();
    for _ in 0..steps {
        step(&mut tokens)?;
    }
    let secs = t.elapsed().as_secs_f64();
    if let Some(n) = sessions.iter_mut().find_map(Session::take_notice) {
        tracing::warn!("{n}");
    }
    Ok(StreamRun { streams, tok_s: (streams * steps) as f64 / secs })
}

/// Positions a stream takes: its prompt, the warm-up step and `steps`.
pub fn positions(steps: usize) -> usize {
    PROMPT + 1 + steps
}
