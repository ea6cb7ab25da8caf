//! Lowers a checked spec, bound to a checkpoint, into the `ir::Program` the runtime executes:
//! value widths evaluated, the layer body expanded once per layer (with `If` decided and
//! `Block`s inlined), tensor names resolved for the naming scheme, every op's widths and
//! weight shapes checked against each other and, when the tensor table is known, against the
//! checkpoint.
//!
//! Pre: `spec::check` passed. Post: a `Program` whose every op reads values of consistent
//! widths, or all the diagnostics found. This module must not place, size or cost anything.

use super::symbols::Symbols;
use crate::bind::{Bindings, Naming};
use crate::diag::{Diagnostics, Span};
use crate::expr::Value;
use crate::ir::*;
use crate::spec::de::Spanned;
use crate::spec::{GluSpec, OpItem, ScalingSpec, Spec, StyleSpec, Text};
use std::collections::BTreeMap;

/// Builds the program of `spec` for the checkpoint described by `bindings`.
pub fn build_program(spec: &Spec, bindings: &Bindings) -> Result<Program, Diagnostics> {
    let mut l = Lowerer {
        spec,
        b: bindings,
        syms: Symbols::new(spec, bindings),
        values: Vec::new(),
        ids: BTreeMap::new(),
        diags: Diagnostics::new(),
        layer: None,
        layer_errors: BTreeMap::new(),
    };
    let program = l.program();
    l.flush_layer_errors();
    let mut d = l.syms.take_diagnostics();
    d.extend(l.diags);
    match program {
        Some(p) if d.is_empty() => Ok(p),
        _ if d.is_empty() => Err(Diagnostics::one(spec.diag(spec.file.family.span, "the program could not be built"))),
        _ => Err(d.sorted()),
    }
}

struct Lowerer<'a> {
    spec: &'a Spec,
    b: &'a Bindings,
    syms: Symbols<'a>,
    values: Vec<ValueInfo>,
    ids: BTreeMap<String, ValueId>,
    diags: Diagnostics,
    /// The layer being expanded (`i`), if any.
    layer: Option<usize>,
    /// Errors met while expanding layers, with the layers they were met in.
    layer_errors: BTreeMap<(Span, String), Vec<u32>>,
}

fn has_e(s: &str) -> bool {
    s.contains("{e}")
}

impl<'a> Lowerer<'a> {
    /// Reports an error at `span`; the same error in several layers is reported once, with
    /// the list of layers.
    fn err(&mut self, span: Span, msg: impl Into<String>) {
        let m = msg.into();
        match self.layer {
            Some(i) => {
                let layers = self.layer_errors.entry((span, m)).or_default();
                if !layers.contains(&(i as u32)) {
                    layers.push(i as u32);
                }
            }
            None => self.diags.push(self.spec.diag(span, m)),
        }
    }

    /// The per-layer errors, as diagnostics.
    fn flush_layer_errors(&mut self) {
        for ((span, m), layers) in std::mem::take(&mut self.layer_errors) {
            let which = if layers.len() == 1 { format!("layer {}", layers[0]) } else { format!("layers {}", crate::print::layer_ranges(&layers)) };
            self.diags.push(self.spec.diag(span, format!("{m} ({which})")));
        }
    }

    fn program(&mut self) -> Option<Program> {
        let file = &self.spec.file;
        // 1. Dimensions and values.
        let dims_vals: Vec<Option<usize>> = ["hidden", "vocab", "layers", "max_context"]
            .iter()
            .map(|n| match self.syms.get(n) {
                Some(Value::Int(v)) if v >= 0 => Some(v as usize),
                Some(v) => {
                    let span = self.spec.file.symbols.0.iter().find(|(k, _)| k.value == *n).map(|(k, _)| k.span).unwrap_or_default();
                    self.err(span, format!("symbol `{n}` must be a non-negative Int, it is {v}"));
                    None
                }
                None => None,
            })
            .collect();
        let [Some(hidden), Some(vocab), Some(layers), Some(max_context)] = dims_vals[..] else { return None };
        let residual = self.val(&file.residual)?;
        let logits = self.val(&file.logits)?;
        if self.width(residual) != hidden {
            self.err(file.residual.span, format!("the residual `{}` has width {}, `hidden` is {hidden}", file.residual.value, self.width(residual)));
        }
        if self.width(logits) != vocab {
            self.err(file.logits.span, format!("the logits `{}` have width {}, `vocab` is {vocab}", file.logits.value, self.width(logits)));
        }
        // 2. Prologue, layers, epilogue.
        let prologue = self.items(&file.prologue.0, 0);
        let mut out_layers = Vec::with_capacity(layers);
        for i in 0..layers {
            self.layer = Some(i);
            let ops = self.items(&file.layer.0, 0);
            let mixer = ops
                .iter()
                .find_map(|op| match op {
                    Op::Attention { spec, .. } if spec.window.is_some() => Some(MixerKind::SlidingAttention),
                    Op::Attention { .. } => Some(MixerKind::Attention),
                    Op::Mla { .. } => Some(MixerKind::Mla),
                    Op::LinearAttention { .. } => Some(MixerKind::LinearAttention),
                    _ => None,
                })
                .unwrap_or(MixerKind::Attention);
            let ffn = if ops.iter().any(|op| matches!(op, Op::RoutedExperts { .. })) { FfnKind::Moe } else { FfnKind::Dense };
            out_layers.push(Layer { id: LayerId(i as u32), mixer, ffn, ops });
        }
        self.layer = None;
        let epilogue = self.items(&file.epilogue.0, 0);
        Some(Program {
            family: file.family.value.clone(),
            dims: Dims { hidden, vocab, layers, max_context },
            values: std::mem::take(&mut self.values),
            residual,
            logits,
            prologue,
            layers: out_layers,
            epilogue,
        })
    }

    // ---- expressions and names -------------------------------------------------------------

    fn eval(&mut self, t: &Text) -> Option<Value> {
        let e = match self.spec.expr(t) {
            Ok(e) => e,
            Err(d) => {
                self.diags.push(d);
                return None;
            }
        };
        let layer = self.layer;
        let r = e.eval(&|n| if n == "i" { layer.map(|i| Value::Int(i as i64)) } else { self.syms.get(n) });
        match r {
            Ok(v) => Some(v),
            Err(x) => {
                // A symbol without a value was reported where it is declared.
                if !x.message.contains("has no value") {
                    self.err(x.span, x.message);
                }
                None
            }
        }
    }

    /// A non-negative Int expression, at most 2^32 (a size past that is a mistake, and
    /// products of two sizes then cannot overflow).
    fn int(&mut self, t: &Text) -> Option<usize> {
        match self.eval(t)? {
            Value::Int(i) if (0..=1 << 32).contains(&i) => Some(i as usize),
            Value::Int(i) if i > 0 => {
                self.err(t.span, format!("`{}` is {i}, too large for a size (at most 2^32)", t.value));
                None
            }
            v => {
                self.err(t.span, format!("expected a non-negative Int, `{}` is {v}", t.value));
                None
            }
        }
    }

    fn float(&mut self, t: &Text) -> Option<f32> {
        match self.eval(t)? {
            v @ (Value::Int(_) | Value::Float(_)) => v.as_f64().map(|f| f as f32),
            v => {
                self.err(t.span, format!("expected a number, `{}` is {v}", t.value));
                None
            }
        }
    }

    fn float_or(&mut self, t: &Option<Text>, dflt: f32) -> Option<f32> {
        match t {
            Some(t) => self.float(t),
            None => Some(dflt),
        }
    }

    fn boolean(&mut self, t: &Text) -> Option<bool> {
        match self.eval(t)? {
            Value::Bool(b) => Some(b),
            v => {
                self.err(t.span, format!("expected a Bool, `{}` is {v}", t.value));
                None
            }
        }
    }

    /// The id of value `t`, allocated on first use (so a program holds only the values its
    /// ops use, numbered in order of first use).
    fn val(&mut self, t: &Text) -> Option<ValueId> {
        if let Some(v) = self.ids.get(&t.value) {
            return Some(*v);
        }
        let Some((_, width)) = self.spec.file.values.0.iter().find(|(k, _)| k.value == t.value) else {
            self.err(t.span, format!("unknown value `{}`", t.value));
            return None;
        };
        // Widths do not depend on the layer.
        let layer = self.layer.take();
        let w = self.int(width);
        self.layer = layer;
        let id = ValueId(self.values.len() as u32);
        self.ids.insert(t.value.clone(), id);
        self.values.push(ValueInfo { name: t.value.clone(), width: w.unwrap_or(0) });
        Some(id)
    }

    fn width(&self, v: ValueId) -> usize {
        self.values.get(v.0 as usize).map(|x| x.width).unwrap_or(0)
    }

    /// Reports unless value `t` has width `want`.
    fn expect_width(&mut self, t: &Text, v: ValueId, want: usize, why: &str) {
        let got = self.width(v);
        if got != want {
            self.err(t.span, format!("value `{}` has width {got}, {why} needs {want}", t.value));
        }
    }

    fn scheme(&self) -> &'static str {
        match self.b.naming {
            Naming::Hf => "HF",
            Naming::Gguf => "GGUF",
        }
    }

    /// The pattern of weight `name` for this checkpoint's naming scheme.
    fn pattern(&self, name: &str) -> Option<&'a Text> {
        let def = self.spec.weight(name)?;
        match self.b.naming {
            Naming::Hf => def.hf.as_ref(),
            Naming::Gguf => def.gguf.as_ref(),
        }
    }

    /// Resolves weight `t` (following `tied`), checking it against the checkpoint.
    fn weight(&mut self, t: &Text) -> Option<WeightRef> {
        let (name, shape, pattern, rows) = self.weight_def(&t.value, t.span, 0)?;
        if has_e(&name) {
            self.err(t.span, format!("weight `{}` is per expert (`{{e}}` in its name); only `RoutedExperts` can read it", t.value));
            return None;
        }
        if self.spec.weight(&t.value).is_some_and(|d| d.input_major) {
            self.err(t.span, format!("weight `{}` is input-major; only `RoutedExperts` can read it", t.value));
            return None;
        }
        let w = WeightRef { name, shape, rows };
        self.check_tensor(&w.name, &w.tensor_shape(), pattern.span);
        Some(w)
    }

    /// A per-expert bias: one stacked `[experts, width]` tensor, possibly selecting entries.
    fn expert_bias(&mut self, t: &Text, experts: usize, width: usize) -> Option<ExpertBias> {
        let (name, shape, pattern, select) = self.weight_def(&t.value, t.span, 0)?;
        if has_e(&name) {
            self.err(t.span, format!("expert bias `{}` must be one stacked [experts, width] tensor (no `{{e}}` in its name)", t.value));
            return None;
        }
        if shape != [width] {
            self.err(t.span, format!("expert bias `{}` has shape {shape:?}, the experts need [{width}]", t.value));
            return None;
        }
        let b = ExpertBias { name, shape: vec![experts, width], select };
        self.check_tensor(&b.name, &b.tensor_shape(), pattern.span);
        Some(b)
    }

    /// `(tensor name, spec shape, pattern, row selection)` of a weight, following `tied`.
    fn weight_def(&mut self, name: &str, span: Span, depth: usize) -> Option<(String, Vec<usize>, &'a Text, Option<RowSelect>)> {
        let def = self.spec.weight(name)?;
        if depth > 4 {
            self.err(span, format!("weight `{name}` is tied in a cycle"));
            return None;
        }
        let shape = def.shape.iter().map(|s| self.int(s)).collect::<Option<Vec<_>>>()?;
        let pattern = self.pattern(name);
        let layer = self.layer.unwrap_or(0);
        if let Some(tied) = &def.tied {
            let when = self.boolean(&tied.when)?;
            let absent = match (pattern, &self.b.tensors) {
                (None, _) => true,
                (Some(p), Some(t)) => !t.contains_key(&self.syms.tensor_name(&p.value, layer)),
                (Some(_), None) => false,
            };
            if when || absent {
                return self.weight_def(&tied.to.value, tied.to.span, depth + 1);
            }
        }
        let Some(p) = pattern else {
            let scheme = self.scheme();
            let key = self.spec.file.weights.0.iter().find(|(k, _)| k.value == name).map(|(k, _)| k.span).unwrap_or(span);
            self.err(key, format!("weight `{name}` has no {scheme} tensor name, and this checkpoint uses {scheme} names"));
            return None;
        };
        let rows = match &def.rows {
            None => None,
            Some(r) => {
                let sel = RowSelect { groups: self.int(&r.groups)?, stride: self.int(&r.stride)?, offset: self.int(&r.offset)?, take: self.int(&r.take)? };
                if shape.first() != Some(&(sel.groups * sel.take)) || sel.offset + sel.take > sel.stride {
                    self.err(r.groups.span, format!("rows {sel:?} do not fit: the shape's first dimension must be groups x take and offset + take at most stride"));
                    return None;
                }
                Some(sel)
            }
        };
        Some((self.syms.tensor_name(&p.value, layer), shape, p, rows))
    }

    fn check_tensor(&mut self, name: &str, want: &[usize], span: Span) {
        let Some(tensors) = &self.b.tensors else { return };
        match tensors.get(name) {
            None => {
                let src = self.b.source.display().to_string();
                self.err(span, format!("tensor `{name}` is not in the checkpoint {src}"));
            }
            Some(t) if t.shape != want => {
                let got = t.shape.clone();
                self.err(span, format!("tensor `{name}` has shape {got:?} in the checkpoint, the spec expects {want:?}"));
            }
            Some(_) => {}
        }
    }

    /// An expert matrix: per-expert (`{e}` in the name) or stacked `[experts, rows, cols]`.
    fn expert(&mut self, t: &Text, experts: usize, rows: usize, cols: usize) -> Option<ExpertTensor> {
        let (name, shape, pattern, sel) = self.weight_def(&t.value, t.span, 0)?;
        if shape != [rows, cols] {
            self.err(t.span, format!("expert weight `{}` has shape {shape:?}, the experts need [{rows}, {cols}]", t.value));
        }
        if self.spec.weight(&t.value).is_some_and(|d| d.input_major) {
            if has_e(&name) {
                self.err(t.span, format!("input-major expert weight `{}` must be one stacked tensor (no `{{e}}` in its name)", t.value));
                return None;
            }
            let e = ExpertTensor::StackedInputMajor { name, shape: vec![experts, rows, cols], select: sel };
            if let ExpertTensor::StackedInputMajor { name, .. } = &e {
                self.check_tensor(name, &e.tensor_shape(), pattern.span);
            }
            return Some(e);
        }
        if sel.is_some() {
            self.err(t.span, "expert weights select rows only when input-major");
            return None;
        }
        if has_e(&name) {
            if let Some(tensors) = &self.b.tensors {
                let bad: Vec<usize> = (0..experts)
                    .filter(|e| tensors.get(&name.replace("{e}", &e.to_string())).map(|x| x.shape != shape).unwrap_or(true))
                    .collect();
                if let Some(first) = bad.first() {
                    let one = name.replace("{e}", &first.to_string());
                    let how = match tensors.get(&one) {
                        None => "missing".to_string(),
                        Some(x) => format!("of shape {:?}", x.shape),
                    };
                    self.err(pattern.span, format!("tensor `{name}` is {how} for {} of {experts} experts (first: `{one}`); the spec expects {shape:?}", bad.len()));
                }
            }
            Some(ExpertTensor::PerExpert { pattern: name, shape })
        } else {
            let stacked = vec![experts, shape[0], shape[1]];
            self.check_tensor(&name, &stacked, pattern.span);
            Some(ExpertTensor::Stacked { name, shape: stacked })
        }
    }

    fn glu(&mut self, g: &GluSpec) -> Option<GluKind> {
        Some(match g {
            GluSpec::SwiGlu => GluKind::SwiGlu,
            GluSpec::GeGlu => GluKind::GeGlu,
            GluSpec::ClampedSwiGlu { limit, alpha } => GluKind::ClampedSwiGlu { limit: self.float(limit)?, alpha: self.float(alpha)? },
        })
    }

    fn scaling(&mut self, s: &ScalingSpec, span: Span) -> Option<RopeScaling> {
        match s {
            ScalingSpec::None => Some(RopeScaling::None),
            ScalingSpec::FromConfig => match self.syms.rope_scaling() {
                Ok(r) => Some(r),
                Err(m) => {
                    self.err(span, m);
                    None
                }
            },
        }
    }

    // ---- ops --------------------------------------------------------------------------------

    fn items(&mut self, items: &'a [Spanned<OpItem>], depth: usize) -> Vec<Op> {
        let mut out = Vec::new();
        for item in items {
            match &item.value {
                OpItem::Block(name) => {
                    if depth > 16 {
                        self.err(name.span, "blocks nest too deep");
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
                op => {
                    if let Some(op) = self.op(op, item.span) {
                        out.push(op);
                    }
                }
            }
        }
        out
    }

    fn op(&mut self, op: &OpItem, span: Span) -> Option<Op> {
        Some(match op {
            OpItem::Embed { out, table, scale } => {
                let (o, table, scale) = (self.val(out), self.weight(table), self.float_or(scale, 1.0));
                let (o, table, scale) = (o?, table?, scale?);
                if table.shape.len() == 2 {
                    self.expect_width(out, o, table.shape[1], "the embedding table's width");
                }
                Op::Embed { out: o, table, scale }
            }
            OpItem::RmsNorm { x, out, weight, eps, group, offset } => {
                let (xv, ov, w, eps, offset) = (self.val(x), self.val(out), self.weight(weight), self.float(eps), self.float_or(offset, 0.0));
                let (xv, ov, weight, eps, offset) = (xv?, ov?, w?, eps?, offset?);
                let xw = self.width(xv);
                let group = match group {
                    Some(g) => self.int(g)?,
                    None => xw,
                };
                if group == 0 || !xw.is_multiple_of(group) {
                    self.err(span, format!("RmsNorm groups of {group} do not divide the width {xw} of `{}`", x.value));
                }
                if weight.shape != [group] {
                    self.err(span, format!("RmsNorm weight has shape {:?}, groups of {group} need [{group}]", weight.shape));
                }
                self.expect_width(out, ov, xw, "the normed input's width");
                Op::RmsNorm { x: xv, out: ov, weight, eps, group, offset }
            }
            OpItem::LayerNorm { x, out, weight, bias, eps } => {
                let (xv, ov, w, eps) = (self.val(x), self.val(out), self.weight(weight), self.float(eps));
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
                    Some(b) => Some(self.weight(b)?),
                    None => None,
                };
                let (xv, ov, weight) = (xv?, ov?, w?);
                if weight.shape.len() != 2 {
                    self.err(span, format!("a Linear weight is [out, in]; `{}` has shape {:?}", weight.name, weight.shape));
                    return None;
                }
                let why = format!("weight `{}` {:?}", wname.value, weight.shape);
                self.expect_width(x, xv, weight.shape[1], &why);
                self.expect_width(out, ov, weight.shape[0], &why);
                if let Some(b) = &bias {
                    if b.shape != [weight.shape[0]] {
                        self.err(span, format!("the bias has shape {:?}, the Linear needs [{}]", b.shape, weight.shape[0]));
                    }
                }
                Op::Linear { x: xv, out: ov, weight, bias }
            }
            OpItem::Rope { x, heads, head_dim, rotary_dim, style, theta, scaling } => {
                let (xv, h, hd, theta) = (self.val(x), self.int(heads), self.int(head_dim), self.float(theta));
                let (xv, heads, head_dim, theta) = (xv?, h?, hd?, theta?);
                let rotary_dim = match rotary_dim {
                    Some(r) => self.int(r)?,
                    None => head_dim,
                };
                self.expect_width(x, xv, heads * head_dim, "RoPE over heads x head_dim");
                if rotary_dim > head_dim || rotary_dim % 2 != 0 {
                    self.err(span, format!("the rotary dimension {rotary_dim} must be even and at most head_dim {head_dim}"));
                }
                let style = match (style, self.b.naming) {
                    (StyleSpec::RotateHalf, _) => RopeStyle::RotateHalf,
                    (StyleSpec::Interleaved, _) => RopeStyle::Interleaved,
                    (StyleSpec::ByNaming { hf, .. }, Naming::Hf) => *hf,
                    (StyleSpec::ByNaming { gguf, .. }, Naming::Gguf) => *gguf,
                };
                let scaling = self.scaling(scaling, span)?;
                Op::Rope { x: xv, heads, head_dim, rotary_dim, style, theta, scaling }
            }
            OpItem::Attention { q, k, v, out, heads, kv_heads, head_dim, v_head_dim, scale, window, sinks, value_scale } => {
                let (qv, kv, vv, ov) = (self.val(q), self.val(k), self.val(v), self.val(out));
                let (h, kvh, hd, sc) = (self.int(heads), self.int(kv_heads), self.int(head_dim), self.float(scale));
                let (qv, kv, vv, ov, heads, kv_heads, head_dim, scale) = (qv?, kv?, vv?, ov?, h?, kvh?, hd?, sc?);
                let v_head_dim = match v_head_dim {
                    Some(t) => self.int(t)?,
                    None => head_dim,
                };
                // A window of 0 means none (configurations say `sliding_window: null`).
                let window = match window {
                    Some(w) => Some(self.int(w)?).filter(|&w| w > 0),
                    None => None,
                };
                let sinks = match sinks {
                    Some(s) => Some(self.weight(s)?),
                    None => None,
                };
                let value_scale = self.float_or(value_scale, 1.0)?;
                if kv_heads == 0 || heads % kv_heads != 0 {
                    self.err(span, format!("{heads} query heads cannot share {kv_heads} KV heads evenly"));
                }
                self.expect_width(q, qv, heads * head_dim, "attention's heads x head_dim");
                self.expect_width(k, kv, kv_heads * head_dim, "attention's kv_heads x head_dim");
                self.expect_width(v, vv, kv_heads * v_head_dim, "attention's kv_heads x v_head_dim");
                self.expect_width(out, ov, heads * v_head_dim, "attention's heads x v_head_dim");
                if let Some(s) = &sinks {
                    if s.shape != [heads] {
                        self.err(span, format!("the sinks have shape {:?}, attention needs [{heads}]", s.shape));
                    }
                }
                let layer = LayerId(self.layer.unwrap_or(0) as u32);
                Op::Attention { q: qv, k: kv, v: vv, out: ov, layer, spec: AttentionSpec { heads, kv_heads, head_dim, v_head_dim, scale, window, sinks, value_scale } }
            }
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
            OpItem::Route { logits, out, scoring, top_k, renormalize, correction_bias, groups, scale } => {
                let (lv, ov, k, rn, sc) = (self.val(logits), self.val(out), self.int(top_k), self.boolean(renormalize), self.float_or(scale, 1.0));
                let (lv, ov, top_k, renormalize, scale) = (lv?, ov?, k?, rn?, sc?);
                let experts = self.width(lv);
                let correction_bias = match correction_bias {
                    Some(b) => Some(self.weight(b)?),
                    None => None,
                };
                let groups = match groups {
                    Some((g, t)) => Some((self.int(g)?, self.int(t)?)),
                    None => None,
                };
                if top_k == 0 || top_k > experts {
                    self.err(top_k_span(op), format!("top_k {top_k} must be between 1 and the {experts} experts"));
                }
                self.expect_width(out, ov, 2 * top_k, "routing (index, weight) pairs for top_k");
                if let Some(b) = &correction_bias {
                    if b.shape != [experts] {
                        self.err(span, format!("the correction bias has shape {:?}, the router needs [{experts}]", b.shape));
                    }
                }
                if let Some((g, t)) = groups {
                    if g == 0 || !experts.is_multiple_of(g) || t == 0 || t > g {
                        self.err(span, format!("groups ({g}, {t}): {g} groups must divide {experts} experts and 1 <= {t} <= {g}"));
                    }
                }
                Op::Route { logits: lv, out: ov, scoring: *scoring, top_k, renormalize, correction_bias, groups, scale }
            }
            OpItem::RoutedExperts { x, routing, out, experts, ffn, gate, up, down, glu, gate_bias, up_bias, down_bias } => {
                let (xv, rv, ov, e, f, g) = (self.val(x), self.val(routing), self.val(out), self.int(experts), self.int(ffn), self.glu(glu));
                let (xv, rv, ov, experts, ffn, glu) = (xv?, rv?, ov?, e?, f?, g?);
                let (xw, ow) = (self.width(xv), self.width(ov));
                let gate = self.expert(gate, experts, ffn, xw);
                let upw = self.expert(up, experts, ffn, xw);
                let downw = self.expert(down, experts, ow, ffn);
                if !self.width(rv).is_multiple_of(2) || self.width(rv) == 0 {
                    self.err(routing.span, format!("routing `{}` must hold (index, weight) pairs; its width is {}", routing.value, self.width(rv)));
                }
                let mut bias = |b: &Option<Text>, width: usize| -> Option<Option<ExpertBias>> {
                    match b {
                        Some(b) => self.expert_bias(b, experts, width).map(Some),
                        None => Some(None),
                    }
                };
                let (gb, ub, db) = (bias(gate_bias, ffn), bias(up_bias, ffn), bias(down_bias, ow));
                let layer = LayerId(self.layer.unwrap_or(0) as u32);
                let weights = ExpertWeights { gate: gate?, up: upw?, down: downw?, gate_bias: gb?, up_bias: ub?, down_bias: db? };
                Op::RoutedExperts { x: xv, routing: rv, out: ov, layer, experts, ffn, weights, glu }
            }
            OpItem::Mla { x, out, heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, scale, weights, theta, scaling, norm_eps, rope_interleave } => {
                let (xv, ov) = (self.val(x)?, self.val(out)?);
                // A q LoRA rank of 0 means none (configurations say `q_lora_rank: null`).
                let q_lora_rank = match q_lora_rank {
                    Some(t) => Some(self.int(t)?).filter(|&r| r > 0),
                    None => None,
                };
                let spec = MlaSpec {
                    heads: self.int(heads)?,
                    q_lora_rank,
                    kv_lora_rank: self.int(kv_lora_rank)?,
                    qk_nope_head_dim: self.int(qk_nope_head_dim)?,
                    qk_rope_head_dim: self.int(qk_rope_head_dim)?,
                    v_head_dim: self.int(v_head_dim)?,
                    scale: self.float(scale)?,
                    weights: self.roles(weights)?,
                    rope_theta: self.float(theta)?,
                    rope_scaling: self.scaling(scaling, span)?,
                    norm_eps: self.float_or(norm_eps, 1e-6)?,
                    rope_interleave: match rope_interleave {
                        Some(t) => self.boolean(t)?,
                        None => true,
                    },
                };
                self.mla_roles(&spec, self.width(xv), span);
                self.expect_width(out, ov, self.width(xv), "MLA's input width");
                Op::Mla { x: xv, out: ov, layer: LayerId(self.layer.unwrap_or(0) as u32), spec }
            }
            OpItem::LinearAttention { x, out, kind, key_heads, value_heads, key_head_dim, value_head_dim, conv_kernel, weights, norm_eps } => {
                let (xv, ov) = (self.val(x)?, self.val(out)?);
                let spec = LinearAttentionSpec {
                    kind: *kind,
                    key_heads: self.int(key_heads)?,
                    value_heads: self.int(value_heads)?,
                    key_head_dim: self.int(key_head_dim)?,
                    value_head_dim: self.int(value_head_dim)?,
                    conv_kernel: self.int(conv_kernel)?,
                    weights: self.roles(weights)?,
                    norm_eps: self.float_or(norm_eps, 1e-6)?,
                };
                if spec.key_heads == 0 || !spec.value_heads.is_multiple_of(spec.key_heads) {
                    self.err(span, format!("{} value heads cannot share {} key heads evenly", spec.value_heads, spec.key_heads));
                } else if spec.kind == LinearAttentionKind::GatedDeltaNet {
                    self.deltanet_roles(&spec, self.width(xv), span);
                }
                self.expect_width(out, ov, self.width(xv), "the mixer's input width");
                Op::LinearAttention { x: xv, out: ov, layer: LayerId(self.layer.unwrap_or(0) as u32), spec }
            }
            OpItem::Block(_) | OpItem::If { .. } => return None,
        })
    }

    /// Reports unless an MLA op's weights are the roles it knows, in the shapes its geometry
    /// needs (so the runtime can rely on them): `q` or `q_a`, `q_a_norm`, `q_b` (as
    /// `q_lora_rank` says); `kv_a`, `kv_a_norm`, `kv_b`, `o`; optional biases `q_a_bias`,
    /// `kv_a_bias`, `o_bias`.
    fn mla_roles(&mut self, s: &MlaSpec, hidden: usize, span: Span) {
        let (h, dn, dr, dv, c) = (s.heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.kv_lora_rank);
        let mut want: Vec<(&str, Vec<usize>, bool)> = vec![
            ("kv_a", vec![c + dr, hidden], true),
            ("kv_a_norm", vec![c], true),
            ("kv_b", vec![h * (dn + dv), c], true),
            ("o", vec![hidden, h * dv], true),
            ("kv_a_bias", vec![c + dr], false),
            ("o_bias", vec![hidden], false),
        ];
        match s.q_lora_rank {
            Some(r) => want.extend([
                ("q_a", vec![r, hidden], true),
                ("q_a_norm", vec![r], true),
                ("q_b", vec![h * (dn + dr), r], true),
                ("q_a_bias", vec![r], false),
            ]),
            None => want.push(("q", vec![h * (dn + dr), hidden], true)),
        }
        for (role, w) in &s.weights {
            match want.iter().find(|(r, _, _)| r == role) {
                None => self.err(span, format!("MLA has no weight role `{role}` here (roles: {})", want.iter().map(|w| w.0).collect::<Vec<_>>().join(", "))),
                Some((_, shape, _)) if &w.shape != shape => self.err(span, format!("MLA weight `{role}` has shape {:?}, the geometry needs {shape:?}", w.shape)),
                Some(_) => {}
            }
        }
        for (role, _, required) in &want {
            if *required && !s.weights.iter().any(|(r, _)| r == role) {
                self.err(span, format!("MLA needs weight role `{role}`"));
            }
        }
        if dr % 2 != 0 || h == 0 || c == 0 {
            self.err(span, format!("MLA needs heads and a latent rank above 0 and an even rope head dim (heads {h}, kv_lora_rank {c}, qk_rope_head_dim {dr})"));
        }
    }

    /// Reports unless a Gated DeltaNet's weights are the roles it knows in the shapes its
    /// geometry needs: `in_proj_qkvz`, `in_proj_ba`, `conv1d` ([channels, 1, kernel]),
    /// `dt_bias`, `a_log`, `norm` ([value_head_dim]), `out_proj`.
    fn deltanet_roles(&mut self, s: &LinearAttentionSpec, hidden: usize, span: Span) {
        let (nk, nv, dk, dv, k) = (s.key_heads, s.value_heads, s.key_head_dim, s.value_head_dim, s.conv_kernel);
        let channels = 2 * nk * dk + nv * dv;
        let want: [(&str, Vec<usize>); 7] = [
            ("in_proj_qkvz", vec![2 * nk * dk + 2 * nv * dv, hidden]),
            ("in_proj_ba", vec![2 * nv, hidden]),
            ("conv1d", vec![channels, 1, k]),
            ("dt_bias", vec![nv]),
            ("a_log", vec![nv]),
            ("norm", vec![dv]),
            ("out_proj", vec![hidden, nv * dv]),
        ];
        for (role, w) in &s.weights {
            match want.iter().find(|(r, _)| r == role) {
                None => self.err(span, format!("Gated DeltaNet has no weight role `{role}` (roles: {})", want.iter().map(|w| w.0).collect::<Vec<_>>().join(", "))),
                Some((_, shape)) if &w.shape != shape => self.err(span, format!("Gated DeltaNet weight `{role}` has shape {:?}, the geometry needs {shape:?}", w.shape)),
                Some(_) => {}
            }
        }
        for (role, _) in &want {
            if !s.weights.iter().any(|(r, _)| r == role) {
                self.err(span, format!("Gated DeltaNet needs weight role `{role}`"));
            }
        }
        if k == 0 {
            self.err(span, "the convolution kernel must be at least 1 wide");
        }
    }

    fn roles(&mut self, weights: &crate::spec::de::Entries<Text, Text>) -> Option<Vec<(String, WeightRef)>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (role, w) in &weights.0 {
            match self.weight(w) {
                Some(w) => out.push((role.value.clone(), w)),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

fn top_k_span(op: &OpItem) -> Span {
    match op {
        OpItem::Route { top_k, .. } => top_k.span,
        _ => Span::default(),
    }
}
