//! Data flow in program order: what the runtime assumes of the values its ops read.
//!
//! The runtime runs the prologue, each layer in turn, then the epilogue, over row buffers that
//! hold nothing until an op writes them. So, as ops are lowered in that order: every value an op
//! reads was written by an earlier op (a layer may read what an earlier layer wrote); the
//! residual is written before the epilogue; the epilogue, which runs on the rows whose logits
//! are wanted only (the last row, in decoding), reads from before it the residual alone, and
//! writes the logits. A layer keeps one mixer state (a KV cache, a latent cache or a recurrent
//! state: one `Attention`, `Mla` or `LinearAttention`) and one set of routed experts (the expert
//! tier keys experts by layer). Each breach is a diagnostic at the field that names the value,
//! or at the op.
//! This module must not evaluate expressions or resolve weights.

use crate::diag::Span;
use crate::ir::{op_io, Op, ValueId, ValueInfo};
use crate::spec::check::{op_fields, op_name, Role};
use crate::spec::OpItem;
use std::collections::{BTreeMap, BTreeSet};

/// The values written so far.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    written: BTreeSet<ValueId>,
    /// Once the epilogue is being lowered: the residual and what the epilogue wrote so far.
    epilogue: Option<(ValueId, BTreeSet<ValueId>)>,
    /// The layer's op with mixer state and its op with routed experts, once met.
    mixer: Option<&'static str>,
    experts: bool,
}

impl Flow {
    /// From here on, ops are a new layer's.
    pub(super) fn enter_layer(&mut self) {
        self.mixer = None;
        self.experts = false;
    }

    /// From here on, ops are the epilogue's.
    pub(super) fn enter_epilogue(&mut self, residual: ValueId) {
        self.epilogue = Some((residual, BTreeSet::new()));
    }

    pub(super) fn written(&self, v: ValueId) -> bool {
        self.written.contains(&v)
    }

    pub(super) fn written_in_epilogue(&self, v: ValueId) -> bool {
        self.epilogue.as_ref().is_some_and(|(_, w)| w.contains(&v))
    }

    fn write(&mut self, v: ValueId) {
        self.written.insert(v);
        if let Some((_, w)) = &mut self.epilogue {
            w.insert(v);
        }
    }
}

/// The span of the field of `item` that names value `name`.
fn value_field(item: &OpItem, name: &str) -> Span {
    op_fields(item)
        .into_iter()
        .find(|(t, r)| *r == Role::Value && t.value == name)
        .map(|(t, _)| t.span)
        .unwrap_or_default()
}

impl Flow {
    /// Checks what lowered op `op` (from `item`, at `span`; a layer's when `in_layer`) reads
    /// against what was written before it, then notes what it writes. Returns the breaches in
    /// order, each at its span; `values` names the values.
    pub(super) fn follow(
        &mut self,
        item: &OpItem,
        span: Span,
        op: &Op,
        in_layer: bool,
        values: &[ValueInfo],
    ) -> Vec<(Span, String)> {
        let mut errs = Vec::new();
        if in_layer {
            match op {
                // A short convolution keeps rows of its input, by its weight, beside the mixer's.
                Op::LinearAttention { spec, .. } if spec.kind == crate::ir::LinearAttentionKind::ShortConv => {}
                Op::Attention { .. } | Op::Mla { .. } | Op::LinearAttention { .. } => {
                    if let Some(first) = self.mixer {
                        let m = format!(
                            "a layer keeps one mixer state (a KV cache, a latent cache or a recurrent state); this `{}` would be its second, after `{first}`",
                            op_name(item)
                        );
                        errs.push((span, m));
                    }
                    self.mixer = Some(op_name(item));
                }
                Op::RoutedExperts { .. } => {
                    if self.experts {
                        errs.push((
                            span,
                            "a layer has one set of routed experts (the expert tier keys them by layer); this `RoutedExperts` would be its second".into(),
                        ));
                    }
                    self.experts = true;
                }
                _ => {}
            }
        }
        let name_of = |v: ValueId| values.get(v.0 as usize).map(|x| x.name.clone()).unwrap_or_default();
        let (reads, writes) = op_io(op);
        for v in reads {
            let name = name_of(v);
            if !self.written(v) {
                errs.push((value_field(item, &name), format!("value `{name}` is read before any op writes it")));
                // Reported once, at its first read.
                self.write(v);
                continue;
            }
            if let Some((residual, wrote)) = &self.epilogue {
                if v != *residual && !wrote.contains(&v) {
                    let r = name_of(*residual);
                    errs.push((
                        value_field(item, &name),
                        format!(
                            "the epilogue runs on the last row only, so from before it it reads only the residual `{r}`; `{name}` is written before it"
                        ),
                    ));
                }
            }
        }
        for v in writes {
            self.write(v);
        }
        errs
    }

    /// An op that did not lower (its errors are reported): the values it names as outputs count
    /// as written (`ids`: the values by name), so that their readers are not reported as well.
    pub(super) fn follow_failed(&mut self, item: &OpItem, ids: &BTreeMap<String, ValueId>) {
        for (t, role) in op_fields(item) {
            if role == Role::Value {
                if let Some(v) = ids.get(&t.value).copied() {
                    self.write(v);
                }
            }
        }
    }
}
