//! Static checks of a spec, before any configuration is bound: every name an op uses is a
//! declared value, weight or block; every expression parses and has the type its place wants;
//! the required symbols exist; symbol defaults and blocks do not form cycles; the ops that keep
//! per-layer state (`layer_state`) stand in the layer body only.
//!
//! All errors are collected, each at the line and column of the offending text. This module
//! must not evaluate anything that needs a configuration.

use super::{GluSpec, OpItem, Spec, Text, REQUIRED_SYMBOLS};
use crate::diag::Diagnostics;
use crate::expr::Type;
use std::collections::BTreeSet;

/// What a string field of an op is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Value,
    Weight,
    Expr(Type),
}

/// The string fields of an op and their roles (structure items `Block`/`If` excluded).
pub fn op_fields(op: &OpItem) -> Vec<(&Text, Role)> {
    use Role::*;
    let int = Expr(Type::Int);
    let float = Expr(Type::Float);
    let mut f: Vec<(&Text, Role)> = Vec::new();
    fn glu<'a>(g: &'a GluSpec, f: &mut Vec<(&'a Text, Role)>) {
        match g {
            GluSpec::ClampedSwiGlu { limit, alpha } => {
                f.push((limit, Expr(Type::Float)));
                f.push((alpha, Expr(Type::Float)));
            }
            GluSpec::LimitedSwiGlu { limit } => f.push((limit, Expr(Type::Float))),
            GluSpec::SwiGlu | GluSpec::GeGlu => {}
        }
    }
    match op {
        OpItem::Embed { out, table, scale } => {
            f.extend([(out, Value), (table, Weight)]);
            f.extend(scale.iter().map(|s| (s, float)));
        }
        OpItem::RmsNorm { x, out, weight, eps, group, offset, scale } => {
            f.extend([(x, Value), (out, Value), (eps, float)]);
            f.extend(weight.iter().map(|s| (s, Weight)));
            f.extend(group.iter().map(|s| (s, int)));
            f.extend(offset.iter().map(|s| (s, float)));
            f.extend(scale.iter().map(|s| (s, float)));
        }
        OpItem::LayerNorm { x, out, weight, bias, eps } => {
            f.extend([(x, Value), (out, Value), (weight, Weight), (eps, float)]);
            f.extend(bias.iter().map(|s| (s, Weight)));
        }
        OpItem::Linear { x, out, weight, bias } => {
            f.extend([(x, Value), (out, Value), (weight, Weight)]);
            f.extend(bias.iter().map(|s| (s, Weight)));
        }
        OpItem::Rope { x, heads, head_dim, rotary_dim, theta, .. } => {
            f.extend([(x, Value), (heads, int), (head_dim, int), (theta, float)]);
            f.extend(rotary_dim.iter().map(|s| (s, int)));
        }
        OpItem::GroupedLinear { x, out, weight, groups } => {
            f.extend([(x, Value), (out, Value), (weight, Weight), (groups, int)]);
        }
        OpItem::HyperPre { x, out, mix, streams, fn_weight, base, scale, sinkhorn_iters, eps, norm_eps } => {
            f.extend([(x, Value), (out, Value), (streams, int), (fn_weight, Weight), (base, Weight), (scale, Weight)]);
            f.extend(mix.iter().map(|s| (s, Value)));
            f.extend(sinkhorn_iters.iter().map(|s| (s, int)));
            f.extend([(eps, float), (norm_eps, float)]);
        }
        OpItem::HyperPost { x, out, residual, mix, streams } => {
            f.extend([(x, Value), (out, Value), (streams, int)]);
            f.extend(residual.iter().chain(mix).map(|s| (s, Value)));
        }
        OpItem::Attention {
            q,
            k,
            v,
            out,
            heads,
            kv_heads,
            head_dim,
            v_head_dim,
            scale,
            window,
            sinks,
            value_scale,
            rel,
            rel_proj,
            compress_rate,
            compress_select,
        } => {
            f.extend(rel.iter().map(|s| (s, Value)));
            f.extend(rel_proj.iter().map(|s| (s, Weight)));
            f.extend(compress_rate.iter().map(|s| (s, int)));
            f.extend(compress_select.iter().map(|s| (s, Value)));
            f.extend([
                (q, Value),
                (k, Value),
                (v, Value),
                (out, Value),
                (heads, int),
                (kv_heads, int),
                (head_dim, int),
                (scale, float),
            ]);
            f.extend(v_head_dim.iter().map(|s| (s, int)));
            f.extend(window.iter().map(|s| (s, int)));
            f.extend(sinks.iter().map(|s| (s, Weight)));
            f.extend(value_scale.iter().map(|s| (s, float)));
        }
        OpItem::Act { x, out, .. } => f.extend([(x, Value), (out, Value)]),
        OpItem::Glu { gate, up, out, kind } => {
            f.extend([(gate, Value), (up, Value), (out, Value)]);
            glu(kind, &mut f);
        }
        OpItem::Add { a, b, out } | OpItem::Mul { a, b, out } | OpItem::Concat { a, b, out } => {
            f.extend([(a, Value), (b, Value), (out, Value)])
        }
        OpItem::Input { out } => f.push((out, Value)),
        OpItem::Route {
            logits,
            out,
            top_k,
            renormalize,
            correction_bias,
            groups,
            scale,
            shared,
            scale_by,
            hash,
            ..
        } => {
            f.extend(shared.iter().map(|s| (s, int)));
            f.extend(scale_by.iter().chain(hash).map(|s| (s, Weight)));
            f.extend([(logits, Value), (out, Value), (top_k, int), (renormalize, Expr(Type::Bool))]);
            f.extend(correction_bias.iter().map(|s| (s, Weight)));
            if let Some((a, b)) = groups {
                f.extend([(a, int), (b, int)]);
            }
            f.extend(scale.iter().map(|s| (s, float)));
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
            glu: g,
            gate_bias,
            up_bias,
            down_bias,
            shared,
            shared_gate,
            shared_up,
            shared_down,
        } => {
            f.extend(shared.iter().map(|s| (s, int)));
            f.extend(shared_gate.iter().chain(shared_up).chain(shared_down).map(|s| (s, Weight)));
            f.extend([
                (x, Value),
                (routing, Value),
                (out, Value),
                (experts, int),
                (ffn, int),
                (gate, Weight),
                (up, Weight),
                (down, Weight),
            ]);
            glu(g, &mut f);
            f.extend(gate_bias.iter().chain(up_bias).chain(down_bias).map(|s| (s, Weight)));
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
            norm_eps,
            rope_interleave,
            select,
            ..
        } => {
            f.extend(select.iter().map(|s| (s, Value)));
            f.extend(norm_eps.iter().map(|s| (s, float)));
            f.extend(rope_interleave.iter().map(|s| (s, Expr(Type::Bool))));
            f.extend([
                (x, Value),
                (out, Value),
                (heads, int),
                (kv_lora_rank, int),
                (qk_nope_head_dim, int),
                (qk_rope_head_dim, int),
                (v_head_dim, int),
                (scale, float),
                (theta, float),
            ]);
            f.extend(q_lora_rank.iter().map(|s| (s, int)));
            f.extend(weights.0.iter().map(|(_, w)| (w, Weight)));
        }
        OpItem::KvCompress {
            x,
            q,
            out,
            rate,
            head_dim,
            rope_dim,
            theta,
            overlap,
            eps,
            index_heads,
            index_head_dim,
            index_topk,
            weights,
            ..
        } => {
            f.extend([
                (x, Value),
                (rate, int),
                (head_dim, int),
                (rope_dim, int),
                (theta, float),
                (overlap, Expr(Type::Bool)),
                (eps, float),
            ]);
            f.extend(q.iter().chain(out.iter()).map(|s| (s, Value)));
            f.extend(index_heads.iter().chain(index_head_dim.iter()).chain(index_topk.iter()).map(|s| (s, int)));
            f.extend(weights.0.iter().map(|(_, w)| (w, Weight)));
        }
        OpItem::Indexer { x, q, out, heads, head_dim, rope_dim, topk, theta, eps, weights, .. } => {
            f.extend(eps.iter().map(|s| (s, float)));
            f.extend([
                (x, Value),
                (q, Value),
                (out, Value),
                (heads, int),
                (head_dim, int),
                (rope_dim, int),
                (topk, int),
                (theta, float),
            ]);
            f.extend(weights.0.iter().map(|(_, w)| (w, Weight)));
        }
        OpItem::LinearAttention {
            x,
            out,
            key_heads,
            value_heads,
            key_head_dim,
            value_head_dim,
            conv_kernel,
            weights,
            norm_eps,
            ..
        } => {
            f.extend(norm_eps.iter().map(|s| (s, float)));
            f.extend([
                (x, Value),
                (out, Value),
                (key_heads, int),
                (value_heads, int),
                (key_head_dim, int),
                (value_head_dim, int),
                (conv_kernel, int),
            ]);
            f.extend(weights.0.iter().map(|(_, w)| (w, Weight)));
        }
        OpItem::Block(_) | OpItem::If { .. } => {}
    }
    f
}

/// What an op keeps per layer, for the ops that keep something: the runtime indexes it by the
/// layer the op is in, so these ops belong in the layer body (the prologue and the epilogue run
/// outside any layer).
pub fn layer_state(op: &OpItem) -> Option<&'static str> {
    match op {
        OpItem::Attention { .. } => Some("its layer's KV cache"),
        OpItem::Mla { .. } => Some("its layer's latent cache"),
        OpItem::Indexer { .. } => Some("its layer's index-key cache"),
        OpItem::KvCompress { .. } => Some("its layer's compressed entries"),
        OpItem::LinearAttention { .. } => Some("its layer's recurrent state"),
        OpItem::RoutedExperts { .. } => Some("its layer's experts in the expert tier"),
        _ => None,
    }
}

/// The name of an op item as the spec writes it.
pub fn op_name(op: &OpItem) -> &'static str {
    match op {
        OpItem::Embed { .. } => "Embed",
        OpItem::Input { .. } => "Input",
        OpItem::Concat { .. } => "Concat",
        OpItem::RmsNorm { .. } => "RmsNorm",
        OpItem::LayerNorm { .. } => "LayerNorm",
        OpItem::Linear { .. } => "Linear",
        OpItem::Rope { .. } => "Rope",
        OpItem::GroupedLinear { .. } => "GroupedLinear",
        OpItem::HyperPre { .. } => "HyperPre",
        OpItem::HyperPost { .. } => "HyperPost",
        OpItem::Attention { .. } => "Attention",
        OpItem::Act { .. } => "Act",
        OpItem::Glu { .. } => "Glu",
        OpItem::Add { .. } => "Add",
        OpItem::Mul { .. } => "Mul",
        OpItem::Route { .. } => "Route",
        OpItem::RoutedExperts { .. } => "RoutedExperts",
        OpItem::Mla { .. } => "Mla",
        OpItem::Indexer { .. } => "Indexer",
        OpItem::KvCompress { .. } => "KvCompress",
        OpItem::LinearAttention { .. } => "LinearAttention",
        OpItem::Block(_) => "Block",
        OpItem::If { .. } => "If",
    }
}

/// Every static check; the errors found, none when the spec is sound.
pub fn check(spec: &Spec) -> Diagnostics {
    let mut d = Diagnostics::new();
    let file = &spec.file;
    let symbol_type = |name: &str, layer: bool| -> Option<Type> {
        match name {
            "gguf" | "hf" => Some(Type::Bool),
            "i" if layer => Some(Type::Int),
            _ => spec.symbol(name).map(|s| s.ty()),
        }
    };
    // An expression of the spec, checked against a wanted type.
    let expr = |t: &Text, want: Type, layer: bool, d: &mut Diagnostics| match spec.expr(t) {
        Err(e) => d.push(e),
        Ok(e) => match e.check(&|n| symbol_type(n, layer)) {
            Err(x) => d.push(spec.diag(x.span, x.message)),
            Ok(got) if !got.fits(want) => {
                d.push(spec.diag(t.span, format!("expected an expression of type {want}, this one is a {got}")))
            }
            Ok(_) => {}
        },
    };

    // 1. Names are unique within each table.
    for (what, names) in [
        ("symbol", file.symbols.0.iter().map(|(k, _)| k).collect::<Vec<_>>()),
        ("weight", file.weights.0.iter().map(|(k, _)| k).collect()),
        ("value", file.values.0.iter().map(|(k, _)| k).collect()),
        ("block", file.blocks.0.iter().map(|(k, _)| k).collect()),
    ] {
        let mut seen = BTreeSet::new();
        for k in names {
            if !seen.insert(k.value.as_str()) {
                d.push(spec.diag(k.span, format!("{what} `{}` is declared twice", k.value)));
            }
        }
    }
    // 2. Required symbols.
    for r in REQUIRED_SYMBOLS {
        if spec.symbol(r).is_none() {
            d.push(spec.diag(
                file.family.span,
                format!("the spec must declare symbol `{r}` (it becomes the program's dimensions)"),
            ));
        }
    }
    // 3. Symbols: sources name weights; defaults have the declared type; no cycles.
    for (name, s) in &file.symbols.0 {
        if matches!(name.value.as_str(), "i" | "gguf" | "hf") {
            d.push(spec.diag(name.span, format!("`{}` is a built-in name and cannot be declared", name.value)));
        }
        if let Some((w, _)) = &s.tensor {
            if spec.weight(&w.value).is_none() {
                d.push(spec.diag(w.span, format!("unknown weight `{}`", w.value)));
            }
        }
        if let Some(def) = &s.default {
            expr(def, s.ty(), false, &mut d);
        }
        if let Some(w) = &s.indices_of {
            if s.ty() != Type::IntList {
                d.push(spec.diag(
                    w.span,
                    format!("`indices_of` makes an IntList; symbol `{}` is declared {}", name.value, s.ty()),
                ));
            }
        }
        if let Some(w) = &s.equals {
            if s.ty() != Type::Bool {
                d.push(
                    spec.diag(w.span, format!("`equals` makes a Bool; symbol `{}` is declared {}", name.value, s.ty())),
                );
            }
        }
        if s.hf.is_empty() && s.gguf.is_empty() && s.tensor.is_none() && s.default.is_none() {
            d.push(spec.diag(
                name.span,
                format!("symbol `{}` has no source: give `hf`, `gguf`, `tensor` or `default`", name.value),
            ));
        }
    }
    for (name, _) in &file.symbols.0 {
        let mut path = vec![name.value.clone()];
        if let Some(cycle) = symbol_cycle(spec, &mut path) {
            d.push(spec.diag(name.span, format!("symbol defaults form a cycle: {}", cycle.join(" -> "))));
        }
    }
    // 4. Weights.
    for (name, w) in &file.weights.0 {
        if w.hf.is_none() && w.gguf.is_none() && w.tied.is_none() {
            d.push(
                spec.diag(name.span, format!("weight `{}` has no tensor name: give `hf` and/or `gguf`", name.value)),
            );
        }
        for s in &w.shape {
            expr(s, Type::Int, true, &mut d);
        }
        if let Some(r) = &w.rows {
            for e in [&r.groups, &r.stride, &r.offset, &r.take] {
                expr(e, Type::Int, true, &mut d);
            }
        }
        if let Some(t) = &w.tied {
            if spec.weight(&t.to.value).is_none() {
                d.push(spec.diag(t.to.span, format!("unknown weight `{}`", t.to.value)));
            }
            expr(&t.when, Type::Bool, true, &mut d);
        }
    }
    // 5. Values.
    for (_, width) in &file.values.0 {
        expr(width, Type::Int, false, &mut d);
    }
    if let Some(s) = &file.streams {
        expr(s, Type::Int, false, &mut d);
    }
    for v in [&file.residual, &file.logits] {
        if !file.values.0.iter().any(|(k, _)| k.value == v.value) {
            d.push(spec.diag(v.span, format!("unknown value `{}`", v.value)));
        }
    }
    // 6. Ops.
    let mut lists =
        vec![(&file.prologue, false, "prologue"), (&file.layer, true, "layer"), (&file.epilogue, false, "epilogue")];
    if let Some(draft) = &file.draft {
        expr(&draft.count, Type::Int, false, &mut d);
        expr(&draft.layer, Type::Int, false, &mut d);
        lists.extend([(&draft.prologue, false, "draft's prologue"), (&draft.epilogue, false, "draft's epilogue")]);
        let mut inputs = Vec::new();
        collect_items(&draft.prologue.0, false, &mut inputs);
        if inputs.iter().filter(|(i, _)| matches!(i.value, OpItem::Input { .. })).count() != 1 {
            d.push(spec.diag(draft.count.span, "a draft's prologue reads the target's rows through one `Input`"));
        }
        if draft.rename.iter().any(|(from, _)| from.is_empty()) {
            d.push(spec.diag(draft.count.span, "a draft's `rename` replaces an empty string"));
        }
    }
    let mut items: Vec<(&super::Spanned<OpItem>, bool)> = Vec::new();
    for (list, layer, part) in lists {
        let from = items.len();
        collect_items(&list.0, layer, &mut items);
        for (item, _) in &items[from..] {
            if matches!(item.value, OpItem::Input { .. }) && part != "draft's prologue" {
                d.push(spec.diag(item.span, format!("`Input` is for a draft's prologue, not the {part}")));
            }
        }
        if layer {
            continue;
        }
        for (item, _) in &items[from..] {
            if let Some(state) = layer_state(&item.value) {
                d.push(spec.diag(
                    item.span,
                    format!(
                        "`{}` keeps {state}, so it belongs in the layer body (or a block), not the {part}",
                        op_name(&item.value)
                    ),
                ));
            }
        }
    }
    for (_, list) in &file.blocks.0 {
        collect_items(&list.0, true, &mut items);
    }
    for (item, layer) in items {
        match &item.value {
            OpItem::Block(name) => {
                if spec.block(&name.value).is_none() {
                    d.push(spec.diag(name.span, format!("unknown block `{}`", name.value)));
                } else if !layer {
                    d.push(spec.diag(name.span, "`Block` is for layer bodies"));
                }
            }
            OpItem::If { cond, .. } => expr(cond, Type::Bool, layer, &mut d),
            op => {
                for (t, role) in op_fields(op) {
                    match role {
                        Role::Value if !file.values.0.iter().any(|(k, _)| k.value == t.value) => d.push(
                            spec.diag(t.span, format!("unknown value `{}` (declare it under `values`)", t.value)),
                        ),
                        Role::Weight if spec.weight(&t.value).is_none() => d.push(
                            spec.diag(t.span, format!("unknown weight `{}` (declare it under `weights`)", t.value)),
                        ),
                        Role::Expr(ty) => expr(t, ty, layer, &mut d),
                        _ => {}
                    }
                }
            }
        }
    }
    for (name, _) in &file.blocks.0 {
        let mut path = vec![name.value.clone()];
        if let Some(cycle) = block_cycle(spec, &mut path) {
            d.push(spec.diag(name.span, format!("blocks include each other: {}", cycle.join(" -> "))));
        }
    }
    d
}

/// Every item of `list`, `If` branches included (not `Block` contents).
fn collect_items<'a>(
    list: &'a [super::Spanned<OpItem>],
    layer: bool,
    out: &mut Vec<(&'a super::Spanned<OpItem>, bool)>,
) {
    for item in list {
        out.push((item, layer));
        if let OpItem::If { then, otherwise, .. } = &item.value {
            collect_items(&then.0, layer, out);
            collect_items(&otherwise.0, layer, out);
        }
    }
}

fn symbol_cycle(spec: &Spec, path: &mut Vec<String>) -> Option<Vec<String>> {
    let last = path.last()?.clone();
    let def = spec.symbol(&last)?.default.as_ref()?;
    let e = spec.expr(def).ok()?;
    for (s, _) in e.symbols() {
        if path[0] == s {
            let mut c = path.clone();
            c.push(s.to_string());
            return Some(c);
        }
        if path.iter().any(|p| p == s) {
            continue; // a cycle not through the start; reported from its own start
        }
        path.push(s.to_string());
        let r = symbol_cycle(spec, path);
        path.pop();
        if r.is_some() {
            return r;
        }
    }
    None
}

fn block_cycle(spec: &Spec, path: &mut Vec<String>) -> Option<Vec<String>> {
    let last = path.last()?.clone();
    let mut items = Vec::new();
    collect_items(&spec.block(&last)?.0, true, &mut items);
    for (item, _) in items {
        if let OpItem::Block(b) = &item.value {
            if path[0] == b.value {
                let mut c = path.clone();
                c.push(b.value.clone());
                return Some(c);
            }
            if path.contains(&b.value) {
                continue;
            }
            path.push(b.value.clone());
            let r = block_cycle(spec, path);
            path.pop();
            if r.is_some() {
                return r;
            }
        }
    }
    None
}
