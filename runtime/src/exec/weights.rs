//! The weights a program reads, resolved once against a checkpoint: every `WeightRef` checked
//! for presence and shape when the model loads (so a forward never meets a missing tensor),
//! small vectors (norms, biases, sinks) converted to f32 once, matrices kept in their
//! checkpoint format as views.

use crate::format::Matrix;
use crate::model::{Checkpoint, LoadError, Tensor};
use coli_compiler::ir::{ExpertTensor, Op, Program, WeightRef};
use std::collections::HashMap;

/// Every tensor of a program, by name.
pub struct WeightStore {
    tensors: HashMap<String, Tensor>,
    vectors: HashMap<String, Vec<f32>>,
}

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{source_path}: tensor {name} has shape {got:?}, the program expects {want:?}")]
    Shape { source_path: String, name: String, got: Vec<usize>, want: Vec<usize> },
}

impl WeightStore {
    /// Resolves every weight `program` reads. `progress(done, total)` is called per tensor.
    pub fn load(ckpt: &Checkpoint, program: &Program, progress: &mut dyn FnMut(usize, usize)) -> Result<WeightStore, WeightError> {
        let mut wanted: Vec<(String, Vec<usize>, bool)> = Vec::new();
        let ops = program.prologue.iter().chain(program.layers.iter().flat_map(|l| l.ops.iter())).chain(program.epilogue.iter());
        let mut expert_tensors: Vec<(ExpertTensor, usize)> = Vec::new();
        for op in ops {
            visit_weights(op, &mut |w: &WeightRef, is_vector| wanted.push((w.name.clone(), w.shape.clone(), is_vector)), &mut |e: &ExpertTensor, n| {
                expert_tensors.push((e.clone(), n))
            });
        }
        for (e, experts) in expert_tensors {
            match e {
                ExpertTensor::PerExpert { pattern, shape } => {
                    for i in 0..experts {
                        wanted.push((pattern.replace("{e}", &i.to_string()), shape.clone(), false));
                    }
                }
                ExpertTensor::Stacked { name, shape } => wanted.push((name, shape, false)),
            }
        }
        let total = wanted.len();
        let mut store = WeightStore { tensors: HashMap::new(), vectors: HashMap::new() };
        for (i, (name, shape, is_vector)) in wanted.into_iter().enumerate() {
            progress(i, total);
            if store.tensors.contains_key(&name) {
                continue;
            }
            let t = ckpt.tensor(&name)?;
            if t.shape != shape {
                return Err(WeightError::Shape { source_path: ckpt.path().display().to_string(), name, got: t.shape.clone(), want: shape });
            }
            if is_vector {
                store.vectors.insert(name.clone(), t.to_f32_vec()?);
            }
            store.tensors.insert(name, t);
        }
        progress(total, total);
        Ok(store)
    }

    pub fn tensor(&self, name: &str) -> &Tensor {
        &self.tensors[name]
    }

    pub fn matrix(&self, name: &str) -> Matrix<'_> {
        self.tensors[name].as_matrix()
    }

    pub fn vector(&self, name: &str) -> &[f32] {
        &self.vectors[name]
    }

    /// Expert `e`'s matrix of one of its three roles.
    pub fn expert(&self, t: &ExpertTensor, e: usize) -> Matrix<'_> {
        match t {
            ExpertTensor::PerExpert { pattern, .. } => self.tensors[&pattern.replace("{e}", &e.to_string())].as_matrix(),
            ExpertTensor::Stacked { name, .. } => self.tensors[name].expert(e),
        }
    }

    /// Bytes of every tensor held.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes().len()).sum()
    }
}

/// Calls `weight(w, is_vector)` for each plain weight of `op` and `experts(t, count)` for each
/// expert tensor.
pub fn visit_weights(op: &Op, weight: &mut dyn FnMut(&WeightRef, bool), experts: &mut dyn FnMut(&ExpertTensor, usize)) {
    match op {
        Op::Embed { table, .. } => weight(table, false),
        Op::RmsNorm { weight: w, .. } => weight(w, true),
        Op::LayerNorm { weight: w, bias, .. } => {
            weight(w, true);
            if let Some(b) = bias {
                weight(b, true);
            }
        }
        Op::Linear { weight: w, bias, .. } => {
            weight(w, false);
            if let Some(b) = bias {
                weight(b, true);
            }
        }
        Op::Attention { spec, .. } => {
            if let Some(s) = &spec.sinks {
                weight(s, true);
            }
        }
        Op::Route { correction_bias, .. } => {
            if let Some(b) = correction_bias {
                weight(b, true);
            }
        }
        Op::RoutedExperts { weights, experts: n, .. } => {
            experts(&weights.gate, *n);
            experts(&weights.up, *n);
            experts(&weights.down, *n);
        }
        Op::Mla { spec, .. } => spec.weights.iter().for_each(|(_, w)| weight(w, w.shape.len() == 1)),
        Op::LinearAttention { spec, .. } => spec.weights.iter().for_each(|(_, w)| weight(w, w.shape.len() == 1)),
        Op::Rope { .. } | Op::Act { .. } | Op::Glu { .. } | Op::Add { .. } | Op::Mul { .. } => {}
    }
}
