//! The architecture spec language: what a `graphs/*.ron` file may say, read with positions.
//!
//! A spec names its symbols (bound from a checkpoint's configuration, with fallbacks and
//! typed expressions), its weights (a tensor-name pattern per naming scheme and a shape), its
//! row buffers (a width each), and its ops: a prologue, one layer body (expanded once per
//! layer, with `If` on the layer index and named `blocks`), and an epilogue. The op set is
//! closed (`OpItem`); an unknown op or field is an error with a line and column.
//!
//! `Spec::load` reads and checks a spec (syntax, structure, names, expression types) and
//! returns every error it finds. This module must not bind a configuration or build IR:
//! that is `lower`'s job.

pub mod check;
pub mod de;
pub mod syntax;

use crate::diag::{Diagnostic, Diagnostics, Span};
use crate::expr::{self, Expr, Type};
use crate::ir::{Activation, GroupScore, LinearAttentionKind, RopeStyle, RouterScoring};
use de::{Entries, Items, Spanned};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A string of the spec with its span (a name or an expression).
pub type Text = Spanned<String>;

/// The contents of a spec file.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename = "Spec")]
pub struct SpecFile {
    /// The family name printed in plans (`olmoe`).
    pub family: Text,
    /// The architectures this spec serves.
    pub serves: Serves,
    /// A configuration to compile with when none is given (relative to the spec file).
    #[serde(default)]
    pub default_config: Option<Text>,
    pub symbols: Entries<Text, SymbolDef>,
    pub weights: Entries<Text, WeightDef>,
    /// Row buffers: name -> width (an Int expression).
    pub values: Entries<Text, Text>,
    /// The residual stream's value.
    pub residual: Text,
    /// The residual holds this many streams of `hidden` per row (an Int expression; default 1):
    /// DeepSeek V4's hyper-connections (`hc_mult`).
    #[serde(default)]
    pub streams: Option<Text>,
    /// The value the epilogue writes the logits to.
    pub logits: Text,
    pub prologue: Items<Spanned<OpItem>>,
    /// The body of one layer; `i` is the layer index.
    pub layer: Items<Spanned<OpItem>>,
    /// Named op sequences, used by `Block("name")`.
    #[serde(default)]
    pub blocks: Entries<Text, Items<Spanned<OpItem>>>,
    pub epilogue: Items<Spanned<OpItem>>,
    /// Configurations the spec does not serve: a checkpoint for which a `when` holds is refused
    /// with its `why`, located at the `when`.
    #[serde(default)]
    pub refuse: Items<Refusal>,
    /// A draft model the checkpoint carries (multi-token prediction layers), for speculative
    /// decoding.
    #[serde(default)]
    pub draft: Option<DraftDef>,
}

/// A draft model built from the spec's own layer body (DeepSeek's and GLM's MTP layers): its
/// `prologue` reads the tokens and, through one `Input`, the target model's residual at each
/// row's position; one layer of the body with `i` = `layer`; its `epilogue` writes the logits
/// (the spec's `residual` and `logits` values, as the main program's).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct DraftDef {
    /// How many draft layers the checkpoint has (an Int expression; 0: none).
    pub count: Text,
    /// The index `i` of the draft's layer (an Int expression): the names of its weights and the
    /// conditions of the layer body.
    pub layer: Text,
    /// Where the checkpoint keeps the draft's layer under other names than the model's layers
    /// (Qwen3-Next's and Qwen3.5's `mtp.layers.0.*`, MiMo's `model.mtp.layers.0.*` with
    /// `pre_mlp_layernorm`): while the draft is lowered, each `(from, to)` in order replaces every
    /// `from` in a weight's tensor name pattern (as written, `{i}` included) by `to`. Patterns
    /// without a `from` (the model's embedding, a GGUF name) are read as they are.
    #[serde(default)]
    pub rename: Vec<(String, String)>,
    pub prologue: Items<Spanned<OpItem>>,
    pub epilogue: Items<Spanned<OpItem>>,
}

/// `(when: "a Bool expression of the symbols", why: "what is not served")`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Refusal {
    pub when: Text,
    pub why: Text,
}

/// HF `architectures[0]` class names and GGUF `general.architecture` names.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Serves {
    #[serde(default)]
    pub hf: Vec<String>,
    #[serde(default)]
    pub gguf: Vec<String>,
    /// HF wrapper classes (a vision-language `...ForConditionalGeneration`) that hold this text
    /// model inside: the configuration is read from one of their objects, the tensor names carry a
    /// longer prefix.
    #[serde(default)]
    pub wrappers: Vec<Wrapper>,
}

/// An HF wrapper architecture: `config` names the object of `config.json` that holds the text
/// model's keys (keys at the top level are the fallback); a spec tensor name starting with
/// `rename.0` is read from the checkpoint with `rename.1` in its place
/// (`model.` -> `model.language_model.`; `lm_head.weight` stays as it is).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Wrapper {
    pub hf: String,
    pub config: String,
    pub rename: (String, String),
}

/// Where a symbol's value comes from, in order: a configuration key of the checkpoint's
/// naming scheme (the first present; HF keys may be dotted paths into nested objects, GGUF keys
/// may contain `{arch}`), a dimension of a tensor, the `default` expression.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SymbolDef {
    #[serde(rename = "type", default)]
    pub ty: Option<Type>,
    #[serde(default)]
    pub hf: Vec<Text>,
    #[serde(default)]
    pub gguf: Vec<Text>,
    /// `(weight, dim)`: the size of dimension `dim` of that weight in the checkpoint.
    #[serde(default)]
    pub tensor: Option<(Text, usize)>,
    #[serde(default)]
    pub default: Option<Text>,
    /// For an `IntList` read from a configuration list of strings: the indices of the entries
    /// equal to this string (`layer_types` and `"sliding_attention"`).
    #[serde(default)]
    pub indices_of: Option<Text>,
    /// For a `Bool` read from a configuration string: whether it equals this string
    /// (`model_type` and `"deepseek_v2"`).
    #[serde(default)]
    pub equals: Option<Text>,
}

impl SymbolDef {
    pub fn ty(&self) -> Type {
        self.ty.unwrap_or(Type::Int)
    }
}

/// A weight: its tensor name per naming scheme (`{i}` the layer, `{e}` the expert, `{arch}`)
/// and its shape, outermost first (for experts: one expert's matrix).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct WeightDef {
    #[serde(default)]
    pub hf: Option<Text>,
    #[serde(default)]
    pub gguf: Option<Text>,
    pub shape: Vec<Text>,
    /// Use another weight when `when` holds or when this one is absent from the checkpoint
    /// (a tied output head).
    #[serde(default)]
    pub tied: Option<Tied>,
    /// Only some rows of the tensor (see `ir::RowSelect`); `shape` is then the selected shape.
    #[serde(default)]
    pub rows: Option<RowsDef>,
    /// A stacked expert tensor stored input-major, `[experts, in, out]` (`y = x W`: transformers'
    /// fused gpt-oss experts); `shape` is still the op's `[rows, cols]` and `rows` selects among
    /// the `out` columns. An expert bias `[experts, out]` selects its entries with `rows` too.
    #[serde(default)]
    pub input_major: bool,
    /// The weight exists only where this Bool holds (an option of the configuration, such as
    /// `attention_bias`); elsewhere an op's optional use of it (a `Linear`'s `bias`, a fused
    /// op's optional role) is left out.
    #[serde(default)]
    pub when: Option<Text>,
}

/// Rows `g * stride + offset ..+ take` for each of `groups` groups (Int expressions).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RowsDef {
    pub groups: Text,
    pub stride: Text,
    pub offset: Text,
    pub take: Text,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Tied {
    pub to: Text,
    pub when: Text,
}

/// RoPE pairing, possibly depending on the naming scheme (llama.cpp permutes the q and k rows
/// of `llama` GGUFs so that they use interleaved pairs).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub enum StyleSpec {
    RotateHalf,
    Interleaved,
    ByNaming { hf: RopeStyle, gguf: RopeStyle },
}

/// RoPE frequency scaling: none, or whatever the configuration says (`rope_scaling` /
/// `rope_parameters` for HF, `{arch}.rope.scaling.*` for GGUF), or what one object of an HF
/// configuration says (`FromConfigAt("rope_parameters.compress")`: DeepSeek V4's parameters
/// per rope type; none where the object is absent, and for GGUF), or no rotation at all
/// (`NoPe`: the rope part passes through unrotated). `ByNaming`: one of two by the
/// checkpoint's naming scheme. `FrequenciesOnly`: another's frequencies with YaRN's attention
/// factor 1, cos and sin unscaled (llama.cpp's DeepSeek V4 cancels YaRN's magnitude).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub enum ScalingSpec {
    #[default]
    None,
    FromConfig,
    FromConfigAt(String),
    NoPe,
    ByNaming {
        hf: Box<ScalingSpec>,
        gguf: Box<ScalingSpec>,
    },
    FrequenciesOnly(Box<ScalingSpec>),
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub enum GluSpec {
    SwiGlu,
    GeGlu,
    ClampedSwiGlu { limit: Text, alpha: Text },
    LimitedSwiGlu { limit: Text },
}

/// One item of an op list: an op of the closed set, or `Block`/`If` structure.
/// Field names are value names (`x`, `out`, ...), weight names (`weight`, `table`, ...) or
/// expressions (everything else).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub enum OpItem {
    Embed {
        out: Text,
        table: Text,
        #[serde(default)]
        scale: Option<Text>,
    },
    /// The rows a draft model is handed (only in a draft's prologue).
    Input {
        out: Text,
    },
    /// `out = [a | b]` per row.
    Concat {
        a: Text,
        b: Text,
        out: Text,
    },
    RmsNorm {
        x: Text,
        out: Text,
        /// None: an unweighted norm.
        #[serde(default)]
        weight: Option<Text>,
        eps: Text,
        #[serde(default)]
        group: Option<Text>,
        #[serde(default)]
        offset: Option<Text>,
        /// Multiplies the output (a Float; default 1).
        #[serde(default)]
        scale: Option<Text>,
    },
    LayerNorm {
        x: Text,
        out: Text,
        weight: Text,
        #[serde(default)]
        bias: Option<Text>,
        eps: Text,
    },
    Linear {
        x: Text,
        out: Text,
        weight: Text,
        #[serde(default)]
        bias: Option<Text>,
    },
    Rope {
        x: Text,
        heads: Text,
        head_dim: Text,
        #[serde(default)]
        rotary_dim: Option<Text>,
        style: StyleSpec,
        theta: Text,
        #[serde(default)]
        scaling: ScalingSpec,
        /// Rotate the last `rotary_dim` columns of each head, not the first.
        #[serde(default)]
        tail: bool,
        /// Rotate by the opposite angles (the conjugate rotation).
        #[serde(default)]
        inverse: bool,
    },
    /// A block-diagonal linear: `groups` column groups of `x`, each times its rows of `weight`.
    GroupedLinear {
        x: Text,
        out: Text,
        weight: Text,
        groups: Text,
    },
    /// Hyper-connections' mix into a sublayer (`ir::Op::HyperPre`); without `mix`, the head's.
    HyperPre {
        x: Text,
        out: Text,
        #[serde(default)]
        mix: Option<Text>,
        streams: Text,
        #[serde(rename = "fn")]
        fn_weight: Text,
        base: Text,
        scale: Text,
        /// Sinkhorn iterations (an Int; with `mix`).
        #[serde(default)]
        sinkhorn_iters: Option<Text>,
        eps: Text,
        norm_eps: Text,
    },
    /// Hyper-connections' mix out of a sublayer (`ir::Op::HyperPost`); without `residual` and
    /// `mix`, `x` copied into every stream.
    HyperPost {
        x: Text,
        out: Text,
        #[serde(default)]
        residual: Option<Text>,
        #[serde(default)]
        mix: Option<Text>,
        streams: Text,
    },
    Attention {
        q: Text,
        k: Text,
        v: Text,
        out: Text,
        heads: Text,
        kv_heads: Text,
        head_dim: Text,
        #[serde(default)]
        v_head_dim: Option<Text>,
        scale: Text,
        /// Sliding window in positions; a value of 0 means full attention.
        #[serde(default)]
        window: Option<Text>,
        #[serde(default)]
        sinks: Option<Text>,
        /// Multiplies the values (a Float; default 1).
        #[serde(default)]
        value_scale: Option<Text>,
        /// Relative-position logits: the value of each row's relative states (`heads x d_rel`)
        /// and the weight `[d_rel, extent]` they mix.
        #[serde(default)]
        rel: Option<Text>,
        #[serde(default)]
        rel_proj: Option<Text>,
        /// The layer's compressed entries (a `KvCompress` before it) attended beside the cached
        /// rows: the compressor's window (an Int), and where it selects, the value of its
        /// selection.
        #[serde(default)]
        compress_rate: Option<Text>,
        #[serde(default)]
        compress_select: Option<Text>,
    },
    Act {
        x: Text,
        out: Text,
        act: Activation,
    },
    Glu {
        gate: Text,
        up: Text,
        out: Text,
        kind: GluSpec,
    },
    Add {
        a: Text,
        b: Text,
        out: Text,
    },
    Mul {
        a: Text,
        b: Text,
        out: Text,
    },
    Route {
        logits: Text,
        out: Text,
        scoring: RouterScoring,
        top_k: Text,
        renormalize: Text,
        #[serde(default)]
        correction_bias: Option<Text>,
        #[serde(default)]
        groups: Option<(Text, Text)>,
        /// What a group scores: `TopTwoSum` (the default) or `Max`.
        #[serde(default)]
        group_score: GroupScore,
        #[serde(default)]
        scale: Option<Text>,
        /// Shared experts whose logits follow the routed ones' (an Int; default 0).
        #[serde(default)]
        shared: Option<Text>,
        /// A one-entry weight multiplying the final weights.
        #[serde(default)]
        scale_by: Option<Text>,
        /// Hash routing: a `[vocab, top_k]` table of expert ids, read at the row's token id.
        #[serde(default)]
        hash: Option<Text>,
    },
    RoutedExperts {
        x: Text,
        routing: Text,
        out: Text,
        experts: Text,
        ffn: Text,
        gate: Text,
        up: Text,
        down: Text,
        glu: GluSpec,
        /// Per-expert biases (stacked `[experts, width]` weights), added after each matrix.
        #[serde(default)]
        gate_bias: Option<Text>,
        #[serde(default)]
        up_bias: Option<Text>,
        #[serde(default)]
        down_bias: Option<Text>,
        /// Shared experts (an Int) and their stacked weights, weighed by the routing's pairs
        /// after the top-k (a `Route` with `shared`).
        #[serde(default)]
        shared: Option<Text>,
        #[serde(default)]
        shared_gate: Option<Text>,
        #[serde(default)]
        shared_up: Option<Text>,
        #[serde(default)]
        shared_down: Option<Text>,
    },
    Mla {
        x: Text,
        out: Text,
        heads: Text,
        #[serde(default)]
        q_lora_rank: Option<Text>,
        kv_lora_rank: Text,
        qk_nope_head_dim: Text,
        qk_rope_head_dim: Text,
        v_head_dim: Text,
        scale: Text,
        /// Role -> weight name.
        weights: Entries<Text, Text>,
        theta: Text,
        #[serde(default)]
        scaling: ScalingSpec,
        /// The latent norms' epsilon (default 1e-6).
        #[serde(default)]
        norm_eps: Option<Text>,
        /// A Bool: RoPE on adjacent pairs (default true), else on halves.
        #[serde(default)]
        rope_interleave: Option<Text>,
        /// A value holding an `Indexer`'s selection: attend over the selected positions only.
        #[serde(default)]
        select: Option<Text>,
    },
    /// DeepSeek Sparse Attention's lightning indexer (`ir::IndexerSpec`).
    Indexer {
        x: Text,
        /// The MLA's normed query latent.
        q: Text,
        out: Text,
        heads: Text,
        head_dim: Text,
        rope_dim: Text,
        topk: Text,
        style: StyleSpec,
        theta: Text,
        #[serde(default)]
        scaling: ScalingSpec,
        /// The key LayerNorm's epsilon (default 1e-6).
        #[serde(default)]
        eps: Option<Text>,
        /// Role -> weight name.
        weights: Entries<Text, Text>,
    },
    /// DeepSeek V4's KV compressor (`ir::CompressSpec`); `q`, `out` and the `index_*` fields
    /// with its lightning indexer.
    KvCompress {
        x: Text,
        #[serde(default)]
        q: Option<Text>,
        #[serde(default)]
        out: Option<Text>,
        rate: Text,
        head_dim: Text,
        rope_dim: Text,
        theta: Text,
        #[serde(default)]
        scaling: ScalingSpec,
        /// A Bool: overlapping windows (compressed sparse attention).
        overlap: Text,
        eps: Text,
        #[serde(default)]
        index_heads: Option<Text>,
        #[serde(default)]
        index_head_dim: Option<Text>,
        #[serde(default)]
        index_topk: Option<Text>,
        /// Role -> weight name.
        weights: Entries<Text, Text>,
    },
    LinearAttention {
        x: Text,
        out: Text,
        kind: LinearAttentionKind,
        key_heads: Text,
        value_heads: Text,
        key_head_dim: Text,
        value_head_dim: Text,
        conv_kernel: Text,
        /// Role -> weight name.
        weights: Entries<Text, Text>,
        /// The gated output norm's epsilon (default 1e-6).
        #[serde(default)]
        norm_eps: Option<Text>,
    },
    /// The ops of a named block.
    Block(Text),
    /// `then` when `cond` holds for this layer, else `else`.
    If {
        cond: Text,
        then: Items<Spanned<OpItem>>,
        #[serde(default, rename = "else")]
        otherwise: Items<Spanned<OpItem>>,
    },
}

/// A loaded, checked spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub path: PathBuf,
    pub source: String,
    pub file: SpecFile,
}

/// Symbols every spec must define: they become `ir::Dims`.
pub const REQUIRED_SYMBOLS: &[&str] = &["hidden", "vocab", "layers", "max_context"];

impl Spec {
    /// Reads and checks the spec at `path`.
    pub fn load(path: &Path) -> Result<Spec, Diagnostics> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Diagnostics::one(Diagnostic::whole(path, format!("cannot read the spec: {e}"))))?;
        Spec::parse(&text, path)
    }

    /// Parses and checks spec `text`, which came from `path` (for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Spec, Diagnostics> {
        let node = syntax::parse(text).map_err(|e| Diagnostics::one(Diagnostic::at(path, text, e.span, e.message)))?;
        let (file, errors) = de::from_node::<SpecFile>(&node);
        let mut d = Diagnostics::new();
        for (span, message) in errors {
            d.push(Diagnostic::at(path, text, span, message));
        }
        let Some(file) = file else { return Err(d.sorted()) };
        let spec = Spec { path: path.to_path_buf(), source: text.to_string(), file };
        // The static checks run on what was read, bad items left out, so that one pass
        // reports the file's errors of both kinds.
        d.extend(check::check(&spec));
        d.into_result(spec)
    }

    /// A diagnostic at `span` of this spec.
    pub fn diag(&self, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::at(&self.path, &self.source, span, message)
    }

    /// Parses an expression of the spec (the text's quotes excluded from spans).
    pub fn expr(&self, t: &Text) -> Result<Expr, Diagnostic> {
        expr::parse(&t.value, t.span.start + 1).map_err(|e| self.diag(e.span, e.message))
    }

    pub fn symbol(&self, name: &str) -> Option<&SymbolDef> {
        self.file.symbols.0.iter().find(|(k, _)| k.value == name).map(|(_, v)| v)
    }

    pub fn weight(&self, name: &str) -> Option<&WeightDef> {
        self.file.weights.0.iter().find(|(k, _)| k.value == name).map(|(_, v)| v)
    }

    pub fn block(&self, name: &str) -> Option<&Items<Spanned<OpItem>>> {
        self.file.blocks.0.iter().find(|(k, _)| k.value == name).map(|(_, v)| v)
    }

    /// Whether this spec serves architecture `arch` (an HF class or a GGUF architecture name).
    pub fn serves(&self, arch: &str) -> bool {
        self.file.serves.hf.iter().chain(&self.file.serves.gguf).any(|a| a == arch) || self.wrapper(arch).is_some()
    }

    /// The wrapper entry of `serves` for architecture `arch`, if it is one.
    pub fn wrapper(&self, arch: &str) -> Option<&Wrapper> {
        self.file.serves.wrappers.iter().find(|w| w.hf == arch)
    }

    /// The default configuration's path, resolved against the spec's directory.
    pub fn default_config(&self) -> Option<PathBuf> {
        let rel = &self.file.default_config.as_ref()?.value;
        Some(self.path.parent().unwrap_or(Path::new(".")).join(rel))
    }
}

/// The spec under `graphs_dir` that serves architecture `arch`, if any. Specs that do not
/// load are skipped (compiling with one reports its errors).
pub fn spec_for_architecture(graphs_dir: &Path, arch: &str) -> Option<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(graphs_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ron"))
        .collect();
    paths.sort();
    paths.into_iter().find(|p| Spec::load(p).is_ok_and(|s| s.serves(arch)))
}
