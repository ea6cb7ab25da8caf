//! Errors: every kind of bad spec, configuration or checkpoint gives a located, readable
//! diagnostic (file, line, column, what was expected), and a file's errors are all reported.

use coli_compiler::bind::{Bindings, Naming, TensorInfo};
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Diagnostics, Options};
use std::collections::BTreeMap;
use std::path::Path;

/// A small valid spec; tests replace parts of it.
const BASE: &str = r#"Spec(
    family: "tiny",
    serves: (hf: ["TinyForCausalLM"]),
    symbols: {
        "hidden": (hf: ["hidden_size"]),
        "vocab": (hf: ["vocab_size"]),
        "layers": (hf: ["num_hidden_layers"]),
        "max_context": (hf: ["max_position_embeddings"], default: "2048"),
        "ffn": (hf: ["intermediate_size"]),
        "eps": (type: Float, hf: ["rms_norm_eps"], default: "1e-5"),
    },
    weights: {
        "embed": (hf: "model.embed_tokens.weight", shape: ["vocab", "hidden"]),
        "norm": (hf: "model.layers.{i}.norm.weight", shape: ["hidden"]),
        "up": (hf: "model.layers.{i}.up.weight", shape: ["ffn", "hidden"]),
        "down": (hf: "model.layers.{i}.down.weight", shape: ["hidden", "ffn"]),
        "head": (hf: "lm_head.weight", shape: ["vocab", "hidden"]),
    },
    values: {
        "h": "hidden",
        "x": "hidden",
        "u": "ffn",
        "d": "hidden",
        "logits": "vocab",
    },
    residual: "h",
    logits: "logits",
    prologue: [
        Embed(out: "h", table: "embed"),
    ],
    layer: [
        RmsNorm(x: "h", out: "x", weight: "norm", eps: "eps"),
        Linear(x: "x", out: "u", weight: "up"),
        Act(x: "u", out: "u", act: Silu),
        Linear(x: "u", out: "d", weight: "down"),
        Add(a: "h", b: "d", out: "h"),
    ],
    epilogue: [
        Linear(x: "h", out: "logits", weight: "head"),
    ],
)
"#;

const CONFIG: &str = r#"{"architectures": ["TinyForCausalLM"], "hidden_size": 8, "vocab_size": 16,
    "num_hidden_layers": 2, "intermediate_size": 12}"#;

fn path() -> &'static Path {
    Path::new("tiny.ron")
}

fn parse(text: &str) -> Result<Spec, Diagnostics> {
    Spec::parse(text, path())
}

fn bindings(config: &str) -> Bindings {
    Bindings::from_config_text(config, Path::new("config.json")).unwrap()
}

fn compile_with(spec: &Spec, b: &Bindings) -> Result<(), Diagnostics> {
    compile(spec, b, &DeviceProfile::cpu_only(), &Options::default()).map(|_| ())
}

/// The 1-based line and column of the first occurrence of `needle` in `text`.
fn at(text: &str, needle: &str) -> (usize, usize) {
    let off = text.find(needle).unwrap_or_else(|| panic!("`{needle}` not in the text"));
    coli_compiler::diag::line_column(text, off)
}

/// Asserts one diagnostic at the position of `needle` whose message contains `want`.
fn expect_one(d: &Diagnostics, text: &str, needle: &str, want: &str) {
    assert_eq!(d.len(), 1, "{d}");
    let e = &d.0[0];
    assert_eq!((e.line, e.column), at(text, needle), "{d}");
    assert!(e.message.contains(want), "`{}` lacks `{want}`", e.message);
    assert!(e.to_string().starts_with(&format!("tiny.ron:{}:{}: error: ", e.line, e.column)), "{e}");
}

#[test]
fn the_base_spec_is_valid() {
    let spec = parse(BASE).unwrap_or_else(|d| panic!("{d}"));
    compile_with(&spec, &bindings(CONFIG)).unwrap_or_else(|d| panic!("{d}"));
}

#[test]
fn syntax_error() {
    let text = BASE.replace(r#"Act(x: "u", out: "u", act: Silu),"#, r#"Act(x: "u" out: "u", act: Silu),"#);
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, r#"out: "u", act"#, "expected `,` or `)`");
}

#[test]
fn unknown_op() {
    let text = BASE.replace("Act(x:", "Activate(x:");
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, "Activate", "unknown variant `Activate`, expected one of `Embed`");
}

#[test]
fn unknown_field() {
    let text = BASE.replace(r#"act: Silu)"#, r#"act: Silu, inplace: true)"#);
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, "inplace", "unknown field `inplace`, expected one of `x`, `out`, `act`");
}

#[test]
fn missing_field() {
    let text = BASE.replace(r#"Linear(x: "x", out: "u", weight: "up"),"#, r#"Linear(x: "x", out: "u"),"#);
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, r#"Linear(x: "x", out: "u")"#, "missing field `weight`");
}

#[test]
fn mistyped_field_value() {
    let text = BASE.replace("act: Silu", "act: 3");
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, "3)", "expected a variant name, found the integer 3");
}

#[test]
fn unknown_symbol_in_an_expression() {
    let text = BASE.replace(r#""u": "ffn","#, r#""u": "ffn_size","#);
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, "ffn_size", "unknown symbol `ffn_size`");
}

#[test]
fn mistyped_symbol() {
    // eps is a Float; a width must be an Int.
    let text = BASE.replace(r#""d": "hidden","#, r#""d": "eps * 2","#);
    let d = parse(&text).unwrap_err();
    expect_one(&d, &text, r#""eps * 2""#, "expected an expression of type Int, this one is a Float");
}

#[test]
fn unknown_value_and_weight() {
    let text = BASE.replace(r#"Add(a: "h", b: "d", out: "h")"#, r#"Add(a: "h", b: "dd", out: "h")"#);
    expect_one(&parse(&text).unwrap_err(), &text, r#""dd""#, "unknown value `dd`");
    let text = BASE.replace(r#"weight: "down""#, r#"weight: "dwn""#);
    expect_one(&parse(&text).unwrap_err(), &text, r#""dwn""#, "unknown weight `dwn`");
}

#[test]
fn a_missing_required_symbol() {
    let text = BASE.replace(r#"        "vocab": (hf: ["vocab_size"]),"#, "");
    let d = parse(&text).unwrap_err();
    assert!(d.to_string().contains("the spec must declare symbol `vocab`"), "{d}");
}

#[test]
fn a_symbol_the_config_lacks() {
    let spec = parse(BASE).unwrap();
    let d =
        compile_with(&spec, &bindings(r#"{"hidden_size": 8, "vocab_size": 16, "num_hidden_layers": 2}"#)).unwrap_err();
    expect_one(&d, BASE, r#""ffn""#, "symbol `ffn` has no value: the configuration has none of `intermediate_size`");
}

#[test]
fn a_config_key_of_the_wrong_type() {
    let spec = parse(BASE).unwrap();
    let d = compile_with(
        &spec,
        &bindings(&CONFIG.replace(r#""intermediate_size": 12"#, r#""intermediate_size": "twelve""#)),
    )
    .unwrap_err();
    expect_one(
        &d,
        BASE,
        r#""intermediate_size"]"#,
        "configuration key `intermediate_size` is `\"twelve\"`, the spec expects an Int",
    );
}

#[test]
fn shape_disagreement() {
    // `down` is [hidden, ffn]; reading it from a value of width hidden disagrees.
    let text =
        BASE.replace(r#"Linear(x: "u", out: "d", weight: "down"),"#, r#"Linear(x: "h", out: "d", weight: "down"),"#);
    let spec = parse(&text).unwrap();
    let d = compile_with(&spec, &bindings(CONFIG)).unwrap_err();
    expect_one(
        &d,
        &text,
        r#""h", out: "d", weight: "down""#,
        "value `h` has width 8, weight `down` [8, 12] needs 12 (layers l0..l1)",
    );
}

fn tiny_tensors() -> BTreeMap<String, TensorInfo> {
    let mut t = BTreeMap::new();
    let mut add = |n: &str, s: &[usize]| {
        t.insert(
            n.to_string(),
            TensorInfo { shape: s.to_vec(), dtype: "F32".into(), bytes: 4 * s.iter().product::<usize>() as u64 },
        );
    };
    add("model.embed_tokens.weight", &[16, 8]);
    add("lm_head.weight", &[16, 8]);
    for i in 0..2 {
        add(&format!("model.layers.{i}.norm.weight"), &[8]);
        add(&format!("model.layers.{i}.up.weight"), &[12, 8]);
        add(&format!("model.layers.{i}.down.weight"), &[8, 12]);
    }
    t
}

#[test]
fn missing_tensor_and_wrong_shape() {
    let spec = parse(BASE).unwrap();
    let mut b = bindings(CONFIG);
    let mut t = tiny_tensors();
    b.tensors = Some(t.clone());
    compile_with(&spec, &b).unwrap_or_else(|d| panic!("{d}"));
    t.remove("model.layers.1.down.weight");
    t.get_mut("lm_head.weight").unwrap().shape = vec![8, 16];
    b.tensors = Some(t);
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 2, "{d}");
    let (l1, c1) = at(BASE, r#""model.layers.{i}.down.weight""#);
    let (l2, c2) = at(BASE, r#""lm_head.weight""#);
    assert_eq!((d.0[0].line, d.0[0].column), (l1, c1), "{d}");
    assert!(
        d.0[0].message.contains("tensor `model.layers.1.down.weight` is not in the checkpoint config.json (layer 1)"),
        "{d}"
    );
    assert_eq!((d.0[1].line, d.0[1].column), (l2, c2), "{d}");
    assert!(
        d.0[1]
            .message
            .contains("tensor `lm_head.weight` has shape [8, 16] in the checkpoint, the spec expects [16, 8]"),
        "{d}"
    );
}

#[test]
fn a_gguf_checkpoint_for_a_spec_without_gguf_names() {
    let spec = parse(BASE).unwrap();
    let mut b = bindings(CONFIG);
    b.naming = Naming::Gguf;
    let d = compile_with(&spec, &b).unwrap_err();
    assert!(d.to_string().contains("the spec names no GGUF configuration key"), "{d}");
}

#[test]
fn every_error_of_a_file_is_reported() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad/many.ron");
    let text = std::fs::read_to_string(&file).unwrap();
    let d = Spec::load(&file).unwrap_err();
    let got: Vec<((usize, usize), &str)> = d.iter().map(|e| ((e.line, e.column), e.message.as_str())).collect();
    let want = [
        (at(&text, "colour: \"red\""), "unknown field `colour`, expected one of `type`, `hf`"),
        (at(&text, "hiden"), "unknown symbol `hiden`"),
        (at(&text, "Softmax"), "unknown variant `Softmax`, expected one of `Embed`"),
        (at(&text, "colour: 3"), "unknown field `colour`, expected one of `x`, `out`, `weight`"),
        (at(&text, "\"missing\""), "unknown value `missing`"),
        (at(&text, "Linear(x: \"h\", out: \"h\")"), "missing field `weight`"),
        (at(&text, "\"hidden > 2\""), "expected an expression of type Float, this one is a Bool"),
    ];
    assert_eq!(got.len(), want.len(), "{d}");
    for ((pos, msg), (wpos, wmsg)) in got.iter().zip(want) {
        assert_eq!(*pos, wpos, "{d}");
        assert!(msg.contains(wmsg), "`{msg}` lacks `{wmsg}`");
    }
}

// ---- what the runtime assumes: values written before they are read, per-layer ops in layers ----

#[test]
fn a_value_read_before_it_is_written() {
    // Two lines of the layer swapped: the Linear reads `x` before the norm writes it.
    let norm = "        RmsNorm(x: \"h\", out: \"x\", weight: \"norm\", eps: \"eps\"),\n";
    let up = "        Linear(x: \"x\", out: \"u\", weight: \"up\"),\n";
    let text = BASE.replace(&format!("{norm}{up}"), &format!("{up}{norm}"));
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    // Layer 1 reads what layer 0 wrote: only layer 0 is wrong.
    expect_one(&d, &text, r#""x", out: "u""#, "value `x` is read before any op writes it (layer 0)");
}

#[test]
fn the_epilogue_reads_only_the_residual_from_before_it() {
    let text = BASE.replace(r#"Linear(x: "h", out: "logits""#, r#"Linear(x: "d", out: "logits""#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(
        &d,
        &text,
        r#""d", out: "logits""#,
        "the epilogue runs on the last row only, so from before it it reads only the residual `h`; `d` is written before it",
    );
}

#[test]
fn the_epilogue_writes_the_logits_and_the_residual_is_written_before_it() {
    let text = BASE.replace(r#"Linear(x: "h", out: "logits", weight: "head"),"#, r#"Add(a: "h", b: "h", out: "d"),"#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, "\"logits\",\n    prologue", "no op of the epilogue writes the logits `logits`");
    // No layers, and the prologue writes another value: nothing writes the residual.
    let text = BASE.replace(r#"Embed(out: "h", table: "embed")"#, r#"Embed(out: "d", table: "embed")"#);
    let no_layers = CONFIG.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 0"#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(&no_layers)).unwrap_err();
    assert_eq!(d.len(), 2, "{d}");
    assert_eq!((d.0[0].line, d.0[0].column), at(&text, "\"h\",\n    logits"), "{d}");
    assert!(d.0[0].message.contains("the residual `h` is not written before the epilogue"), "{d}");
    assert_eq!((d.0[1].line, d.0[1].column), at(&text, r#""h", out: "logits""#), "{d}");
    assert!(d.0[1].message.contains("value `h` is read before any op writes it"), "{d}");
}

#[test]
fn an_op_with_per_layer_state_outside_the_layer_body() {
    let attn =
        r#"Attention(q: "h", k: "h", v: "h", out: "x", heads: "2", kv_heads: "2", head_dim: "4", scale: "0.5"),"#;
    for (part, anchor) in [
        ("prologue", r#"Embed(out: "h", table: "embed"),"#),
        ("epilogue", r#"Linear(x: "h", out: "logits", weight: "head"),"#),
    ] {
        let text = BASE.replace(anchor, &format!("{anchor}\n        {attn}"));
        let d = parse(&text).unwrap_err();
        let want = format!(
            "`Attention` keeps its layer's KV cache, so it belongs in the layer body (or a block), not the {part}"
        );
        expect_one(&d, &text, "Attention(", &want);
    }
}

#[test]
fn a_spec_whose_layer_and_epilogue_are_swapped() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/llama.ron");
    let text = std::fs::read_to_string(&file).unwrap();
    let body = |name: &str| {
        let start = text.find(&format!("\n    {name}: [")).unwrap();
        let end = start + text[start..].find("\n    ],").unwrap();
        (start, end)
    };
    let ((ls, le), (es, ee)) = (body("layer"), body("epilogue"));
    let layer = text[ls..le].replacen("layer: [", "epilogue: [", 1);
    let epilogue = text[es..ee].replacen("epilogue: [", "layer: [", 1);
    let swapped = format!("{}{epilogue}{}{layer}{}", &text[..ls], &text[le..es], &text[ee..]);
    let d = Spec::parse(&swapped, path()).unwrap_err();
    assert!(
        d.iter().any(|e| e.message.contains("`Attention` keeps its layer's KV cache")
            && (e.line, e.column) == at(&swapped, "Attention(")),
        "{d}"
    );
}

// ---- limits ----

#[test]
fn layers_past_the_limit() {
    let spec = parse(BASE).unwrap();
    for n in ["1000000000000", "10000", "1000000", "4097"] {
        let cfg = CONFIG.replace(r#""num_hidden_layers": 2"#, &format!(r#""num_hidden_layers": {n}"#));
        let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
        let want = format!(
            "symbol `layers` (from configuration key `num_hidden_layers`): {n} is past the limit of 4096 (layers)"
        );
        expect_one(&d, BASE, r#""layers""#, &want);
    }
    // 10^30 is no Int a JSON float holds exactly.
    let cfg = CONFIG.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1e30"#);
    let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
    expect_one(
        &d,
        BASE,
        r#""num_hidden_layers"]"#,
        "configuration key `num_hidden_layers` is `1e+30`, the spec expects an Int",
    );
}

/// GGUF bindings for graphs/llama.ron (no tensor table), `extra` keys added or replaced.
fn llama_gguf(extra: &[(&str, serde_json::Value)]) -> (Spec, Bindings) {
    let spec = Spec::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/llama.ron")).unwrap();
    let mut config = serde_json::json!({
        "general.architecture": "llama", "llama.embedding_length": 8, "llama.block_count": 2,
        "llama.attention.head_count": 2, "llama.feed_forward_length": 12, "llama.vocab_size": 16,
    });
    for (k, v) in extra {
        config[*k] = v.clone();
    }
    let serde_json::Value::Object(config) = config else { unreachable!() };
    (spec, Bindings { source: "model.gguf".into(), naming: Naming::Gguf, config, tensors: None })
}

#[test]
fn a_gguf_block_count_past_the_limit_is_refused_before_anything_is_allocated() {
    let (spec, b) = llama_gguf(&[("llama.block_count", serde_json::json!(1_000_000_000_000u64))]);
    compile_with(&llama_gguf(&[]).0, &llama_gguf(&[]).1).unwrap_or_else(|d| panic!("{d}"));
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    assert!(d.0[0].message.contains(
        "symbol `layers` (from configuration key `llama.block_count`): 1000000000000 is past the limit of 4096 (layers)"
    ), "{d}");
}

#[test]
fn experts_past_the_limit() {
    let (spec, b) = llama_gguf(&[("llama.expert_count", serde_json::json!(1_000_000))]);
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    assert!(
        d.0[0].message.contains(
            "`experts` (from configuration key `llama.expert_count`): 1000000 is past the limit of 65536 (experts) (layers l0..l1)"
        ),
        "{d}"
    );
    assert_eq!((d.0[0].line, d.0[0].column), at(&spec.source, r#""experts", ffn:"#), "{d}");
}

#[test]
fn widths_past_the_limit() {
    let spec = parse(BASE).unwrap();
    let cfg = CONFIG.replace(r#""hidden_size": 8"#, r#""hidden_size": 1048576"#);
    let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
    expect_one(&d, BASE, r#""hidden""#, "1048576 is past the limit of 262144 (columns of hidden width)");
    let cfg = CONFIG.replace(r#""intermediate_size": 12"#, r#""intermediate_size": 33554432"#);
    let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
    expect_one(
        &d,
        BASE,
        "\"ffn\",\n        \"d\"",
        "`ffn` (from configuration key `intermediate_size`): 33554432 is past the limit of 16777216 (columns of a row buffer)",
    );
}

#[test]
fn the_most_layers_compile_and_their_errors_are_reported_quickly() {
    let spec = parse(BASE).unwrap();
    let cfg = CONFIG.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 4096"#);
    let mut b = bindings(&cfg);
    compile_with(&spec, &b).unwrap_or_else(|d| panic!("{d}"));
    // A tensor table with none of the layers' tensors: three distinct errors per layer.
    let mut t = tiny_tensors();
    t.retain(|k, _| !k.starts_with("model.layers."));
    b.tensors = Some(t);
    let start = std::time::Instant::now();
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 3 * 4096);
    assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
}

// ---- numbers at the door ----

#[test]
fn an_epsilon_must_be_above_zero() {
    let spec = parse(BASE).unwrap();
    for (eps, shown) in [("-1e-5", "-0.00001"), ("0", "0"), ("0.0", "0")] {
        let cfg =
            CONFIG.replace(r#""intermediate_size": 12"#, &format!(r#""intermediate_size": 12, "rms_norm_eps": {eps}"#));
        let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
        let want = format!(
            "RmsNorm's epsilon `eps` is {shown} (from configuration key `rms_norm_eps`); it must be above 0 (layers l0..l1)"
        );
        expect_one(&d, BASE, r#""eps"),"#, &want);
    }
}

/// BASE with a Rope over `u` whose base is symbol `theta` (HF `rope_theta`).
fn with_rope() -> String {
    BASE.replace(
        r#"        Act(x: "u""#,
        "        Rope(x: \"u\", heads: \"3\", head_dim: \"4\", style: RotateHalf, theta: \"theta\"),\n        Act(x: \"u\"",
    )
    .replace(r#"        "eps": (type: Float"#, "        \"theta\": (type: Float, hf: [\"rope_theta\"], default: \"10000.0\"),\n        \"eps\": (type: Float")
}

#[test]
fn a_rope_base_must_be_above_zero() {
    let text = with_rope();
    let spec = parse(&text).unwrap();
    compile_with(&spec, &bindings(CONFIG)).unwrap_or_else(|d| panic!("{d}"));
    for theta in ["-10000.0", "0"] {
        let cfg =
            CONFIG.replace(r#""intermediate_size": 12"#, &format!(r#""intermediate_size": 12, "rope_theta": {theta}"#));
        let d = compile_with(&spec, &bindings(&cfg)).unwrap_err();
        expect_one(
            &d,
            &text,
            r#""theta"),"#,
            "(from configuration key `rope_theta`); it must be above 0 (layers l0..l1)",
        );
    }
    // A GGUF's negative `freq_base`: both RoPEs of every layer refuse it.
    let (spec, b) = llama_gguf(&[("llama.rope.freq_base", serde_json::json!(-10000.0))]);
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 2, "{d}");
    for e in d.iter() {
        assert!(
            e.message.contains(
                "the RoPE base `theta` is -10000 (from configuration key `llama.rope.freq_base`); it must be above 0"
            ),
            "{d}"
        );
    }
}

#[test]
fn a_scale_must_be_finite() {
    // Past f32's range: refused, not made infinite.
    let text = BASE.replace(r#"default: "1e-5""#, r#"default: "1e39""#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, r#""eps"),"#, "`eps` is 1e39, not a finite 32-bit float (layers l0..l1)");
    // An expression whose result is not finite, at the sub-expression that made it.
    let text = BASE
        .replace(r#"Embed(out: "h", table: "embed")"#, r#"Embed(out: "h", table: "embed", scale: "2.0 * (1.0 / 0)")"#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, "(1.0 / 0)", "this expression is inf, not a finite number");
    // In a symbol's default.
    let text = BASE.replace(r#"default: "1e-5""#, r#"default: "sqrt(0.0 - 1.0)""#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, "sqrt(0.0", "symbol `eps`: this expression is NaN, not a finite number");
}

#[test]
fn integer_division_by_zero() {
    let text = BASE.replace(r#""u": "ffn","#, r#""u": "ffn / (hidden - 8)","#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, "(hidden - 8)", "division by zero");
}

// ---- a missing untied head ----

#[test]
fn a_missing_head_is_tied_only_when_the_configuration_does_not_say_untied() {
    let text = BASE
        .replace(r#"shape: ["vocab", "hidden"]),
    },"#, r#"shape: ["vocab", "hidden"], tied: (to: "embed", when: "tie")),
    },"#)
        .replace(r#"        "eps": (type: Float"#, "        \"tie\": (type: Bool, hf: [\"tie_word_embeddings\"], default: \"false\"),\n        \"eps\": (type: Float");
    let spec = parse(&text).unwrap();
    let with = |tie: &str, tensors: bool| {
        let mut b =
            bindings(&CONFIG.replace(r#""intermediate_size": 12"#, &format!(r#""intermediate_size": 12{tie}"#)));
        let mut t = tiny_tensors();
        t.remove("lm_head.weight");
        b.tensors = tensors.then_some(t);
        compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default())
    };
    let head = |p: &coli_compiler::Plan| match p.program.epilogue.last() {
        Some(coli_compiler::ir::Op::Linear { weight, .. }) => weight.name.clone(),
        op => panic!("{op:?}"),
    };
    let d = with(r#", "tie_word_embeddings": false"#, true).unwrap_err();
    expect_one(
        &d,
        &text,
        r#""lm_head.weight""#,
        "tensor `lm_head.weight` is not in the checkpoint config.json, and weight `head` is not tied to `embed` (`tie` is false, from configuration key `tie_word_embeddings`)",
    );
    // Tied by the configuration, or the configuration silent (a GGUF's convention): the embedding.
    for tie in [r#", "tie_word_embeddings": true"#, ""] {
        assert_eq!(head(&with(tie, true).unwrap_or_else(|d| panic!("{d}"))), "model.embed_tokens.weight");
    }
    // No tensor table (a bare config.json): the head the configuration names.
    assert_eq!(head(&with(r#", "tie_word_embeddings": false"#, false).unwrap()), "lm_head.weight");
}

// ---- recursion bounded ----

#[test]
fn ron_nested_too_deep() {
    let text = BASE.replace("act: Silu", &format!("act: {}{}", "[".repeat(20_000), "]".repeat(20_000)));
    let d = parse(&text).unwrap_err();
    // Spec, the layer's list and Act are the first three levels: the 126th bracket is one too many.
    let off = text.find("[[[").unwrap() + 125;
    assert_eq!(d.len(), 1, "{d}");
    assert_eq!((d.0[0].line, d.0[0].column), coli_compiler::diag::line_column(&text, off), "{d}");
    assert!(d.0[0].message.contains("values nest too deep here (at most 128 levels of nesting in a RON file)"), "{d}");
}

#[test]
fn an_expression_nested_too_deep() {
    let deep = format!("{}ffn{}", "(".repeat(5000), ")".repeat(5000));
    let text = BASE.replace(r#""u": "ffn","#, &format!(r#""u": "{deep}","#));
    let d = parse(&text).unwrap_err();
    let off = text.find("(((").unwrap() + 256;
    assert_eq!(d.len(), 1, "{d}");
    assert_eq!((d.0[0].line, d.0[0].column), coli_compiler::diag::line_column(&text, off), "{d}");
    assert!(d.0[0].message.contains("the expression nests too deep here (at most 256 levels"), "{d}");
    // A long chain is as deep.
    let chain = format!("ffn{}", " + 0".repeat(5000));
    let text = BASE.replace(r#""u": "ffn","#, &format!(r#""u": "{chain}","#));
    let d = parse(&text).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    assert!(d.0[0].message.contains("the expression nests too deep (at most 256 levels"), "{d}");
}

#[test]
fn a_layer_keeps_one_mixer_state_and_one_set_of_experts() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/llama.ron");
    let text = std::fs::read_to_string(&file).unwrap();
    let attn = text.lines().find(|l| l.trim_start().starts_with("Attention(")).unwrap();
    let twice = text.replacen(attn, &format!("{attn}\n{attn}"), 1);
    let spec = Spec::parse(&twice, path()).unwrap();
    let b = llama_gguf(&[]).1;
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    let second = twice.find(attn).unwrap() + attn.len() + 1 + (attn.len() - attn.trim_start().len());
    assert_eq!((d.0[0].line, d.0[0].column), coli_compiler::diag::line_column(&twice, second), "{d}");
    assert!(d.0[0].message.contains("a layer keeps one mixer state"), "{d}");
    assert!(d.0[0].message.contains("this `Attention` would be its second, after `Attention` (layers l0..l1)"), "{d}");
    let moe = text.lines().find(|l| l.trim_start().starts_with("RoutedExperts(")).unwrap();
    let twice = text.replacen(moe, &format!("{moe}\n{moe}"), 1);
    let spec = Spec::parse(&twice, path()).unwrap();
    let d = compile_with(&spec, &llama_gguf(&[("llama.expert_count", serde_json::json!(4))]).1).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    assert!(d.0[0].message.contains("this `RoutedExperts` would be its second (layers l0..l1)"), "{d}");
}

#[test]
fn a_scale_past_the_limit_and_a_clamp_limit_not_above_zero() {
    // Finite, but q.k times it overflows f32 for activations of ordinary size.
    let text = BASE.replace(r#"Embed(out: "h", table: "embed")"#, r#"Embed(out: "h", table: "embed", scale: "1e30")"#);
    let d = compile_with(&parse(&text).unwrap(), &bindings(CONFIG)).unwrap_err();
    expect_one(&d, &text, r#""1e30""#, "`1e30`: 1e30 is past the limit of 65536 (the magnitude of a scale)");
    // gpt-oss's clamped SwiGLU: a limit of 0 or below would clamp [limit, -limit].
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gpt_oss.ron");
    let spec = Spec::load(&file).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpt_oss/config.json");
    let mut b = Bindings::from_config_json(&config).unwrap();
    compile_with(&spec, &b).unwrap_or_else(|d| panic!("{d}"));
    b.config.insert("swiglu_limit".into(), serde_json::json!(-7.0));
    let d = compile_with(&spec, &b).unwrap_err();
    assert_eq!(d.len(), 1, "{d}");
    assert!(
        d.0[0].message.contains(
            "the SwiGLU clamp limit `limit` is -7 (from configuration key `swiglu_limit`); it must be above 0"
        ),
        "{d}"
    );
}

/// BASE with a draft model: a layer at index `layers`, its input beside the embedding.
fn with_draft(prologue: &str) -> String {
    let text = BASE
        .replace(r#""logits": "vocab","#, r#""logits": "vocab", "e": "hidden", "hp": "hidden", "eh": "2 * hidden","#)
        .replace(
            r#""head": (hf: "lm_head.weight", shape: ["vocab", "hidden"]),"#,
            r#""head": (hf: "lm_head.weight", shape: ["vocab", "hidden"]),
        "eh_proj": (hf: "model.layers.{i}.eh_proj.weight", shape: ["hidden", "2 * hidden"]),"#,
        );
    let draft = format!(
        r#"    draft: (
        count: "1",
        layer: "layers",
        prologue: [{prologue}],
        epilogue: [Linear(x: "h", out: "logits", weight: "head")],
    ),
)
"#
    );
    let end = text.trim_end().strip_suffix(')').unwrap().to_string();
    end + &draft
}

#[test]
fn a_draft_reads_its_input_in_its_prologue_only() {
    let good = r#"Embed(out: "e", table: "embed"), Input(out: "hp"), Concat(a: "e", b: "hp", out: "eh"), Linear(x: "eh", out: "h", weight: "eh_proj")"#;
    let text = with_draft(good);
    let spec = parse(&text).unwrap_or_else(|d| panic!("{d}"));
    let b = bindings(CONFIG);
    let o = Options { draft: coli_compiler::DraftRole::Draft, ..Options::default() };
    let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &o).unwrap_or_else(|d| panic!("{d}"));
    // One layer, its state the draft's layer 0, its weights the checkpoint's layer 2.
    assert_eq!(plan.program.layers.len(), 1);
    assert_eq!(plan.program.layers[0].id.0, 0);
    let text_of = coli_compiler::print::op_text(&plan.program.layers[0].ops[0]);
    assert!(text_of.contains("model.layers.2.norm.weight"), "{text_of}");
    assert_eq!(plan.program.export, Some(plan.program.residual));
    // The model's own plan as a draft's target exports its residual; alone it does not.
    let o = Options { draft: coli_compiler::DraftRole::Target, ..Options::default() };
    let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &o).unwrap();
    assert_eq!((plan.program.layers.len(), plan.program.export), (2, Some(plan.program.residual)));
    assert_eq!(compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap().program.export, None);

    // No `Input` in the draft's prologue; an `Input` in the model's.
    let text = with_draft(r#"Embed(out: "h", table: "embed")"#);
    expect_one(&parse(&text).unwrap_err(), &text, r#""1""#, "through one `Input`");
    let text = with_draft(good)
        .replace(r#"Embed(out: "h", table: "embed"),"#, r#"Embed(out: "h", table: "embed"), Input(out: "x"),"#);
    expect_one(
        &parse(&text).unwrap_err(),
        &text,
        r#"Input(out: "x")"#,
        "`Input` is for a draft's prologue, not the prologue",
    );
    // A draft of a spec without one, of a checkpoint without draft layers.
    let spec = parse(BASE).unwrap();
    let o = Options { draft: coli_compiler::DraftRole::Draft, ..Options::default() };
    let d = compile(&spec, &b, &DeviceProfile::cpu_only(), &o).unwrap_err();
    assert!(d.to_string().contains("the tiny spec has no draft model"), "{d}");
    let text = with_draft(good).replace(r#"count: "1""#, r#"count: "0""#);
    let d = compile(&parse(&text).unwrap(), &b, &DeviceProfile::cpu_only(), &o).unwrap_err();
    assert!(d.to_string().contains("this checkpoint has no draft layers"), "{d}");
}

/// A draft's `rename` reads its layer's weights under other names; an empty string to replace
/// is refused where the spec is checked.
#[test]
fn a_draft_reads_its_layer_under_renamed_weights() {
    let good = r#"Embed(out: "e", table: "embed"), Input(out: "hp"), Concat(a: "e", b: "hp", out: "eh"), Linear(x: "eh", out: "h", weight: "eh_proj")"#;
    let rename =
        |pairs: &str| with_draft(good).replace(r#"layer: "layers","#, &format!(r#"layer: "layers", rename: {pairs},"#));
    let o = Options { draft: coli_compiler::DraftRole::Draft, ..Options::default() };
    let b = bindings(CONFIG);
    // The draft's layer norm read as `mtp.0.input_norm.weight`.
    let text = rename(r#"[("model.layers.{i}.", "mtp.0."), (".norm.", ".input_norm.")]"#);
    let spec = parse(&text).unwrap_or_else(|d| panic!("{d}"));
    let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &o).unwrap_or_else(|d| panic!("{d}"));
    let first = coli_compiler::print::op_text(&plan.program.layers[0].ops[0]);
    assert!(first.contains("mtp.0.input_norm.weight"), "{first}");
    // The model's own plan is not renamed.
    let plan = compile(&spec, &b, &DeviceProfile::cpu_only(), &Options::default()).unwrap();
    assert!(coli_compiler::print::op_text(&plan.program.layers[0].ops[0]).contains("model.layers.0.norm.weight"));
    let text = rename(r#"[("", "mtp.0.")]"#);
    expect_one(&parse(&text).unwrap_err(), &text, r#""1""#, "`rename` replaces an empty string");
}
