//! The weights a program reads, resolved once against a checkpoint: every `WeightRef` checked
//! for presence and shape when the model loads (so a forward never meets a missing tensor),
//! small vectors (norms, biases, sinks) converted to f32 once, matrices kept in their
//! checkpoint format as views. A weight that selects rows of a fused tensor (`WeightRef::rows`)
//! is copied once into a tensor of its rows, stored under a derived name (`#` in it) that
//! `name_row_selections` writes into the program, so ops look it up by name like any other.

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
        let mut selections: Vec<(WeightRef, bool)> = Vec::new();
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
            let mut weight = |w: &WeightRef, is_vector: bool| match w.rows {
                None => wanted.push((w.name.clone(), w.shape.clone(), is_vector)),
                Some(_) => selections.push((w.clone(), is_vector)),
            };
            visit_weights(op, &mut weight, &mut |e: &ExpertTensor, n| {
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
        for (w, is_vector) in selections {
            store.select_rows(ckpt, &w, is_vector)?;
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

    /// Copies the rows a weight selects into a tensor of its own (and, for a vector, its f32
    /// entries), under `derived_key`.
    fn select_rows(&mut self, ckpt: &Checkpoint, w: &WeightRef, is_vector: bool) -> Result<(), WeightError> {
        let key = derived_key(&w.name, w.rows);
        if self.tensors.contains_key(&key) {
            return Ok(());
        }
        let t = ckpt.tensor(&w.name)?;
        let want = w.tensor_shape();
        if t.shape != want {
            return Err(WeightError::Shape { source_path: ckpt.path().display().to_string(), name: w.name.clone(), got: t.shape.clone(), want });
        }
        let m = t.as_matrix();
        let rows = w.shape.first().copied().unwrap_or(1);
        let mut bytes = Vec::with_capacity(rows * m.bytes().len() / m.rows.max(1));
        if is_vector {
            // A vector's "rows" are its entries.
            let all = t.to_f32_vec()?;
            let v: Vec<f32> = (0..rows).map(|i| all[w.tensor_row(i)]).collect();
            bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            self.vectors.insert(key.clone(), v);
            let owned = Tensor::owned(key.clone(), WeightFormat::F32, w.shape.clone(), bytes, Arc::new(t.source().to_path_buf()));
            self.tensors.insert(key, owned);
            return Ok(());
        }
        for i in 0..rows {
            bytes.extend_from_slice(m.row(w.tensor_row(i)));
        }
        let owned = Tensor::owned(key.clone(), t.format, w.shape.clone(), bytes, Arc::new(t.source().to_path_buf()));
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

/// Points every row-selecting weight of `program` at the tensor of its rows the store built
/// (its `derived_key`, `rows: None`), so that lookups by name see exactly the selected rows.
pub fn name_row_selections(program: &mut Program) {
    let mut rename = |w: &mut WeightRef| {
        if w.rows.is_some() {
            w.name = derived_key(&w.name, w.rows);
            w.rows = None;
        }
    };
    let ops = program.prologue.iter_mut().chain(program.layers.iter_mut().flat_map(|l| l.ops.iter_mut())).chain(program.epilogue.iter_mut());
    for op in ops {
        match op {
            Op::Embed { table: w, .. } | Op::RmsNorm { weight: w, .. } => rename(w),
            Op::LayerNorm { weight, bias, .. } | Op::Linear { weight, bias, .. } => {
                rename(weight);
                bias.iter_mut().for_each(&mut rename);
            }
            Op::Attention { spec, .. } => spec.sinks.iter_mut().for_each(&mut rename),
            Op::Route { correction_bias, .. } => correction_bias.iter_mut().for_each(&mut rename),
            Op::Mla { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::LinearAttention { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::RoutedExperts { .. } | Op::Rope { .. } | Op::Act { .. } | Op::Glu { .. } | Op::Add { .. } | Op::Mul { .. } => {}
        }
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
        // The convolution's taps (`[channels, 1, kernel]`) are read as f32 too.
        Op::LinearAttention { spec, .. } => spec.weights.iter().for_each(|(role, w)| weight(w, w.shape.len() == 1 || role == "conv1d")),
        Op::Rope { .. } | Op::Act { .. } | Op::Glu { .. } | Op::Add { .. } | Op::Mul { .. } => {}
    }
}
