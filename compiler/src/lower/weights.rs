//! The weight side of lowering: a weight name resolved for the checkpoint's naming scheme
//! (following `tied`: the other weight when `when` holds, or when the tensor is absent and no
//! configuration key says it is untied), its shape checked against the tensor table,
//! routed-expert tensors and their biases, and the weight roles of the fused ops (MLA, Gated DeltaNet) checked against
//! the geometry the runtime relies on. Must not: decide widths of values (that is `program`).

use super::program::{has_e, Lowerer};
use super::symbols::Origin;
use crate::bind::Naming;
use crate::cost::Format;
use crate::diag::Span;
use crate::ir::*;
use crate::spec::{GluSpec, ScalingSpec, Text};

impl<'a> Lowerer<'a> {
    pub(super) fn scheme(&self) -> &'static str {
        match self.b.naming {
            Naming::Hf => "HF",
            Naming::Gguf => "GGUF",
        }
    }

    /// The pattern of weight `name` for this checkpoint's naming scheme.
    pub(super) fn pattern(&self, name: &str) -> Option<&'a Text> {
        let def = self.spec.weight(name)?;
        match self.b.naming {
            Naming::Hf => def.hf.as_ref(),
            Naming::Gguf => def.gguf.as_ref(),
        }
    }

    /// The checkpoint's name of a tensor of `pattern` at `layer`: a draft's `rename` first
    /// (while the draft is lowered), then `{i}`, `{arch}` and a wrapper's prefix.
    fn tensor_name(&self, pattern: &str, layer: usize) -> String {
        let mut name = pattern.to_string();
        if let (Some(draft), Some(_)) = (&self.spec.file.draft, self.draft_i) {
            for (from, to) in &draft.rename {
                name = name.replace(from.as_str(), to);
            }
        }
        self.syms.tensor_name(&name, layer)
    }

    /// Resolves weight `t` (following `tied`), checking it against the checkpoint.
    pub(super) fn weight(&mut self, t: &Text) -> Option<WeightRef> {
        let (name, shape, pattern, rows) = self.weight_def(&t.value, t.span, 0)?;
        if has_e(&name) {
            self.err(
                t.span,
                format!("weight `{}` is per expert (`{{e}}` in its name); only `RoutedExperts` can read it", t.value),
            );
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
    pub(super) fn expert_bias(&mut self, t: &Text, experts: usize, width: usize) -> Option<ExpertBias> {
        let (name, shape, pattern, select) = self.weight_def(&t.value, t.span, 0)?;
        if has_e(&name) {
            self.err(
                t.span,
                format!(
                    "expert bias `{}` must be one stacked [experts, width] tensor (no `{{e}}` in its name)",
                    t.value
                ),
            );
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
    pub(super) fn weight_def(
        &mut self,
        name: &str,
        span: Span,
        depth: usize,
    ) -> Option<(String, Vec<usize>, &'a Text, Option<RowSelect>)> {
        let def = self.spec.weight(name)?;
        if depth > 4 {
            self.err(span, format!("weight `{name}` is tied in a cycle"));
            return None;
        }
        let shape = def.shape.iter().map(|s| self.int(s)).collect::<Option<Vec<_>>>()?;
        let pattern = self.pattern(name);
        let layer = self.index_i().unwrap_or(0);
        if let Some(tied) = &def.tied {
            let when = self.boolean(&tied.when)?;
            let absent = match (pattern, &self.b.tensors) {
                (None, _) => true,
                (Some(p), Some(t)) => !t.contains_key(&self.tensor_name(&p.value, layer)),
                (Some(_), None) => false,
            };
            if !when && absent {
                // A tensor that is absent is read as tied only when the configuration does not
                // say otherwise (GGUF files drop `output.weight` for a tied head and have no key
                // for it); a configuration that says untied while the tensor is absent is an error.
                if let (Some(p), Some(key)) = (pattern, self.stated_by_config(&tied.when)) {
                    let tname = self.tensor_name(&p.value, layer);
                    let src = self.b.source.display().to_string();
                    self.err(
                        p.span,
                        format!(
                            "tensor `{tname}` is not in the checkpoint {src}, and weight `{name}` is not tied to `{}` (`{}` is false, from configuration key `{key}`)",
                            tied.to.value, tied.when.value
                        ),
                    );
                    return None;
                }
            }
            if when || absent {
                return self.weight_def(&tied.to.value, tied.to.span, depth + 1);
            }
        }
        let Some(p) = pattern else {
            let scheme = self.scheme();
            let key =
                self.spec.file.weights.0.iter().find(|(k, _)| k.value == name).map(|(k, _)| k.span).unwrap_or(span);
            self.err(
                key,
                format!("weight `{name}` has no {scheme} tensor name, and this checkpoint uses {scheme} names"),
            );
            return None;
        };
        let rows = match &def.rows {
            None => None,
            Some(r) => {
                let sel = RowSelect {
                    groups: self.int(&r.groups)?,
                    stride: self.int(&r.stride)?,
                    offset: self.int(&r.offset)?,
                    take: self.int(&r.take)?,
                };
                let (rows, end) = (sel.groups.checked_mul(sel.take), sel.offset.checked_add(sel.take));
                if rows.is_none() || shape.first() != rows.as_ref() || end.is_none_or(|e| e > sel.stride) {
                    self.err(r.groups.span, format!("rows {sel:?} do not fit: the shape's first dimension must be groups x take and offset + take at most stride"));
                    return None;
                }
                Some(sel)
            }
        };
        Some((self.tensor_name(&p.value, layer), shape, p, rows))
    }

    /// The configuration key of the first symbol of expression `t` that the configuration gave.
    fn stated_by_config(&self, t: &Text) -> Option<String> {
        let e = self.spec.expr(t).ok()?;
        e.symbols().into_iter().find_map(|(s, _)| match self.syms.origin(s) {
            Some(Origin::Config(k)) => Some(k),
            _ => None,
        })
    }

    /// Whether the checkpoint stores tensor `name` in a block format (not F32, F16 or BF16):
    /// MXFP4 from safetensors `_blocks`, GGUF's quantized types.
    fn stored_in_blocks(&self, name: &str) -> bool {
        let Some(t) = self.b.tensors.as_ref().and_then(|t| t.get(name)) else { return false };
        !matches!(Format::from_dtype(&t.dtype), None | Some(Format::F32 | Format::F16 | Format::Bf16))
    }

    pub(super) fn check_tensor(&mut self, name: &str, want: &[usize], span: Span) {
        let Some(tensors) = &self.b.tensors else { return };
        match tensors.get(name) {
            None => {
                let src = self.b.source.display().to_string();
                self.err(span, format!("tensor `{name}` is not in the checkpoint {src}"));
            }
            Some(t) if t.shape != want => {
                let got = t.shape.clone();
                self.err(
                    span,
                    format!("tensor `{name}` has shape {got:?} in the checkpoint, the spec expects {want:?}"),
                );
            }
            Some(_) => {}
        }
    }

    /// An expert matrix: per-expert (`{e}` in the name) or stacked `[experts, rows, cols]`.
    pub(super) fn expert(&mut self, t: &Text, experts: usize, rows: usize, cols: usize) -> Option<ExpertTensor> {
        let (name, shape, pattern, sel) = self.weight_def(&t.value, t.span, 0)?;
        if shape != [rows, cols] {
            self.err(
                t.span,
                format!("expert weight `{}` has shape {shape:?}, the experts need [{rows}, {cols}]", t.value),
            );
        }
        if self.spec.weight(&t.value).is_some_and(|d| d.input_major) {
            if has_e(&name) {
                self.err(
                    t.span,
                    format!(
                        "input-major expert weight `{}` must be one stacked tensor (no `{{e}}` in its name)",
                        t.value
                    ),
                );
                return None;
            }
            let e = ExpertTensor::StackedInputMajor { name, shape: vec![experts, rows, cols], select: sel };
            if let ExpertTensor::StackedInputMajor { name, .. } = &e {
                // A block format's rows run along the input, so its tensor is out-major.
                let want = if self.stored_in_blocks(name) { e.out_major_shape() } else { e.tensor_shape() };
                self.check_tensor(name, &want, pattern.span);
            }
            return Some(e);
        }
        if sel.is_some() && has_e(&name) {
            self.err(t.span, "expert weights select rows only when stacked (no `{e}` in the name)");
            return None;
        }
        if has_e(&name) {
            if let Some(tensors) = &self.b.tensors {
                let bad: Vec<usize> = (0..experts)
                    .filter(|e| {
                        tensors.get(&name.replace("{e}", &e.to_string())).map(|x| x.shape != shape).unwrap_or(true)
                    })
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
            let e = ExpertTensor::Stacked { name, shape: vec![experts, shape[0], shape[1]], select: sel };
            if let ExpertTensor::Stacked { name, .. } = &e {
                self.check_tensor(name, &e.tensor_shape(), pattern.span);
            }
            Some(e)
        }
    }

    pub(super) fn glu(&mut self, g: &GluSpec) -> Option<GluKind> {
        Some(match g {
            GluSpec::SwiGlu => GluKind::SwiGlu,
            GluSpec::GeGlu => GluKind::GeGlu,
            GluSpec::ClampedSwiGlu { limit, alpha } => {
                let limit = self.positive(limit, "the SwiGLU clamp limit");
                GluKind::ClampedSwiGlu { limit: limit?, alpha: self.scale(alpha)? }
            }
            GluSpec::LimitedSwiGlu { limit } => {
                GluKind::LimitedSwiGlu { limit: self.positive(limit, "the SwiGLU clamp limit")? }
            }
        })
    }

    pub(super) fn scaling(&mut self, s: &ScalingSpec, span: Span) -> Option<RopeScaling> {
        match s {
            ScalingSpec::None => Some(RopeScaling::None),
            ScalingSpec::NoPe => Some(RopeScaling::NoPe),
            ScalingSpec::ByNaming { hf, gguf } => match self.b.naming {
                Naming::Hf => self.scaling(hf, span),
                Naming::Gguf => self.scaling(gguf, span),
            },
            ScalingSpec::FrequenciesOnly(inner) => self.scaling(inner, span).map(|mut r| {
                if let RopeScaling::Yarn { attention_factor, .. } = &mut r {
                    *attention_factor = 1.0;
                }
                r
            }),
            ScalingSpec::FromConfig | ScalingSpec::FromConfigAt(_) => {
                let at = match s {
                    ScalingSpec::FromConfigAt(key) => Some(key.as_str()),
                    _ => None,
                };
                match self.syms.rope_scaling(at) {
                    Ok(r) => Some(r),
                    Err(m) => {
                        self.err(span, m);
                        None
                    }
                }
            }
        }
    }

    /// Reports unless an MLA op's weights are the roles it knows, in the shapes its geometry
    /// needs (so the runtime can rely on them): `q` or `q_a`, `q_a_norm`, `q_b` (as
    /// `q_lora_rank` says); `kv_a`, `kv_a_norm`, `kv_b`, `o`; optional biases `q_a_bias`,
    /// `kv_a_bias`, `o_bias`.
    pub(super) fn mla_roles(&mut self, s: &MlaSpec, hidden: usize, span: Span) {
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
                None => self.err(
                    span,
                    format!(
                        "MLA has no weight role `{role}` here (roles: {})",
                        want.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some((_, shape, _)) if &w.shape != shape => {
                    self.err(span, format!("MLA weight `{role}` has shape {:?}, the geometry needs {shape:?}", w.shape))
                }
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

    /// Reports unless `weights` are exactly the roles of `want`, each in its shape (`what` names
    /// the op in the messages).
    fn exact_roles(&mut self, what: &str, weights: &[(String, WeightRef)], want: &[(&str, Vec<usize>)], span: Span) {
        for (role, w) in weights {
            match want.iter().find(|(r, _)| r == role) {
                None => self.err(
                    span,
                    format!(
                        "the {what} has no weight role `{role}` here (roles: {})",
                        want.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some((_, shape)) if &w.shape != shape => self
                    .err(span, format!("{what} weight `{role}` has shape {:?}, the geometry needs {shape:?}", w.shape)),
                Some(_) => {}
            }
        }
        for (role, _) in want {
            if !weights.iter().any(|(r, _)| r == role) {
                self.err(span, format!("the {what} needs weight role `{role}`"));
            }
        }
    }

    /// Reports unless a compressor's weights are the roles it knows in the shapes its geometry
    /// needs (`ir::CompressSpec`), its rope part is even and within an entry, and its window and
    /// top-k are above 0.
    pub(super) fn compress_roles(&mut self, s: &CompressSpec, (hidden, q_width): (usize, Option<usize>), span: Span) {
        let w = if s.overlap { 2 } else { 1 };
        let mut want: Vec<(&str, Vec<usize>)> = vec![
            ("kv", vec![w * s.head_dim, hidden]),
            ("gate", vec![w * s.head_dim, hidden]),
            ("ape", vec![s.rate, w * s.head_dim]),
            ("norm", vec![s.head_dim]),
        ];
        let mut dims = vec![s.head_dim];
        if let (Some(i), Some(q_width)) = (s.index, q_width) {
            dims.push(i.head_dim);
            want.extend([
                ("index_kv", vec![w * i.head_dim, hidden]),
                ("index_gate", vec![w * i.head_dim, hidden]),
                ("index_ape", vec![s.rate, w * i.head_dim]),
                ("index_norm", vec![i.head_dim]),
                ("index_q_b", vec![i.heads * i.head_dim, q_width]),
                ("index_w", vec![i.heads, hidden]),
            ]);
            if i.topk == 0 || i.heads == 0 {
                self.err(span, "the compressor's indexer needs heads and a top-k above 0");
            }
        }
        self.exact_roles("compressor", &s.weights, &want, span);
        if s.rate == 0 || !s.rope_dim.is_multiple_of(2) || dims.iter().any(|&d| d == 0 || s.rope_dim > d) {
            self.err(span, format!("the compressor needs a window above 0 and an even rope part within its entries (rate {}, rope {}, entries {dims:?})", s.rate, s.rope_dim));
        }
    }

    /// Reports unless an indexer's weights are the roles it knows in the shapes its geometry
    /// needs: `q_b` ([heads x head_dim, the query latent's width]), `k` ([head_dim, hidden]),
    /// `k_norm` and `k_norm_bias` ([head_dim]), `w` ([heads, hidden]); and unless its rope part
    /// is even, within a head, and its top-k above 0.
    pub(super) fn indexer_roles(&mut self, s: &IndexerSpec, (hidden, q_width): (usize, usize), span: Span) {
        let (h, d) = (s.heads, s.head_dim);
        let want: [(&str, Vec<usize>); 5] = [
            ("q_b", vec![h * d, q_width]),
            ("k", vec![d, hidden]),
            ("k_norm", vec![d]),
            ("k_norm_bias", vec![d]),
            ("w", vec![h, hidden]),
        ];
        self.exact_roles("indexer", &s.weights, &want, span);
        if h == 0 || d == 0 || s.topk == 0 || !s.rope_dim.is_multiple_of(2) || s.rope_dim > d {
            self.err(span, format!("the indexer needs heads, a head dim and a top-k above 0 and an even rope part within the head (heads {h}, head_dim {d}, rope_dim {}, topk {})", s.rope_dim, s.topk));
        }
    }

    /// Reports unless a Gated DeltaNet's weights are the roles it knows in the shapes its
    /// geometry needs: the input projections as Qwen3-Next groups them (`in_proj_qkvz`,
    /// `in_proj_ba`) or as Qwen3.5 keeps them apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`,
    /// `in_proj_a`), one set and not both; `conv1d` ([channels, 1, kernel]), `dt_bias`,
    /// `a_log`, `norm` ([value_head_dim]), `out_proj`.
    pub(super) fn deltanet_roles(&mut self, s: &LinearAttentionSpec, hidden: usize, span: Span) {
        let (nk, nv, dk, dv, k) = (s.key_heads, s.value_heads, s.key_head_dim, s.value_head_dim, s.conv_kernel);
        let channels = 2 * nk * dk + nv * dv;
        let split = s.projections_apart();
        let proj: Vec<(&str, Vec<usize>)> = if split {
            vec![
                ("in_proj_qkv", vec![channels, hidden]),
                ("in_proj_z", vec![nv * dv, hidden]),
                ("in_proj_b", vec![nv, hidden]),
                ("in_proj_a", vec![nv, hidden]),
            ]
        } else {
            vec![("in_proj_qkvz", vec![2 * nk * dk + 2 * nv * dv, hidden]), ("in_proj_ba", vec![2 * nv, hidden])]
        };
        let rest: [(&str, Vec<usize>); 5] = [
            ("conv1d", vec![channels, 1, k]),
            ("dt_bias", vec![nv]),
            ("a_log", vec![nv]),
            ("norm", vec![dv]),
            ("out_proj", vec![hidden, nv * dv]),
        ];
        let want: Vec<(&str, Vec<usize>)> = proj.into_iter().chain(rest).collect();
        self.mixer_roles("Gated DeltaNet", &want, &s.weights, span);
        if k == 0 {
            self.err(span, "the convolution kernel must be at least 1 wide");
        }
    }

    /// Reports unless Kimi Delta Attention's weights are the roles it knows in the shapes its
    /// geometry needs (as many key as value heads, of one width `d`; `hd = heads * d`):
    /// `q_proj`, `k_proj`, `v_proj` ([hd, hidden]); one short convolution each, `q_conv`,
    /// `k_conv`, `v_conv` ([hd, 1, kernel]); the forget gate `f_a` ([d, hidden]), `f_b`
    /// ([hd, d]), `dt_bias` ([hd]), `a_log` ([1, 1, heads, 1] as transformers stores it, or
    /// [heads]); `b_proj` ([heads, hidden]); the output gate `g_a` ([d, hidden]), `g_b`
    /// ([hd, d]); `norm` ([d]); `out_proj` ([hidden, hd]).
    pub(super) fn kda_roles(&mut self, s: &LinearAttentionSpec, hidden: usize, span: Span) {
        let (h, d, k) = (s.value_heads, s.value_head_dim, s.conv_kernel);
        if s.key_heads != h || s.key_head_dim != d {
            self.err(
                span,
                format!(
                    "Kimi Delta Attention has as many key as value heads of one width: {} x {} keys, {h} x {d} values",
                    s.key_heads, s.key_head_dim
                ),
            );
            return;
        }
        let hd = h * d;
        let a_log = match s.weights.iter().find(|(r, _)| r == "a_log") {
            Some((_, w)) if w.shape.len() == 1 => vec![h],
            _ => vec![1, 1, h, 1],
        };
        let want: Vec<(&str, Vec<usize>)> = vec![
            ("q_proj", vec![hd, hidden]),
            ("k_proj", vec![hd, hidden]),
            ("v_proj", vec![hd, hidden]),
            ("q_conv", vec![hd, 1, k]),
            ("k_conv", vec![hd, 1, k]),
            ("v_conv", vec![hd, 1, k]),
            ("f_a", vec![d, hidden]),
            ("f_b", vec![hd, d]),
            ("dt_bias", vec![hd]),
            ("a_log", a_log),
            ("b_proj", vec![h, hidden]),
            ("g_a", vec![d, hidden]),
            ("g_b", vec![hd, d]),
            ("norm", vec![d]),
            ("out_proj", vec![hidden, hd]),
        ];
        self.mixer_roles("Kimi Delta Attention", &want, &s.weights, span);
        if k == 0 {
            self.err(span, "the convolution kernel must be at least 1 wide");
        }
    }

    /// A short convolution (`LinearAttentionKind::ShortConv`): one head as wide as its input,
    /// role `conv1d` `[channels, 1, kernel]`, `input_scale` `[1]` where there is one.
    pub(super) fn short_conv_roles(&mut self, s: &LinearAttentionSpec, width: usize, span: Span) {
        let one_head = s.key_heads == 1 && s.value_heads == 1 && s.value_head_dim == s.key_head_dim;
        if !one_head || s.key_head_dim != width {
            self.err(
                span,
                format!(
                    "a short convolution is one head as wide as its input ({width}): {} x {} keys, {} x {} values",
                    s.key_heads, s.key_head_dim, s.value_heads, s.value_head_dim
                ),
            );
            return;
        }
        let mut want: Vec<(&str, Vec<usize>)> = vec![("conv1d", vec![width, 1, s.conv_kernel])];
        if s.weights.iter().any(|(r, _)| r == "input_scale") {
            want.push(("input_scale", vec![1]));
        }
        self.mixer_roles("a short convolution", &want, &s.weights, span);
        if s.conv_kernel == 0 {
            self.err(span, "the convolution kernel must be at least 1 wide");
        }
    }

    /// Reports each role of `weights` that `want` lacks or whose shape differs, and each role
    /// of `want` that `weights` lacks.
    fn mixer_roles(&mut self, mixer: &str, want: &[(&str, Vec<usize>)], weights: &[(String, WeightRef)], span: Span) {
        for (role, w) in weights {
            match want.iter().find(|(r, _)| r == role) {
                None => self.err(
                    span,
                    format!(
                        "{mixer} has no weight role `{role}` beside `{}` (roles: {})",
                        want[0].0,
                        want.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some((_, shape)) if &w.shape != shape => self.err(
                    span,
                    format!("{mixer} weight `{role}` has shape {:?}, the geometry needs {shape:?}", w.shape),
                ),
                Some(_) => {}
            }
        }
        for (role, _) in want {
            if !weights.iter().any(|(r, _)| r == role) {
                self.err(span, format!("{mixer} needs weight role `{role}`"));
            }
        }
    }

    /// Whether weight `t` is switched off here: its `when` is false.
    pub(super) fn weight_off(&mut self, t: &Text) -> bool {
        match self.spec.weight(&t.value).and_then(|d| d.when.as_ref()) {
            Some(cond) => self.boolean(cond) == Some(false),
            None => false,
        }
    }

    pub(super) fn roles(&mut self, weights: &crate::spec::de::Entries<Text, Text>) -> Option<Vec<(String, WeightRef)>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (role, w) in &weights.0 {
            if self.weight_off(w) {
                continue;
            }
            match self.weight(w) {
                Some(w) => out.push((role.value.clone(), w)),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}
