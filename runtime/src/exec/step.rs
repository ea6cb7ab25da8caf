//! What one forward runs on: a `Step` (its rows, positions, precision and wanted logits) and
//! the host's side of the sequence (`HostRows`). A leaf of the executor: the loop, the host
//! frames and the device frames all read it.

use super::LogitRows;
use crate::cpu::Precision;
use crate::store::kv::KvCache;

/// One forward's rows: `tokens` at positions `pos0..pos0 + tokens.len()` of one sequence, the
/// precision of the CPU's products, and which rows' logits are wanted.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub precision: Precision,
    pub logits: LogitRows,
}

/// The host's side of a sequence: every value's rows and the canonical KV cache.
pub(crate) struct HostRows<'a> {
    pub values: &'a mut [Vec<f32>],
    pub widths: &'a [usize],
    pub kv: &'a mut KvCache,
}
