//! The engine thread: it owns the model and its slots (`coli_runtime::slots`), takes jobs from
//! the HTTP side over a channel, encodes their prompts, queues them when every slot is busy,
//! and steps every running request one forward at a time, sending what each produced back on
//! the request's own channel. A request whose channel is closed (its client went away) is
//! dropped from the queue, or cancelled in its slot, at the next step.
//!
//! Must not: block on the HTTP side (its channels are unbounded), or stop serving because a
//! request failed.

use super::api::{ApiError, Input, Job};
use super::metrics::Metrics;
use coli_runtime::engine::{Engine, EngineError, Prompt};
use coli_runtime::slots::{AdmitError, Event, Request, RequestId, Slots};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What the engine thread sends back about one request.
#[derive(Debug)]
pub enum Reply {
    /// The request has a slot: its prompt's length and how much of it came from the cache.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Event(Event),
    /// The request was not run.
    Rejected(ApiError),
}

/// A job and where its replies go.
pub struct Submission {
    pub job: Job,
    pub replies: UnboundedSender<Reply>,
}

/// A job encoded, waiting for a slot.
struct Queued {
    id: RequestId,
    request: Request,
    replies: UnboundedSender<Reply>,
}

/// How the engine thread runs.
pub struct WorkerConfig {
    pub slots: usize,
    pub context: usize,
    pub chunk_rows: usize,
    /// Jobs waiting beyond this many are refused (503).
    pub max_queue: usize,
    /// Drafts for a request that decodes alone (`--speculate`).
    pub speculation: coli_runtime::speculate::Speculation,
}

/// The slots `cfg` asks for (their sessions' memory, on the devices too), made before the
/// server says it is up.
pub fn slots<'e>(engine: &'e Engine, cfg: &WorkerConfig) -> Result<Slots<'e>, String> {
    Slots::new(engine, cfg.slots, cfg.context, cfg.chunk_rows).map_err(|e| format!("the {} slots: {e}", cfg.slots))
}

/// Runs `slots` until every sender of `jobs` is gone.
pub fn run(
    engine: &Engine,
    mut slots: Slots,
    cfg: &WorkerConfig,
    jobs: mpsc::Receiver<Submission>,
    metrics: Arc<Metrics>,
) {
    let mut queue: VecDeque<Queued> = VecDeque::new();
    let mut running: HashMap<RequestId, UnboundedSender<Reply>> = HashMap::new();
    let mut next_id: RequestId = 0;
    loop {
        // 1. New jobs: block when there is nothing else to do.
        if running.is_empty() && queue.is_empty() {
            match jobs.recv() {
                Ok(s) => take(engine, &slots, cfg, s, &mut queue, &mut next_id, &metrics),
                Err(_) => return,
            }
        }
        while let Ok(s) = jobs.try_recv() {
            take(engine, &slots, cfg, s, &mut queue, &mut next_id, &metrics);
        }
        // 2. Clients that went away.
        let before = queue.len();
        queue.retain(|q| !q.replies.is_closed());
        metrics.cancelled.fetch_add((before - queue.len()) as u64, Ordering::Relaxed);
        running.retain(|&id, replies| {
            let gone = replies.is_closed();
            if gone {
                slots.cancel(id);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        // 3. Free slots take the oldest waiting jobs.
        while slots.free() > 0 {
            let Some(q) = queue.pop_front() else { break };
            let prompt_tokens = q.request.prompt.len();
            match slots.admit(q.id, q.request) {
                Ok(cached_tokens) => {
                    metrics.prompt_tokens.fetch_add(prompt_tokens as u64, Ordering::Relaxed);
                    metrics.cached_tokens.fetch_add(cached_tokens as u64, Ordering::Relaxed);
                    if q.replies.send(Reply::Started { prompt_tokens, cached_tokens }).is_ok() {
                        running.insert(q.id, q.replies);
                    } else {
                        slots.cancel(q.id);
                    }
                }
                Err(e) => reject(&q.replies, admit_error(e), &metrics),
            }
        }
        // 4. One forward for each running request.
        let t = Instant::now();
        let events = slots.step();
        metrics.step_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        metrics.steps.fetch_add(1, Ordering::Relaxed);
        for (id, event) in events {
            let over = matches!(event, Event::Done(_) | Event::Failed(_));
            match &event {
                Event::Done(f) => {
                    metrics.completion_tokens.fetch_add(f.generated.len() as u64, Ordering::Relaxed);
                    metrics.completed.fetch_add(1, Ordering::Relaxed);
                }
                Event::Failed(e) => {
                    tracing::warn!("request {id} failed: {e}");
                    metrics.failed.fetch_add(1, Ordering::Relaxed);
                }
                Event::Text(_) => {}
            }
            // The gauge first, so a client that has its answer sees itself gone from it.
            let r = if over { running.remove(&id) } else { running.get(&id).cloned() };
            metrics.running.store(running.len() as u64, Ordering::Relaxed);
            if let Some(r) = r {
                // A closed channel is noticed at the next step.
                let _ = r.send(Reply::Event(event));
            }
        }
        for n in slots.take_notices() {
            tracing::warn!("{n}");
            metrics.degraded.store(true, Ordering::Relaxed);
        }
        metrics.queued.store(queue.len() as u64, Ordering::Relaxed);
        metrics.running.store(running.len() as u64, Ordering::Relaxed);
        let (cache, kept) = slots.cache_bytes();
        metrics.cache_bytes.store(cache as u64, Ordering::Relaxed);
        metrics.snapshot_bytes.store(kept as u64, Ordering::Relaxed);
        if let Some(chain) = engine.device() {
            let (record, wait) =
                chain.devices().iter().map(|d| d.ctx.host_times()).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
            metrics.device_record_ns.store((record * 1e9) as u64, Ordering::Relaxed);
            metrics.device_wait_ns.store((wait * 1e9) as u64, Ordering::Relaxed);
        }
        if let Some((routed, device)) =
            engine.device().and_then(|d| d.with_tier(|t| (t.stats().routed, t.stats().device)))
        {
            metrics.tier_routed.store(routed, Ordering::Relaxed);
            metrics.tier_device.store(device, Ordering::Relaxed);
        }
    }
}

/// Encodes a new job and queues it, or refuses it.
fn take(
    engine: &Engine,
    slots: &Slots,
    cfg: &WorkerConfig,
    s: Submission,
    queue: &mut VecDeque<Queued>,
    next_id: &mut RequestId,
    metrics: &Metrics,
) {
    metrics.requests.fetch_add(1, Ordering::Relaxed);
    if queue.len() >= cfg.max_queue {
        let e = ApiError::unavailable(format!("{} requests are waiting already; try again later", queue.len()));
        return reject(&s.replies, e, metrics);
    }
    let job = s.job;
    let prompt = match encode(engine, &job.input) {
        Ok(p) => p,
        Err(e) => return reject(&s.replies, e, metrics),
    };
    // Conversations sharing a system prompt branch after it: a recurrent model keeps its state there.
    let marks = match &job.input {
        Input::Chat(messages) => engine.branch_points(messages, &prompt),
        _ => Vec::new(),
    };
    let context = slots.context();
    if prompt.len() >= context {
        let e = ApiError::bad_request(
            format!(
                "the prompt has {} tokens; the context holds {context} (one more is needed to answer)",
                prompt.len()
            ),
            Some("messages"),
        )
        .with_code("context_length_exceeded");
        return reject(&s.replies, e, metrics);
    }
    let request = Request {
        prompt,
        sampler: job.sampler,
        max_new_tokens: job.max_tokens.unwrap_or(usize::MAX),
        stop_strings: job.stop,
        stop_at_eos: !job.ignore_eos,
        penalty_window: 64,
        speculation: cfg.speculation,
        marks,
    };
    *next_id += 1;
    queue.push_back(Queued { id: *next_id, request, replies: s.replies });
}

fn reject(replies: &UnboundedSender<Reply>, e: ApiError, metrics: &Metrics) {
    metrics.rejected.fetch_add(1, Ordering::Relaxed);
    let _ = replies.send(Reply::Rejected(e));
}

/// The prompt's ids.
fn encode(engine: &Engine, input: &Input) -> Result<Vec<u32>, ApiError> {
    let bad = |e: EngineError| ApiError::bad_request(e.to_string(), None);
    match input {
        Input::Ids(ids) => engine.prompt_ids(&Prompt::Ids(ids)).map_err(bad),
        Input::Text(t) => engine.prompt_ids(&Prompt::Text(t)).map_err(bad),
        Input::Chat(messages) => {
            let tok = engine.tokenizer().ok_or_else(|| {
                let why = engine.tokenizer_note().map_or_else(String::new, |n| format!(": {n}"));
                ApiError::bad_request(format!("chat needs a tokenizer and the model has none{why}"), None)
            })?;
            let template = tok.chat_template().map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
            let text =
                template.render(messages, true).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
            tok.encode(&text, false).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))
        }
    }
}

fn admit_error(e: AdmitError) -> ApiError {
    match e {
        AdmitError::PromptTooLong { .. } => {
            ApiError::bad_request(e.to_string(), None).with_code("context_length_exceeded")
        }
        AdmitError::Busy => ApiError::internal(e.to_string()),
        _ => ApiError::bad_request(e.to_string(), None),
    }
}
