//! The host KV cache: per attention layer, the K and V rows of every position so far. The
//! host's copy is canonical; a device mirror (later) follows it behind a watermark. An MLA
//! layer (DeepSeek) keeps its normalized latent in the `k` rows and its rotated shared rope
//! key in the `v` rows (`cpu::mla`).
//!
//! A recurrent layer (Gated DeltaNet, KDA) keeps a state instead of rows: every position it has
//! absorbed is folded into it, so it can go back only to position 0 (a reset) or to the start
//! of its last step: each step keeps the state it started from (`keep_back` copies it, a
//! device's `commit_state` swaps buffers), so a forward that fails after some of its layers
//! stepped (a device lost mid-forward) goes back and re-runs on the CPU. Truncating to any
//! other earlier position marks the state unknown; the next forward then fails with a typed
//! error unless it starts at position 0 (`Session::try_truncate` reports it up front), or to a
//! position whose state was kept (`snapshot`: a few copies of the state at chosen positions, such
//! as the ends of a prompt's chunks, so that a prefix shared with a new request can be reused).
//!
//! A DeepSeek Sparse Attention layer keeps its indexer's keys beside its MLA rows (`index`, one
//! row of the indexer's head width per position), so they go back to any position with them.
//!
//! A KV compressor (DeepSeek V4's `Op::KvCompress`) keeps every position's projections and the
//! entries of the windows closed so far (`compress`: the attention's, then its indexer's), so
//! they go back to any position with the KV rows: an entry stays while its window does.
//!
//! A short convolution (Inkling's `*_sconv`) keeps the rows of its input instead, one set per
//! convolution (by its weight's name), position-major as K/V rows are, so it goes back to any
//! position as the KV cache does.

/// The fewest rows a K/V buffer grows by (`LayerKv::prepare_rows`).
pub const MIN_GROW_ROWS: usize = 64;

/// K and V rows of one layer, position-major (`len x width`).
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub k_width: usize,
    pub v_width: usize,
    /// A recurrent layer's state (`LinearAttentionSpec::state_floats`), empty until its first
    /// forward and for attention layers.
    pub state: Vec<f32>,
    /// Positions the state has absorbed; `None` when unknown (truncated past it).
    pub state_len: Option<usize>,
    /// The state the last step started from, and its position (`None`: nothing to go back to).
    pub state_back: Vec<f32>,
    pub back_len: Option<usize>,
    /// Copies of the state at earlier positions (`snapshot`), oldest first: a truncation to one
    /// of them goes back to it.
    pub snapshots: Vec<(usize, Vec<f32>)>,
    /// The short convolutions' input rows of this layer.
    pub conv: Vec<ConvRows>,
    /// The indexer's keys (`cpu::indexer`), `index_width` per position, empty for layers
    /// without one.
    pub index: Vec<f32>,
    pub index_width: usize,
    /// A KV compressor's rows and entries (`cpu::compress`), empty for layers without one.
    pub compress: Vec<CompressRows>,
}

/// One KV compressor's state: `rows` holds every position's projections (`width` each), and
/// `entries` one entry (`entry_width`) per closed window of `rate` positions.
#[derive(Clone, Debug, Default)]
pub struct CompressRows {
    pub width: usize,
    pub rate: usize,
    pub rows: Vec<f32>,
    pub entry_width: usize,
    pub entries: Vec<f32>,
}

impl CompressRows {
    pub fn len(&self) -> usize {
        self.rows.len().checked_div(self.width).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The entries closed so far.
    pub fn entry_count(&self) -> usize {
        self.entries.len().checked_div(self.entry_width).unwrap_or(0)
    }

    /// Forgets every position from `len` on, and the entries of windows not closed before it.
    pub fn truncate(&mut self, len: usize) {
        self.rows.truncate(len * self.width);
        self.entries.truncate(len.checked_div(self.rate).unwrap_or(0) * self.entry_width);
    }
}

/// The input rows of one short convolution, `len x width`.
#[derive(Clone, Debug, Default)]
pub struct ConvRows {
    /// The convolution's weight name.
    pub key: String,
    pub width: usize,
    pub rows: Vec<f32>,
}

impl ConvRows {
    pub fn len(&self) -> usize {
        self.rows.len().checked_div(self.width).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl LayerKv {
    pub fn len(&self) -> usize {
        self.k.len().checked_div(self.k_width).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for `n` more rows after the first `len` ones without reallocating or
    /// first-touching memory as they are written: when the room is short, the capacity grows
    /// to at least twice `len` rows (and `MIN_GROW_ROWS`) and the new room is written once, so
    /// the pages come in one burst here (the caller runs the layers at once) instead of a
    /// fault or two on every decode step's critical path (measured on the H200 machine: about
    /// 320 us a token over 32 K/V rows of 8 KiB).
    pub fn prepare_rows(&mut self, len: usize, n: usize) {
        fn grow(x: &mut Vec<f32>, len: usize, n: usize, width: usize) {
            let (used, need) = (len * width, (len + n) * width);
            x.truncate(used);
            if x.capacity() >= need {
                return;
            }
            let rows = (2 * len).max(len + n).max(MIN_GROW_ROWS);
            x.reserve_exact(rows * width - x.len());
            x.spare_capacity_mut().iter_mut().for_each(|s| {
                s.write(0.0);
            });
        }
        grow(&mut self.k, len, n, self.k_width);
        grow(&mut self.v, len, n, self.v_width);
    }

    /// Appends `n` rows at the end; they must be the rows of positions `len .. len + n`.
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }

    /// Forgets every position from `len` on (a recurrent state that held more becomes unknown,
    /// or is reset when `len` is 0).
    pub fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.k_width);
        self.v.truncate(len * self.v_width);
        for c in &mut self.conv {
            c.rows.truncate(len * c.width);
        }
        self.index.truncate(len * self.index_width);
        for c in &mut self.compress {
            c.truncate(len);
        }
        if !self.state.is_empty() && self.state_len.is_none_or(|s| s > len) {
            if len == 0 {
                self.reset_state(self.state.len());
            } else if self.back_len == Some(len) && self.state_back.len() == self.state.len() {
                std::mem::swap(&mut self.state, &mut self.state_back);
                self.state_len = Some(len);
                self.back_len = None;
            } else if let Some((_, s)) = self.snapshots.iter().find(|(p, _)| *p == len) {
                self.state.clone_from(s);
                self.state_len = Some(len);
                self.back_len = None;
            } else {
                self.state_len = None;
            }
        }
        self.snapshots.retain(|(p, _)| *p <= len);
    }

    /// Keeps a copy of the recurrent state at its position (not 0, not twice), the last `most`
    /// copies only.
    pub fn snapshot(&mut self, most: usize) {
        let Some(at) = self.state_len.filter(|&p| p > 0 && !self.state.is_empty()) else { return };
        if self.snapshots.last().is_some_and(|(p, _)| *p >= at) {
            return;
        }
        if most == 0 {
            return;
        }
        // At the limit the oldest copy's buffer takes the new one (no allocation a chunk: a
        // model's states are tens of MB).
        let mut copy = if self.snapshots.len() >= most { self.snapshots.remove(0).1 } else { Vec::new() };
        copy.clone_from(&self.state);
        self.snapshots.push((at, copy));
        let over = self.snapshots.len().saturating_sub(most);
        self.snapshots.drain(..over);
    }

    /// Whether truncating to `len` keeps the layer usable (a recurrent state cannot go back
    /// except to 0).
    pub fn can_truncate(&self, len: usize) -> bool {
        self.state.is_empty()
            || len == 0
            || self.state_len.is_some_and(|s| s <= len)
            || self.back_len == Some(len)
            || self.snapshots.iter().any(|(p, _)| *p == len)
    }

    /// A zero recurrent state of `floats` entries, at position 0.
    pub fn reset_state(&mut self, floats: usize) {
        self.state.clear();
        self.state.resize(floats, 0.0);
        self.state_len = Some(0);
        self.back_len = None;
    }

    /// Before a step that updates the state in place: keeps a copy to go back to.
    pub fn keep_back(&mut self) {
        self.state_back.clone_from(&self.state);
        self.back_len = self.state_len;
    }

    /// After a step made elsewhere (a device): `new` becomes the state at position `len`, the
    /// old state the one to go back to, and `new` gets the old back buffer (no copy).
    pub fn commit_state(&mut self, new: &mut Vec<f32>, len: usize) {
        std::mem::swap(&mut self.state, new);
        std::mem::swap(&mut self.state_back, new);
        self.back_len = self.state_len;
        self.state_len = Some(len);
    }
}

/// The KV rows of every layer (layers without attention keep an empty entry).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(widths: &[(usize, usize)]) -> KvCache {
        KvCache {
            layers: widths
                .iter()
                .map(|&(k_width, v_width)| LayerKv { k_width, v_width, ..Default::default() })
                .collect(),
        }
    }

    pub fn truncate(&mut self, len: usize) {
        self.layers.iter_mut().for_each(|l| l.truncate(len));
    }

    /// Keeps a copy of every recurrent state at its position (`LayerKv::snapshot`).
    pub fn snapshot(&mut self, most: usize) {
        self.layers.iter_mut().for_each(|l| l.snapshot(most));
    }

    /// The latest position at most `max` that every layer can go back to (0 at the least).
    pub fn rewind_point(&self, max: usize) -> usize {
        let mut points: Vec<usize> = vec![max];
        for l in &self.layers {
            points.extend(l.snapshots.iter().map(|(p, _)| *p).filter(|&p| p <= max));
            points.extend(l.back_len.filter(|&p| p <= max));
        }
        points.sort_unstable_by(|a, b| b.cmp(a));
        points.into_iter().find(|&p| self.layers.iter().all(|l| l.can_truncate(p))).unwrap_or(0)
    }

    /// Bytes of the recurrent states' kept copies (`snapshot`; part of `bytes`).
    pub fn snapshot_bytes(&self) -> usize {
        self.layers.iter().flat_map(|l| &l.snapshots).map(|(_, s)| s.len() * 4).sum()
    }

    /// Bytes held by the cache (recurrent states included).
    pub fn bytes(&self) -> usize {
        let conv = |l: &LayerKv| l.conv.iter().map(|c| c.rows.len()).sum::<usize>();
        let compress = |l: &LayerKv| l.compress.iter().map(|c| c.rows.len() + c.entries.len()).sum::<usize>();
        let rows = |l: &LayerKv| l.k.len() + l.v.len() + l.index.len() + compress(l);
        let kept = |l: &LayerKv| l.snapshots.iter().map(|(_, s)| s.len()).sum::<usize>();
        self.layers.iter().map(|l| (rows(l) + l.state.len() + l.state_back.len() + conv(l) + kept(l)) * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_rows_keep_the_data_and_grow_by_doubling() {
        let mut c = LayerKv { k_width: 3, v_width: 2, ..Default::default() };
        c.append(&[1.0, 2.0, 3.0], &[4.0, 5.0]);
        c.prepare_rows(1, 3);
        assert_eq!((c.k.as_slice(), c.v.as_slice()), (&[1.0, 2.0, 3.0][..], &[4.0, 5.0][..]));
        assert!(c.k.capacity() >= MIN_GROW_ROWS * 3 && c.v.capacity() >= MIN_GROW_ROWS * 2);
        // Enough room: nothing moves; short of it: at least twice the rows kept.
        let (ptr, cap) = (c.k.as_ptr(), c.k.capacity());
        c.prepare_rows(1, MIN_GROW_ROWS - 1);
        assert_eq!((c.k.as_ptr(), c.k.capacity()), (ptr, cap));
        (c.k, c.v) = (vec![7.0; 100 * 3], vec![7.0; 100 * 2]);
        c.prepare_rows(100, 1);
        assert!(c.k.capacity() >= 200 * 3 && c.v.capacity() >= 200 * 2);
        assert_eq!(c.len(), 100);
        // Rows past `len` are dropped first (a step that rewrites them).
        c.prepare_rows(10, 1);
        assert_eq!(c.len(), 10);
    }

    #[test]
    fn append_and_truncate_track_positions() {
        let mut c = KvCache::new(&[(2, 3)]);
        c.layers[0].append(&[1.0, 2.0, 3.0, 4.0], &[0.0; 6]);
        assert_eq!(c.layers[0].len(), 2);
        c.truncate(1);
        assert_eq!(c.layers[0].k, vec![1.0, 2.0]);
        assert_eq!(c.layers[0].v.len(), 3);
    }

    #[test]
    fn short_convolution_rows_go_back_with_the_kv_rows() {
        let mut c = KvCache::new(&[(2, 2)]);
        c.layers[0].append(&[1.0; 6], &[2.0; 6]);
        c.layers[0].conv.push(ConvRows { key: "w".into(), width: 3, rows: vec![0.5; 9] });
        assert!(c.layers[0].can_truncate(1));
        c.truncate(1);
        assert_eq!((c.layers[0].len(), c.layers[0].conv[0].len()), (1, 1));
        assert_eq!(c.bytes(), (2 + 2 + 3) * 4);
    }

    #[test]
    fn index_keys_go_back_with_the_kv_rows() {
        let mut c = KvCache::new(&[(2, 1)]);
        let l = &mut c.layers[0];
        l.append(&[1.0; 6], &[2.0; 3]);
        (l.index, l.index_width) = (vec![0.5; 12], 4);
        c.truncate(2);
        assert_eq!((c.layers[0].len(), c.layers[0].index.len()), (2, 8));
        assert_eq!(c.bytes(), (4 + 2 + 8) * 4);
        c.truncate(0);
        assert!(c.layers[0].index.is_empty());
    }

    #[test]
    fn compressed_entries_go_back_with_their_windows() {
        let mut c = KvCache::new(&[(2, 2)]);
        let l = &mut c.layers[0];
        l.append(&[1.0; 14], &[1.0; 14]);
        // Seven positions of width 2, windows of 3: two entries of width 4.
        l.compress.push(CompressRows {
            width: 2,
            rate: 3,
            rows: vec![0.5; 14],
            entry_width: 4,
            entries: vec![0.25; 8],
        });
        assert_eq!((l.compress[0].len(), l.compress[0].entry_count()), (7, 2));
        c.truncate(6);
        assert_eq!((c.layers[0].compress[0].len(), c.layers[0].compress[0].entry_count()), (6, 2));
        c.truncate(5);
        assert_eq!((c.layers[0].compress[0].len(), c.layers[0].compress[0].entry_count()), (5, 1));
        assert_eq!(c.bytes(), (10 + 10 + 10 + 4) * 4);
    }

    #[test]
    fn a_recurrent_state_goes_back_only_to_the_start() {
        let mut c = KvCache::new(&[(0, 0)]);
        c.layers[0].reset_state(4);
        c.layers[0].state = vec![1.0; 4];
        c.layers[0].state_len = Some(5);
        assert!(c.layers[0].can_truncate(5) && c.layers[0].can_truncate(9) && !c.layers[0].can_truncate(3));
        c.truncate(7);
        assert_eq!(c.layers[0].state_len, Some(5));
        c.truncate(3);
        assert_eq!(c.layers[0].state_len, None);
        c.truncate(0);
        assert_eq!((c.layers[0].state_len, c.layers[0].state.clone()), (Some(0), vec![0.0; 4]));
    }

    #[test]
    fn a_recurrent_state_goes_back_to_the_start_of_its_last_step() {
        let mut c = KvCache::new(&[(0, 0)]);
        let l = &mut c.layers[0];
        l.reset_state(2);
        l.state = vec![1.0, 2.0];
        l.state_len = Some(4);
        // A device step 4..7 commits its state; the old one is kept.
        let mut new = vec![3.0, 4.0];
        l.commit_state(&mut new, 7);
        assert_eq!((l.state.clone(), l.state_len, l.back_len), (vec![3.0, 4.0], Some(7), Some(4)));
        assert!(l.can_truncate(4) && !l.can_truncate(5));
        c.truncate(4);
        let l = &mut c.layers[0];
        assert_eq!((l.state.clone(), l.state_len, l.back_len), (vec![1.0, 2.0], Some(4), None));
        // A CPU step keeps a copy likewise.
        l.keep_back();
        l.state = vec![5.0, 6.0];
        l.state_len = Some(5);
        c.truncate(4);
        assert_eq!((c.layers[0].state.clone(), c.layers[0].state_len), (vec![1.0, 2.0], Some(4)));
    }

    #[test]
    fn kept_states_are_positions_to_go_back_to() {
        let mut c = KvCache::new(&[(0, 0), (2, 2)]);
        c.layers[0].reset_state(2);
        let at = |c: &mut KvCache, p: usize, v: f32| {
            c.layers[0].state = vec![v, v];
            c.layers[0].state_len = Some(p);
        };
        // States kept at 4, 8 and 12 (twice at 12: once), the last two only.
        for (p, v) in [(4, 4.0), (8, 8.0), (12, 12.0), (12, 12.0)] {
            at(&mut c, p, v);
            c.snapshot(2);
        }
        assert_eq!(c.layers[0].snapshots.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [8, 12]);
        at(&mut c, 15, 15.0);
        // The attention layer goes anywhere; the recurrent one to its kept states or 0.
        assert_eq!([c.rewind_point(14), c.rewind_point(12), c.rewind_point(11), c.rewind_point(7)], [12, 12, 8, 0]);
        assert!(c.layers[0].can_truncate(8) && !c.layers[0].can_truncate(9));
        c.truncate(8);
        assert_eq!((c.layers[0].state.clone(), c.layers[0].state_len), (vec![8.0, 8.0], Some(8)));
        // The state kept past it is gone; a position without one leaves the state unknown.
        assert_eq!(c.layers[0].snapshots.len(), 1);
        at(&mut c, 10, 10.0);
        c.truncate(9);
        assert_eq!(c.layers[0].state_len, None);
        assert_eq!(c.bytes(), 4 * (2 + 2));
    }
}
