//! The weights a program reads, resolved once against a checkpoint: every `WeightRef` checked
//! for presence and shape when the model loads (so a forward never meets a missing tensor),
//! small vectors (norms, biases, sinks) converted to f32 once, matrices kept in their
//! checkpoint format as views.

use crate::format::{Matrix, WeightFormat};
use crate::model::{Checkpoint, LoadError, Tensor};
use coli_compiler::ir::{ExpertBias, ExpertTensor, Op, Program, RowSelect, WeightRef};
use std::collections::HashMap;
use std::sync::Arc;

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
    #[error("{source_path}: tensor {name} is stored input-major in {format}; coli re-lays only F32, F16 and BF16 tensors at load")]
    Relayout { source_path: String, name: String, format: WeightFormat },
}

impl WeightStore {
    /// Resolves every weight `program` reads. `progress(done, total)` is called per tensor.
    pub fn load(ckpt: &Checkpoint, program: &Program, progress: &mut dyn FnMut(usize, usize)) -> Result<WeightStore, WeightError> {
        let mut wanted: Vec<(String, Vec<usize>, bool)> = Vec::new();
        let ops = program.prologue.iter().chain(program.layers.iter().flat_map(|l| l.ops.iter())).chain(program.epilogue.iter());
        let mut expert_tensors: Vec<(ExpertTensor, usize)> = Vec::new();
        let mut derived: Vec<ExpertTensor> = Vec::new();
        let mut biases: Vec<ExpertBias> = Vec::new();
        for op in program.layers.iter().flat_map(|l| l.ops.iter()) {
            if let Op::RoutedExperts { weights: w, .. } = op {
                biases.extend([&w.gate_bias, &w.up_bias, &w.down_bias].into_iter().flatten().cloned());
            }
        }
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
                ExpertTensor::StackedInputMajor { .. } => derived.push(e),
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
        for e in derived {
            store.relayout_expert(ckpt, &e)?;
        }
        for b in biases {
            store.expert_bias_load(ckpt, &b)?;
        }
        progress(total, total);
        Ok(store)
    }

    /// Re-lays an input-major stacked expert tensor (`[experts, cols, out]`) as the usual
    /// `[experts, rows, cols]`, its selected output columns only, in the tensor's own float
    /// format (an owned copy).
    fn relayout_expert(&mut self, ckpt: &Checkpoint, e: &ExpertTensor) -> Result<(), WeightError> {
        let ExpertTensor::StackedInputMajor { name, shape, select } = e else { return Ok(()) };
        let key = derived_key(name, *select);
        if self.tensors.contains_key(&key) {
            return Ok(());
        }
        let src_path = ckpt.path().display().to_string();
        let t = ckpt.tensor(name)?;
        let want = e.tensor_shape();
        if t.shape != want {
            return Err(WeightError::Shape { source_path: src_path, name: name.clone(), got: t.shape.clone(), want });
        }
        let size = match t.format {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            format => return Err(WeightError::Relayout { source_path: src_path, name: name.clone(), format }),
        };
        let (experts, rows, cols, out) = (shape[0], shape[1], shape[2], want[2]);
        let src = t.bytes();
        let mut bytes = vec![0u8; experts * rows * cols * size];
        for ex in 0..experts {
            for r in 0..rows {
                let oc = select.map_or(r, |s| s.index(r));
                for c in 0..cols {
                    let from = ((ex * cols + c) * out + oc) * size;
                    let to = ((ex * rows + r) * cols + c) * size;
                    bytes[to..to + size].copy_from_slice(&src[from..from + size]);
                }
            }
        }
        let owned = Tensor::owned(key.clone(), t.format, shape.clone(), bytes, Arc::new(t.source().to_path_buf()));
        self.tensors.insert(key, owned);
        Ok(())
    }

    /// Reads a stacked expert bias (`[experts, width]`, its selected entries) as f32.
    fn expert_bias_load(&mut self, ckpt: &Checkpoint, b: &ExpertBias) -> Result<(), WeightError> {
        let key = derived_key(&b.name, b.select);
        if self.vectors.contains_key(&key) {
            return Ok(());
        }
        let t = ckpt.tensor(&b.name)?;
        let want = b.tensor_shape();
        if t.shape != want {
            return Err(WeightError::Shape { source_path: ckpt.path().display().to_string(), name: b.name.clone(), got: t.shape.clone(), want });
        }
        let all = t.to_f32_vec()?;
        let (experts, width, total) = (b.shape[0], b.shape[1], want[1]);
        let v: Vec<f32> = (0..experts * width).map(|i| all[(i / width) * total + b.select.map_or(i % width, |s| s.index(i % width))]).collect();
        self.vectors.insert(key, v);
        Ok(())
    }

    /// Expert `e`'s entries of a per-expert bias.
    pub fn expert_bias(&self, b: &ExpertBias, e: usize) -> &[f32] {
        let width = b.shape[1];
        &self.vectors[&derived_key(&b.name, b.select)][e * width..(e + 1) * width]
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
            ExpertTensor::StackedInputMajor { name, select, .. } => self.tensors[&derived_key(name, *select)].expert(e),
        }
    }

    /// Bytes of every tensor held.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes().len()).sum()
    }
}

/// The store's key of a tensor re-laid or selected at load (never a checkpoint name: `#`).
fn derived_key(name: &str, select: Option<RowSelect>) -> String {
    match select {
        None => format!("{name}#all"),
        Some(s) => format!("{name}#{}x{}+{}/{}", s.groups, s.take, s.offset, s.stride),
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
