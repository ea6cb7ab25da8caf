//! The resident-experts rule (`place::resident`): where a device's tier budget holds every
//! routed expert of a layer, that layer's routing and experts run inside the device's frame.
//! Whole layers from the device's first while they fit; the rest stay host steps; nothing
//! with the tier off, on a device that does not list the two op kinds, or past the forced
//! device layers.

use coli_compiler::bind::Bindings;
use coli_compiler::frames::op_of;
use coli_compiler::ids::{DeviceId, Part, Place};
use coli_compiler::ir::Op;
use coli_compiler::ops::OpKind;
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options, Plan};
use std::path::{Path, PathBuf};

fn graphs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

fn olmoe(profile: &DeviceProfile, options: &Options) -> Plan {
    let spec = Spec::load(&graphs().join("olmoe.ron")).unwrap();
    let b = Bindings::from_config_json(&graphs().join("configs/olmoe-1b-7b.json")).unwrap();
    compile(&spec, &b, profile, options).unwrap_or_else(|d| panic!("{d}"))
}

fn h200(budget: u64) -> DeviceProfile {
    let mut p = DeviceProfile::load(&graphs().join("profiles/h200.ron")).unwrap();
    p.devices[0].memory_budget = budget;
    p
}

/// Layers whose experts are resident on d0.
fn resident(p: &Plan) -> Vec<usize> {
    p.placement.resident.layers.iter().enumerate().filter(|(_, d)| **d == Some(DeviceId(0))).map(|(i, _)| i).collect()
}

/// Where each layer's `Route` and `RoutedExperts` run, from the frames.
fn expert_places(p: &Plan) -> Vec<(usize, Place)> {
    let mut out = Vec::new();
    for f in &p.frames {
        for id in &f.ops {
            if let (Part::Layer(l), Op::Route { .. } | Op::RoutedExperts { .. }) = (id.part, op_of(&p.program, *id)) {
                out.push((l.0 as usize, f.place));
            }
        }
    }
    out
}

#[test]
fn a_device_that_holds_every_expert_routes_in_frame() {
    let p = olmoe(&h200(150_000_000_000), &Options::default());
    assert_eq!(resident(&p), (0..16).collect::<Vec<_>>());
    assert!(expert_places(&p).iter().all(|(_, place)| *place == Place::Device(DeviceId(0))));
    // The embedding on the host, then one device frame for the whole forward.
    assert_eq!(p.frames.len(), 2, "{p}");
    assert!(p.to_string().contains("experts l0..l15 resident on d0 (in-frame routing): 1024 experts"), "{p}");
}

#[test]
fn a_budget_short_of_every_layer_leaves_the_experts_to_the_adaptive_cache() {
    let full = olmoe(&h200(150_000_000_000), &Options::default());
    let (experts, scratch) = full.placement.resident.bytes[0];
    let per_layer = experts / 16;
    let dense = full.placement.fits[0].bytes + full.profile.devices[0].reserve;
    for layers in [0u64, 1, 5, 11, 15, 16] {
        // Exactly what `layers` layers need, plus less than one more layer.
        let budget = dense + scratch + layers * per_layer + per_layer / 2;
        let p = olmoe(&h200(budget), &Options::default());
        assert_eq!(p.placement.layers.iter().filter(|l| **l != Place::Host).count(), 16, "the dense part fits first");
        // All or nothing: a budget short of every layer's experts makes none resident.
        let want: Vec<usize> = if layers == 16 { (0..16).collect() } else { Vec::new() };
        assert_eq!(resident(&p), want, "budget {budget}");
        for (l, place) in expert_places(&p) {
            let want = if layers == 16 { Place::Device(DeviceId(0)) } else { Place::Host };
            assert_eq!(place, want, "l{l} with {layers} layers' worth of budget");
        }
        let (b, s) = p.placement.resident.bytes[0];
        assert!(b + s <= p.placement.fits[0].tier, "resident experts within the tier");
        if layers < 16 {
            assert!(p.placement.fits[0].tier >= layers * per_layer, "the budget stays the tier's");
            assert!(!p.to_string().contains("in-frame routing"), "{p}");
        }
    }
}

#[test]
fn no_resident_experts_with_the_tier_off_or_a_device_that_does_not_list_them() {
    let off = olmoe(&h200(150_000_000_000), &Options { expert_tier: false, ..Options::default() });
    assert!(resident(&off).is_empty());
    assert!(expert_places(&off).iter().all(|(_, place)| *place == Place::Host));
    let mut p = h200(150_000_000_000);
    let kinds = [
        OpKind::Embed,
        OpKind::RmsNorm,
        OpKind::Linear,
        OpKind::Rope,
        OpKind::Attention,
        OpKind::Act,
        OpKind::Glu,
        OpKind::Add,
        OpKind::Mul,
        OpKind::Route,
    ];
    p.devices[0].features.ops = Some(kinds.to_vec());
    let plan = olmoe(&p, &Options::default());
    assert!(resident(&plan).is_empty(), "RoutedExperts is not listed");
    assert!(expert_places(&plan).iter().all(|(_, place)| *place == Place::Host));
}

#[test]
fn resident_experts_off_sends_every_layer_through_host_steps() {
    let p = olmoe(&h200(150_000_000_000), &Options { resident_experts: false, ..Options::default() });
    assert!(resident(&p).is_empty());
    assert!(expert_places(&p).iter().all(|(_, place)| *place == Place::Host));
    assert!(p.placement.fits[0].tier > 0, "the budget stays the tier's");
}

#[test]
fn forced_device_layers_bound_the_resident_ones() {
    let p = olmoe(&h200(150_000_000_000), &Options { device_layers: Some(6), ..Options::default() });
    assert_eq!(resident(&p), (0..6).collect::<Vec<_>>());
    for (l, place) in expert_places(&p) {
        assert_eq!(place, if l < 6 { Place::Device(DeviceId(0)) } else { Place::Host }, "l{l}");
    }
}
