//! The weights a program reads, resolved once against a checkpoint: every `WeightRef` checked
//! for presence and shape when the model loads (so a forward never meets a missing tensor),
//! small vectors (norms, biases, sinks) converted to f32 once, matrices kept in their
//! checkpoint format as views. A weight that selects rows of a fused tensor (`WeightRef::rows`)
//! is copied once into a tensor of its rows, stored under a derived name (`#` in it) that
//! `name_row_selections` writes into the program, so ops look it up by name like any other.
//!
//! Dense weights on the device only (`release`): the host copies of matrices a device holds
//! (quantized at load, re-laid, or rows selected) can be dropped once uploaded; each matrix
//! keeps how it was made from the checkpoint's file (`Remake`) and is made again, bit for bit,
//! when the CPU first reads it (a lost device), once, whichever thread asks first. A matrix
//! that is a view of the mapped file has no copy: its pages are only advised away. An FP8
//! weight's repack (`model/fp8.rs`) is a copy: released, and made again from the maps; so is an
//! MXFP4 weight's (`model/mxfp4.rs`).
//!
//! Must not: decide which matrices a device holds (the caller names them, from the plan), or
//! copy a mapped tensor except to re-lay, select or quantize it.

use crate::format::{Matrix, WeightFormat};
use crate::model::{fp8::Fp8Source, mxfp4::Mxfp4Source, Checkpoint, LoadError, Tensor};
use coli_compiler::frames::op_of;
use coli_compiler::ids::Place;
use coli_compiler::ir::{ExpertBias, ExpertTensor, Op, Program, RowSelect, WeightRef};
use coli_compiler::Plan;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Every tensor of a program, by name.
pub struct WeightStore {
    tensors: HashMap<String, Held>,
    vectors: HashMap<String, Vec<f32>>,
    /// Released matrices made again since (first CPU reads after a release).
    remade: AtomicUsize,
}

/// A tensor of the store: present from load, absent after a release until first read.
struct Held {
    tensor: OnceLock<Tensor>,
    remake: Remake,
}

/// Where a tensor of the store comes from in the checkpoint's file.
#[derive(Clone)]
struct Source {
    origin: Origin,
    /// The format it was quantized to at load, if it was.
    quantize: Option<WeightFormat>,
}

/// The file's bytes of a tensor.
#[derive(Clone)]
enum Origin {
    /// The file's tensor (a view of the map).
    File(Tensor),
    /// A paired FP8 weight: its codes and scales in the maps, repacked when made.
    Fp8(Fp8Source),
    /// A paired MXFP4 weight: its blocks and scales in the maps, repacked when made.
    Mxfp4(Mxfp4Source),
}

impl Origin {
    fn name(&self) -> &str {
        match self {
            Origin::File(t) => &t.name,
            Origin::Fp8(f) => f.name(),
            Origin::Mxfp4(m) => m.name(),
        }
    }
}

impl Source {
    fn of(ckpt: &Checkpoint, name: &str) -> Result<Source, LoadError> {
        let origin = match (ckpt.fp8_source(name), ckpt.mxfp4_source(name)) {
            (Some(f), _) => Origin::Fp8(f),
            (None, Some(m)) => Origin::Mxfp4(m),
            (None, None) => Origin::File(ckpt.file_tensor(name)?),
        };
        Ok(Source { origin, quantize: ckpt.quantized_to(name) })
    }

    /// The tensor as the store first had it: the file's view (or an FP8 weight's repack), or
    /// quantized again from it.
    fn make(&self) -> Result<Tensor, LoadError> {
        let file = match &self.origin {
            Origin::File(t) => t.clone(),
            Origin::Fp8(f) => f.make()?,
            Origin::Mxfp4(m) => m.make()?,
        };
        match self.quantize {
            None => Ok(file),
            Some(f) => crate::model::quantize_tensor(&file, f),
        }
    }
}

/// How to make a tensor of the store again from the file.
#[derive(Clone)]
enum Remake {
    /// As the checkpoint gives it (a view, or quantized at load).
    Plain(Source),
    /// An input-major stacked expert tensor re-laid.
    Relayout(Source, ExpertTensor),
    /// The rows a weight selects.
    Rows(Source, WeightRef),
}

impl Remake {
    fn make(&self) -> Result<Tensor, WeightError> {
        match self {
            Remake::Plain(src) => Ok(src.make()?),
            Remake::Relayout(src, e) => relayout(&src.make()?, e),
            Remake::Rows(src, w) => Ok(select(&src.make()?, w)),
        }
    }

    /// Whether the tensor is a view of the mapped file (nothing of its own to release; an FP8
    /// weight's repack is a copy of its own).
    fn is_view(&self) -> bool {
        matches!(self, Remake::Plain(Source { origin: Origin::File(_), quantize: None }))
    }
}

/// What `release` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Host copies dropped (quantized, re-laid or selected matrices), and their bytes.
    pub copies: usize,
    pub bytes: usize,
    /// Views of the mapped file whose pages the kernel was told are not needed, and their bytes.
    pub views: usize,
    pub advised: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{source_path}: tensor {name} has shape {got:?}, the program expects {want:?}")]
    Shape { source_path: String, name: String, got: Vec<usize>, want: Vec<usize> },
    #[error("{source_path}: tensor {name} is stored input-major in {format}; coli re-lays F32, F16 and BF16 tensors at load, and reads a block format's out-major")]
    Relayout { source_path: String, name: String, format: WeightFormat },
}

impl WeightStore {
    /// Resolves every weight `program` reads. `progress(done, total)` is called per tensor.
    pub fn load(
        ckpt: &Checkpoint,
        program: &Program,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<WeightStore, WeightError> {
        let mut wanted: Vec<(String, Vec<usize>, bool)> = Vec::new();
        let mut selections: Vec<(WeightRef, bool)> = Vec::new();
        let ops = program
            .prologue
            .iter()
            .chain(program.layers.iter().flat_map(|l| l.ops.iter()))
            .chain(program.epilogue.iter());
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
            visit_weights(op, &mut weight, &mut |e: &ExpertTensor, n| expert_tensors.push((e.clone(), n)));
        }
        for (e, experts) in expert_tensors {
            match e {
                ExpertTensor::PerExpert { pattern, shape } => {
                    for i in 0..experts {
                        wanted.push((pattern.replace("{e}", &i.to_string()), shape.clone(), false));
                    }
                }
                ExpertTensor::Stacked { name, shape, select: None } => wanted.push((name, shape, false)),
                ExpertTensor::Stacked { .. } | ExpertTensor::StackedInputMajor { .. } => derived.push(e),
            }
        }
        let total = wanted.len();
        let mut store = WeightStore { tensors: HashMap::new(), vectors: HashMap::new(), remade: AtomicUsize::new(0) };
        for (i, (name, shape, is_vector)) in wanted.into_iter().enumerate() {
            progress(i, total);
            if store.tensors.contains_key(&name) {
                continue;
            }
            let t = ckpt.tensor(&name)?;
            if t.shape != shape {
                return Err(WeightError::Shape {
                    source_path: ckpt.path().display().to_string(),
                    name,
                    got: t.shape.clone(),
                    want: shape,
                });
            }
            if is_vector {
                store.vectors.insert(name.clone(), t.to_f32_vec()?);
            }
            let remake = Remake::Plain(Source::of(ckpt, &name)?);
            store.insert(name, t, remake);
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

    fn insert(&mut self, name: String, t: Tensor, remake: Remake) {
        let tensor = OnceLock::new();
        let _ = tensor.set(t);
        self.tensors.insert(name, Held { tensor, remake });
    }

    /// Re-lays an input-major stacked expert tensor (`[experts, cols, out]`) as the usual
    /// `[experts, rows, cols]`, its selected output columns only, in the tensor's own float
    /// format (an owned copy); one in a block format is out-major already (`[experts, out,
    /// cols]`, MXFP4 from `_blocks`) and only its selected rows are copied.
    fn relayout_expert(&mut self, ckpt: &Checkpoint, e: &ExpertTensor) -> Result<(), WeightError> {
        // Input-major, or out-major with some rows of each expert (Inkling's fused gate_up).
        let (name, select) = match e {
            ExpertTensor::StackedInputMajor { name, select, .. } => (name, *select),
            ExpertTensor::Stacked { name, select: Some(s), .. } => (name, Some(*s)),
            _ => return Ok(()),
        };
        let key = derived_key(name, select);
        if self.tensors.contains_key(&key) {
            return Ok(());
        }
        let t = ckpt.tensor(name)?;
        let want = if is_float(t.format) { e.tensor_shape() } else { e.out_major_shape() };
        if t.shape != want {
            return Err(WeightError::Shape {
                source_path: ckpt.path().display().to_string(),
                name: name.clone(),
                got: t.shape.clone(),
                want,
            });
        }
        let owned = relayout(&t, e)?;
        self.insert(key, owned, Remake::Relayout(Source::of(ckpt, name)?, e.clone()));
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
            return Err(WeightError::Shape {
                source_path: ckpt.path().display().to_string(),
                name: w.name.clone(),
                got: t.shape.clone(),
                want,
            });
        }
        if is_vector {
            // A vector's "rows" are its entries.
            let rows = w.shape.first().copied().unwrap_or(1);
            let all = t.to_f32_vec()?;
            let v: Vec<f32> = (0..rows).map(|i| all[w.tensor_row(i)]).collect();
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.vectors.insert(key.clone(), v);
            let owned = Tensor::owned(
                key.clone(),
                WeightFormat::F32,
                w.shape.clone(),
                bytes,
                Arc::new(t.source().to_path_buf()),
            );
            // Vectors are never released; the remake is what the matrix path would do.
            self.insert(key, owned, Remake::Rows(Source::of(ckpt, &w.name)?, w.clone()));
            return Ok(());
        }
        let owned = select(&t, w);
        self.insert(key, owned, Remake::Rows(Source::of(ckpt, &w.name)?, w.clone()));
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
            return Err(WeightError::Shape {
                source_path: ckpt.path().display().to_string(),
                name: b.name.clone(),
                got: t.shape.clone(),
                want,
            });
        }
        let all = t.to_f32_vec()?;
        let (experts, width, total) = (b.shape[0], b.shape[1], want[1]);
        let v: Vec<f32> = (0..experts * width)
            .map(|i| all[(i / width) * total + b.select.map_or(i % width, |s| s.index(i % width))])
            .collect();
        self.vectors.insert(key, v);
        Ok(())
    }

    /// Expert `e`'s entries of a per-expert bias.
    pub fn expert_bias(&self, b: &ExpertBias, e: usize) -> &[f32] {
        let width = b.shape[1];
        &self.vectors[&derived_key(&b.name, b.select)][e * width..(e + 1) * width]
    }

    /// The tensor `name` (made again from the file on the first read after a release).
    pub fn tensor(&self, name: &str) -> &Tensor {
        let h = &self.tensors[name];
        h.tensor.get_or_init(|| {
            self.remade.fetch_add(1, Ordering::Relaxed);
            // The same bytes of the same file went through the same steps at load.
            h.remake.make().unwrap_or_else(|e| {
                panic!("{name}: making a released matrix again failed, where the same steps succeeded at load: {e}")
            })
        })
    }

    pub fn matrix(&self, name: &str) -> Matrix<'_> {
        self.tensor(name).as_matrix()
    }

    pub fn vector(&self, name: &str) -> &[f32] {
        &self.vectors[name]
    }

    /// Expert `e`'s matrix of one of its three roles.
    pub fn expert(&self, t: &ExpertTensor, e: usize) -> Matrix<'_> {
        match t {
            ExpertTensor::PerExpert { pattern, .. } => self.tensor(&pattern.replace("{e}", &e.to_string())).as_matrix(),
            ExpertTensor::Stacked { name, select: None, .. } => self.tensor(name).expert(e),
            ExpertTensor::Stacked { name, select, .. } => self.tensor(&derived_key(name, *select)).expert(e),
            ExpertTensor::StackedInputMajor { name, select, .. } => self.tensor(&derived_key(name, *select)).expert(e),
        }
    }

    /// Bytes of every tensor held now (a released matrix not made again counts nothing).
    pub fn bytes(&self) -> usize {
        self.tensors.values().filter_map(|h| h.tensor.get()).map(|t| t.bytes().len()).sum()
    }

    /// Drops the host copies of the matrices `names` (the store's keys; vectors stay): a copy
    /// made at load is freed once no one else holds it, a view of the mapped file has its
    /// pages advised away. Each is made again from the file on its next read.
    pub fn release<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) -> Released {
        let mut r = Released::default();
        for name in names {
            if self.vectors.contains_key(name) {
                continue;
            }
            let Some(h) = self.tensors.get_mut(name) else { continue };
            if h.remake.is_view() {
                if let Some(t) = h.tensor.get() {
                    r.views += 1;
                    r.advised += t.advise_not_needed();
                }
            } else if let Some(t) = h.tensor.take() {
                r.copies += 1;
                r.bytes += t.bytes().len();
            }
        }
        r
    }

    /// Whether the matrix `name` is released and not yet made again.
    pub fn is_released(&self, name: &str) -> bool {
        self.tensors.get(name).is_some_and(|h| h.tensor.get().is_none())
    }

    /// The file tensors behind every tensor the store holds now: a tensor quantized at load
    /// whose name is not here has no reader left on the host but the checkpoint itself.
    pub fn sources_in_use(&self) -> BTreeSet<String> {
        self.tensors
            .values()
            .filter(|h| h.tensor.get().is_some())
            .map(|h| match &h.remake {
                Remake::Plain(src) | Remake::Relayout(src, _) | Remake::Rows(src, _) => src.origin.name().to_string(),
            })
            .collect()
    }

    /// Released matrices made again so far.
    pub fn remade(&self) -> usize {
        self.remade.load(Ordering::Relaxed)
    }
}

/// The matrices only devices read: every matrix of an op in a device frame (its key in the
/// store; routed experts' per expert), less those any host frame also reads (a tied
/// embedding, the experts a host step serves). `program` is the model's (row selections
/// named).
pub fn device_only_matrices(plan: &Plan, program: &Program) -> Vec<String> {
    let mut on_device = BTreeSet::new();
    let mut on_host = BTreeSet::new();
    for f in &plan.frames {
        let set = if matches!(f.place, Place::Device(_)) { &mut on_device } else { &mut on_host };
        for &id in &f.ops {
            set.extend(matrices_of(op_of(program, id)));
        }
    }
    // The embedding runs on the host whether or not the plan lists it in a frame.
    for op in &program.prologue {
        on_host.extend(matrices_of(op));
    }
    on_device.difference(&on_host).cloned().collect()
}

/// The store's keys of the matrices `op` reads (vectors left out).
fn matrices_of(op: &Op) -> Vec<String> {
    let mut plain = Vec::new();
    let mut experts = Vec::new();
    visit_weights(
        op,
        &mut |w, is_vector| {
            if !is_vector {
                plain.push(w.name.clone());
            }
        },
        &mut |t, n| experts.extend(expert_keys(t, n)),
    );
    plain.extend(experts);
    plain
}

/// The store's keys of an expert tensor of `n` experts.
fn expert_keys(t: &ExpertTensor, n: usize) -> Vec<String> {
    match t {
        ExpertTensor::PerExpert { pattern, .. } => (0..n).map(|i| pattern.replace("{e}", &i.to_string())).collect(),
        ExpertTensor::Stacked { name, select: None, .. } => vec![name.clone()],
        ExpertTensor::Stacked { name, select, .. } => vec![derived_key(name, *select)],
        ExpertTensor::StackedInputMajor { name, select, .. } => vec![derived_key(name, *select)],
    }
}

/// Whether `f` is a float format (an input-major tensor in it is re-laid element by element).
fn is_float(f: WeightFormat) -> bool {
    matches!(f, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16)
}

/// Re-lays an input-major stacked expert tensor `t` (`[experts, cols, out]`) as `[experts,
/// rows, cols]`, its selected output columns only, in its own float format; in a block format
/// `t` is out-major (`[experts, out, cols]`) and its selected rows are copied whole.
fn relayout(t: &Tensor, e: &ExpertTensor) -> Result<Tensor, WeightError> {
    if let ExpertTensor::Stacked { name, shape, select: Some(s) } = e {
        // Out-major already: whole rows of each expert, in any format.
        let rows_in = s.groups * s.stride;
        let row = t.bytes().len() / (shape[0] * rows_in).max(1);
        let src = t.bytes();
        let mut bytes = Vec::with_capacity(shape[0] * shape[1] * row);
        for ex in 0..shape[0] {
            for r in 0..shape[1] {
                let from = (ex * rows_in + s.index(r)) * row;
                bytes.extend_from_slice(&src[from..from + row]);
            }
        }
        let key = derived_key(name, Some(*s));
        return Ok(Tensor::owned(key, t.format, shape.clone(), bytes, Arc::new(t.source().to_path_buf())));
    }
    let ExpertTensor::StackedInputMajor { name, shape, select } = e else {
        return Ok(t.clone());
    };
    let src_path = t.source().display().to_string();
    let size = match t.format {
        WeightFormat::F32 => 4,
        WeightFormat::F16 | WeightFormat::BF16 => 2,
        format => {
            let out_major = e.out_major_shape();
            let row = format.row_bytes(shape[2]).ok().filter(|_| t.shape == out_major);
            let Some(row) = row else {
                return Err(WeightError::Relayout { source_path: src_path, name: name.clone(), format });
            };
            let (experts, rows, out) = (shape[0], shape[1], out_major[1]);
            let src = t.bytes();
            let mut bytes = Vec::with_capacity(experts * rows * row);
            for ex in 0..experts {
                for r in 0..rows {
                    let from = (ex * out + select.map_or(r, |s| s.index(r))) * row;
                    bytes.extend_from_slice(&src[from..from + row]);
                }
            }
            let key = derived_key(name, *select);
            return Ok(Tensor::owned(key, format, shape.clone(), bytes, Arc::new(t.source().to_path_buf())));
        }
    };
    let want = e.tensor_shape();
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
    Ok(Tensor::owned(derived_key(name, *select), t.format, shape.clone(), bytes, Arc::new(t.source().to_path_buf())))
}

/// The rows of `t` that `w` selects, as a tensor of its own (a vector's rows are its entries,
/// kept in their stored format here; the store reads vectors as f32 separately).
fn select(t: &Tensor, w: &WeightRef) -> Tensor {
    let key = derived_key(&w.name, w.rows);
    let m = t.as_matrix();
    let rows = w.shape.first().copied().unwrap_or(1);
    if w.shape.len() == 1 {
        let all = t.to_f32_vec().unwrap_or_default();
        let bytes: Vec<u8> =
            (0..rows).flat_map(|i| all.get(w.tensor_row(i)).copied().unwrap_or(0.0).to_le_bytes()).collect();
        return Tensor::owned(key, WeightFormat::F32, w.shape.clone(), bytes, Arc::new(t.source().to_path_buf()));
    }
    let mut bytes = Vec::with_capacity(rows * m.bytes().len() / m.rows.max(1));
    for i in 0..rows {
        bytes.extend_from_slice(m.row(w.tensor_row(i)));
    }
    Tensor::owned(key, t.format, w.shape.clone(), bytes, Arc::new(t.source().to_path_buf()))
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
    let ops = program
        .prologue
        .iter_mut()
        .chain(program.layers.iter_mut().flat_map(|l| l.ops.iter_mut()))
        .chain(program.epilogue.iter_mut());
    for op in ops {
        match op {
            Op::Embed { table: w, .. } | Op::GroupedLinear { weight: w, .. } => rename(w),
            Op::RmsNorm { weight, .. } => weight.iter_mut().for_each(&mut rename),
            Op::LayerNorm { weight, bias, .. } | Op::Linear { weight, bias, .. } => {
                rename(weight);
                bias.iter_mut().for_each(&mut rename);
            }
            Op::HyperPre { spec, .. } => {
                rename(&mut spec.fn_weight);
                rename(&mut spec.base);
                rename(&mut spec.scale);
            }
            Op::Attention { spec, .. } => spec.sinks.iter_mut().for_each(&mut rename),
            Op::Route { correction_bias, hash, .. } => {
                correction_bias.iter_mut().chain(hash.iter_mut()).for_each(&mut rename)
            }
            Op::Mla { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::Indexer { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::KvCompress { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::LinearAttention { spec, .. } => spec.weights.iter_mut().for_each(|(_, w)| rename(w)),
            Op::RoutedExperts { .. }
            | Op::Rope { .. }
            | Op::Act { .. }
            | Op::Glu { .. }
            | Op::HyperPost { .. }
            | Op::Add { .. }
            | Op::Mul { .. }
            | Op::Input { .. }
            | Op::Concat { .. } => {}
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
        Op::RmsNorm { weight: w, .. } => w.iter().for_each(|w| weight(w, true)),
        Op::GroupedLinear { weight: w, .. } => weight(w, false),
        Op::HyperPre { spec, .. } => {
            weight(&spec.fn_weight, false);
            weight(&spec.base, true);
            weight(&spec.scale, true);
        }
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
            // The relative logits' bank `[d_rel, extent]` is read as f32.
            if let Some(r) = &spec.rel {
                weight(&r.proj, true);
            }
        }
        Op::Route { correction_bias, scale_by, hash, .. } => {
            // A hash table of expert ids is read as f32 too (exact below 2^24).
            correction_bias.iter().chain(scale_by).chain(hash).for_each(|b| weight(b, true));
        }
        Op::RoutedExperts { weights, experts: n, .. } => {
            experts(&weights.gate, *n);
            experts(&weights.up, *n);
            experts(&weights.down, *n);
            if let Some(s) = &weights.shared {
                experts(&s.gate, s.count);
                experts(&s.up, s.count);
                experts(&s.down, s.count);
            }
        }
        Op::Mla { spec, .. } => spec.weights.iter().for_each(|(_, w)| weight(w, w.shape.len() == 1)),
        Op::Indexer { spec, .. } => spec.weights.iter().for_each(|(_, w)| weight(w, w.shape.len() == 1)),
        // The per-slot biases (`ape`, `[rate, width]`) are added, not multiplied: f32 rows.
        Op::KvCompress { spec, .. } => {
            spec.weights.iter().for_each(|(r, w)| weight(w, w.shape.len() == 1 || r.ends_with("ape")))
        }
        // Every weight but the matrices is read as f32: the convolutions' taps (`[channels, 1,
        // kernel]`) and KDA's `A_log` (`[1, 1, heads, 1]`) too.
        Op::LinearAttention { spec, .. } => spec.weights.iter().for_each(|(_, w)| weight(w, w.shape.len() != 2)),
        Op::Rope { .. }
        | Op::Act { .. }
        | Op::Glu { .. }
        | Op::HyperPost { .. }
        | Op::Add { .. }
        | Op::Mul { .. }
        | Op::Input { .. }
        | Op::Concat { .. } => {}
    }
}
