//! Several sequences over one engine, for front ends that serve many requests at once: a fixed
//! number of slots, each a `Session` that remembers the ids its cache holds. `admit` starts a
//! request in the free slot whose cached ids share the longest prefix with the request's prompt
//! (the next turn of a conversation, a shared system prompt), and that prefix is not computed
//! again; `step` advances every active request by one forward (a chunk of its prompt, or one
//! token) and returns what each produced (`Event`s); the decode steps of the requests run as
//! one batched forward (`Session::forward_batch`: every matrix read once for all their rows),
//! one for those on the CPU and one for those on the devices; prompt chunks run one forward
//! each. Requests are independent: each has its own cache, positions and sampler, so a
//! request's tokens do not depend on what else runs.
//!
//! A request that asks for speculation (`Request::speculation`) drafts tokens when it decodes
//! alone (the only one decoding on its CPU or devices, or a plan that cannot batch); each
//! checked row is taken as a step of its own would be, so its tokens are the same either way.
//! A draft model attached to a slot's session (`--speculate mtp`) follows its session through
//! batched steps too, so it can guess as soon as the request decodes alone.
//!
//! A slot whose model keeps a recurrent state (Gated DeltaNet, KDA) goes back only to the positions
//! whose state it kept: the ends of its prompts' chunks (`Session::snapshot_states`, the last few),
//! so a new prompt reuses the longest of those within its shared prefix (all of it when it extends
//! everything the slot holds), else it starts again at 0. A request's marks (`Request::marks`: the
//! end of its system prompt) end a chunk too, so a prompt sharing just that much starts there.
//!
//! Must not: know about HTTP, threads or clocks (the front end drives `step`), or panic on a
//! bad request (`AdmitError`).

mod turn;

pub use turn::Request;

use crate::engine::{Engine, EngineError};
use crate::exec::{LogitRows, Session};
use crate::generate::StopReason;
use crate::sample::SampleError;
use crate::speculate::{Pacer, SpecStats, Speculation};
use rayon::prelude::*;
use turn::Turn;

/// A front end's name for a request.
pub type RequestId = u64;

/// What a step produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Text now safe to show.
    Text(String),
    /// The request is over; its slot is free again.
    Done(Finish),
    /// The request failed (its slot is free again and its cache forgotten).
    Failed(String),
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the slot's cache instead of computed.
    pub cached_tokens: usize,
    /// The generated ids (an EOS that ended the generation included).
    pub generated: Vec<u32>,
    /// What its drafts did (nothing without speculation).
    pub speculation: SpecStats,
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AdmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("token id {id} is not in the vocabulary of {vocab}")]
    TokenOutOfVocab { id: u32, vocab: usize },
    #[error("every slot is busy")]
    Busy,
    #[error(transparent)]
    Sampler(#[from] SampleError),
}

/// A request in a slot.
struct Active<'e> {
    id: RequestId,
    turn: Turn<'e>,
    /// Prompt ids in the cache so far (reused ones included).
    fed: usize,
    cached_tokens: usize,
    /// The sampled id the next forward runs.
    next: Option<u32>,
    pacer: Pacer,
    spec: SpecStats,
}

struct Slot<'e> {
    session: Session<'e>,
    /// The ids whose positions the session holds, in order.
    cached: Vec<u32>,
    active: Option<Active<'e>>,
    /// When the slot was last given a request (for the least recently used among equals).
    used: u64,
}

/// The slots of one engine.
pub struct Slots<'e> {
    engine: &'e Engine,
    slots: Vec<Slot<'e>>,
    chunk_rows: usize,
    clock: u64,
    notices: Vec<String>,
}

impl<'e> Slots<'e> {
    /// `n` slots of `context` positions each (at most the engine's), prompts run `chunk_rows`
    /// rows per forward.
    pub fn new(engine: &'e Engine, n: usize, context: usize, chunk_rows: usize) -> Result<Slots<'e>, EngineError> {
        let slots = (0..n.max(1))
            .map(|_| {
                let session = engine.session_with_context(context)?;
                Ok(Slot { session, cached: Vec::new(), active: None, used: 0 })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(Slots { engine, slots, chunk_rows: chunk_rows.max(1), clock: 0, notices: Vec::new() })
    }

    /// Positions a request may use.
    pub fn context(&self) -> usize {
        self.slots[0].session.max_context()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Slots without a request.
    pub fn free(&self) -> usize {
        self.slots.iter().filter(|s| s.active.is_none()).count()
    }

    /// Bytes of every slot's host cache and of its kept recurrent states, part of the first
    /// (`Session::cache_bytes`): what prefix reuse holds in memory.
    pub fn cache_bytes(&self) -> (usize, usize) {
        self.slots.iter().map(|s| s.session.cache_bytes()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Whether any request is running.
    pub fn busy(&self) -> bool {
        self.free() < self.slots.len()
    }

    /// Starts `req` as `id` in the free slot that holds the longest prefix of its prompt;
    /// returns how many prompt tokens come from that slot's cache.
    pub fn admit(&mut self, id: RequestId, req: Request) -> Result<usize, AdmitError> {
        let context = self.context();
        let vocab = self.engine.plan().program.dims.vocab;
        if req.prompt.is_empty() {
            return Err(AdmitError::EmptyPrompt);
        }
        if req.prompt.len() > context {
            return Err(AdmitError::PromptTooLong { prompt: req.prompt.len(), context });
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(AdmitError::TokenOutOfVocab { id: bad, vocab });
        }
        let prefix = |s: &Slot| common_prefix(&s.cached, &req.prompt);
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(_, s)| (prefix(s), std::cmp::Reverse(s.used)))
            .map(|(i, _)| i)
            .ok_or(AdmitError::Busy)?;
        let turn = Turn::new(req, self.engine.tokenizer(), &self.engine.generation_defaults().eos_ids)?;
        self.clock += 1;
        let slot = &mut self.slots[best];
        // At least the prompt's last position runs again: its logits choose the first token.
        let keep = common_prefix(&slot.cached, &turn.req.prompt).min(turn.req.prompt.len() - 1);
        let keep = slot.session.rewind_point(keep);
        if slot.session.try_truncate(keep).is_err() {
            slot.session.truncate(0);
        }
        slot.cached.truncate(slot.session.pos());
        let cached_tokens = slot.cached.len();
        slot.used = self.clock;
        let pacer = Pacer::new(turn.req.speculation.max_draft());
        let spec = SpecStats::default();
        slot.active = Some(Active { id, turn, fed: cached_tokens, cached_tokens, next: None, pacer, spec });
        Ok(cached_tokens)
    }

    /// Ends request `id` now (a client that went away); its slot keeps what its cache holds.
    /// Returns whether it was running.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        for s in &mut self.slots {
            if s.active.as_ref().is_some_and(|a| a.id == id) {
                s.active = None;
                return true;
            }
        }
        false
    }

    /// The requests running, in slot order.
    pub fn running(&self) -> Vec<RequestId> {
        self.slots.iter().filter_map(|s| s.active.as_ref().map(|a| a.id)).collect()
    }

    /// One forward for every running request: the next chunk of its prompt, or the token it
    /// sampled last. Returns what each produced, in slot order.
    pub fn step(&mut self) -> Vec<(RequestId, Event)> {
        let batched = self.step_batch();
        let mut out = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Slot { session, cached, active, .. } = slot;
            let Some(a) = active.as_mut() else { continue };
            let id = a.id;
            let events = match batched.iter().find(|(j, _)| *j == i) {
                Some((_, events)) => events.clone(),
                None => advance(session, cached, a, self.chunk_rows),
            };
            if let Some(n) = slot.session.take_notice() {
                self.notices.push(n);
            }
            for e in events {
                let over = matches!(e, Event::Done(_) | Event::Failed(_));
                out.push((id, e));
                if over {
                    slot.active = None;
                }
            }
        }
        out
    }

    /// The decode steps of the requests, two or more on the CPU or on the devices, as one
    /// batched forward per kind (`Session::forward_batch`); returns each batched slot's events
    /// by slot index.
    fn step_batch(&mut self) -> Vec<(usize, Vec<Event>)> {
        let mut out = Vec::new();
        for device in [false, true] {
            // Decode steps only: a prompt's rows batched with others' take other tiles of the
            // CPU's products than alone (groups of four rows, the rest), so its last logits can
            // differ in the last bits and tip a greedy near-tie (one of eight concurrent answers
            // of the default model did); a request's tokens must not depend on what else runs.
            let ready = |s: &Slot| {
                s.session.on_a_device() == device
                    && s.session.batches()
                    && s.active.as_ref().is_some_and(|a| a.next.is_some())
            };
            if self.slots.iter().filter(|s| ready(s)).count() < 2 {
                continue;
            }
            let picked: Vec<(usize, &mut Slot<'e>)> =
                self.slots.iter_mut().enumerate().filter(|(_, s)| ready(s)).collect();
            out.extend(batch(picked));
        }
        out
    }

    /// Notices the sessions raised (a device failure a request survived on the CPU), once.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Whether every slot still runs on the devices it was given (false after a device failed).
    pub fn on_devices(&self) -> bool {
        self.engine.device().is_none() || self.slots.iter().all(|s| s.session.on_a_device())
    }
}

/// One batched forward of `picked`'s decode steps and what each produced.
fn batch<'e>(mut picked: Vec<(usize, &mut Slot<'e>)>) -> Vec<(usize, Vec<Event>)> {
    let tokens: Vec<u32> = picked.iter().filter_map(|(_, s)| s.active.as_ref().and_then(|a| a.next)).collect();
    let result = {
        let mut sessions: Vec<&mut Session<'e>> = picked.iter_mut().map(|(_, s)| &mut s.session).collect();
        Session::forward_batch(&mut sessions, &tokens)
    };
    match result {
        Ok(logits) => {
            // Each request samples its own row: in parallel, as 64 rows of a large vocabulary
            // are milliseconds on one thread.
            let mut work: Vec<(usize, usize, usize, &mut Active<'e>, &[f32])> = Vec::with_capacity(picked.len());
            for ((i, s), (l, &t)) in picked.into_iter().zip(logits.iter().zip(&tokens)) {
                let Slot { session, cached, active, .. } = s;
                let Some(a) = active.as_mut() else { continue };
                cached.push(t);
                work.push((i, session.pos(), session.max_context(), a, l));
            }
            work.into_par_iter().map(|(i, pos, max, a, l)| (i, taken_at(pos, max, a, l))).collect()
        }
        Err(e) => picked
            .into_iter()
            .map(|(i, s)| {
                s.session.truncate(0);
                s.cached.clear();
                (i, vec![Event::Failed(e.to_string())])
            })
            .collect(),
    }
}

/// The prompt positions a request feeds next: up to `chunk_rows`, ending at a mark (a state
/// kept exactly where a later prompt may branch).
fn prompt_chunk(a: &Active, chunk_rows: usize) -> std::ops::Range<usize> {
    let end = (a.fed + chunk_rows).min(a.turn.req.prompt.len());
    let end = a.turn.req.marks.iter().copied().filter(|&m| m > a.fed && m < end).min().unwrap_or(end);
    a.fed..end
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One forward of a slot's request `a` and what it produced.
fn advance(session: &mut Session, cached: &mut Vec<u32>, a: &mut Active, chunk_rows: usize) -> Vec<Event> {
    let prompt_len = a.turn.req.prompt.len();
    let tokens: Vec<u32> = match a.next {
        Some(t) => std::iter::once(t).chain(draft(session, a, t)).collect(),
        None => a.turn.req.prompt[prompt_chunk(a, chunk_rows)].to_vec(),
    };
    let drafted = if a.next.is_some() { tokens.len() - 1 } else { 0 };
    let rows = if drafted > 0 { LogitRows::All } else { LogitRows::Last };
    let start = session.pos();
    let logits = match session.forward(&tokens, rows) {
        Ok(l) => l,
        Err(e) => return failed(session, cached, e.to_string()),
    };
    cached.extend_from_slice(&tokens);
    if a.next.is_none() {
        a.fed += tokens.len();
        // A later prompt that shares this much can start here (recurrent states kept).
        session.snapshot_states();
        if a.fed < prompt_len {
            return Vec::new();
        }
    }
    if drafted == 0 {
        return taken(session, a, &logits);
    }
    // Row `k` follows the sampled token and `k` drafts: taken while the drafts agree.
    let vocab = logits.len() / tokens.len();
    let mut events = Vec::new();
    let mut kept = 1;
    loop {
        let row = &logits[(kept - 1) * vocab..kept * vocab];
        let ev = taken_at(start + kept, session.max_context(), a, row);
        let over = ev.iter().any(|e| matches!(e, Event::Done(_) | Event::Failed(_)));
        events.extend(ev);
        if over || kept == tokens.len() || a.next != Some(tokens[kept]) {
            break;
        }
        kept += 1;
    }
    a.spec.verifies += 1;
    a.spec.drafted += drafted;
    a.spec.accepted += kept - 1;
    a.pacer.record(drafted, kept - 1);
    match session.keep_of_last(start, &tokens, kept) {
        Ok(replayed) => {
            a.spec.replays += usize::from(replayed);
            cached.truncate(start + kept);
            if let Some(Event::Done(f)) = events.last_mut() {
                f.speculation = a.spec;
            }
            events
        }
        Err(e) => failed(session, cached, e.to_string()),
    }
}

/// The tokens a request decoding alone drafts after `next`, its last sampled one (none without
/// speculation, or where the budget or the context leaves no room). A draft model that fails
/// drafts nothing (the forward checks no guess).
fn draft(session: &mut Session, a: &mut Active, next: u32) -> Vec<u32> {
    let req = &a.turn.req;
    let left = req.max_new_tokens.saturating_sub(a.turn.generated.len());
    let room = session.max_context().saturating_sub(session.pos() + 1);
    let cap = left.saturating_sub(1).min(room);
    if cap == 0 || req.speculation.max_draft() == 0 {
        return Vec::new();
    }
    let cap = cap.min(a.pacer.allowance());
    if cap == 0 {
        return Vec::new();
    }
    match req.speculation {
        Speculation::Mtp { max_draft } => session.draft_tokens(next, cap.min(max_draft)).unwrap_or_default(),
        s => {
            let history: Vec<u32> = req.prompt.iter().chain(&a.turn.generated).copied().collect();
            s.draft(&history, cap)
        }
    }
}

/// A failed forward: the slot's cache is forgotten.
fn failed(session: &mut Session, cached: &mut Vec<u32>, why: String) -> Vec<Event> {
    session.truncate(0);
    cached.clear();
    vec![Event::Failed(why)]
}

/// What a request makes of the logits of its last position.
fn taken(session: &Session, a: &mut Active, logits: &[f32]) -> Vec<Event> {
    taken_at(session.pos(), session.max_context(), a, logits)
}

/// `taken` for the logits of position `pos - 1` (of a session of `max_context` positions).
fn taken_at(pos: usize, max_context: usize, a: &mut Active, logits: &[f32]) -> Vec<Event> {
    let room = pos < max_context;
    let taken = match a.turn.take(logits, room) {
        Ok(t) => t,
        Err(e) => return vec![Event::Failed(e.to_string())],
    };
    let mut events = Vec::new();
    if !taken.text.is_empty() {
        events.push(Event::Text(taken.text));
    }
    match taken.next {
        Ok(t) => a.next = Some(t),
        Err(reason) => events.push(Event::Done(Finish {
            reason,
            prompt_tokens: a.turn.req.prompt.len(),
            cached_tokens: a.cached_tokens,
            generated: std::mem::take(&mut a.turn.generated),
            speculation: a.spec,
        })),
    }
    events
}
