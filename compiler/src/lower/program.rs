//! Lowers a checked spec, bound to a checkpoint, into the `ir::Program` the runtime executes:
//! value widths evaluated, the layer body expanded once per layer (with `If` decided and
//! `Block`s inlined), tensor names resolved for the naming scheme, every op's widths and
//! weight shapes checked against each other and, when the tensor table is known, against the
//! checkpoint. Every size is checked against its `limits` entry when it is evaluated, before
//! anything is allocated or iterated by it; every Float is finite, epsilons and RoPE bases
//! above 0. What the ops read and write is followed in program order (`flow`).
//!
//! Pre: `spec::check` passed. Post: a `Program` whose every op reads values of consistent
//! widths, written before they are read, within the limits; or all the diagnostics found.
//! This module must not place, size or cost anything.

use super::flow::Flow;
use super::symbols::Symbols;
use crate::bind::{Bindings, Naming};
use crate::diag::{Diagnostics, Span};
use crate::expr::Value;
use crate::ir::*;
use crate::limits;
use crate::spec::de::Spanned;
use crate::spec::{OpItem, Spec, StyleSpec, Text};
use std::collections::{BTreeMap, BTreeSet};

/// Which program of a spec to build: the model's, or the draft model the checkpoint carries
/// (`spec::DraftDef`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Model,
    Draft,
}

/// Builds the program of `spec` for the checkpoint described by `bindings`.
pub fn build_program(spec: &Spec, bindings: &Bindings) -> Result<Program, Diagnostics> {
    build_part(spec, bindings, Part::Model)
}

/// Builds the model's program or its draft's (`part`).
pub fn build_part(spec: &Spec, bindings: &Bindings, part: Part) -> Result<Program, Diagnostics> {
    let unwrapped = super::symbols::unwrap_wrapper(spec, bindings)?;
    let bindings = unwrapped.as_ref().unwrap_or(bindings);
    let mut l = Lowerer {
        spec,
        b: bindings,
        syms: Symbols::new(spec, bindings),
        values: Vec::new(),
        ids: BTreeMap::new(),
        diags: Diagnostics::new(),
        layer: None,
        layer_errors: BTreeMap::new(),
        flow: Flow::default(),
        bad_values: BTreeSet::new(),
        draft_i: None,
        input_allowed: false,
    };
    let program = match part {
        Part::Model => l.program(),
        Part::Draft => l.draft_program(),
    };
    l.flush_layer_errors();
    let mut d = l.syms.take_diagnostics();
    d.extend(l.diags);
    match program {
        Some(p) if d.is_empty() => Ok(p),
        _ if d.is_empty() => Err(Diagnostics::one(spec.diag(spec.file.family.span, "the program could not be built"))),
        _ => Err(d.sorted()),
    }
}

pub(super) struct Lowerer<'a> {
    pub(super) spec: &'a Spec,
    pub(super) b: &'a Bindings,
    pub(super) syms: Symbols<'a>,
    pub(super) values: Vec<ValueInfo>,
    pub(super) ids: BTreeMap<String, ValueId>,
    pub(super) diags: Diagnostics,
    /// The layer being expanded (`i`), if any.
    pub(super) layer: Option<usize>,
    /// Errors met while expanding layers, with the layers they were met in.
    pub(super) layer_errors: BTreeMap<(Span, String), Vec<u32>>,
    /// Which values the ops lowered so far write.
    pub(super) flow: Flow,
    /// Values whose width could not be evaluated (reported).
    pub(super) bad_values: BTreeSet<String>,
    /// Lowering a draft: its layer's index `i` (also in its prologue and epilogue), whose
    /// state is the draft program's layer 0.
    pub(super) draft_i: Option<usize>,
    /// Lowering a draft's prologue, where its `Input` belongs.
    pub(super) input_allowed: bool,
}

pub(super) fn has_e(s: &str) -> bool {
    s.contains("{e}")
}

impl<'a> Lowerer<'a> {
    /// Reports an error at `span`; the same error in several layers is reported once, with
    /// the list of layers.
    pub(super) fn err(&mut self, span: Span, msg: impl Into<String>) {
        let m = msg.into();
        match self.layer {
            Some(i) => {
                let layers = self.layer_errors.entry((span, m)).or_default();
                // Layers are expanded in order: the last one noted is the only possible repeat.
                if layers.last() != Some(&(i as u32)) {
                    layers.push(i as u32);
                }
            }
            None => self.diags.push(self.spec.diag(span, m)),
        }
    }

    /// The per-layer errors, as diagnostics.
    pub(super) fn flush_layer_errors(&mut self) {
        for ((span, m), layers) in std::mem::take(&mut self.layer_errors) {
            let which = if layers.len() == 1 {
                format!("layer {}", layers[0])
            } else {
                format!("layers {}", crate::print::layer_ranges(&layers))
            };
            self.diags.push(self.spec.diag(span, format!("{m} ({which})")));
        }
    }

    /// The index `i` of the layer being expanded, or the draft's in its prologue and epilogue.
    pub(super) fn index_i(&self) -> Option<usize> {
        self.layer.or(self.draft_i)
    }

    /// The id of the layer being expanded in the program being built (a draft's one layer is
    /// its layer 0).
    pub(super) fn layer_id(&self) -> LayerId {
        let i = self.layer.unwrap_or(0);
        LayerId(i.saturating_sub(self.draft_i.unwrap_or(0)) as u32)
    }

    /// The draft model's program (`spec::DraftDef`): its prologue, the layer body once at the
    /// draft's index, its epilogue.
    fn draft_program(&mut self) -> Option<Program> {
        let file = &self.spec.file;
        let Some(draft) = &file.draft else {
            self.err(file.family.span, format!("the {} spec has no draft model", file.family.value));
            return None;
        };
        let count = self.sized(&draft.count, limits::LAYERS)?;
        if count == 0 {
            let from = self.origin_of(&draft.count);
            self.err(
                draft.count.span,
                format!("this checkpoint has no draft layers (`{}` is 0{from})", draft.count.value),
            );
            return None;
        }
        let i = self.sized(&draft.layer, limits::LAYERS)?;
        self.draft_i = Some(i);
        self.program_of(&draft.prologue.0, Some(i..i + 1), &draft.epilogue.0)
    }

    pub(super) fn program(&mut self) -> Option<Program> {
        let file = &self.spec.file;
        self.program_of(&file.prologue.0, None, &file.epilogue.0)
    }

    /// The program of `prologue_items`, the layer body for each index of `layer_range` (every
    /// layer when none), `epilogue_items`.
    fn program_of(
        &mut self,
        prologue_items: &'a [Spanned<OpItem>],
        layer_range: Option<std::ops::Range<usize>>,
        epilogue_items: &'a [Spanned<OpItem>],
    ) -> Option<Program> {
        let file = &self.spec.file;
        // 0. What the spec refuses to serve.
        for r in &file.refuse.0 {
            if self.boolean(&r.when) == Some(true) {
                self.err(r.when.span, format!("not served: {}", r.why.value));
            }
        }
        // 1. Dimensions and values.
        // The limits are checked here, before anything is allocated by these sizes.
        let required = [
            ("hidden", limits::HIDDEN),
            ("vocab", limits::VOCAB),
            ("layers", limits::LAYERS),
            ("max_context", limits::CONTEXT),
        ];
        let dims_vals: Vec<Option<usize>> = required
            .iter()
            .map(|(n, limit)| {
                let v = self.syms.get(n)?;
                let span = self
                    .spec
                    .file
                    .symbols
                    .0
                    .iter()
                    .find(|(k, _)| k.value == *n)
                    .map(|(k, _)| k.span)
                    .unwrap_or_default();
                let from = self.syms.origin(n).map(|o| format!(" (from {o})")).unwrap_or_default();
                match v {
                    Value::Int(v) if v >= 0 => match limit.check(v as usize) {
                        Ok(v) => Some(v),
                        Err(m) => {
                            self.err(span, format!("symbol `{n}`{from}: {m}"));
                            None
                        }
                    },
                    v => {
                        self.err(span, format!("symbol `{n}` must be a non-negative Int, it is {v}{from}"));
                        None
                    }
                }
            })
            .collect();
        let [Some(hidden), Some(vocab), Some(layers), Some(max_context)] = dims_vals[..] else { return None };
        let residual = self.val(&file.residual)?;
        let logits = self.val(&file.logits)?;
        let streams = match &file.streams {
            Some(s) => self.sized(s, limits::STREAMS)?,
            None => 1,
        };
        if self.width(residual) != streams * hidden {
            self.err(
                file.residual.span,
                format!(
                    "the residual `{}` has width {}, {streams} stream(s) of `hidden` {hidden} are {}",
                    file.residual.value,
                    self.width(residual),
                    streams * hidden
                ),
            );
        }
        if self.width(logits) != vocab {
            self.err(
                file.logits.span,
                format!("the logits `{}` have width {}, `vocab` is {vocab}", file.logits.value, self.width(logits)),
            );
        }
        // 2. Prologue, layers, epilogue, what they read and write followed in that order.
        self.input_allowed = self.draft_i.is_some();
        let prologue = self.items(prologue_items, 0);
        self.input_allowed = false;
        let layer_range = layer_range.unwrap_or(0..layers);
        let layers = layer_range.len();
        let mut out_layers = Vec::with_capacity(layers);
        for i in layer_range {
            self.layer = Some(i);
            self.flow.enter_layer();
            let ops = self.items(&file.layer.0, 0);
            let mixer = ops
                .iter()
                .find_map(|op| match op {
                    Op::Attention { spec, .. } if spec.window.is_some() => Some(MixerKind::SlidingAttention),
                    Op::Attention { .. } => Some(MixerKind::Attention),
                    Op::Mla { .. } => Some(MixerKind::Mla),
                    // A short convolution is no mixer (Inkling's sit beside attention).
                    Op::LinearAttention { spec, .. } if spec.kind == LinearAttentionKind::ShortConv => None,
                    Op::LinearAttention { .. } => Some(MixerKind::LinearAttention),
                    _ => None,
                })
                .unwrap_or(MixerKind::Attention);
            let ffn =
                if ops.iter().any(|op| matches!(op, Op::RoutedExperts { .. })) { FfnKind::Moe } else { FfnKind::Dense };
            out_layers.push(Layer { id: self.layer_id(), mixer, ffn, ops });
        }
        self.layer = None;
        self.flow.enter_epilogue(residual);
        if !self.flow.written(residual) {
            self.err(
                file.residual.span,
                format!(
                    "the residual `{}` is not written before the epilogue (by the prologue or the layers)",
                    file.residual.value
                ),
            );
        }
        let epilogue = self.items(epilogue_items, 0);
        if !self.flow.written_in_epilogue(logits) {
            self.err(file.logits.span, format!("no op of the epilogue writes the logits `{}`", file.logits.value));
        }
        Some(Program {
            family: file.family.value.clone(),
            dims: Dims { hidden, vocab, layers, max_context, streams },
            values: std::mem::take(&mut self.values),
            residual,
            logits,
            prologue,
            layers: out_layers,
            epilogue,
            export: None,
        })
    }

    // ---- names -------------------------------------------------------------------------------

    /// The id of value `t`, allocated on first use (so a program holds only the values its
    /// ops use, numbered in order of first use).
    pub(super) fn val(&mut self, t: &Text) -> Option<ValueId> {
        if let Some(v) = self.ids.get(&t.value) {
            return Some(*v);
        }
        let Some((_, width)) = self.spec.file.values.0.iter().find(|(k, _)| k.value == t.value) else {
            self.err(t.span, format!("unknown value `{}`", t.value));
            return None;
        };
        // Widths do not depend on the layer.
        if self.bad_values.contains(&t.value) {
            return None;
        }
        let layer = self.layer.take();
        let w = self.sized(width, limits::WIDTH);
        self.layer = layer;
        let Some(w) = w else {
            // Reported once; the ops that use the value are left out, not checked against a
            // width it does not have.
            self.bad_values.insert(t.value.clone());
            return None;
        };
        let id = ValueId(self.values.len() as u32);
        self.ids.insert(t.value.clone(), id);
        self.values.push(ValueInfo { name: t.value.clone(), width: w });
        Some(id)
    }

    pub(super) fn width(&self, v: ValueId) -> usize {
        self.values.get(v.0 as usize).map(|x| x.width).unwrap_or(0)
    }

    /// Reports unless value `t` has width `want`.
    pub(super) fn expect_width(&mut self, t: &Text, v: ValueId, want: usize, why: &str) {
        let got = self.width(v);
        if got != want {
            self.err(t.span, format!("value `{}` has width {got}, {why} needs {want}", t.value));
        }
    }

    // ---- ops --------------------------------------------------------------------------------

    pub(super) fn items(&mut self, items: &'a [Spanned<OpItem>], depth: usize) -> Vec<Op> {
        let mut out = Vec::new();
        for item in items {
            match &item.value {
                OpItem::Block(name) => {
                    if depth >= limits::BLOCK_DEPTH.max {
                        self.err(name.span, format!("blocks nest too deep ({})", limits::BLOCK_DEPTH));
                        continue;
                    }
                    if let Some(b) = self.spec.block(&name.value) {
                        out.extend(self.items(&b.0, depth + 1));
                    }
                }
                OpItem::If { cond, then, otherwise } => match self.boolean(cond) {
                    Some(true) => out.extend(self.items(&then.0, depth)),
                    Some(false) => out.extend(self.items(&otherwise.0, depth)),
                    None => {}
                },
                op => match self.op(op, item.span) {
                    Some(lowered) => {
                        for (span, m) in self.flow.follow(op, item.span, &lowered, self.layer.is_some(), &self.values) {
                            self.err(span, m);
                        }
                        out.push(lowered);
                    }
                    // Its errors are reported; its outputs count as written, so that they
                    // are not reported again as read before written.
                    None => self.flow.follow_failed(op, &self.ids),
                },
            }
        }
        out
    }

    pub(super) fn op(&mut self, op: &OpItem, span: Span) -> Option<Op> {
        Some(match op {
            OpItem::Embed { out, table, scale } => {
                let (o, table, scale) = (self.val(out), self.weight(table), self.scale_or(scale, 1.0));
                let (o, table, scale) = (o?, table?, scale?);
                if table.shape.len() == 2 {
                    self.expect_width(out, o, table.shape[1], "the embedding table's width");
                }
                Op::Embed { out: o, table, scale }
            }
            OpItem::RmsNorm { x, out, weight, eps, group, offset, scale } => {
                let scale = self.scale_or(scale, 1.0)?;
                let weight = match weight {
                    Some(w) => Some(self.weight(w)?),
                    None => None,
                };
                let (xv, ov, eps, offset) =
                    (self.val(x), self.val(out), self.positive(eps, "RmsNorm's epsilon"), self.scale_or(offset, 0.0));
                let (xv, ov, eps, offset) = (xv?, ov?, eps?, offset?);
                let xw = self.width(xv);
                let group = match group {
                    Some(g) => self.sized(g, limits::WIDTH)?,
                    None => xw,
                };
                if group == 0 || !xw.is_multiple_of(group) {
                    self.err(span, format!("RmsNorm groups of {group} do not divide the width {xw} of `{}`", x.value));
                }
                if let Some(w) = weight.as_ref().filter(|w| w.shape != [group]) {
                    self.err(span, format!("RmsNorm weight has shape {:?}, groups of {group} need [{group}]", w.shape));
                }
                self.expect_width(out, ov, xw, "the normed input's width");
                Op::RmsNorm { x: xv, out: ov, weight, eps, group, offset, scale }
            }
            OpItem::LayerNorm { x, out, weight, bias, eps } => {
                let (xv, ov, w, eps) =
                    (self.val(x), self.val(out), self.weight(weight), self.positive(eps, "LayerNorm's epsilon"));
                let bias = match bias {
                    Some(b) => Some(self.weight(b)?),
                    None => None,
                };
                let (xv, ov, weight, eps) = (xv?, ov?, w?, eps?);
                let xw = self.width(xv);
                if weight.shape != [xw] || bias.as_ref().is_some_and(|b| b.shape != [xw]) {
                    self.err(span, format!("LayerNorm weight and bias must have shape [{xw}]"));
                }
                self.expect_width(out, ov, xw, "the normed input's width");
                Op::LayerNorm { x: xv, out: ov, weight, bias, eps }
            }
            OpItem::Linear { x, out, weight: wname, bias } => {
                let (xv, ov, w) = (self.val(x), self.val(out), self.weight(wname));
                let bias = match bias {
                    Some(b) if !self.weight_off(b) => Some(self.weight(b)?),
                    _ => None,
                };
                let (xv, ov, weight) = (xv?, ov?, w?);
                if weight.shape.len() != 2 {
                    self.err(
                        span,
                        format!("a Linear weight is [out, in]; `{}` has shape {:?}", weight.name, weight.shape),
                    );
                    return None;
                }
                let why = format!("weight `{}` {:?}", wname.value, weight.shape);
                self.expect_width(x, xv, weight.shape[1], &why);
                self.expect_width(out, ov, weight.shape[0], &why);
                if let Some(b) = &bias {
                    if b.shape != [weight.shape[0]] {
                        self.err(
                            span,
                            format!("the bias has shape {:?}, the Linear needs [{}]", b.shape, weight.shape[0]),
                        );
                    }
                }
                Op::Linear { x: xv, out: ov, weight, bias }
            }
            OpItem::Rope { x, heads, head_dim, rotary_dim, style, theta, scaling, tail, inverse } => {
                let (xv, h, hd, theta) = (
                    self.val(x),
                    self.sized(heads, limits::HEADS),
                    self.sized(head_dim, limits::HEAD_DIM),
                    self.positive(theta, "the RoPE base"),
                );
                let (xv, heads, head_dim, theta) = (xv?, h?, hd?, theta?);
                let rotary_dim = match rotary_dim {
                    Some(r) => self.sized(r, limits::HEAD_DIM)?,
                    None => head_dim,
                };
                self.expect_width(x, xv, heads * head_dim, "RoPE over heads x head_dim");
                let style = match (style, self.b.naming) {
                    (StyleSpec::RotateHalf, _) => RopeStyle::RotateHalf,
                    (StyleSpec::Interleaved, _) => RopeStyle::Interleaved,
                    (StyleSpec::ByNaming { hf, .. }, Naming::Hf) => *hf,
                    (StyleSpec::ByNaming { gguf, .. }, Naming::Gguf) => *gguf,
                };
                let scaling = self.scaling(scaling, span)?;
                let (rotary_dim, theta) = self.rotary(rotary_dim, theta, scaling);
                if rotary_dim > head_dim || rotary_dim % 2 != 0 {
                    self.err(
                        span,
                        format!("the rotary dimension {rotary_dim} must be even and at most head_dim {head_dim}"),
                    );
                }
                Op::Rope { x: xv, heads, head_dim, rotary_dim, style, theta, scaling, tail: *tail, inverse: *inverse }
            }
            OpItem::Attention { .. } => self.attention(op, span)?,
            OpItem::Act { x, out, act } => {
                let (xv, ov) = (self.val(x)?, self.val(out)?);
                self.expect_width(out, ov, self.width(xv), "the activation's input width");
                Op::Act { x: xv, out: ov, act: *act }
            }
            OpItem::Glu { gate, up, out, kind } => {
                let (g, u, o, k) = (self.val(gate), self.val(up), self.val(out), self.glu(kind));
                let (g, u, o, kind) = (g?, u?, o?, k?);
                let w = self.width(g);
                self.expect_width(up, u, w, "the gate's width");
                self.expect_width(out, o, w, "the gate's width");
                Op::Glu { gate: g, up: u, out: o, kind }
            }
            OpItem::Input { out } => {
                let ov = self.val(out)?;
                if !self.input_allowed {
                    self.err(span, "`Input` is for a draft's prologue");
                }
                Op::Input { out: ov }
            }
            OpItem::Concat { a, b, out } => {
                let (av, bv, ov) = (self.val(a)?, self.val(b)?, self.val(out)?);
                let w = self.width(av) + self.width(bv);
                self.expect_width(out, ov, w, "Concat (the two widths' sum)");
                Op::Concat { a: av, b: bv, out: ov }
            }
            OpItem::Add { a, b, out } | OpItem::Mul { a, b, out } => {
                let (av, bv, ov) = (self.val(a)?, self.val(b)?, self.val(out)?);
                let w = self.width(av);
                let is_mul = matches!(op, OpItem::Mul { .. });
                if !(is_mul && self.width(bv) == 1) {
                    self.expect_width(b, bv, w, if is_mul { "Mul (or width 1)" } else { "Add" });
                }
                self.expect_width(out, ov, w, "the result");
                if is_mul {
                    Op::Mul { a: av, b: bv, out: ov }
                } else {
                    Op::Add { a: av, b: bv, out: ov }
                }
            }
            OpItem::Route { .. } => self.route(op, span)?,
            OpItem::GroupedLinear { .. } | OpItem::HyperPre { .. } | OpItem::HyperPost { .. } => {
                self.hyper(op, span)?
            }
            OpItem::RoutedExperts {
                x,
                routing,
                out,
                experts,
                ffn,
                gate,
                up,
                down,
                glu,
                gate_bias,
                up_bias,
                down_bias,
                shared,
                shared_gate,
                shared_up,
                shared_down,
            } => {
                let (xv, rv, ov, e, f, g) = (
                    self.val(x),
                    self.val(routing),
                    self.val(out),
                    self.sized(experts, limits::EXPERTS),
                    self.sized(ffn, limits::WIDTH),
                    self.glu(glu),
                );
                let (xv, rv, ov, experts, ffn, glu) = (xv?, rv?, ov?, e?, f?, g?);
                let (xw, ow) = (self.width(xv), self.width(ov));
                let gate = self.expert(gate, experts, ffn, xw);
                let upw = self.expert(up, experts, ffn, xw);
                let downw = self.expert(down, experts, ow, ffn);
                if !self.width(rv).is_multiple_of(2) || self.width(rv) == 0 {
                    self.err(
                        routing.span,
                        format!(
                            "routing `{}` must hold (index, weight) pairs; its width is {}",
                            routing.value,
                            self.width(rv)
                        ),
                    );
                }
                let mut bias = |b: &Option<Text>, width: usize| -> Option<Option<ExpertBias>> {
                    match b {
                        Some(b) => self.expert_bias(b, experts, width).map(Some),
                        None => Some(None),
                    }
                };
                let (gb, ub, db) = (bias(gate_bias, ffn), bias(up_bias, ffn), bias(down_bias, ow));
                let layer = self.layer_id();
                let shared = match (shared, shared_gate, shared_up, shared_down) {
                    (None, None, None, None) => None,
                    (Some(n), Some(g), Some(u), Some(d)) => {
                        let count = self.sized(n, limits::EXPERTS)?;
                        let (g, u) = (self.expert(g, count, ffn, xw), self.expert(u, count, ffn, xw));
                        let d = self.expert(d, count, ow, ffn);
                        Some(Box::new(SharedExperts { count, gate: g?, up: u?, down: d? }))
                    }
                    _ => {
                        self.err(span, "shared experts need `shared`, `shared_gate`, `shared_up` and `shared_down`");
                        return None;
                    }
                };
                let weights = ExpertWeights {
                    gate: gate?,
                    up: upw?,
                    down: downw?,
                    gate_bias: gb?,
                    up_bias: ub?,
                    down_bias: db?,
                    shared,
                };
                Op::RoutedExperts { x: xv, routing: rv, out: ov, layer, experts, ffn, weights, glu }
            }
            OpItem::Mla {
                x,
                out,
                heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                scale,
                weights,
                theta,
                scaling,
                norm_eps,
                rope_interleave,
                select,
            } => {
                let (xv, ov) = (self.val(x)?, self.val(out)?);
                let select = match select {
                    Some(t) => Some(self.val(t)?),
                    None => None,
                };
                // A q LoRA rank of 0 means none (configurations say `q_lora_rank: null`).
                let q_lora_rank = match q_lora_rank {
                    Some(t) => Some(self.sized(t, limits::HEAD_DIM)?).filter(|&r| r > 0),
                    None => None,
                };
                let spec = MlaSpec {
                    heads: self.sized(heads, limits::HEADS)?,
                    q_lora_rank,
                    kv_lora_rank: self.sized(kv_lora_rank, limits::HEAD_DIM)?,
                    qk_nope_head_dim: self.sized(qk_nope_head_dim, limits::HEAD_DIM)?,
                    qk_rope_head_dim: self.sized(qk_rope_head_dim, limits::HEAD_DIM)?,
                    v_head_dim: self.sized(v_head_dim, limits::HEAD_DIM)?,
                    scale: self.scale(scale)?,
                    weights: self.roles(weights)?,
                    rope_theta: self.positive(theta, "the RoPE base")?,
                    rope_scaling: self.scaling(scaling, span)?,
                    norm_eps: self.positive_or(norm_eps, 1e-6, "MLA's epsilon")?,
                    rope_interleave: match rope_interleave {
                        Some(t) => self.boolean(t)?,
                        None => true,
                    },
                    select,
                };
                self.mla_roles(&spec, self.width(xv), span);
                self.expect_width(out, ov, self.width(xv), "MLA's input width");
                Op::Mla { x: xv, out: ov, layer: self.layer_id(), spec }
            }
            OpItem::Indexer { x, q, out, heads, head_dim, rope_dim, topk, style, theta, scaling, eps, weights } => {
                let (xv, qv, ov) = (self.val(x)?, self.val(q)?, self.val(out)?);
                let rope_style = match (style, self.b.naming) {
                    (StyleSpec::RotateHalf, _) => RopeStyle::RotateHalf,
                    (StyleSpec::Interleaved, _) => RopeStyle::Interleaved,
                    (StyleSpec::ByNaming { hf, .. }, Naming::Hf) => *hf,
                    (StyleSpec::ByNaming { gguf, .. }, Naming::Gguf) => *gguf,
                };
                let spec = IndexerSpec {
                    heads: self.sized(heads, limits::HEADS)?,
                    head_dim: self.sized(head_dim, limits::HEAD_DIM)?,
                    rope_dim: self.sized(rope_dim, limits::HEAD_DIM)?,
                    topk: self.sized(topk, limits::WIDTH)?,
                    rope_style,
                    rope_theta: self.positive(theta, "the RoPE base")?,
                    rope_scaling: self.scaling(scaling, span)?,
                    eps: self.positive_or(eps, 1e-6, "the key norm's epsilon")?,
                    weights: self.roles(weights)?,
                };
                self.indexer_roles(&spec, (self.width(xv), self.width(qv)), span);
                self.expect_width(out, ov, spec.topk, "the indexer's top-k");
                Op::Indexer { x: xv, q: qv, out: ov, layer: self.layer_id(), spec }
            }
            OpItem::KvCompress {
                x,
                q,
                out,
                rate,
                head_dim,
                rope_dim,
                theta,
                scaling,
                overlap,
                eps,
                index_heads,
                index_head_dim,
                index_topk,
                weights,
            } => {
                let xv = self.val(x)?;
                let out_text = out.as_ref();
                let (q, out) = (q.as_ref().map(|t| self.val(t)), out.as_ref().map(|t| self.val(t)));
                let index = match (index_heads, index_head_dim, index_topk) {
                    (Some(h), Some(d), Some(k)) => Some(CompressIndex {
                        heads: self.sized(h, limits::HEADS)?,
                        head_dim: self.sized(d, limits::HEAD_DIM)?,
                        topk: self.sized(k, limits::WIDTH)?,
                    }),
                    (None, None, None) => None,
                    _ => {
                        self.err(
                            span,
                            "the compressor's indexer needs `index_heads`, `index_head_dim` and `index_topk`",
                        );
                        return None;
                    }
                };
                let spec = CompressSpec {
                    rate: self.sized(rate, limits::CONTEXT)?,
                    head_dim: self.sized(head_dim, limits::HEAD_DIM)?,
                    rope_dim: self.sized(rope_dim, limits::HEAD_DIM)?,
                    rope_theta: self.positive(theta, "the RoPE base")?,
                    rope_scaling: self.scaling(scaling, span)?,
                    overlap: self.boolean(overlap)?,
                    eps: self.positive(eps, "the entries' norm epsilon")?,
                    index,
                    weights: self.roles(weights)?,
                };
                let (q, out) = match (index, q, out) {
                    (Some(i), Some(q), Some(out)) => {
                        let (q, o) = (q?, out?);
                        if let Some(t) = out_text {
                            self.expect_width(t, o, i.topk, "the compressor's index top-k");
                        }
                        (Some(q), Some(o))
                    }
                    (None, None, None) => (None, None),
                    _ => {
                        self.err(span, "a compressor's indexer and its `q` and `out` go together");
                        return None;
                    }
                };
                self.compress_roles(&spec, (self.width(xv), q.map(|q| self.width(q))), span);
                Op::KvCompress { x: xv, q, out, layer: self.layer_id(), spec }
            }
            OpItem::LinearAttention {
                x,
                out,
                kind,
                key_heads,
                value_heads,
                key_head_dim,
                value_head_dim,
                conv_kernel,
                weights,
                norm_eps,
            } => {
                let (xv, ov) = (self.val(x)?, self.val(out)?);
                let spec = LinearAttentionSpec {
                    kind: *kind,
                    key_heads: self.sized(key_heads, limits::HEADS)?,
                    value_heads: self.sized(value_heads, limits::HEADS)?,
                    key_head_dim: self.sized(key_head_dim, limits::HEAD_DIM)?,
                    value_head_dim: self.sized(value_head_dim, limits::HEAD_DIM)?,
                    conv_kernel: self.sized(conv_kernel, limits::CONV_KERNEL)?,
                    weights: self.roles(weights)?,
                    norm_eps: self.positive_or(norm_eps, 1e-6, "the output norm's epsilon")?,
                };
                if spec.key_heads == 0 || !spec.value_heads.is_multiple_of(spec.key_heads) {
                    self.err(
                        span,
                        format!("{} value heads cannot share {} key heads evenly", spec.value_heads, spec.key_heads),
                    );
                } else if spec.kind == LinearAttentionKind::ShortConv {
                    self.short_conv_roles(&spec, self.width(xv), span);
                } else if spec.kind == LinearAttentionKind::GatedDeltaNet {
                    self.deltanet_roles(&spec, self.width(xv), span);
                } else {
                    self.kda_roles(&spec, self.width(xv), span);
                }
                self.expect_width(out, ov, self.width(xv), "the mixer's input width");
                Op::LinearAttention { x: xv, out: ov, layer: self.layer_id(), spec }
            }
            OpItem::Block(_) | OpItem::If { .. } => return None,
        })
    }
}
