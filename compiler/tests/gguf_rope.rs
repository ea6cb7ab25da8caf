//! YaRN from GGUF metadata as llama.cpp reads it: `yarn_beta_fast` / `yarn_beta_slow`, the
//! correction dims rounded out (`truncate`), the rotation's factor mscale(factor, 1) or, with
//! a `yarn_log_multiplier` (DeepSeek's `mscale_all_dim`, whose `mscale` llama.cpp takes equal
//! to it), 1; times `attn_factor` when the file has one.

use coli_compiler::bind::{Bindings, Naming};
use coli_compiler::ir::RopeScaling;
use coli_compiler::lower::symbols::rope_scaling;
use serde_json::{json, Map, Value};

fn gguf(keys: Value) -> Bindings {
    let mut config: Map<String, Value> = keys.as_object().unwrap().clone();
    config.insert("general.architecture".into(), json!("deepseek2"));
    Bindings { source: "m.gguf".into(), naming: Naming::Gguf, config, tensors: None }
}

fn yarn(b: &Bindings) -> (f32, f32, f32, bool) {
    match rope_scaling(b).unwrap() {
        RopeScaling::Yarn { beta_fast, beta_slow, attention_factor, truncate, .. } => {
            (beta_fast, beta_slow, attention_factor, truncate)
        }
        other => panic!("expected YaRN, got {other:?}"),
    }
}

#[test]
fn gguf_yarn_reads_llama_cpp_keys() {
    let base = json!({
        "deepseek2.rope.scaling.type": "yarn",
        "deepseek2.rope.scaling.factor": 4.0,
        "deepseek2.rope.scaling.original_context_length": 64,
        "deepseek2.rope.scaling.yarn_beta_fast": 16.0,
        "deepseek2.rope.scaling.yarn_beta_slow": 2.0,
    });
    let (fast, slow, factor, truncate) = yarn(&gguf(base.clone()));
    assert_eq!((fast, slow, truncate), (16.0, 2.0, true));
    assert!((factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6, "{factor}");

    let mut with_log_mul = base.clone();
    with_log_mul["deepseek2.rope.scaling.yarn_log_multiplier"] = json!(0.0707);
    assert_eq!(yarn(&gguf(with_log_mul.clone())).2, 1.0);

    with_log_mul["deepseek2.rope.scaling.attn_factor"] = json!(1.25);
    assert_eq!(yarn(&gguf(with_log_mul)).2, 1.25);
}
