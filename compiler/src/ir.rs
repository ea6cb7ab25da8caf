//! The program: a model's forward pass as typed ops over named row buffers, layers expanded,
//! every symbol bound and every tensor name resolved for the checkpoint's naming scheme.
//!
//! This is the contract between the compiler and the runtime. The compiler builds a `Program`
//! from a spec and a checkpoint's bindings; the runtime executes it op by op (on the CPU) or
//! frame by frame (on a device). Nothing here knows about a particular model family: a new
//! architecture is a new spec, not a new variant here, unless it needs a new *kind* of op.
//!
//! Model of execution: a forward pass runs over `n` rows (tokens) at once. Every `ValueId`
//! names a buffer of `n x width` f32 activations (row-major). Ops read and write values; the
//! residual stream is `Program::residual`. The runtime allocates each value once and reuses it
//! across layers (layers run one after another, so a value is rewritten by each layer).
//!
//! Must not: hold weights, depend on any runtime type, or carry strings that the runtime has
//! to parse beyond a tensor name (and the `{e}` expert placeholder of `ExpertTensor`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A row buffer of the program (`v3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A layer index (`l12`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LayerId(pub u32);

impl fmt::Display for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "l{}", self.0)
    }
}

/// One row buffer: its name in the spec (for printing) and its width in f32 per row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueInfo {
    pub name: String,
    pub width: usize,
}

/// A weight tensor of the checkpoint, by its resolved name, with the shape the spec expects
/// (outermost first, as both safetensors and the compiler print it: a Linear weight is
/// `[out_features, in_features]`; GGUF's reversed dimension order is undone by the reader).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightRef {
    pub name: String,
    /// The shape the op sees (with `rows`, the selected rows only).
    pub shape: Vec<usize>,
    /// Some rows of the tensor only (Qwen3-Next's fused query-and-gate projection); `None`:
    /// the whole tensor. The checkpoint's tensor has shape `tensor_shape()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<RowSelect>,
}

/// Rows `g * stride + offset .. g * stride + offset + take` of a `[groups * stride, cols]`
/// tensor, for each group `g` in order: `[groups * take, cols]` rows in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowSelect {
    pub groups: usize,
    pub stride: usize,
    pub offset: usize,
    pub take: usize,
}

impl WeightRef {
    /// A whole tensor.
    pub fn whole(name: impl Into<String>, shape: Vec<usize>) -> WeightRef {
        WeightRef { name: name.into(), shape, rows: None }
    }

    /// The shape of the checkpoint tensor this weight reads from.
    pub fn tensor_shape(&self) -> Vec<usize> {
        match self.rows {
            None => self.shape.clone(),
            Some(r) => {
                let mut s = self.shape.clone();
                if let Some(first) = s.first_mut() {
                    *first = r.groups * r.stride;
                }
                s
            }
        }
    }

    /// The tensor rows the op's row `i` reads.
    pub fn tensor_row(&self, i: usize) -> usize {
        match self.rows {
            None => i,
            Some(r) => (i / r.take) * r.stride + r.offset + i % r.take,
        }
    }
}

/// How the experts of one routed-experts op are stored in the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ExpertTensor {
    /// One tensor per expert; `pattern` contains `{e}` (HF: `model.layers.3.mlp.experts.{e}.up_proj.weight`).
    /// `shape` is the shape of one expert's matrix.
    PerExpert { pattern: String, shape: Vec<usize> },
    /// One 3-D tensor `[experts, rows, cols]` (GGUF: `blk.3.ffn_up_exps.weight`), or the rows
    /// `select` picks of each expert's (Inkling's fused `gate_up_proj` `[experts, 2 * ffn, cols]`:
    /// `groups: 1, stride: 2 * ffn, offset: 0 or ffn, take: ffn`); `shape` is the op's view.
    Stacked {
        name: String,
        shape: Vec<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        select: Option<RowSelect>,
    },
    /// One 3-D tensor stored input-major, `[experts, cols, out]` (transformers' fused gpt-oss
    /// experts: `y = x W`), of which the op's rows are the `out` columns `select` picks
    /// (gpt-oss interleaves gate and up: `groups: ffn, stride: 2, offset: 0 or 1, take: 1`),
    /// or all of them. `shape` is `[experts, rows, cols]` as the op sees it; the checkpoint's
    /// tensor has shape `tensor_shape()` in a float format, and `out_major_shape()` in a block
    /// format, whose rows run along the input (gpt-oss's MXFP4 `_blocks`: `[experts, out, cols]`).
    StackedInputMajor { name: String, shape: Vec<usize>, select: Option<RowSelect> },
}

impl ExpertTensor {
    /// The tensor name (and, for stacked tensors, the expert index) holding expert `e`.
    pub fn name_of(&self, e: usize) -> (String, Option<usize>) {
        match self {
            ExpertTensor::PerExpert { pattern, .. } => (pattern.replace("{e}", &e.to_string()), None),
            ExpertTensor::Stacked { name, .. } | ExpertTensor::StackedInputMajor { name, .. } => {
                (name.clone(), Some(e))
            }
        }
    }
    /// `[rows, cols]` of one expert's matrix.
    pub fn matrix_shape(&self) -> [usize; 2] {
        match self {
            ExpertTensor::PerExpert { shape, .. } => [shape[0], shape[1]],
            ExpertTensor::Stacked { shape, .. } | ExpertTensor::StackedInputMajor { shape, .. } => [shape[1], shape[2]],
        }
    }
    /// `[experts, out, cols]`: the shape of a `StackedInputMajor` tensor stored in a block
    /// format (out-major); `tensor_shape()` for the others.
    pub fn out_major_shape(&self) -> Vec<usize> {
        match self {
            ExpertTensor::StackedInputMajor { shape, select, .. } => {
                vec![shape[0], select.map_or(shape[1], |r| r.groups * r.stride), shape[2]]
            }
            _ => self.tensor_shape(),
        }
    }
    /// The shape of the checkpoint tensor (of one expert, for `PerExpert`).
    pub fn tensor_shape(&self) -> Vec<usize> {
        match self {
            ExpertTensor::PerExpert { shape, .. } => shape.clone(),
            ExpertTensor::Stacked { shape, select, .. } => {
                vec![shape[0], select.map_or(shape[1], |r| r.groups * r.stride), shape[2]]
            }
            ExpertTensor::StackedInputMajor { shape, select, .. } => {
                let out = select.map_or(shape[1], |r| r.groups * r.stride);
                vec![shape[0], shape[2], out]
            }
        }
    }
}

/// A per-expert bias, from one stacked `[experts, width]` tensor, of which the op reads the
/// entries `select` picks (the rows of the matrix the bias follows), or all of them. `shape`
/// is `[experts, width]` as the op sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertBias {
    pub name: String,
    pub shape: Vec<usize>,
    pub select: Option<RowSelect>,
}

impl ExpertBias {
    /// The shape of the checkpoint tensor.
    pub fn tensor_shape(&self) -> Vec<usize> {
        vec![self.shape[0], self.select.map_or(self.shape[1], |r| r.groups * r.stride)]
    }
}

impl RowSelect {
    /// The index in the whole dimension of the selection's entry `i`.
    pub fn index(&self, i: usize) -> usize {
        (i / self.take) * self.stride + self.offset + i % self.take
    }
}

/// The three matrices of a gated FFN expert: `down(act(gate x) * up x)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertWeights {
    pub gate: ExpertTensor,
    pub up: ExpertTensor,
    pub down: ExpertTensor,
    /// Biases added after each matrix (gpt-oss); none for most families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_bias: Option<ExpertBias>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_bias: Option<ExpertBias>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_bias: Option<ExpertBias>,
    /// Shared experts the routing weighs as it weighs the routed ones (Inkling): the routing's
    /// expert `experts + s` is shared expert `s` of these stacked tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<Box<SharedExperts>>,
}

/// Shared experts of a routed-experts op, each stacked `[count, rows, cols]` (no biases).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedExperts {
    pub count: usize,
    pub gate: ExpertTensor,
    pub up: ExpertTensor,
    pub down: ExpertTensor,
}

/// Relative-position logits of an attention op (Inkling): each query row's `r` (`heads x
/// d_rel`) mixes the rows of `proj` (`[d_rel, extent]`) into one logit per head and backward
/// distance `0 .. extent`, added to the scaled scores; zero at larger distances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RelLogits {
    pub r: ValueId,
    pub proj: WeightRef,
    pub d_rel: usize,
    pub extent: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Activation {
    Silu,
    Gelu,
    GeluTanh,
    Relu,
    Sigmoid,
}

/// The gated unit of an FFN: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum GluKind {
    /// `silu(gate) * up`.
    SwiGlu,
    /// gpt-oss: gate clamped to `(-inf, limit]`, up to `[-limit, limit]`,
    /// `gate * sigmoid(alpha * gate) * (up + 1)`.
    ClampedSwiGlu { limit: f32, alpha: f32 },
    /// `gelu(gate) * up`.
    GeGlu,
    /// DeepSeek V4: gate clamped to `(-inf, limit]`, up to `[-limit, limit]`,
    /// `silu(gate) * up` (no `+ 1`, no `alpha`: not gpt-oss's form).
    LimitedSwiGlu { limit: f32 },
}

/// Which pairs RoPE rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeStyle {
    /// NeoX / HF `rotate_half`: pairs `(i, i + rotary_dim/2)`.
    RotateHalf,
    /// GPT-J / GGUF `llama` original: pairs `(2i, 2i+1)`.
    Interleaved,
}

/// Frequency scaling of RoPE, from the checkpoint's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    None,
    /// No rotation at all (NoPE): every inverse frequency is 0, so the rope part passes through
    /// as it is (Kimi Linear's MLA, whose shared rope key still takes part in the scores).
    NoPe,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: u32,
    },
    /// YaRN (DeepSeek-V3 and others); `attention_factor` multiplies cos and sin. `truncate`:
    /// the correction range's bounds are rounded to whole dimensions (transformers' default;
    /// gpt-oss says `truncate: false`).
    Yarn {
        factor: f32,
        original_max_position: u32,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        #[serde(default = "yes")]
        truncate: bool,
    },
}

fn yes() -> bool {
    true
}

/// How a router turns logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterScoring {
    Softmax,
    Sigmoid,
    /// `sqrt(softplus(logit))` (DeepSeek V4).
    SqrtSoftplus,
}

/// What a group of experts scores in a group-limited top-k: the groups with the best scores
/// are the only ones the top-k chooses from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupScore {
    /// The sum of its two best choice scores (DeepSeek-V3's `noaux_tc`).
    #[default]
    TopTwoSum,
    /// Its best choice score (DeepSeek-V2's `group_limited_greedy`).
    Max,
}

impl GroupScore {
    fn is_default(&self) -> bool {
        *self == GroupScore::TopTwoSum
    }
}

/// The attention variant of an `Attention` op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Width of one value head (MiMo differs from `head_dim`).
    pub v_head_dim: usize,
    /// Multiplies `q . k` before the softmax (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Sliding window in positions: a query at `p` sees keys `p - window + 1 ..= p`.
    pub window: Option<usize>,
    /// Per-head sink logits (`[heads]`) added to the softmax denominator.
    pub sinks: Option<WeightRef>,
    /// Multiplies the values (so the output) of every head: MiMo-V2-Flash's
    /// `attention_value_scale`; 1 for most families.
    #[serde(default = "one")]
    pub value_scale: f32,
    /// Relative-position logits (Inkling), added to the scaled scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rel: Option<RelLogits>,
    /// Compressed entries of the layer (a `KvCompress` before it, DeepSeek V4) attended beside
    /// the cached rows: an op kind of its own (`attention_compressed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed: Option<CompressedKv>,
}

/// The compressed entries an attention reads (`AttentionSpec::compressed`): entry `e` closes
/// window `e` of `rate` positions, so a query at `p` sees the entries `e < (p + 1) / rate`; with
/// `select` (a `KvCompress`'s output, `topk` wide, `-1` padded) only the selected ones. Each
/// entry is one head of `head_dim`, both key and value (one KV head).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressedKv {
    pub rate: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<ValueId>,
}

/// DeepSeek V4's KV compressor (`Op::KvCompress`). Each position projects `kv` and `gate`
/// (`w x head_dim` wide, `w` 2 with `overlap`, else 1); window `e` (positions `e * rate ..+
/// rate`) closes into one entry: per channel the softmax over its slots of `gate + ape[j]`
/// weighs the slots' `kv`; with `overlap` the slots are the previous window's first halves and
/// this window's second halves (width `2 x rate`, stride `rate`). The entry is RMSNormed
/// (`norm`, `eps`) and RoPE'd on its last `rope_dim` columns (adjacent pairs) at position
/// `e * rate`. Roles: `kv`, `gate` (`[w x head_dim, hidden]`), `ape` (`[rate, w x head_dim]`),
/// `norm` (`[head_dim]`).
///
/// With `index` (compressed sparse attention's lightning indexer): a second compressor of
/// `index.head_dim` (roles `index_kv`, `index_gate`, `index_ape`, `index_norm`), queries
/// `index_q_b(q)` in `index.heads` heads RoPE'd at the row's position, head weights
/// `index_w(x) / sqrt(heads)`; a row's score of entry `e` is `sum_h w_h relu(q_h . k_e) /
/// sqrt(head_dim)` over the entries it sees, and its `topk` best are written ascending to the
/// op's output (`-1` after them where it sees fewer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressSpec {
    pub rate: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub overlap: bool,
    pub eps: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<CompressIndex>,
    pub weights: Vec<(String, WeightRef)>,
}

/// The lightning indexer of a compressor (`CompressSpec::index`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressIndex {
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
}

fn one() -> f32 {
    1.0
}

fn is_one(x: &f32) -> bool {
    *x == 1.0
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

fn is_false(x: &bool) -> bool {
    !*x
}

/// One site of manifold-constrained hyper-connections (`Op::HyperPre`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HyperSpec {
    /// The residual's streams (`hc_mult`).
    pub streams: usize,
    /// `[(2 + S) * S, S * hidden]` at a layer's site, `[S, S * hidden]` at the head.
    pub fn_weight: WeightRef,
    /// `[(2 + S) * S]` or `[S]`.
    pub base: WeightRef,
    /// `[3]` or `[1]`.
    pub scale: WeightRef,
    /// Sinkhorn iterations of `comb` (`hc_sinkhorn_iters`; 0 acts as 1).
    pub sinkhorn_iters: usize,
    /// `hc_eps`: added to `pre` and `comb`, and to the Sinkhorn sums.
    pub eps: f32,
    /// The epsilon of the unweighted RMSNorm over the flattened streams.
    pub norm_eps: f32,
}

/// One op of the program. Reads and writes `ValueId`s; weights by `WeightRef`.
// A program holds a few ops per layer, built once per plan: the size of `RoutedExperts`
// costs nothing, and boxing its weights would change the contract the runtime matches on.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Token ids -> rows of the embedding table (`[vocab, width]`), times `scale`.
    Embed { out: ValueId, table: WeightRef, scale: f32 },
    /// Rows the caller hands the forward (a draft model's: the target model's final residual
    /// at each row's position); the host writes them into `out` before the forward.
    Input { out: ValueId },
    /// `out = [a | b]` per row (a draft model's embedding beside the target's hidden state).
    Concat { a: ValueId, b: ValueId, out: ValueId },
    /// RMSNorm over groups of `group` columns (`group == width`: whole row; `head_dim`: per head).
    /// `out = x / rms(x) * (weight + offset) * scale`; `weight` has `group` entries (none: 1,
    /// DeepSeek V4's unweighted query norm); `scale` is 1 but where a width multiplier divides
    /// the final hidden state (Inkling's logits).
    RmsNorm {
        x: ValueId,
        out: ValueId,
        weight: Option<WeightRef>,
        eps: f32,
        group: usize,
        offset: f32,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        scale: f32,
    },
    /// LayerNorm over the whole row.
    LayerNorm { x: ValueId, out: ValueId, weight: WeightRef, bias: Option<WeightRef>, eps: f32 },
    /// `out = x W^T (+ bias)`; `weight` is `[out, in]`.
    Linear { x: ValueId, out: ValueId, weight: WeightRef, bias: Option<WeightRef> },
    /// A block-diagonal linear (DeepSeek V4's `o_a_proj`): `x` in `groups` equal column groups,
    /// group `g` times rows `g * r .. (g + 1) * r` of `weight` (`[groups * r, in / groups]`).
    GroupedLinear { x: ValueId, out: ValueId, weight: WeightRef, groups: usize },
    /// Manifold-constrained hyper-connections (DeepSeek V4), the mix into a sublayer: `x` holds
    /// `spec.streams` streams of `out`'s width per row; `out = sum_s pre[s] * x[s]` with
    /// `pre = sigmoid(m[..S] * scale[0] + base[..S]) + eps`, `m = fn . rmsnorm(x)` (unweighted).
    /// With `mix` (a site of a layer): also `post = 2 sigmoid(m[S..2S] * scale[1] + base)` and
    /// `comb` = the Sinkhorn projection of `softmax(m[2S..] * scale[2] + base)` (rows of S) +
    /// eps, written to `mix` as `[post (S), comb (S x S, row-major)]` per row. Without (the
    /// head before the final norm): `fn` has `S` rows and `scale` one entry.
    HyperPre { x: ValueId, out: ValueId, mix: Option<ValueId>, spec: HyperSpec },
    /// The mix out of a sublayer: `out[k] = post[k] * x + sum_j comb[j][k] * residual[j]` (the
    /// streams of `residual`, `mix` as `HyperPre` wrote it; `out` may be `residual`). Without
    /// `residual` and `mix`: `x` copied into every one of `streams` streams (the embedding).
    HyperPost { x: ValueId, residual: Option<ValueId>, mix: Option<ValueId>, out: ValueId, streams: usize },
    /// Rotates the first `rotary_dim` columns of each of `heads` heads of `head_dim`, in place;
    /// the last ones with `tail` (DeepSeek V4's `[nope | rope]` heads), by the opposite angles
    /// with `inverse` (the conjugate rotation V4 applies to its attention output).
    Rope {
        x: ValueId,
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        style: RopeStyle,
        theta: f32,
        scaling: RopeScaling,
        #[serde(default, skip_serializing_if = "is_false")]
        tail: bool,
        #[serde(default, skip_serializing_if = "is_false")]
        inverse: bool,
    },
    /// Causal attention of `q` over this layer's KV cache after appending `k`, `v`.
    Attention { q: ValueId, k: ValueId, v: ValueId, out: ValueId, layer: LayerId, spec: AttentionSpec },
    /// Elementwise activation.
    Act { x: ValueId, out: ValueId, act: Activation },
    /// `out = glu(gate, up)`.
    Glu { gate: ValueId, up: ValueId, out: ValueId, kind: GluKind },
    /// `out = a + b`.
    Add { a: ValueId, b: ValueId, out: ValueId },
    /// `out = a * b`; `b` may have width 1 (a per-row scale) or the width of `a`.
    Mul { a: ValueId, b: ValueId, out: ValueId },
    /// Host step: top-k routing from router logits (`[n, experts]`). Writes `out` as
    /// `top_k` (expert index as f32, weight) pairs per row: width `2 * top_k`, ranks in order.
    Route {
        logits: ValueId,
        out: ValueId,
        scoring: RouterScoring,
        top_k: usize,
        /// Divide the chosen weights by their sum.
        renormalize: bool,
        /// Added to the scores for the choice only (DeepSeek-V3's `e_score_correction_bias`).
        correction_bias: Option<WeightRef>,
        /// Group-limited top-k: `(n_group, topk_group)`.
        groups: Option<(usize, usize)>,
        /// What a group scores (with `groups`).
        #[serde(default, skip_serializing_if = "GroupScore::is_default")]
        group_score: GroupScore,
        /// Multiplies the final weights.
        scale: f32,
        /// Shared experts whose logits follow the routed ones' (Inkling's sink): they take no
        /// part in the choice, join the renormalisation, and their weights follow the top-k
        /// pairs in `out` as `(experts + s, weight)`: width `2 * (top_k + shared)`.
        #[serde(default, skip_serializing_if = "is_zero")]
        shared: usize,
        /// A one-entry tensor that multiplies the final weights too (Inkling's `global_scale`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scale_by: Option<WeightRef>,
        /// Hash routing (DeepSeek V4's `tid2eid`, `[vocab, top_k]`): the experts of a row are
        /// the table's row of its token id, not a top-k; their weights are their scores.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash: Option<WeightRef>,
    },
    /// `out = sum_r weight_r * expert_r(x)` over the routing in `routing`: a host step served by
    /// the runtime's expert tier, or in a device frame where the plan makes the layer's
    /// experts resident.
    RoutedExperts {
        x: ValueId,
        routing: ValueId,
        out: ValueId,
        layer: LayerId,
        experts: usize,
        ffn: usize,
        weights: ExpertWeights,
        glu: GluKind,
    },
    /// Multi-head latent attention (DeepSeek-V3): the CPU's expanded and absorbed forms, the
    /// device's absorbed form; the cache holds the normed latent and the rotated rope key.
    Mla { x: ValueId, out: ValueId, layer: LayerId, spec: MlaSpec },
    /// DeepSeek Sparse Attention's lightning indexer: per row, the `topk` cached positions a
    /// later `Mla` (its `select`) attends over. Reads the layer's input `x` and the MLA's normed
    /// query latent `q`; appends this block's index keys to the layer's index-key cache; writes
    /// `out` (`topk` wide): the chosen positions as f32 in ascending order, then `-1` where a row
    /// sees fewer than `topk` positions (it then keeps every one it sees).
    Indexer { x: ValueId, q: ValueId, out: ValueId, layer: LayerId, spec: IndexerSpec },
    /// DeepSeek V4's KV compressor (`CompressSpec`): closes the layer's windows into entries
    /// kept with its cache; with an indexer, reads the query latent `q` and writes each row's
    /// selection of entries to `out`.
    KvCompress { x: ValueId, q: Option<ValueId>, out: Option<ValueId>, layer: LayerId, spec: CompressSpec },
    /// A linear-attention mixer with recurrent state (Gated DeltaNet): the causal convolution's
    /// ring and the delta rule, on the CPU and the device (the host's state canonical).
    LinearAttention { x: ValueId, out: ValueId, layer: LayerId, spec: LinearAttentionSpec },
}

/// The values an op reads and writes.
pub fn op_io(op: &Op) -> (Vec<ValueId>, Vec<ValueId>) {
    match op {
        Op::Embed { out, .. } | Op::Input { out } => (vec![], vec![*out]),
        Op::Concat { a, b, out } => (vec![*a, *b], vec![*out]),
        Op::RmsNorm { x, out, .. }
        | Op::LayerNorm { x, out, .. }
        | Op::Linear { x, out, .. }
        | Op::GroupedLinear { x, out, .. }
        | Op::Act { x, out, .. } => (vec![*x], vec![*out]),
        Op::HyperPre { x, out, mix, .. } => (vec![*x], std::iter::once(*out).chain(*mix).collect()),
        Op::HyperPost { x, residual, mix, out, .. } => {
            (std::iter::once(*x).chain(*residual).chain(*mix).collect(), vec![*out])
        }
        Op::Rope { x, .. } => (vec![*x], vec![*x]),
        Op::Attention { q, k, v, out, spec, .. } => {
            let mut reads = vec![*q, *k, *v];
            reads.extend(spec.rel.as_ref().map(|r| r.r));
            reads.extend(spec.compressed.and_then(|c| c.select));
            (reads, vec![*out])
        }
        Op::Glu { gate, up, out, .. } => (vec![*gate, *up], vec![*out]),
        Op::Add { a, b, out } | Op::Mul { a, b, out } => (vec![*a, *b], vec![*out]),
        Op::Route { logits, out, .. } => (vec![*logits], vec![*out]),
        Op::RoutedExperts { x, routing, out, .. } => (vec![*x, *routing], vec![*out]),
        Op::Mla { x, out, spec, .. } => {
            let mut reads = vec![*x];
            reads.extend(spec.select);
            (reads, vec![*out])
        }
        Op::Indexer { x, q, out, .. } => (vec![*x, *q], vec![*out]),
        Op::KvCompress { x, q, out, .. } => (std::iter::once(*x).chain(*q).collect(), out.iter().copied().collect()),
        Op::LinearAttention { x, out, .. } => (vec![*x], vec![*out]),
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MlaSpec {
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    /// Every weight the mixer reads, by role (`q_a`, `q_a_norm`, `q_b`, `kv_a`, `kv_a_norm`, `kv_b`, `o`).
    pub weights: Vec<(String, WeightRef)>,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// The epsilon of the two latent RMSNorms (transformers: 1e-6, not `rms_norm_eps`).
    #[serde(default = "mla_norm_eps")]
    pub norm_eps: f32,
    /// RoPE on adjacent pairs of the rope part (transformers' `rope_interleave`, DeepSeek's
    /// layout), else on halves.
    #[serde(default = "yes")]
    pub rope_interleave: bool,
    /// A selection of positions (an `Indexer`'s output, `topk` wide): each row attends over its
    /// selected positions only, not every cached one (DeepSeek Sparse Attention). An op kind of
    /// its own (`mla_sparse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<ValueId>,
}

/// The lightning indexer of DeepSeek Sparse Attention (`Op::Indexer`). Per row `s` and cached
/// position `t`: `score = sum_h w[s,h] * relu(q[s,h] . k[t] * head_dim^-0.5)`, with `q = q_b(q)`
/// in `heads` heads of `head_dim`, `k = LayerNorm(k(x))` (one key per position, cached),
/// `w = w(x) * heads^-0.5`, RoPE on the first `rope_dim` columns of every query head and of the
/// key; the `topk` best positions at or before `s` are chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexerSpec {
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub topk: usize,
    pub rope_style: RopeStyle,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// The key LayerNorm's epsilon.
    pub eps: f32,
    /// Every weight the indexer reads, by role (`q_b`, `k`, `k_norm`, `k_norm_bias`, `w`).
    pub weights: Vec<(String, WeightRef)>,
}

fn mla_norm_eps() -> f32 {
    1e-6
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinearAttentionKind {
    GatedDeltaNet,
    Kda,
    /// A causal depthwise convolution that adds its input, `out = x + conv(x)`, over
    /// `key_head_dim` channels (Inkling's `*_sconv`): role `conv1d` (`[channels, 1, kernel]`),
    /// and `input_scale` (a one-entry tensor multiplying `x` first) where there is one. Its
    /// state is the session's rows of its input, kept per weight, so it rewinds as a KV cache.
    ShortConv,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearAttentionSpec {
    pub kind: LinearAttentionKind,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
    /// Every weight the mixer reads, by role.
    pub weights: Vec<(String, WeightRef)>,
    /// The epsilon of the gated RMSNorm on the output heads.
    #[serde(default = "mla_norm_eps")]
    pub norm_eps: f32,
}

impl LinearAttentionSpec {
    /// Whether a Gated DeltaNet's input projections are apart (Qwen3.5: `in_proj_qkv`,
    /// `in_proj_z`, `in_proj_b`, `in_proj_a`) rather than grouped per key head (Qwen3-Next:
    /// `in_proj_qkvz`, `in_proj_ba`); the compiler admits one set of roles, not both.
    pub fn projections_apart(&self) -> bool {
        self.weights.iter().any(|(role, _)| role == "in_proj_qkv")
    }

    /// f32 entries of the recurrent state of one sequence: the per-head `dk x dv` matrix
    /// and the convolution ring.
    pub fn state_floats(&self) -> usize {
        if self.kind == LinearAttentionKind::ShortConv {
            return self.key_head_dim * self.conv_kernel.saturating_sub(1);
        }
        let conv_channels = 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim;
        self.value_heads * self.key_head_dim * self.value_head_dim + conv_channels * self.conv_kernel.saturating_sub(1)
    }
}

/// What the layer's mixer and FFN are, for placement and printing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MixerKind {
    Attention,
    SlidingAttention,
    Mla,
    LinearAttention,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FfnKind {
    Dense,
    Moe,
}

/// One layer of the expanded program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    pub id: LayerId,
    pub mixer: MixerKind,
    pub ffn: FfnKind,
    pub ops: Vec<Op>,
}

/// Model-wide dimensions the runtime needs outside the ops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dims {
    pub hidden: usize,
    pub vocab: usize,
    pub layers: usize,
    /// The checkpoint's maximum context (`max_position_embeddings`).
    pub max_context: usize,
    /// The residual is this many streams of `hidden` per row (DeepSeek V4's hyper-connections:
    /// `hc_mult`); 1 for most families.
    #[serde(default = "one_stream", skip_serializing_if = "is_one_stream")]
    pub streams: usize,
}

fn one_stream() -> usize {
    1
}

fn is_one_stream(x: &usize) -> bool {
    *x == 1
}

/// A whole forward pass: `prologue` (embedding), `layers`, `epilogue` (final norm and head,
/// writing `logits`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The spec's family name (`llama`, `olmoe`, ...).
    pub family: String,
    pub dims: Dims,
    pub values: Vec<ValueInfo>,
    /// The residual stream, written by the prologue and read by the epilogue.
    pub residual: ValueId,
    /// `[n, vocab]` logits written by the epilogue.
    pub logits: ValueId,
    pub prologue: Vec<Op>,
    pub layers: Vec<Layer>,
    pub epilogue: Vec<Op>,
    /// A value the host reads after each forward besides the logits, every row of it: the
    /// residual, when a draft model continues from this program's hidden states
    /// (`profile::DraftRole::Target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ValueId>,
}

impl Program {
    pub fn value(&self, v: ValueId) -> &ValueInfo {
        &self.values[v.0 as usize]
    }
}
