//! Replays of a device frame's recordings, for frames the schedule marks replayable (every
//! kernel takes its positions from a device buffer, `Pos::Dynamic`):
//! - a one-row forward: recorded once per session and kept in its state (`DeviceState::replays`),
//!   its position written into the session's `pos` before each run;
//! - a batched decode step (one row for each of several sequences): recorded once for the same
//!   sessions in the same order and kept by the device model (`BatchReplays`, the recordings of
//!   at most `MAX_BATCH_SETS` such orders). The recording names every member's buffers (the rows'
//!   values in the first's; each one's K/V mirrors, rings, recurrent states, index keys and
//!   `pos`), so it is keyed by the members' state ids and is valid only while each of them
//!   lives: a state's buffers are allocated once with it, so the same id means the same buffers,
//!   and a state that drops takes every batched recording naming it with it (`Drop for
//!   DeviceState`), before its buffers go. The host writes one small buffer of the sequences'
//!   positions before each run; the recording starts by copying each into its sequence's `pos`.
//!
//! A frame that is not replayable (a KV compressor: its windows closed in the frame are fixed
//! when recorded) keeps being recorded at every step (`DeviceModel::run_frame`).

use super::{DeviceModel, DeviceState, Rec, SeqState};
use crate::bytes::as_bytes;
use crate::cpu::Precision;
use crate::vk::{DeviceBuffer, MemoryUse, Pos, Recorded, VkError};
use coli_compiler::frames::Frame;
use coli_compiler::ir::Program;
use coli_compiler::schedule::Call;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Orders of sessions whose batched recordings a device model keeps (the latest used).
const MAX_BATCH_SETS: usize = 2;

/// The next device state's id (never reused within the process).
static NEXT_STATE: AtomicU64 = AtomicU64::new(1);

/// A fresh state's id.
pub(super) fn new_state_id() -> u64 {
    NEXT_STATE.fetch_add(1, Ordering::Relaxed)
}

/// What a recording is for, besides its sessions: (frame index, last row only, precision).
type Key = (usize, bool, Precision);

/// How a device model's batched steps ran (`DeviceModel::replay_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Frames of batched steps recorded for replay.
    pub recorded: u64,
    /// Frames of batched steps run from a kept recording.
    pub replayed: u64,
    /// Recordings dropped: a member session went away, or their order of sessions was the
    /// least recently used when another came.
    pub dropped: u64,
}

/// A batched frame's recording and the buffer of its sequences' positions (u32 each).
struct BatchRec {
    key: Key,
    positions: DeviceBuffer,
    rec: Recorded,
}

/// The batched recordings for one order of sessions (their state ids).
struct BatchSet {
    members: Vec<u64>,
    recs: Vec<BatchRec>,
}

/// The batched recordings a device model keeps, the latest used first; shared with every state
/// the model made, so that a state leaving drops those that name it.
#[derive(Default)]
pub(super) struct BatchReplays {
    sets: Vec<BatchSet>,
    stats: ReplayStats,
}

/// The store, shared between a device model and its states.
pub(super) type SharedReplays = Arc<Mutex<BatchReplays>>;

pub(super) fn lock(m: &Mutex<BatchReplays>) -> MutexGuard<'_, BatchReplays> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BatchReplays {
    /// Drops every recording naming state `id`.
    fn forget(&mut self, id: u64) {
        let (gone, kept): (Vec<BatchSet>, Vec<BatchSet>) =
            std::mem::take(&mut self.sets).into_iter().partition(|s| s.members.contains(&id));
        self.stats.dropped += gone.iter().map(|s| s.recs.len() as u64).sum::<u64>();
        self.sets = kept;
    }

    /// The set for `members`, made the latest used (a new one may push the oldest out).
    fn set_for(&mut self, members: Vec<u64>) -> &mut BatchSet {
        match self.sets.iter().position(|s| s.members == members) {
            Some(i) => {
                let s = self.sets.remove(i);
                self.sets.insert(0, s);
            }
            None => {
                while self.sets.len() >= MAX_BATCH_SETS {
                    let old = self.sets.pop().map_or(0, |s| s.recs.len() as u64);
                    self.stats.dropped += old;
                }
                self.sets.insert(0, BatchSet { members, recs: Vec::new() });
            }
        }
        &mut self.sets[0]
    }
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        // The recordings naming this state's buffers go first (each waits for its last run).
        lock(&self.batches).forget(self.id);
    }
}

/// What a frame's replay runs: the program, the frame and its calls, the value widths, the
/// precision and whether only the last row's logits are wanted.
#[derive(Clone, Copy)]
pub(super) struct Job<'p> {
    pub program: &'p Program,
    pub frame: &'p Frame,
    pub calls: &'p [Call],
    pub widths: &'p [usize],
    pub precision: Precision,
    pub last_only: bool,
}

impl Job<'_> {
    fn key(&self) -> Key {
        (self.frame.id.0 as usize, self.last_only, self.precision)
    }
}

impl DeviceModel {
    /// How this device's batched steps ran: recordings made, replays, recordings dropped.
    pub fn replay_stats(&self) -> ReplayStats {
        lock(&self.batches).stats
    }

    /// A one-row forward at `pos0` from the session's recording of the frame (made on its first
    /// such step). The host's time from `t` to the submission is noted as recording, `t` then
    /// restarted.
    pub(super) fn replay_one(
        &self,
        st: &mut DeviceState,
        job: Job,
        pos0: usize,
        t: &mut Instant,
    ) -> Result<(), VkError> {
        let ctx = &self.ctx;
        ctx.write(&st.pos, 0, &(pos0 as u32).to_le_bytes())?;
        let key = job.key();
        let at = match st.replays.iter().position(|r| (r.0, r.1, r.2) == key) {
            Some(i) => i,
            None => {
                let rec = {
                    let mut f = ctx.recording()?;
                    let pos = Pos::Dynamic(st.pos.view(0, 1));
                    let seqs = [SeqState { rows: 0..1, pos, st }];
                    let Job { program, frame, calls, widths, precision, last_only } = job;
                    let rec = Rec { program, st, seqs: &seqs, widths, n: 1, pos, precision, last_only };
                    self.record(&mut f, rec, frame, calls)?;
                    f.finish()?
                };
                st.replays.push((key.0, key.1, key.2, rec));
                st.replays.len() - 1
            }
        };
        ctx.note_host("recording", *t);
        *t = Instant::now();
        st.replays[at].3.run()
    }

    /// A batched decode step (`seqs`: each sequence's one row and its position, `sts` their
    /// states in the step's order) from the recording for these sessions in this order (made
    /// on their first such step). `t` as `replay_one`'s.
    pub(super) fn replay_batch(
        &self,
        sts: &[&mut DeviceState],
        job: Job,
        seqs: &[(Range<usize>, usize)],
        t: &mut Instant,
    ) -> Result<(), VkError> {
        let ctx = &self.ctx;
        let n = seqs.len();
        if sts.len() != n || seqs.iter().enumerate().any(|(i, (r, _))| *r != (i..i + 1)) {
            let msg = "a batched replay takes one row of each sequence, in order".into();
            return Err(VkError::BadArgument { op: "frame", msg });
        }
        let mut store = lock(&self.batches);
        let set = store.set_for(sts.iter().map(|s| s.id).collect());
        let key = job.key();
        let (at, made) = match set.recs.iter().position(|r| r.key == key) {
            Some(i) => (i, false),
            None => {
                let positions = ctx.buffer(MemoryUse::Upload, n * 4)?;
                let rec = {
                    let mut f = ctx.recording()?;
                    // Each sequence's position into its own `pos`, which its kernels read.
                    for (i, st) in sts.iter().enumerate() {
                        f.copy(positions.view(i, 1), st.pos.view(0, 1))?;
                    }
                    let states: Vec<SeqState> = seqs
                        .iter()
                        .zip(sts)
                        .map(|((rows, _), st)| SeqState {
                            rows: rows.clone(),
                            pos: Pos::Dynamic(st.pos.view(0, 1)),
                            st,
                        })
                        .collect();
                    let Job { program, frame, calls, widths, precision, last_only } = job;
                    let (st, pos) = (&*sts[0], states[0].pos);
                    let rec = Rec { program, st, seqs: &states, widths, n, pos, precision, last_only };
                    self.record(&mut f, rec, frame, calls)?;
                    f.finish()?
                };
                set.recs.push(BatchRec { key, positions, rec });
                (set.recs.len() - 1, true)
            }
        };
        let r = &set.recs[at];
        let positions: Vec<u32> = seqs.iter().map(|(_, p)| *p as u32).collect();
        ctx.write(&r.positions, 0, as_bytes(&positions))?;
        ctx.note_host("recording", *t);
        *t = Instant::now();
        r.rec.run()?;
        match made {
            true => store.stats.recorded += 1,
            false => store.stats.replayed += 1,
        }
        Ok(())
    }
}
