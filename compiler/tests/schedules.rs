//! Schedule snapshots: each spec under graphs/ with its reference configuration cut to four
//! layers, on the CPU alone and on one large GPU (every frame on the device, fused), and one
//! MoE model on a small GPU (device frames around host steps). A schedule's text is its
//! snapshot: reviewing a diff is how a fusion change is reviewed.

use coli_compiler::bind::Bindings;
use coli_compiler::ids::Place;
use coli_compiler::ir::Op;
use coli_compiler::schedule::{print, Kernel, Schedule};
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options, Plan};
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

const TABLE: &[(&str, &str)] = &[
    ("llama", "llama-3.1-8b"),
    ("olmoe", "olmoe-1b-7b"),
    ("qwen3_moe", "qwen3-30b-a3b"),
    ("mixtral", "mixtral-8x7b"),
    ("deepseek_v3", "deepseek-v3"),
    ("qwen3_next", "qwen3-next-80b-a3b"),
    ("qwen3_5_moe", "qwen3.5-35b-a3b"),
    ("kimi_linear", "kimi-linear-48b-a3b"),
    ("inkling", "inkling-text"),
    ("gpt_oss", "gpt-oss-20b"),
    ("mimo_v2_flash", "mimo-v2-flash"),
    ("deepseek_v32", "deepseek-v3.2"),
    ("glm_moe_dsa", "glm-moe-dsa"),
    ("deepseek_v4", "deepseek-v4-flash"),
];

const LAYERS: usize = 4;

/// The configuration with `LAYERS` layers (per-layer lists cut to match).
fn bindings(config: &str) -> Bindings {
    let path = graphs().join("configs").join(format!("{config}.json"));
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let o = v.as_object_mut().unwrap();
    o.insert("num_hidden_layers".into(), LAYERS.into());
    for key in ["layer_types", "mlp_layer_types", "indexer_types"] {
        if let Some(serde_json::Value::Array(a)) = o.get_mut(key) {
            a.truncate(LAYERS);
        }
    }
    if let Some(serde_json::Value::Array(a)) = o.get_mut("mlp_only_layers") {
        a.retain(|l| l.as_u64().is_some_and(|l| (l as usize) < LAYERS));
    }
    Bindings::from_config_text(&v.to_string(), &path).unwrap()
}

fn plan(spec: &str, config: &str, profile: &str) -> Plan {
    let spec = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap_or_else(|d| panic!("{d}"));
    let profile = DeviceProfile::load(&graphs().join("profiles").join(format!("{profile}.ron")))
        .unwrap_or_else(|d| panic!("{d}"));
    let options = Options { kv_split: false, ..Options::default() };
    compile(&spec, &bindings(config), &profile, &options).unwrap_or_else(|d| panic!("{d}"))
}

#[test]
fn schedule_snapshots() {
    for &(spec, config) in TABLE {
        for profile in ["cpu-only", "h200"] {
            let p = plan(spec, config, profile);
            let s = Schedule::build(&p.program, &p.frames);
            insta::assert_snapshot!(format!("{spec}@{profile}"), print(&s));
        }
    }
    let p = plan("olmoe", "olmoe-1b-7b", "gpu-1gb");
    insta::assert_snapshot!("olmoe@gpu-1gb", print(&Schedule::build(&p.program, &p.frames)));
}

/// Host frames get no fused kernel; a CPU-only schedule is one host frame whose calls cover
/// every op of the program once (a `Linears` call counts its products).
#[test]
fn host_schedules_cover_every_op_once_and_fuse_nothing() {
    for &(spec, config) in TABLE {
        let p = plan(spec, config, "cpu-only");
        let s = Schedule::host_only(&p.program);
        assert_eq!(s.frames.len(), 1);
        assert_eq!(s.frames[0].place, Place::Host);
        let mut ops = 0;
        for c in &s.frames[0].calls {
            ops += match &c.kernel {
                Kernel::Op(op) => {
                    assert!(!matches!(op, Op::Linear { .. }), "{spec}: a lone Linear is a Linears call");
                    1
                }
                Kernel::Linears { outs, .. } => outs.len(),
                k => panic!("{spec}: a fused kernel in a host frame: {k:?}"),
            };
        }
        let total = p.program.prologue.len()
            + p.program.layers.iter().map(|l| l.ops.len()).sum::<usize>()
            + p.program.epilogue.len();
        assert_eq!(ops, total, "{spec}");
    }
}

/// On a GPU that holds everything, the products read their norms, the residual adds land in
/// the products' stores, and the one-row frames replay.
#[test]
fn device_schedules_fuse_norms_residuals_and_rope() {
    let p = plan("llama", "llama-3.1-8b", "h200");
    let s = Schedule::build(&p.program, &p.frames);
    let dev: Vec<_> = s.frames.iter().filter(|f| f.place != Place::Host).collect();
    assert!(!dev.is_empty() && dev.iter().all(|f| f.replayable));
    let calls: Vec<&Kernel> = dev.iter().flat_map(|f| f.calls.iter().map(|c| &c.kernel)).collect();
    let count = |f: &dyn Fn(&Kernel) -> bool| calls.iter().filter(|k| f(k)).count();
    assert!(count(&|k| matches!(k, Kernel::Matmul(m) if m.residual.is_some())) >= 2 * LAYERS);
    assert!(count(&|k| matches!(k, Kernel::Matmul(m) if !m.src.sources().is_empty())) >= 3 * LAYERS);
    assert_eq!(count(&|k| matches!(k, Kernel::Attention(a) if a.rope.is_some())), LAYERS);
    assert_eq!(count(&|k| matches!(k, Kernel::Op(Op::Add { .. } | Op::Rope { .. } | Op::RmsNorm { .. }))), 0);
}
