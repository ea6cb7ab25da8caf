//! Where a layer's routed experts lie in the checkpoint's files: per expert, the file, offset
//! and length of its gate, up and down, when every one is a view of a file.
//!
//! Must not: read the files (the I/O pool does), or accept a layer whose experts differ in shape.

use super::{Role, Span};
use crate::format::WeightFormat;
use crate::model::Tensor;
use crate::store::weights::WeightStore;
use coli_compiler::ir::{ExpertTensor, ExpertWeights};
use std::path::PathBuf;

/// Where each expert's gate, up and down lie in the files, with the tensors holding them;
/// `None` when any is not a view of a file.
#[allow(clippy::type_complexity)]
pub(super) fn layer_spans<'a>(
    ws: &'a WeightStore,
    w: &ExpertWeights,
    experts: usize,
    files: &mut Vec<PathBuf>,
) -> Option<([Role; 3], Vec<[Span; 3]>, Vec<&'a Tensor>)> {
    let holder = |t: &ExpertTensor, e: usize| -> Option<&'a Tensor> {
        match t {
            ExpertTensor::PerExpert { pattern, .. } => Some(ws.tensor(&pattern.replace("{e}", &e.to_string()))),
            ExpertTensor::Stacked { name, select: None, .. } => Some(ws.tensor(name)),
            // Derived at load (rows of a fused tensor, input-major re-laid): not file spans.
            ExpertTensor::Stacked { .. } | ExpertTensor::StackedInputMajor { .. } => None,
        }
    };
    let roles = [&w.gate, &w.up, &w.down];
    let mut shape = None;
    let mut spans = Vec::with_capacity(experts);
    let mut tensors: Vec<&Tensor> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for e in 0..experts {
        let mut s = [Span { file: 0, offset: 0, len: 0 }; 3];
        let mut r = [Role { format: WeightFormat::F32, rows: 0, cols: 0 }; 3];
        for (i, role) in roles.iter().enumerate() {
            let t = holder(role, e)?;
            let base = t.file_offset()?;
            let m = ws.expert(role, e);
            let within = (m.bytes().as_ptr() as usize).checked_sub(t.bytes().as_ptr() as usize)?;
            let file = match files.iter().position(|f| f == t.source()) {
                Some(f) => f,
                None => {
                    files.push(t.source().to_path_buf());
                    files.len() - 1
                }
            };
            s[i] = Span { file, offset: base + within as u64, len: m.bytes().len() };
            r[i] = Role { format: m.format, rows: m.rows, cols: m.cols };
            if seen.insert(t as *const Tensor as usize) {
                tensors.push(t);
            }
        }
        match &shape {
            None => shape = Some(r),
            Some(like) => {
                let same = like.iter().zip(&r).all(|(a, b)| (a.format, a.rows, a.cols) == (b.format, b.rows, b.cols));
                if !same {
                    return None;
                }
            }
        }
        spans.push(s);
    }
    Some((shape?, spans, tensors))
}
