//! The plan: the compiler's output, plain data. The program the runtime executes, where each
//! part of it runs (placement, with the fit's numbers), and the frames the runtime submits.
//!
//! `Plan`'s `Display` is its readable text format (the snapshots are made of it); `to_dot`
//! draws it. This module must not compute placement or frames; it only holds and prints them.

use crate::cost::human;
use crate::frames::{op_of, Frame};
use crate::ids::{ExpertId, OpId, Place};
use crate::ir::{LayerId, Program};
use crate::place::Placement;
use crate::print::layer_ranges;
use crate::profile::{DeviceProfile, Options};
use std::fmt::{self, Write};

/// What `compile` produces.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The forward pass, op by op: the runtime's contract.
    pub program: Program,
    /// The profile the plan was made for.
    pub profile: DeviceProfile,
    pub options: Options,
    pub placement: Placement,
    /// The program cut into frames, in execution order.
    pub frames: Vec<Frame>,
}

impl Plan {
    /// Every op in execution order with the name of the part it belongs to
    /// (`prologue`, `l3`, `epilogue`).
    pub fn ops_in_order(&self) -> Vec<(String, &crate::ir::Op)> {
        let p = &self.program;
        let mut out: Vec<(String, &crate::ir::Op)> = p.prologue.iter().map(|op| ("prologue".to_string(), op)).collect();
        for l in &p.layers {
            out.extend(l.ops.iter().map(|op| (l.id.to_string(), op)));
        }
        out.extend(p.epilogue.iter().map(|op| ("epilogue".to_string(), op)));
        out
    }

    /// The frame each op is in, by op.
    pub fn frame_of(&self, op: OpId) -> Option<&Frame> {
        self.frames.iter().find(|f| f.ops.contains(&op))
    }
}

/// `l0:3..l1:2` for a frame's ops.
fn op_span(ops: &[OpId]) -> String {
    match (ops.first(), ops.last()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}..{b}"),
        _ => "-".into(),
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let pl = &self.placement;
        writeln!(f, "plan {} for profile {}", self.program.family, self.profile.name)?;
        let upload =
            o.upload_format.map(|u| format!("matrices up as {u}")).unwrap_or_else(|| "matrices up as stored".into());
        writeln!(
            f,
            "options: context {}, chunk {} rows, dense part {}, expert tier {}, {upload}, unknown formats as {}{}",
            o.context,
            o.chunk_rows,
            if o.dense_on_device { "on devices" } else { "on the host" },
            if o.expert_tier { "on" } else { "off" },
            o.assumed_format,
            o.device_layers.map(|n| format!(", device layers forced to {n}")).unwrap_or_default()
        )?;
        if let Some(n) = o.second_device_layers {
            writeln!(f, "options: second device's layers forced to {n}")?;
        }
        if let Some(d) = o.kv_device_positions {
            writeln!(f, "options: kv split forced to {d} device positions a layer, blocks of {}", o.kv_block)?;
        }
        match o.draft {
            crate::DraftRole::None => {}
            crate::DraftRole::Target => writeln!(f, "options: a draft's target (its residual read by the host)")?,
            crate::DraftRole::Draft => writeln!(f, "options: the draft model (its multi-token prediction layer)")?,
        }
        // Devices and the fit.
        if self.profile.devices.is_empty() {
            writeln!(f, "devices: none (host only)")?;
        } else {
            writeln!(f, "devices:")?;
            for (d, fit) in self.profile.devices.iter().zip(&pl.fits) {
                writeln!(
                    f,
                    "  {} {:?} \"{}\": budget {}, reserve {}, usable {}",
                    fit.device,
                    d.kind,
                    d.name,
                    human(d.memory_budget),
                    human(d.reserve),
                    human(fit.usable)
                )?;
            }
        }
        writeln!(
            f,
            "sizes: fixed {} (scratch of one chunk), tail {} (head and its rows)",
            human(pl.fixed),
            human(pl.tail)
        )?;
        let mut groups: Vec<(crate::place::size::LayerCost, Vec<u32>)> = Vec::new();
        for (i, c) in pl.costs.iter().enumerate() {
            match groups.iter_mut().find(|(g, _)| g == c) {
                Some((_, ids)) => ids.push(i as u32),
                None => groups.push((*c, vec![i as u32])),
            }
        }
        for (c, ids) in groups {
            writeln!(f, "  {} each: {c}", layer_ranges(&ids))?;
        }
        for fit in &pl.fits {
            let took = if fit.layers == 0 {
                format!("no layer (offered from l{})", fit.first_layer)
            } else {
                let ids: Vec<u32> = (fit.first_layer as u32..(fit.first_layer + fit.layers) as u32).collect();
                format!("{} ({} layer{})", layer_ranges(&ids), fit.layers, if fit.layers == 1 { "" } else { "s" })
            };
            let tier = if fit.tier > 0 { format!(", expert tier {}", human(fit.tier)) } else { String::new() };
            writeln!(
                f,
                "fit {}: {took}{}, placed {} of {}{tier}",
                fit.device,
                if fit.tail { " and the head" } else { "" },
                human(fit.bytes),
                human(fit.usable)
            )?;
        }
        // Placement.
        let mut line = String::from("placement: prologue host");
        let mut i = 0;
        while i < pl.layers.len() {
            let mut j = i;
            while j + 1 < pl.layers.len() && pl.layers[j + 1] == pl.layers[i] {
                j += 1;
            }
            let ids: Vec<u32> = (i as u32..=j as u32).collect();
            let _ = write!(line, ", {} {}", layer_ranges(&ids), pl.layers[i]);
            i = j + 1;
        }
        let _ = write!(line, ", head {}", pl.head);
        writeln!(f, "{line}")?;
        if let Some(k) = &pl.kv_split {
            writeln!(f, "{k}")?;
        }
        if let Some(&(layer, bytes, experts)) = pl.expert_bytes.first() {
            let ids: Vec<u32> = pl.expert_bytes.iter().map(|(l, _, _)| l.0).collect();
            let first = ExpertId { layer, index: 0 };
            let tier: u64 = pl.fits.iter().map(|x| x.tier).sum();
            let held = tier.checked_div(bytes).unwrap_or(0);
            let total = experts as u64 * ids.len() as u64;
            let tier = match tier {
                0 => String::new(),
                _ if held >= total => format!("; the tier holds all {total}"),
                _ => format!("; the tier holds {held} of {total}"),
            };
            writeln!(f, "experts: {} x {experts}, {} each ({first}){tier}", layer_ranges(&ids), human(bytes))?;
            // Resident layers: every expert on a device, routing and experts in its frame.
            let res = &pl.resident;
            for (k, fit) in pl.fits.iter().enumerate() {
                let on: Vec<u32> = ids
                    .iter()
                    .copied()
                    .filter(|l| res.layers.get(*l as usize).copied().flatten() == Some(fit.device))
                    .collect();
                if let (false, Some((b, s))) = (on.is_empty(), res.bytes.get(k)) {
                    writeln!(
                        f,
                        "experts {} resident on {} (in-frame routing): {} experts, {}, scratch {}",
                        layer_ranges(&on),
                        fit.device,
                        on.len() * experts,
                        human(*b),
                        human(*s)
                    )?;
                }
            }
            let host: Vec<u32> =
                ids.iter().copied().filter(|l| res.layers.get(*l as usize).copied().flatten().is_none()).collect();
            if res.layers.iter().any(Option::is_some) && !host.is_empty() {
                writeln!(f, "experts {} through host steps", layer_ranges(&host))?;
            }
        }
        // Frames.
        writeln!(f, "frames ({}):", self.frames.len())?;
        for fr in &self.frames {
            let mut s = format!("  {} {} {}", fr.id, fr.place, op_span(&fr.ops));
            if fr.ops.len() <= 4 {
                let kinds: Vec<String> = fr.ops.iter().map(|id| op_of(&self.program, *id).kind().to_string()).collect();
                let _ = write!(s, " [{}]", kinds.join(" "));
            } else {
                let _ = write!(s, " [{} ops]", fr.ops.len());
            }
            if let Some(b) = fr.beside {
                let _ = write!(s, " beside {b}, not waited for");
            }
            if let Some(id) = fr.kv_split {
                let _ = write!(s, "; the host finishes {id} (kv split)");
            }
            let names = |vs: &[crate::ir::ValueId]| {
                vs.iter().map(|v| format!("{v} {}", self.program.value(*v).name)).collect::<Vec<_>>().join(", ")
            };
            if !fr.uploads.is_empty() {
                let _ = write!(s, "; up {}", names(&fr.uploads));
            }
            if !fr.downloads.is_empty() {
                let _ = write!(s, "; down {}", names(&fr.downloads));
            }
            writeln!(f, "{s}")?;
        }
        write!(f, "{}", self.program)
    }
}

/// The layers placed on `place`.
pub fn layers_on(placement: &Placement, place: Place) -> Vec<LayerId> {
    placement.layers.iter().enumerate().filter(|(_, p)| **p == place).map(|(i, _)| LayerId(i as u32)).collect()
}
