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
    // `up` is [ffn, hidden]; reading it from a value of width ffn disagrees.
    let text = BASE.replace(r#"Linear(x: "x", out: "u", weight: "up"),"#, r#"Linear(x: "u", out: "u", weight: "up"),"#);
    let spec = parse(&text).unwrap();
    let d = compile_with(&spec, &bindings(CONFIG)).unwrap_err();
    expect_one(
        &d,
        &text,
        r#""u", out: "u", weight: "up""#,
        "value `u` has width 12, weight `up` [12, 8] needs 8 (layers l0..l1)",
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
