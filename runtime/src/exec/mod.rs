//! The executor: runs a compiled program's forward pass over a block of tokens, keeping the
//! KV cache between calls. Every forward is a schedule run by one loop (`run`): the model's
//! own schedule of one host frame on the CPU, or a device plan's (`chain`) behind the same
//! `Session::forward`; any device failure sends the forward back to the CPU's schedule from
//! the host's cache.

pub use crate::store::{kv, weights};

pub mod chain;
pub mod device;
pub mod draft;
mod host;
pub mod kv_split;
pub mod mla_mirror;
pub mod probe;
pub mod recurrent;
pub mod run;
pub mod step;

use crate::cpu::{CpuError, CpuOps, Precision};
use crate::model::Checkpoint;
use crate::oplib::{op_name, OpLib};
use chain::{Chain, ChainState};
use coli_compiler::ir::{Op, Program};
use coli_compiler::schedule::Schedule;
use kv::KvCache;
pub use step::Step;
use weights::{WeightError, WeightStore};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error(transparent)]
    Cpu(#[from] CpuError),
    #[error(
        "{lib} cannot run op {op} of layer {layer}; this architecture's mixer is not supported by the runtime yet"
    )]
    Unsupported { lib: String, op: &'static str, layer: String },
    #[error("device: {0}")]
    Device(crate::vk::VkError),
    #[error(transparent)]
    RamCache(#[from] crate::ramcache::RamError),
    #[error("context full: {need} positions needed, the context holds {max}")]
    ContextFull { need: usize, max: usize },
    #[error("cannot go back from position {from} to {to}: layer {layer} keeps a recurrent state, which goes back only to position 0")]
    CannotRewind { layer: usize, from: usize, to: usize },
    #[error("cannot take another session's context: {0}")]
    Adopt(&'static str),
    #[error("the schedule runs frame {0} on a device, and this session has none")]
    NoDevice(u32),
    #[error("cannot batch these sessions: {0}")]
    Batch(&'static str),
    #[error("draft model: {0}")]
    Draft(&'static str),
}

/// The rows a device op records over: `n` rows of `x` into `out`, its products in
/// `precision` (what `exec::device` hands `recurrent` and `mla_mirror` for their ops).
#[derive(Clone, Copy)]
pub struct OpRows<'a> {
    pub x: crate::vk::View<'a>,
    pub out: crate::vk::View<'a>,
    pub n: usize,
    pub precision: Precision,
}

/// A program with its weights resolved, its schedule on the CPU alone, and the RAM expert
/// cache the CPU reads routed experts through when the engine gave it one.
pub struct Model {
    pub program: Program,
    pub weights: WeightStore,
    cpu: Schedule,
    ram: Option<crate::ramcache::RamCache>,
}

impl Model {
    /// Checks that the CPU library runs every op, then resolves every weight.
    pub fn load(
        ckpt: &Checkpoint,
        mut program: Program,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model, ExecError> {
        let cpu = CpuOps;
        let check = |ops: &[Op], layer: String| -> Result<(), ExecError> {
            for op in ops {
                if !cpu.supports(op, None) {
                    return Err(ExecError::Unsupported { lib: cpu.name(), op: op_name(op), layer: layer.clone() });
                }
            }
            Ok(())
        };
        check(&program.prologue, "prologue".into())?;
        for l in &program.layers {
            check(&l.ops, l.id.to_string())?;
        }
        check(&program.epilogue, "epilogue".into())?;
        let weights = WeightStore::load(ckpt, &program, progress)?;
        // A draft model reads one layer of the checkpoint: the rest is the model's.
        let draft = program.prologue.iter().any(|op| matches!(op, Op::Input { .. }));
        let unread = if draft { Vec::new() } else { crate::store::unread::unread(ckpt, &program) };
        if !unread.is_empty() {
            let some: Vec<&str> = unread.iter().take(3).map(String::as_str).collect();
            tracing::warn!(
                "{} tensors of {} are not read by the {} spec ({}{}): the checkpoint may use an option the spec does not serve",
                unread.len(),
                ckpt.path().display(),
                program.family,
                some.join(", "),
                if unread.len() > some.len() { ", ..." } else { "" }
            );
        }
        weights::name_row_selections(&mut program);
        let cpu = Schedule::host_only(&program);
        Ok(Model { program, weights, cpu, ram: None })
    }

    /// The RAM expert cache, when there is one.
    pub fn ram_cache(&self) -> Option<&crate::ramcache::RamCache> {
        self.ram.as_ref()
    }

    /// Gives the model a RAM expert cache (`None`: the CPU reads experts from the map).
    pub fn set_ram_cache(&mut self, ram: Option<crate::ramcache::RamCache>) {
        self.ram = ram;
    }

    /// The schedule of a run on the CPU alone: every op in one host frame.
    pub fn cpu_schedule(&self) -> &Schedule {
        &self.cpu
    }
}

/// Recurrent states kept per layer by `Session::snapshot_states` (Qwen3-Next's 48 layers of
/// 32 x 128 x 128 floats are 100 MB a copy).
pub const STATE_SNAPSHOTS: usize = 4;

/// Which rows' logits a forward returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    Last,
    All,
}

/// One sequence being generated: its KV cache and position.
pub struct Session<'m> {
    model: &'m Model,
    kv: KvCache,
    values: Vec<Vec<f32>>,
    widths: Vec<usize>,
    pos: usize,
    max_context: usize,
    precision: Precision,
    device: Option<(&'m Chain, ChainState)>,
    notice: Option<String>,
    /// The rows of the program's exported value (`Program::export`) of the last forward.
    exported: Vec<f32>,
    /// The rows of the program's `Input` for the forward under way (`forward_from`).
    input: Option<(coli_compiler::ir::ValueId, Vec<f32>)>,
    /// The draft model that continues from this session's rows (`draft::Draft`).
    draft: Option<Box<draft::Draft<'m>>>,
}

impl<'m> Session<'m> {
    /// A new sequence; `max_context` caps its positions (the plan's context length).
    pub fn new(model: &'m Model, max_context: usize) -> Session<'m> {
        let p = &model.program;
        let mut widths = vec![(0, 0); p.layers.len()];
        for l in &p.layers {
            for op in &l.ops {
                if let Op::Attention { spec, .. } = op {
                    widths[l.id.0 as usize] = (spec.kv_heads * spec.head_dim, spec.kv_heads * spec.v_head_dim);
                }
                // MLA caches the normed latent as `k` and the rotated shared rope key as `v`.
                if let Op::Mla { spec, .. } = op {
                    widths[l.id.0 as usize] = (spec.kv_lora_rank, spec.qk_rope_head_dim);
                }
            }
        }
        Session {
            model,
            kv: KvCache::new(&widths),
            values: vec![Vec::new(); p.values.len()],
            widths: p.values.iter().map(|v| v.width).collect(),
            pos: 0,
            max_context,
            precision: Precision::Fast,
            device: None,
            notice: None,
            exported: Vec::new(),
            input: None,
            draft: None,
        }
    }

    /// Gives this session a draft model that continues from its rows (the model's program
    /// exports its residual: `DraftRole::Target`); the draft's session starts empty.
    pub fn attach_draft(&mut self, draft: Session<'m>) -> Result<(), ExecError> {
        if self.pos != 0 {
            return Err(ExecError::Draft("a draft joins a session before its first forward"));
        }
        self.draft = Some(Box::new(draft::Draft::new(&self.model.program, draft)?));
        Ok(())
    }

    /// Whether a draft model is attached (`attach_draft`).
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Up to `cap` tokens the attached draft model guesses to follow `next`, the token sampled
    /// to be fed next; empty without a draft.
    pub fn draft_tokens(&mut self, next: u32, cap: usize) -> Result<Vec<u32>, ExecError> {
        let pos = self.pos;
        match self.draft.as_mut() {
            Some(d) => d.guess(next, pos, cap),
            None => Ok(Vec::new()),
        }
    }

    /// The rows of the program's exported value (`Program::export`) written by the last
    /// forward, `n x width`; empty when the program exports none.
    pub fn exported(&self) -> &[f32] {
        &self.exported
    }

    /// `forward` with the rows of the program's `Input` (a draft model's: `tokens.len()` rows
    /// of its width) handed in.
    pub fn forward_from(&mut self, tokens: &[u32], input: &[f32], rows: LogitRows) -> Result<Vec<f32>, ExecError> {
        let Some(v) = self.model.program.prologue.iter().find_map(|op| match op {
            Op::Input { out } => Some(*out),
            _ => None,
        }) else {
            return Err(ExecError::Draft("this program takes no input rows"));
        };
        if input.len() != tokens.len() * self.widths[v.0 as usize] {
            return Err(ExecError::Draft("the input rows do not match the tokens"));
        }
        self.input = Some((v, input.to_vec()));
        let r = self.forward(tokens, rows);
        self.input = None;
        r
    }

    /// A new sequence whose plan's device frames run on `device` (every device of the plan).
    pub fn on_device(
        model: &'m Model,
        device: &'m Chain,
        max_context: usize,
    ) -> Result<Session<'m>, crate::vk::VkError> {
        // The device's KV mirrors hold the plan's context: the session holds no more.
        let max_context = max_context.min(device.max_context());
        let state = device.new_state(model, max_context)?;
        let mut s = Session::new(model, max_context);
        s.device = Some((device, state));
        Ok(s)
    }

    /// Bytes of this session's K/V mirrors on its devices (`None` without a device).
    pub fn device_kv_bytes(&self) -> Option<u64> {
        self.device.as_ref().map(|(_, st)| st.kv_mirror_bytes())
    }

    /// Whether forwards run the plan's device frames (false after a device failure).
    pub fn on_a_device(&self) -> bool {
        self.device.is_some()
    }

    /// A one-line notice for the user (a device failure the run survived), once.
    pub fn take_notice(&mut self) -> Option<String> {
        self.notice.take()
    }

    /// How CPU matmuls meet quantized weights (`Fast` by default).
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// Positions consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Takes `other`'s context (its positions and the host's cache of them) as this fresh
    /// session's: a context filled by another session of the same program under another
    /// placement (`coli bench -d N --fill-unsplit` fills a long context without its KV split).
    /// This session's device mirrors follow from the host's cache at its next forward, as after
    /// any host write.
    pub fn adopt_context(&mut self, other: &Session) -> Result<(), ExecError> {
        if self.pos != 0 {
            return Err(ExecError::Adopt("this session has positions of its own"));
        }
        let widths = |s: &Session| s.kv.layers.iter().map(|l| (l.k_width, l.v_width)).collect::<Vec<_>>();
        if widths(self) != widths(other) {
            return Err(ExecError::Adopt("the other session's layers differ"));
        }
        if other.pos > self.max_context {
            return Err(ExecError::ContextFull { need: other.pos, max: self.max_context });
        }
        self.kv = other.kv.clone();
        self.pos = other.pos;
        Ok(())
    }

    /// Forgets every position from `pos` on. A recurrent layer's state (Gated DeltaNet, KDA) cannot
    /// go back except to 0: it becomes unknown, and the next forward fails with a typed error
    /// unless it starts at 0 (`try_truncate` refuses up front instead).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
        self.kv.truncate(self.pos);
        if let Some(d) = self.draft.as_mut() {
            d.cut(self.pos);
        }
    }

    /// Bytes of the host cache (K/V rows, recurrent states) and of its kept recurrent states
    /// (`snapshot_states`), part of the first.
    pub fn cache_bytes(&self) -> (usize, usize) {
        (self.kv.bytes(), self.kv.snapshot_bytes())
    }

    /// Keeps a copy of each recurrent layer's state at this position, so that `truncate` can go
    /// back here later (the last `STATE_SNAPSHOTS` positions kept); nothing for a model without
    /// recurrent layers.
    pub fn snapshot_states(&mut self) {
        self.kv.snapshot(STATE_SNAPSHOTS);
    }

    /// The latest position at most `max` that `try_truncate` can go back to: `max` itself unless
    /// a recurrent layer's state cannot, else the latest kept state (`snapshot_states`) before it,
    /// else 0.
    pub fn rewind_point(&self, max: usize) -> usize {
        self.kv.rewind_point(max.min(self.pos))
    }

    /// `truncate`, or `ExecError::CannotRewind` (nothing changed) when a recurrent layer's
    /// state would have to go back to a position other than 0.
    pub fn try_truncate(&mut self, pos: usize) -> Result<(), ExecError> {
        let to = self.pos.min(pos);
        if let Some(layer) = self.kv.layers.iter().position(|l| !l.can_truncate(to)) {
            return Err(ExecError::CannotRewind { layer, from: self.pos, to });
        }
        self.truncate(pos);
        Ok(())
    }

    /// After a forward that ran `fed` from position `start` (the last one): keeps its first
    /// `kept` positions and forgets the rest (a checked draft's rejected tokens). Where a
    /// recurrent layer cannot step back there (only to the forward's start), the forward's start
    /// comes back and the kept tokens run again; returns whether they did.
    pub fn keep_of_last(&mut self, start: usize, fed: &[u32], kept: usize) -> Result<bool, ExecError> {
        if kept >= fed.len() || self.try_truncate(start + kept).is_ok() {
            return Ok(false);
        }
        self.try_truncate(start)?;
        self.forward(&fed[..kept], LogitRows::Last)?;
        Ok(true)
    }

    /// Runs `tokens` (positions `pos..pos+n`) through the model; returns the logits of the
    /// last row (`vocab` floats) or of every row (`n x vocab`). A failure of any device re-runs
    /// the forward on the CPU from the host's cache, and the session stays on the CPU (every
    /// device of the chain off).
    pub fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<f32>, ExecError> {
        let start = self.pos;
        let r = self.forward_rows(tokens, rows);
        if let (Ok(_), Some(d)) = (&r, self.draft.as_mut()) {
            d.follow(start, tokens, &self.exported);
        }
        r
    }

    /// `forward` without the draft's bookkeeping.
    fn forward_rows(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<f32>, ExecError> {
        let n = tokens.len();
        if self.pos + n > self.max_context {
            return Err(ExecError::ContextFull { need: self.pos + n, max: self.max_context });
        }
        if self.device.is_some() {
            let start = self.pos;
            match self.run(tokens, rows) {
                Ok(l) => return Ok(l),
                Err(ExecError::Device(e)) => {
                    self.notice = Some(format!(
                        "the device failed ({e}); this forward and the rest of the run continue on the CPU"
                    ));
                    self.device = None;
                    self.truncate(start);
                }
                Err(e) => return Err(e),
            }
        }
        let r = self.run(tokens, rows);
        if let Err(ExecError::RamCache(_)) = &r {
            // A failed read stopped the forward part way: the cache keeps only whole forwards.
            self.truncate(self.pos);
        }
        r
    }

    /// One token for each of `sessions` (all of the same model, all on the CPU or all on the
    /// same devices) in one forward: their rows go through every matrix together (the expert
    /// tier's MoE step included), each row against its own sequence's positions and cache.
    /// Returns each session's logits (`vocab` floats), in order. The precision is the first
    /// session's. A device failure re-runs the step on the CPU, where every session stays, as
    /// `forward` does. On another error no session has moved (within a device forward's rows:
    /// more sessions than those run as several steps).
    pub fn forward_batch(sessions: &mut [&mut Session<'m>], tokens: &[u32]) -> Result<Vec<Vec<f32>>, ExecError> {
        if sessions.len() != tokens.len() {
            return Err(ExecError::Batch("one token per session"));
        }
        let feeds: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
        Session::forward_batch_rows(sessions, &feeds)
    }

    /// `forward_batch` with any number of tokens for each session (a decode step's token, a
    /// prompt's next chunk): `feeds[i]` at session `i`'s next positions. Returns the logits of
    /// each session's last row. Sessions whose rows together pass the chain's rows run as
    /// several steps; one feed longer than them is refused (feed it alone: `forward` chunks it).
    pub fn forward_batch_rows(sessions: &mut [&mut Session<'m>], feeds: &[&[u32]]) -> Result<Vec<Vec<f32>>, ExecError> {
        if sessions.len() != feeds.len() {
            return Err(ExecError::Batch("one feed per session"));
        }
        if feeds.iter().any(|f| f.is_empty()) {
            return Err(ExecError::Batch("an empty feed"));
        }
        let Some((first, rest)) = sessions.split_first() else { return Ok(Vec::new()) };
        if rest.iter().any(|s| !std::ptr::eq(s.model, first.model)) {
            return Err(ExecError::Batch("the sessions run different models"));
        }
        let chain = first.device.as_ref().map(|(c, _)| *c);
        let same = |s: &Session| match (&s.device, chain) {
            (None, None) => true,
            (Some((c, _)), Some(d)) => std::ptr::eq(*c, d),
            _ => false,
        };
        if !rest.iter().all(|s| same(s)) {
            return Err(ExecError::Batch("the sessions do not all run on the same devices"));
        }
        if let Some(why) = chain.and_then(Chain::batch_refusal) {
            return Err(ExecError::Batch(why));
        }
        for (s, f) in sessions.iter().zip(feeds) {
            if s.pos + f.len() > s.max_context {
                return Err(ExecError::ContextFull { need: s.pos + f.len(), max: s.max_context });
            }
        }
        let cap = chain.map_or(usize::MAX, |c| c.cap_rows.max(1));
        if feeds.iter().any(|f| f.len() > cap) {
            return Err(ExecError::Batch("a feed longer than the chain's rows"));
        }
        // Consecutive sessions while their rows fit the chain's.
        let mut groups = vec![0];
        let mut rows = 0;
        for (i, f) in feeds.iter().enumerate() {
            if rows + f.len() > cap {
                groups.push(i);
                rows = 0;
            }
            rows += f.len();
        }
        if groups.len() > 1 {
            groups.push(feeds.len());
            let mut out = Vec::with_capacity(feeds.len());
            let mut left = &mut sessions[..];
            for w in groups.windows(2) {
                let (group, tail) = left.split_at_mut(w[1] - w[0]);
                out.extend(Session::forward_batch_rows(group, &feeds[w[0]..w[1]])?);
                left = tail;
            }
            return Ok(out);
        }
        if chain.is_some() {
            match Session::run_batch(sessions, feeds, true) {
                Err(ExecError::Device(e)) => {
                    for s in sessions.iter_mut() {
                        s.notice = Some(format!(
                            "the device failed ({e}); this forward and the rest of the run continue on the CPU"
                        ));
                        s.device = None;
                    }
                }
                r => return r,
            }
        }
        Session::run_batch(sessions, feeds, false)
    }

    /// One batched step of `forward_batch_rows` (checked there): on the sessions' devices, or
    /// on the CPU. On an error every session's cache is back at its position.
    fn run_batch(
        sessions: &mut [&mut Session<'m>],
        feeds: &[&[u32]],
        on_device: bool,
    ) -> Result<Vec<Vec<f32>>, ExecError> {
        let mut batch: Vec<step::SeqRows> = Vec::with_capacity(feeds.len());
        let mut row = 0;
        for (s, f) in sessions.iter().zip(feeds) {
            batch.push(step::SeqRows { rows: row..row + f.len(), pos0: s.pos });
            row += f.len();
        }
        let tokens: Vec<u32> = feeds.concat();
        let Some((first, rest)) = sessions.split_first_mut() else { return Ok(Vec::new()) };
        let model = first.model;
        let step = Step {
            tokens: &tokens,
            pos0: first.pos,
            precision: first.precision,
            logits: LogitRows::All,
            batch: &batch,
        };
        let Session { values, widths, kv, device, .. } = &mut **first;
        let chain = device.as_ref().filter(|_| on_device).map(|(c, _)| *c);
        let mut states: Vec<&mut ChainState> = Vec::new();
        let mut rest_kv: Vec<&mut KvCache> = Vec::new();
        if let Some((_, st)) = device.as_mut().filter(|_| on_device) {
            states.push(st);
        }
        for s in rest.iter_mut() {
            let Session { kv, device, .. } = &mut **s;
            rest_kv.push(kv);
            if let Some((_, st)) = device.as_mut().filter(|_| on_device) {
                states.push(st);
            }
        }
        let mut host = step::HostRows { values, widths, kv, rest: &mut rest_kv };
        let r = match chain {
            Some(c) => run::forward(c.schedule(), model, &mut host, &step, Some((c, &mut states[..]))),
            None => run::forward(&model.cpu, model, &mut host, &step, None),
        };
        if let Err(e) = r {
            for s in sessions.iter_mut() {
                s.kv.truncate(s.pos);
            }
            return Err(e);
        }
        let lv = model.program.logits.0 as usize;
        let vocab = sessions[0].widths[lv];
        let out = batch
            .iter()
            .map(|b| sessions[0].values[lv][(b.rows.end - 1) * vocab..b.rows.end * vocab].to_vec())
            .collect();
        // Each session's rows of the exported value, and its draft told of them.
        let exported: Vec<Vec<f32>> = match model.program.export {
            Some(e) => {
                let w = sessions[0].widths[e.0 as usize];
                batch
                    .iter()
                    .map(|b| sessions[0].values[e.0 as usize][b.rows.start * w..b.rows.end * w].to_vec())
                    .collect()
            }
            None => vec![Vec::new(); feeds.len()],
        };
        for ((s, rows), f) in sessions.iter_mut().zip(exported).zip(feeds) {
            if let Some(d) = s.draft.as_mut() {
                d.follow(s.pos, f, &rows);
            }
            s.exported = rows;
            s.pos += f.len();
        }
        Ok(out)
    }

    /// Whether this session can share a forward with others of its kind (`forward_batch`): on
    /// the CPU always, on devices unless the plan runs one sequence a frame.
    pub fn batches(&self) -> bool {
        self.device.as_ref().is_none_or(|(c, _)| c.batch_refusal().is_none())
    }

    /// Runs the session's schedule (the chain's, or the model's on the CPU) over `tokens`, in
    /// steps of at most the chain's rows.
    fn run(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Vec<f32>, ExecError> {
        let lv = self.model.program.logits.0 as usize;
        let vocab = self.widths[lv];
        let cap = self.device.as_ref().map_or(tokens.len(), |(c, _)| c.cap_rows).max(1);
        let mut out = Vec::new();
        self.exported.clear();
        for (k, chunk) in tokens.chunks(cap).enumerate() {
            if let Some((v, rows)) = &self.input {
                let w = self.widths[v.0 as usize];
                self.values[v.0 as usize] = rows[k * cap * w..(k * cap + chunk.len()) * w].to_vec();
            }
            let step = Step { tokens: chunk, pos0: self.pos, precision: self.precision, logits: rows, batch: &[] };
            let mut host =
                step::HostRows { values: &mut self.values, widths: &self.widths, kv: &mut self.kv, rest: &mut [] };
            match self.device.as_mut() {
                Some((c, st)) => run::forward(c.schedule(), self.model, &mut host, &step, Some((*c, &mut [st])))?,
                None => run::forward(&self.model.cpu, self.model, &mut host, &step, None)?,
            }
            self.pos += chunk.len();
            if let Some(e) = self.model.program.export {
                self.exported.extend_from_slice(&self.values[e.0 as usize][..chunk.len() * self.widths[e.0 as usize]]);
            }
            let l = &self.values[lv][..chunk.len() * vocab];
            match rows {
                LogitRows::All => out.extend_from_slice(l),
                LogitRows::Last => out = l[l.len() - vocab..].to_vec(),
            }
        }
        Ok(out)
    }
}
