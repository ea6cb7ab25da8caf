//! Properties of the fit, on byte counts and on whole plans: the number of device layers N
//! grows with the budget, placed bytes never exceed the budget, and N = L exactly when the
//! fixed bytes and every layer fit.

use coli_compiler::bind::Bindings;
use coli_compiler::ids::{DeviceId, Place};
use coli_compiler::place::fit::fit_chain;
use coli_compiler::profile::{Device, DeviceKind, Features};
use coli_compiler::spec::Spec;
use coli_compiler::{compile, DeviceProfile, Options, Plan};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

fn layers() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(0u64..1_000, 0..12)
}

proptest! {
    #[test]
    fn n_is_monotone_in_the_budget(fixed in 0u64..500, l in layers(), tail in 0u64..500, a in 0u64..10_000, b in 0u64..10_000) {
        let (lo, hi) = (a.min(b), a.max(b));
        let (x, y) = (fit_chain(fixed, &l, tail, lo), fit_chain(fixed, &l, tail, hi));
        prop_assert!(x.layers <= y.layers);
        prop_assert!(!x.tail || y.tail);
    }

    #[test]
    fn placed_bytes_never_exceed_the_budget(fixed in 0u64..500, l in layers(), tail in 0u64..500, usable in 0u64..10_000) {
        let f = fit_chain(fixed, &l, tail, usable);
        prop_assert!(f.bytes <= usable);
        let want = if f.layers == 0 { 0 } else { fixed + l[..f.layers].iter().sum::<u64>() + if f.tail { tail } else { 0 } };
        prop_assert_eq!(f.bytes, want);
    }

    #[test]
    fn n_is_l_exactly_when_everything_fits(fixed in 0u64..500, l in layers(), tail in 0u64..500, usable in 0u64..10_000) {
        prop_assume!(!l.is_empty());
        let f = fit_chain(fixed, &l, tail, usable);
        prop_assert_eq!(f.layers == l.len(), fixed + l.iter().sum::<u64>() <= usable);
        // And it is the most layers that fit: one more would not.
        if f.layers < l.len() {
            prop_assert!(fixed + l[..=f.layers].iter().sum::<u64>() > usable);
        }
    }
}

fn olmoe() -> &'static (Spec, Bindings) {
    static S: OnceLock<(Spec, Bindings)> = OnceLock::new();
    S.get_or_init(|| {
        let g = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs");
        (
            Spec::load(&g.join("olmoe.ron")).unwrap(),
            Bindings::from_config_json(&g.join("configs/olmoe-1b-7b.json")).unwrap(),
        )
    })
}

fn plan_with(budgets: &[u64]) -> Plan {
    let devices = budgets
        .iter()
        .enumerate()
        .map(|(i, &b)| Device {
            name: format!("gpu{i}"),
            kind: DeviceKind::Discrete,
            memory_budget: b,
            reserve: 0,
            features: Features::default(),
        })
        .collect();
    let (spec, b) = olmoe();
    compile(spec, b, &DeviceProfile { name: "prop".into(), devices }, &Options::default()).unwrap()
}

fn on(p: &Plan, d: u32) -> usize {
    p.placement.layers.iter().filter(|x| **x == Place::Device(DeviceId(d))).count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn plans_respect_budgets_and_grow_with_them(a in 0u64..4_000_000_000, b in 0u64..4_000_000_000, second in 0u64..2_000_000_000) {
        let (lo, hi) = (a.min(b), a.max(b));
        let (x, y) = (plan_with(&[lo, second]), plan_with(&[hi, second]));
        prop_assert!(on(&x, 0) <= on(&y, 0));
        for p in [&x, &y] {
            for f in &p.placement.fits {
                prop_assert!(f.bytes <= f.usable);
            }
            // The two devices together never take more layers than there are, in order.
            prop_assert!(on(p, 0) + on(p, 1) <= p.program.layers.len());
        }
    }
}
