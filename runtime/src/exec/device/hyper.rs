//! DeepSeek V4's ops over a residual of several streams in a device frame: the
//! hyper-connections' mix into a sublayer and out of it, and the grouped output projection.
//! Their weights go up apart from the other matrices (`Apart`): a site's mixing weights as f32
//! whatever the checkpoint's format (the CPU multiplies them in f32, `Precision::Exact`), a
//! grouped projection's weight as one matrix per group (its rows of that group, in the
//! checkpoint's or the quantizer's format). The streams are row values like any other: a
//! residual that crosses frames goes up and down with the frame's uploads and downloads.
//!
//! Must not: keep state between forwards beyond the per-session scratch of a grouped
//! projection's regrouped input (`scratch`), which every call overwrites before it reads.

use super::{DeviceModel, Rec};
use crate::exec::weights::WeightStore;
use crate::format::dequant_row;
use crate::oplib::op_name;
use crate::vk::{Context, DeviceBuffer, DeviceMatrix, Frame as VkFrame, HyperMix, HyperShape, VkError};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ir::{Op, Program, ValueId};
use std::collections::HashMap;

/// The weights of a device's hyper-connection sites and grouped projections.
#[derive(Default)]
pub(super) struct Apart {
    /// Mixing weights (`fn`, `[rows, S * hidden]`) as f32 rows, by name.
    pub dense: HashMap<String, DeviceBuffer>,
    /// A grouped projection's weight, one matrix per group, by name.
    pub grouped: HashMap<String, Vec<DeviceMatrix>>,
    /// Bytes uploaded.
    pub bytes: u64,
}

impl Apart {
    /// Whether `name` went up here (and not as a plain matrix).
    pub fn holds(&self, name: &str) -> bool {
        self.dense.contains_key(name) || self.grouped.contains_key(name)
    }
}

/// Uploads the mixing weights and grouped projections `ops` read.
pub(super) fn upload_apart(ctx: &Context, ops: &[&Op], weights: &WeightStore) -> Result<Apart, VkError> {
    let mut a = Apart::default();
    for op in ops {
        match op {
            Op::HyperPre { spec, .. } if !a.dense.contains_key(&spec.fn_weight.name) => {
                let m = weights.matrix(&spec.fn_weight.name);
                let mut rows = vec![0f32; m.rows * m.cols];
                for (r, out) in rows.chunks_exact_mut(m.cols.max(1)).enumerate() {
                    dequant_row(m.format, m.row(r), out);
                }
                let b = ctx.upload_f32(&rows)?;
                a.bytes += b.len_bytes() as u64;
                a.dense.insert(spec.fn_weight.name.clone(), b);
            }
            Op::GroupedLinear { weight, groups, .. } if !a.grouped.contains_key(&weight.name) => {
                let m = weights.matrix(&weight.name);
                if *groups == 0 || !m.rows.is_multiple_of(*groups) {
                    return Err(VkError::BadArgument {
                        op: "grouped_linear",
                        msg: format!("{} rows in {groups} groups", m.rows),
                    });
                }
                let r = m.rows / groups;
                let mut mats = Vec::with_capacity(*groups);
                for g in 0..*groups {
                    let part = m.rows_range(g * r, (g + 1) * r);
                    mats.push(ctx.upload_matrix(part.format, part.rows, part.cols, part.bytes())?);
                    a.bytes += part.bytes().len() as u64;
                }
                a.grouped.insert(weight.name.clone(), mats);
            }
            _ => {}
        }
    }
    Ok(a)
}

/// The per-session scratch of the grouped projections of `frames`: `rows` of the widest input.
pub(super) fn scratch(
    ctx: &Context,
    p: &Program,
    frames: &[Frame],
    rows: usize,
) -> Result<Option<DeviceBuffer>, VkError> {
    let width = frames
        .iter()
        .flat_map(|f| &f.ops)
        .filter_map(|&id| match op_of(p, id) {
            Op::GroupedLinear { x, .. } => Some(p.value(*x).width),
            _ => None,
        })
        .max();
    width.map(|w| ctx.f32_buffer((w * rows).max(1))).transpose()
}

impl DeviceModel {
    /// Records a hyper-connection or a grouped projection over every row of the step (`record_op`'s
    /// arms for these kinds; they keep no state per sequence).
    pub(super) fn record_hyper<'a>(&'a self, f: &mut VkFrame<'a>, rec: &Rec<'a, '_>, op: &Op) -> Result<(), VkError> {
        let Rec { st, widths, n, precision, .. } = *rec;
        let w = |v: ValueId| widths[v.0 as usize];
        let view = |v: ValueId| st.values[v.0 as usize].view(0, n * w(v));
        match op {
            Op::HyperPre { x, out, mix, spec } => {
                let weights = HyperMix {
                    fn_weight: self.apart.dense[&spec.fn_weight.name].all(),
                    base: self.vecs[&spec.base.name].all(),
                    scale: self.vecs[&spec.scale.name].all(),
                };
                let shape = HyperShape {
                    n,
                    streams: spec.streams,
                    hidden: w(*out),
                    sinkhorn_iters: spec.sinkhorn_iters,
                    eps: spec.eps,
                    norm_eps: spec.norm_eps,
                };
                f.hyper_pre(view(*x), weights, view(*out), mix.map(view), shape)?;
            }
            Op::HyperPost { x, residual, mix, out, streams } => {
                // Without a residual of its own the mix reads the output's streams (in place).
                let mix = mix.map(|m| (view(residual.unwrap_or(*out)), view(m)));
                f.hyper_post(view(*x), mix, view(*out), (n, *streams, w(*x)))?;
            }
            Op::GroupedLinear { x, out, weight, .. } => {
                let scratch = st.grouped.as_ref().ok_or_else(|| VkError::BadArgument {
                    op: "grouped_linear",
                    msg: "no scratch for a grouped projection".into(),
                })?;
                let mats = &self.apart.grouped[&weight.name];
                f.grouped_linear(mats, view(*x), scratch.view(0, n * w(*x)), view(*out), n, precision)?;
            }
            op => {
                return Err(VkError::BadArgument { op: op_name(op), msg: "not a hyper-connection op".into() });
            }
        }
        Ok(())
    }
}
