//! Sizes of a program's parts on a device: each layer's bytes (its matrices in the format
//! they go up in, its vectors as f32, its KV mirror at the context length, its recurrent
//! state), the fixed bytes every device of a chain needs (the scratch of one prompt chunk),
//! the tail (the head with its output rows), and one routed expert.
//!
//! This module must not decide placement; it counts for `place`.

use crate::cost::Format;
use crate::ir::{ExpertTensor, Layer, Op, Program, WeightRef};
use crate::profile::{KvElement, Options};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Bytes of f32 per KV-cache element and per activation.
pub const F32: u64 = 4;

/// The bytes of one layer on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCost {
    pub matrices: u64,
    pub vectors: u64,
    /// The KV mirror at the context length (f32, or the device's `KvElement`), or MLA's latent
    /// cache.
    pub kv: u64,
    /// Recurrent state of one sequence (linear attention).
    pub state: u64,
}

impl LayerCost {
    pub fn total(&self) -> u64 {
        self.matrices.saturating_add(self.vectors).saturating_add(self.kv).saturating_add(self.state)
    }
}

impl fmt::Display for LayerCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::cost::human;
        write!(
            f,
            "{} (matrices {}, vectors {}, kv {}, state {})",
            human(self.total()),
            human(self.matrices),
            human(self.vectors),
            human(self.kv),
            human(self.state)
        )
    }
}

/// The dense weights an op reads (not routed experts).
pub fn op_weights(op: &Op) -> Vec<&WeightRef> {
    match op {
        Op::Embed { table, .. } => vec![table],
        Op::RmsNorm { weight, .. } => weight.iter().collect(),
        Op::LayerNorm { weight, bias, .. } | Op::Linear { weight, bias, .. } => {
            std::iter::once(weight).chain(bias.iter()).collect()
        }
        Op::GroupedLinear { weight, .. } => vec![weight],
        Op::HyperPre { spec, .. } => vec![&spec.fn_weight, &spec.base, &spec.scale],
        Op::Attention { spec, .. } => spec.sinks.iter().chain(spec.rel.as_ref().map(|r| &r.proj)).collect(),
        Op::Route { correction_bias, scale_by, hash, .. } => {
            correction_bias.iter().chain(scale_by.iter()).chain(hash.iter()).collect()
        }
        Op::Mla { spec, .. } => spec.weights.iter().map(|(_, w)| w).collect(),
        Op::Indexer { spec, .. } => spec.weights.iter().map(|(_, w)| w).collect(),
        Op::KvCompress { spec, .. } => spec.weights.iter().map(|(_, w)| w).collect(),
        Op::LinearAttention { spec, .. } => spec.weights.iter().map(|(_, w)| w).collect(),
        Op::RoutedExperts { .. }
        | Op::Rope { .. }
        | Op::Act { .. }
        | Op::Glu { .. }
        | Op::HyperPost { .. }
        | Op::Add { .. }
        | Op::Mul { .. }
        | Op::Input { .. }
        | Op::Concat { .. } => vec![],
    }
}

/// f32 entries of a linear-attention mixer's state (as `LinearAttentionSpec::state_floats`,
/// without overflow on absurd sizes).
fn state_floats(s: &crate::ir::LinearAttentionSpec) -> u64 {
    let (kh, kd, vh, vd, k) = (
        s.key_heads as u64,
        s.key_head_dim as u64,
        s.value_heads as u64,
        s.value_head_dim as u64,
        s.conv_kernel as u64,
    );
    if s.kind == crate::ir::LinearAttentionKind::ShortConv {
        // The ring of its last `conv_kernel - 1` input rows.
        return kd.saturating_mul(k.saturating_sub(1));
    }
    let conv_channels = (2 * kh).saturating_mul(kd).saturating_add(vh.saturating_mul(vd));
    vh.saturating_mul(kd).saturating_mul(vd).saturating_add(conv_channels.saturating_mul(k.saturating_sub(1)))
}

/// Whether a weight is a matrix (two or more dimensions); vectors go up as f32.
pub fn is_matrix(w: &WeightRef) -> bool {
    w.shape.len() >= 2
}

/// The most floats of scores an indexer's selection holds on a device at once (64 MiB): a
/// prompt chunk over a long context selects in passes of as many rows as fit.
pub const INDEX_SCORES: usize = 1 << 24;

/// Counts bytes for one checkpoint and one set of options.
#[derive(Clone)]
pub struct Sizer {
    /// Scratch of one chunk over every value the layers use.
    fixed: u64,
    /// The epilogue's weights and output rows.
    tail: u64,
    tail_rows: u64,
    /// Stored format of each tensor the checkpoint lists; others are `assumed`.
    stored: BTreeMap<String, Format>,
    assumed: Format,
    upload: Option<Format>,
    context: u64,
    chunk_rows: u64,
    /// Positions an attention mirror holds at most (a KV split's ring); `None`: whole.
    kv_cap: Option<u64>,
}

impl Sizer {
    pub fn new(program: &Program, stored: BTreeMap<String, Format>, options: &Options) -> Sizer {
        let mut s = Sizer {
            fixed: 0,
            tail: 0,
            tail_rows: 0,
            stored,
            assumed: options.assumed_format,
            upload: options.upload_format,
            context: options.context.min(program.dims.max_context.max(1)) as u64,
            chunk_rows: options.chunk_rows as u64,
            kv_cap: None,
        };
        let mut used = BTreeSet::new();
        for l in &program.layers {
            for op in &l.ops {
                let (r, w) = crate::ir::op_io(op);
                used.extend(r);
                used.extend(w);
            }
        }
        let widths: u64 = used.iter().fold(0u64, |a, v| a.saturating_add(program.value(*v).width as u64));
        s.fixed = s.chunk_rows.saturating_mul(widths).saturating_mul(F32);
        // An indexer's scratch on a device: its queries, key and head weights, and the scores of
        // every position for as many rows as `INDEX_SCORES` floats hold.
        let index = (program.layers.iter().flat_map(|l| &l.ops))
            .filter_map(|op| match op {
                Op::Indexer { spec, .. } => Some((spec.heads * spec.head_dim + spec.head_dim + spec.heads) as u64),
                // A compressor's lightning indexer: its queries and head weights, its scores
                // (counted at every position, more than its entries).
                Op::KvCompress { spec, .. } => spec.index.map(|i| (i.heads * i.head_dim + i.heads) as u64),
                _ => None,
            })
            .max();
        if let Some(w) = index {
            let pass = s.chunk_rows.min(INDEX_SCORES as u64 / s.context.max(1)).max(1);
            let floats = s.chunk_rows.saturating_mul(w).saturating_add(pass.saturating_mul(s.context));
            s.fixed = s.fixed.saturating_add(floats.saturating_mul(F32));
        }
        s.tail_rows = s.chunk_rows.saturating_mul(program.value(program.logits).width as u64).saturating_mul(F32);
        s.tail = s.ops_cost(&program.epilogue).total() + s.tail_rows;
        s
    }

    /// The format a matrix is stored in.
    pub fn stored_format(&self, name: &str) -> Format {
        self.stored.get(name).copied().unwrap_or(self.assumed)
    }

    /// The format a matrix goes up to a device in.
    pub fn upload_format(&self, w: &WeightRef) -> Format {
        self.upload.unwrap_or_else(|| self.stored_format(&w.name))
    }

    /// Bytes of one weight on a device.
    pub fn weight_bytes(&self, w: &WeightRef) -> u64 {
        let n: u64 = w.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        if !is_matrix(w) {
            return n.saturating_mul(F32);
        }
        let cols = *w.shape.last().unwrap_or(&1) as u64;
        let rows = n.checked_div(cols).unwrap_or(0);
        self.upload_format(w).bytes(rows, cols)
    }

    /// `weight_bytes`, but a hyper-connection site's mixing weights as f32 whatever their
    /// format (a device multiplies them in f32, as the CPU: `exec::device::hyper`).
    fn op_weight_bytes(&self, op: &Op, w: &WeightRef) -> u64 {
        match op {
            Op::HyperPre { spec, .. } if spec.fn_weight.name == w.name => {
                w.shape.iter().fold(F32, |a, &d| a.saturating_mul(d as u64))
            }
            _ => self.weight_bytes(w),
        }
    }

    /// Bytes of a list of ops' dense weights (each tensor once) and their per-layer caches, the
    /// K/V mirrors in f32.
    pub fn ops_cost<'o>(&self, ops: impl IntoIterator<Item = &'o Op>) -> LayerCost {
        self.ops_cost_on(ops, KvElement::F32)
    }

    /// `ops_cost` on a device whose attention K/V mirrors hold `kv` (`Features::kv`): rows of
    /// odd widths and compressed-entry layers stay f32 there (the runtime's `mirror_types`).
    pub fn ops_cost_on<'o>(&self, ops: impl IntoIterator<Item = &'o Op>, kv: KvElement) -> LayerCost {
        let mut seen = BTreeSet::new();
        let mut c = LayerCost::default();
        for op in ops {
            for w in op_weights(op) {
                // Two row selections of one tensor count as their rows, once each.
                if seen.insert((w.name.clone(), w.rows.map(|r| r.offset))) {
                    if is_matrix(w) {
                        c.matrices = c.matrices.saturating_add(self.op_weight_bytes(op, w));
                    } else {
                        c.vectors = c.vectors.saturating_add(self.weight_bytes(w));
                    }
                }
            }
            match op {
                Op::Attention { spec, .. } => {
                    // A sliding window's mirror is a ring of the window and a chunk.
                    let window =
                        |w: usize| super::kv_split::window_rows(w, self.chunk_rows as usize, self.context as usize);
                    let positions = spec.window.map_or(self.context, |w| window(w) as u64);
                    // Relative logits (Inkling) and compressed entries (DeepSeek V4) have no split
                    // parts: their mirror stays whole.
                    let cap = self.kv_cap.filter(|_| spec.rel.is_none() && spec.compressed.is_none());
                    let positions = cap.map_or(positions, |c| positions.min(c));
                    let per_position = (spec.kv_heads as u64).saturating_mul((spec.head_dim + spec.v_head_dim) as u64);
                    let even = (spec.kv_heads * spec.head_dim) % 2 == 0 && (spec.kv_heads * spec.v_head_dim) % 2 == 0;
                    let element = if even && spec.compressed.is_none() { kv.bytes() } else { F32 };
                    c.kv = c.kv.saturating_add(positions.saturating_mul(per_position).saturating_mul(element));
                    // The compressed entries' mirror on a device: one entry a window.
                    if let Some(r) = spec.compressed.map(|r| r.rate.max(1) as u64) {
                        let entries = (self.context / r).saturating_mul(spec.head_dim as u64);
                        c.kv = c.kv.saturating_add(entries.saturating_mul(F32));
                    }
                }
                Op::Mla { spec, .. } => {
                    let per_position = (spec.kv_lora_rank + spec.qk_rope_head_dim) as u64;
                    c.kv = c.kv.saturating_add(self.context.saturating_mul(per_position).saturating_mul(F32));
                }
                // Every position's projections (kept to go back to any position) and one entry
                // a window, for the compressor and its indexer.
                Op::KvCompress { spec, .. } => {
                    let w = if spec.overlap { 2 } else { 1 };
                    let dims = std::iter::once(spec.head_dim).chain(spec.index.map(|i| i.head_dim));
                    let per_position: u64 =
                        dims.map(|d| (2 * w * d) as u64 + (d as u64).div_ceil(spec.rate.max(1) as u64)).sum();
                    c.kv = c.kv.saturating_add(self.context.saturating_mul(per_position).saturating_mul(F32));
                }
                // One index key per position beside the latent cache.
                Op::Indexer { spec, .. } => {
                    c.kv = c.kv.saturating_add(self.context.saturating_mul(spec.head_dim as u64).saturating_mul(F32));
                }
                // A short convolution's state on a device is its ring of the last inputs (the
                // session's rows stay on the host).
                Op::LinearAttention { spec, .. } => {
                    c.state = c.state.saturating_add(state_floats(spec).saturating_mul(F32))
                }
                _ => {}
            }
        }
        c
    }

    /// The same counts with every attention mirror capped at `cap` positions (a KV split's
    /// ring; `None`: whole).
    pub fn with_kv_cap(&self, cap: Option<usize>) -> Sizer {
        Sizer { kv_cap: cap.map(|c| c as u64), ..self.clone() }
    }

    /// The context the mirrors are sized for (the options', at most the model's).
    pub fn context(&self) -> usize {
        self.context as usize
    }

    /// Bytes of a layer's dense part on a device.
    pub fn layer(&self, layer: &Layer) -> LayerCost {
        self.ops_cost(&layer.ops)
    }

    /// Scratch every device of a chain holds: one prompt chunk of every value the layers use.
    pub fn fixed(&self) -> u64 {
        self.fixed
    }

    /// The tail: the epilogue's weights, and its output rows for one chunk.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The head's output rows for one chunk.
    pub fn tail_rows(&self) -> u64 {
        self.tail_rows
    }

    /// Bytes of one routed expert of `op` (its three matrices as they would go up), if it is
    /// a routed-experts op.
    pub fn expert(&self, op: &Op) -> Option<u64> {
        let Op::RoutedExperts { weights, .. } = op else { return None };
        let one = |t: &ExpertTensor| {
            let [r, c] = t.matrix_shape();
            let name = match t {
                ExpertTensor::PerExpert { pattern, .. } => pattern.replace("{e}", "0"),
                ExpertTensor::Stacked { name, .. } | ExpertTensor::StackedInputMajor { name, .. } => name.clone(),
            };
            let f = self.upload.unwrap_or_else(|| self.stored_format(&name));
            f.bytes(r as u64, c as u64)
        };
        Some(one(&weights.gate) + one(&weights.up) + one(&weights.down))
    }
}
