//! Options and profiles change plans as documented: the dense part kept on the host, a forced
//! number of device layers (on one device and on two), the expert tier off, a device that
//! cannot run an op kind, a profile with errors; and the Graphviz output.

use coli_compiler::bind::Bindings;
use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::ops::OpKind;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Diagnostics, Options, Plan};
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

fn compile_with(spec: &str, config: &str, profile: &DeviceProfile, options: &Options) -> Result<Plan, Diagnostics> {
    let spec = Spec::load(&graphs().join(format!("{spec}.ron"))).unwrap();
    let b = Bindings::from_config_json(&graphs().join("configs").join(format!("{config}.json"))).unwrap();
    compile(&spec, &b, profile, options)
}

fn profile(name: &str) -> DeviceProfile {
    DeviceProfile::load(&graphs().join("profiles").join(format!("{name}.ron"))).unwrap()
}

fn on_device(p: &Plan) -> usize {
    p.placement.layers.iter().filter(|x| **x != Place::Host).count()
}

#[test]
fn dense_part_on_the_host_leaves_the_device_to_the_tier() {
    let o = Options { dense_on_device: false, ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &profile("h200"), &o).unwrap();
    assert_eq!(on_device(&p), 0);
    assert_eq!(p.placement.head, Place::Host);
    assert_eq!(p.placement.fits[0].tier, p.placement.fits[0].usable);
    assert!(p.frames.iter().all(|f| f.place == Place::Host));
}

#[test]
fn forced_device_layers() {
    let o = Options { device_layers: Some(3), ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &profile("h200"), &o).unwrap();
    assert_eq!(on_device(&p), 3);
    assert_eq!(p.placement.head, Place::Host);
    // More than the device holds is an error that says so.
    let o = Options { device_layers: Some(12), ..Options::default() };
    let d = compile_with("olmoe", "olmoe-1b-7b", &profile("gpu-1gb"), &o).unwrap_err();
    assert!(d.to_string().contains("--device-layers 12: the layers need"), "{d}");
    // Forcing every layer where they fit is the same as the fit.
    let o = Options { device_layers: Some(99), ..Options::default() };
    assert_eq!(on_device(&compile_with("olmoe", "olmoe-1b-7b", &profile("h200"), &o).unwrap()), 16);
}

#[test]
fn forced_layers_on_two_devices() {
    let two = profile("two-gpu-1gb");
    let dev = |p: &Plan, d: u32| p.placement.layers.iter().filter(|x| **x == Place::Device(DeviceId(d))).count();
    // A forced primary: the second device fits the layers after it (8 fit each).
    let p =
        compile_with("olmoe", "olmoe-1b-7b", &two, &Options { device_layers: Some(3), ..Options::default() }).unwrap();
    assert_eq!((dev(&p, 0), dev(&p, 1)), (3, 8));
    assert_eq!(p.placement.fits[1].first_layer, 3);
    // Both forced.
    let o = Options { device_layers: Some(3), second_device_layers: Some(2), ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &two, &o).unwrap();
    assert_eq!((dev(&p, 0), dev(&p, 1)), (3, 2));
    assert!(p.to_string().contains("second device's layers forced to 2"));
    assert_eq!(p.placement.layers[3..5], [Place::Device(DeviceId(1)); 2]);
    assert!(p.frames.iter().any(|f| f.place == Place::Device(DeviceId(1))));
    // None on the second device: the old partial chain.
    let o = Options { device_layers: Some(3), second_device_layers: Some(0), ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &two, &o).unwrap();
    assert_eq!((dev(&p, 0), dev(&p, 1)), (3, 0));
    // More than the second device holds is an error that names its flag.
    let o = Options { device_layers: Some(1), second_device_layers: Some(12), ..Options::default() };
    let d = compile_with("olmoe", "olmoe-1b-7b", &two, &o).unwrap_err();
    assert!(d.to_string().contains("--device2-layers 12: the layers need"), "{d}");
}

#[test]
fn expert_tier_off() {
    let o = Options { expert_tier: false, ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &profile("h200"), &o).unwrap();
    assert_eq!(p.placement.fits[0].tier, 0);
    assert!(p.to_string().lines().filter(|l| l.starts_with("fit")).all(|l| !l.contains("expert tier")));
}

#[test]
fn an_op_the_device_cannot_run_goes_to_the_host() {
    let mut prof = profile("h200");
    // A device whose op library lacks MLA.
    prof.devices[0].features.ops = Some(OpKind::all().filter(|k| *k != OpKind::Mla).collect());
    let p = compile_with("deepseek_v3", "deepseek-v3", &prof, &Options::default()).unwrap();
    assert_eq!(on_device(&p), 61);
    for f in &p.frames {
        for id in &f.ops {
            if coli_compiler::frames::op_of(&p.program, *id).kind() == OpKind::Mla {
                assert_eq!(f.place, Place::Host, "{}", f.id);
            }
        }
    }
    // The MLA's weights are not counted on the device.
    let full = compile_with("deepseek_v3", "deepseek-v3", &profile("h200"), &Options::default()).unwrap();
    assert!(p.placement.costs[5].matrices < full.placement.costs[5].matrices);
}

#[test]
fn a_device_that_does_not_read_a_format_runs_those_matrices_on_the_host() {
    let mut prof = profile("h200");
    prof.devices[0].features.formats = Some(vec![coli_compiler::cost::Format::Q4K]);
    let p = compile_with("llama", "llama-3.1-8b", &prof, &Options::default()).unwrap();
    // bf16 matrices: every Linear runs on the host; the norms, RoPE and attention stay.
    for f in &p.frames {
        for id in &f.ops {
            let k = coli_compiler::frames::op_of(&p.program, *id).kind();
            if f.place == Place::Device(DeviceId(0)) {
                assert_ne!(k, OpKind::Linear);
            }
        }
    }
    let o = Options { upload_format: Some(coli_compiler::cost::Format::Q4K), ..Options::default() };
    let p = compile_with("llama", "llama-3.1-8b", &prof, &o).unwrap();
    // Uploaded as q4_k, everything after the embedding runs on the device, the head too.
    assert_eq!(p.frames.len(), 2);
    assert_eq!(p.placement.head, Place::Device(DeviceId(0)));
}

#[test]
fn profile_errors_are_located() {
    let text = "Profile(\n  name: \"x\",\n  devices: [(name: \"g\", kind: Discreet, memory_budget: 10)],\n)";
    let d = DeviceProfile::parse(text, Path::new("p.ron")).unwrap_err();
    let s = d.to_string();
    assert!(
        s.starts_with("p.ron:3:31: error: unknown variant `Discreet`, expected one of `Discrete`, `Integrated`, `Cpu`"),
        "{s}"
    );
    let text = "Profile(name: \"x\", devices: [(name: \"g\", kind: Discrete, memory_budget: 10, reserve: 20)])";
    assert!(DeviceProfile::parse(text, Path::new("p.ron"))
        .unwrap_err()
        .to_string()
        .contains("reserve 20 exceeds the budget 10"));
}

#[test]
fn every_shipped_profile_loads() {
    for e in std::fs::read_dir(graphs().join("profiles")).unwrap() {
        let path = e.unwrap().path();
        DeviceProfile::load(&path).unwrap_or_else(|d| panic!("{d}"));
    }
}

#[test]
fn dot_output_draws_frames_and_host_steps() {
    let o = Options { kv_split: false, ..Options::default() };
    let p = compile_with("olmoe", "olmoe-1b-7b", &profile("gpu-1gb"), &o).unwrap();
    let dot = p.to_dot();
    assert!(dot.starts_with("digraph plan {"));
    assert!(dot.contains("label=\"f2 host\""), "{}", &dot[..400]);
    assert!(dot.contains("shape=box"));
    assert!(dot.contains("-> "));
    assert!(dot.trim_end().ends_with('}'));
}
