//! What one forward runs on: a `Step` (its rows, positions, precision and wanted logits) and
//! the host's side of the sequence (`HostRows`). A leaf of the executor: the loop, the host
//! frames and the device frames all read it.

use super::LogitRows;
use crate::cpu::Precision;
use crate::store::kv::KvCache;

/// One forward's rows: `tokens` at positions `pos0..pos0 + tokens.len()` of one sequence, the
/// precision of the CPU's products, and which rows' logits are wanted. A batched step (`batch`
/// not empty) holds the rows of several sequences instead, each its own `SeqRows`; its
/// `pos0` is then the first sequence's, and every row's logits are computed.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub precision: Precision,
    pub logits: LogitRows,
    pub batch: &'a [SeqRows],
}

impl Step<'_> {
    /// Each sequence's rows of the step and its first position: the one sequence of a step
    /// that is not batched.
    pub fn sequences(&self) -> Vec<(std::ops::Range<usize>, usize)> {
        if self.batch.is_empty() {
            return vec![(0..self.tokens.len(), self.pos0)];
        }
        self.batch.iter().map(|s| (s.rows.clone(), s.pos0)).collect()
    }
}

/// A sequence's rows in a batched step: `rows` of the step are its positions `pos0..`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqRows {
    pub rows: std::ops::Range<usize>,
    pub pos0: usize,
}

/// The host's side of the step's sequences: every value's rows (all sequences' rows in one
/// table) and the canonical KV caches: `kv` the first (or only) sequence's, `rest` the other
/// sequences' of a batched step, in `Step::batch` order.
pub(crate) struct HostRows<'a, 'k> {
    pub values: &'a mut [Vec<f32>],
    pub widths: &'a [usize],
    pub kv: &'a mut KvCache,
    pub rest: &'a mut [&'k mut KvCache],
}
