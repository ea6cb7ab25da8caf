//! The text format of a program: one line per op, `v3 = linear v2 blk.{i}.attn_q.weight[..]`.
//! Consecutive layers whose ops differ only in the layer index are printed once, as a group
//! (`l1..l15`), with `{i}` in their tensor names. Plans embed this text; snapshots are made
//! of it.
//!
//! This module must not change a program; it only prints one.

use crate::ir::*;
use std::fmt::{self, Write};

pub(crate) fn w(r: &WeightRef) -> String {
    match r.rows {
        None => format!("{}{:?}", r.name, r.shape),
        Some(s) => format!("{}{:?}(rows {}x{}+{} of {})", r.name, r.shape, s.groups, s.take, s.offset, s.stride),
    }
}

fn ex(t: &ExpertTensor) -> String {
    match t {
        ExpertTensor::PerExpert { pattern, shape } => format!("{pattern}{shape:?}"),
        ExpertTensor::Stacked { name, shape, select: None } => format!("{name}{shape:?}"),
        ExpertTensor::Stacked { name, shape, select: Some(s) } => {
            format!("{name}{shape:?}(rows {}x{}+{} of {})", s.groups, s.take, s.offset, s.stride)
        }
        ExpertTensor::StackedInputMajor { name, shape, select } => match select {
            None => format!("{name}{shape:?}(input-major)"),
            Some(s) => {
                format!("{name}{shape:?}(input-major, rows {}x{}+{} of {})", s.groups, s.take, s.offset, s.stride)
            }
        },
    }
}

fn exb(b: &Option<ExpertBias>) -> String {
    match b {
        None => String::new(),
        Some(b) => match b.select {
            None => format!(" + {}{:?}", b.name, b.shape),
            Some(s) => format!(" + {}{:?}(rows {}x{}+{} of {})", b.name, b.shape, s.groups, s.take, s.offset, s.stride),
        },
    }
}

pub(crate) fn g(x: f32) -> String {
    // Shortest text that reads back as the same f32.
    format!("{x:?}")
}

/// One op as text.
pub fn op_text(op: &Op) -> String {
    match op {
        Op::Embed { out, table, scale } => format!("{out} = embed {}{}", w(table), if *scale != 1.0 { format!(" scale {}", g(*scale)) } else { String::new() }),
        Op::Input { out } => format!("{out} = input"),
        Op::Concat { a, b, out } => format!("{out} = concat {a} {b}"),
        Op::RmsNorm { x, out, weight, eps, group, offset, scale } => {
            let wt = weight.as_ref().map_or_else(|| "unweighted".to_string(), w);
            let mut s = format!("{out} = rms_norm {x} {wt} eps {}", g(*eps));
            let _ = write!(s, " group {group}");
            if *offset != 0.0 {
                let _ = write!(s, " offset {}", g(*offset));
            }
            if *scale != 1.0 {
                let _ = write!(s, " scale {}", g(*scale));
            }
            s
        }
        Op::LayerNorm { x, out, weight, bias, eps } => {
            format!("{out} = layer_norm {x} {}{} eps {}", w(weight), bias.as_ref().map(|b| format!(" + {}", w(b))).unwrap_or_default(), g(*eps))
        }
        Op::Linear { x, out, weight, bias } => format!("{out} = linear {x} {}{}", w(weight), bias.as_ref().map(|b| format!(" + {}", w(b))).unwrap_or_default()),
        Op::Rope { x, heads, head_dim, rotary_dim, style, theta, scaling, tail, inverse } => {
            format!(
                "{x} = rope {x} heads {heads}x{head_dim} rotary {rotary_dim}{}{} {style:?} theta {} scaling {scaling:?}",
                if *tail { " tail" } else { "" },
                if *inverse { " inverse" } else { "" },
                g(*theta)
            )
        }
        Op::GroupedLinear { x, out, weight, groups } => format!("{out} = grouped_linear {x} {} groups {groups}", w(weight)),
        Op::HyperPre { x, out, mix, spec } => {
            format!(
                "{out}{} = hyper_pre {x} streams {} fn {} base {} scale {} sinkhorn {} eps {} norm eps {}",
                mix.map_or(String::new(), |m| format!(", {m}")),
                spec.streams,
                w(&spec.fn_weight),
                w(&spec.base),
                w(&spec.scale),
                spec.sinkhorn_iters,
                g(spec.eps),
                g(spec.norm_eps)
            )
        }
        Op::HyperPost { x, residual, mix, out, streams } => match (residual, mix) {
            (Some(r), Some(m)) => format!("{out} = hyper_post {x} residual {r} mix {m} streams {streams}"),
            _ => format!("{out} = hyper_post {x} expand streams {streams}"),
        },
        Op::Attention { q, k, v, out, layer, spec } => {
            let mut s = format!(
                "{out} = attention {q} {k} {v} kv {layer} heads {} kv_heads {} head_dim {} v_head_dim {} scale {}",
                spec.heads,
                spec.kv_heads,
                spec.head_dim,
                spec.v_head_dim,
                g(spec.scale)
            );
            if let Some(win) = spec.window {
                let _ = write!(s, " window {win}");
            }
            if let Some(sk) = &spec.sinks {
                let _ = write!(s, " sinks {}", w(sk));
            }
            if spec.value_scale != 1.0 {
                let _ = write!(s, " value_scale {}", g(spec.value_scale));
            }
            if let Some(r) = &spec.rel {
                let _ = write!(s, " rel {} {} d_rel {} extent {}", r.r, w(&r.proj), r.d_rel, r.extent);
            }
            if let Some(c) = &spec.compressed {
                let _ = write!(s, " compressed rate {}", c.rate);
                if let Some(sel) = c.select {
                    let _ = write!(s, " select {sel}");
                }
            }
            s
        }
        Op::Act { x, out, act } => format!("{out} = act {act:?} {x}"),
        Op::Glu { gate, up, out, kind } => format!("{out} = glu {kind:?} {gate} {up}"),
        Op::Add { a, b, out } => format!("{out} = add {a} {b}"),
        Op::Mul { a, b, out } => format!("{out} = mul {a} {b}"),
        Op::Route {
            logits,
            out,
            scoring,
            top_k,
            renormalize,
            correction_bias,
            groups,
            group_score,
            scale,
            shared,
            scale_by,
            hash,
        } => {
            let mut s = format!("{out} = route {logits} {scoring:?} top {top_k}");
            if let Some(h) = hash {
                let _ = write!(s, " hash {}", w(h));
            }
            if *renormalize {
                s.push_str(" renormalize");
            }
            if let Some(b) = correction_bias {
                let _ = write!(s, " bias {}", w(b));
            }
            if let Some((n, t)) = groups {
                let _ = write!(s, " groups {n} top_groups {t}");
                if *group_score != GroupScore::TopTwoSum {
                    let _ = write!(s, " by {group_score:?}");
                }
            }
            if *scale != 1.0 {
                let _ = write!(s, " scale {}", g(*scale));
            }
            if let Some(b) = scale_by {
                let _ = write!(s, " scale_by {}", w(b));
            }
            if *shared > 0 {
                let _ = write!(s, " shared {shared}");
            }
            s
        }
        Op::RoutedExperts { x, routing, out, layer, experts, ffn, weights, glu } => format!(
            "{out} = routed_experts {x} {routing} {layer} experts {experts} ffn {ffn} {glu:?} gate {}{} up {}{} down {}{}{}",
            ex(&weights.gate),
            exb(&weights.gate_bias),
            ex(&weights.up),
            exb(&weights.up_bias),
            ex(&weights.down),
            exb(&weights.down_bias),
            weights.shared.as_ref().map_or(String::new(), |s| format!(
                " shared {} gate {} up {} down {}",
                s.count,
                ex(&s.gate),
                ex(&s.up),
                ex(&s.down)
            ))
        ),
        Op::Mla { x, out, layer, spec } => {
            let ws: Vec<String> = spec.weights.iter().map(|(r, x)| format!("{r} {}", w(x))).collect();
            format!(
                "{out} = mla {x} kv {layer} heads {} q_lora {:?} kv_lora {} nope {} rope {} v {} scale {} theta {} scaling {:?} {} norm eps {}{} [{}]",
                spec.heads,
                spec.q_lora_rank,
                spec.kv_lora_rank,
                spec.qk_nope_head_dim,
                spec.qk_rope_head_dim,
                spec.v_head_dim,
                g(spec.scale),
                g(spec.rope_theta),
                spec.rope_scaling,
                if spec.rope_interleave { "Interleaved" } else { "RotateHalf" },
                g(spec.norm_eps),
                spec.select.map_or(String::new(), |v| format!(" select {v}")),
                ws.join(", ")
            )
        }
        Op::Indexer { x, q, out, layer, spec } => {
            let ws: Vec<String> = spec.weights.iter().map(|(r, x)| format!("{r} {}", w(x))).collect();
            format!(
                "{out} = indexer {x} q {q} keys {layer} heads {}x{} rope {} {:?} topk {} theta {} scaling {:?} norm eps {} [{}]",
                spec.heads,
                spec.head_dim,
                spec.rope_dim,
                spec.rope_style,
                spec.topk,
                g(spec.rope_theta),
                spec.rope_scaling,
                g(spec.eps),
                ws.join(", ")
            )
        }
        Op::KvCompress { x, q, out, layer, spec } => {
            let ws: Vec<String> = spec.weights.iter().map(|(r, x)| format!("{r} {}", w(x))).collect();
            let mut s = match out {
                Some(o) => format!("{o} = kv_compress {x}"),
                None => format!("kv_compress {x}"),
            };
            if let Some(q) = q {
                let _ = write!(s, " q {q}");
            }
            let _ = write!(
                s,
                " entries {layer} rate {} head_dim {} rope {} theta {} scaling {:?}{} eps {}",
                spec.rate,
                spec.head_dim,
                spec.rope_dim,
                g(spec.rope_theta),
                spec.rope_scaling,
                if spec.overlap { " overlap" } else { "" },
                g(spec.eps)
            );
            if let Some(i) = &spec.index {
                let _ = write!(s, " index {}x{} topk {}", i.heads, i.head_dim, i.topk);
            }
            let _ = write!(s, " [{}]", ws.join(", "));
            s
        }
        Op::LinearAttention { x, out, layer, spec } => {
            let ws: Vec<String> = spec.weights.iter().map(|(r, x)| format!("{r} {}", w(x))).collect();
            format!(
                "{out} = linear_attention {:?} {x} state {layer} key_heads {}x{} value_heads {}x{} conv {} norm eps {} [{}]",
                spec.kind,
                spec.key_heads,
                spec.key_head_dim,
                spec.value_heads,
                spec.value_head_dim,
                spec.conv_kernel,
                g(spec.norm_eps),
                ws.join(", ")
            )
        }
    }
}

/// A layer's ops as text with the layer index written `{i}` in tensor names and ids (`general`);
/// a program of one layer (a draft's, whose tensor names carry another index or none) prints its
/// names as they are.
fn layer_lines(layer: &Layer, general: bool) -> Vec<String> {
    let i = layer.id.0;
    layer
        .ops
        .iter()
        .map(|op| match general {
            true => op_text(op)
                .replace(&format!(".{i}."), ".{i}.")
                .replace(&format!(" l{i} "), " l{i} ")
                .replace(&format!(" l{i}"), " l{i}"),
            false => op_text(op),
        })
        .collect()
}

/// `l0..l2, l4, l6..l9`: sorted layer indices as ranges.
pub fn layer_ranges(ids: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { format!("l{}", ids[i]) } else { format!("l{}..l{}", ids[i], ids[j]) });
        i = j + 1;
    }
    parts.join(", ")
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.dims;
        write!(
            f,
            "program {}: hidden {}, vocab {}, layers {}, max_context {}",
            self.family, d.hidden, d.vocab, d.layers, d.max_context
        )?;
        if d.streams != 1 {
            write!(f, ", streams {}", d.streams)?;
        }
        writeln!(f)?;
        write!(f, "values:")?;
        for (i, v) in self.values.iter().enumerate() {
            write!(f, " v{i} {}[{}]", v.name, v.width)?;
        }
        writeln!(f)?;
        writeln!(f, "residual {}, logits {}", self.residual, self.logits)?;
        writeln!(f, "prologue:")?;
        for op in &self.prologue {
            writeln!(f, "  {}", op_text(op))?;
        }
        // Layers with the same ops (up to the layer index) print once, with the list of them.
        let mut groups: Vec<(Vec<String>, Vec<u32>, &Layer)> = Vec::new();
        for l in &self.layers {
            let lines = layer_lines(l, self.layers.len() > 1);
            match groups.iter_mut().find(|(g, _, first)| *g == lines && first.mixer == l.mixer && first.ffn == l.ffn) {
                Some((_, ids, _)) => ids.push(l.id.0),
                None => groups.push((lines, vec![l.id.0], l)),
            }
        }
        for (lines, ids, first) in groups {
            writeln!(f, "{} ({:?}, {:?}):", layer_ranges(&ids), first.mixer, first.ffn)?;
            for l in lines {
                writeln!(f, "  {l}")?;
            }
        }
        writeln!(f, "epilogue:")?;
        for op in &self.epilogue {
            writeln!(f, "  {}", op_text(op))?;
        }
        Ok(())
    }
}
