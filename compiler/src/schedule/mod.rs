//! The schedule: a plan's frames lowered once into flat lists of typed kernel calls, the form
//! every executor runs (the CPU's host frames and each device's frames alike).
//!
//! A call is one kernel of an op library with its operands named: an op on its own
//! (`Kernel::Op`), or a fused kernel that computes several ops of the program at once
//! (`Matmul` with its input normalized or gated as it is read and the residual add in its
//! store, `NormPair`, `Attention` with its RoPE and q/k norms, `Experts` with their norm and
//! residual, and on the host `Linears` sharing one input). Which ops fuse is decided here, in
//! one pass over the whole forward (`fuse`), from the program and the frames alone; so a
//! schedule is plain data, printed by `coli compile --schedule` and snapshot-tested like plans.
//!
//! `Rows::Tail` marks the calls of the epilogue: when only the last row's logits are wanted, an
//! executor runs them on the last row alone.
//!
//! Must not: depend on a device's properties (an executor picks kernel variants, activation
//! formats and whether to replay a recording), or change what a frame computes.

mod fuse;
mod print;

use crate::frames::{op_of, Frame};
use crate::ids::{FrameId, Part, Place};
use crate::ir::{
    AttentionSpec, ExpertWeights, GluKind, LayerId, Op, Program, RopeScaling, RopeStyle, ValueId, WeightRef,
};

pub use print::print;

/// Every frame's calls, in the plan's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub frames: Vec<FrameCalls>,
}

/// One frame's calls.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameCalls {
    pub frame: FrameId,
    pub place: Place,
    pub calls: Vec<Call>,
    /// A device frame whose one-row recording depends on nothing but the row count and the
    /// positions, so that one recording serves every decode step (`fuse::replayable`).
    pub replayable: bool,
}

/// One kernel call and the rows it runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub kernel: Kernel,
    pub rows: Rows,
}

/// Which rows of a step a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every row.
    All,
    /// The epilogue: the last row alone when only the last row's logits are wanted.
    Tail,
}

/// A kernel with its operands.
// `Op` is as large as the IR's largest op (the routed experts' tensors); a schedule is made once
// per plan and holds a few calls per layer, so no variant is boxed for size alone.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Kernel {
    /// One op of the program as its op library's kernel(s).
    Op(Op),
    /// Host: `Linear`s reading the same input, to distinct outputs none of which is the input:
    /// one quantization of the input, one parallel pass over the matrices.
    Linears { x: ValueId, outs: Vec<LinearOut> },
    /// A `Linear` whose input is transformed as it is read and whose store may add a residual.
    Matmul(Matmul),
    /// Two `RmsNorm`s neither of which reads what the other writes, in one dispatch.
    NormPair(Norm, Norm),
    /// Attention with the KV append, and the RoPE and q/k norms fused into it.
    Attention(Box<AttentionCall>),
    /// The routed experts of a resident layer, with their input norm and residual add.
    Experts(Box<ExpertsCall>),
}

/// One product of a `Linears` group.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearOut {
    pub out: ValueId,
    pub weight: WeightRef,
    pub bias: Option<WeightRef>,
}

/// An `RmsNorm`'s operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Norm {
    pub x: ValueId,
    pub out: ValueId,
    pub weight: WeightRef,
    pub eps: f32,
    pub group: usize,
    pub offset: f32,
}

/// What a fused product reads.
#[derive(Clone, Debug, PartialEq)]
pub enum MatSrc {
    /// Its input as it is.
    Plain,
    /// Its input is this norm's output: the rows of `x` normalized as they are read.
    Norm(Norm),
    /// Its input is this gated unit's output: `glu(gate, up)` as it is read.
    Glu { gate: ValueId, up: ValueId, kind: GluKind },
}

impl MatSrc {
    /// The values the transform reads (none for `Plain`).
    pub fn sources(&self) -> Vec<ValueId> {
        match self {
            MatSrc::Plain => vec![],
            MatSrc::Norm(n) => vec![n.x],
            MatSrc::Glu { gate, up, .. } => vec![*gate, *up],
        }
    }
}

/// An `Add` absorbed into a product's store: `sum = product + other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residual {
    pub other: ValueId,
    pub sum: ValueId,
}

/// A fused product. `x` and `out` are the `Linear`'s own (its input value, which the transform
/// writes in the program; its output, which the residual's sum replaces).
#[derive(Clone, Debug, PartialEq)]
pub struct Matmul {
    pub x: ValueId,
    pub src: MatSrc,
    pub weight: WeightRef,
    pub bias: Option<WeightRef>,
    pub out: ValueId,
    pub residual: Option<Residual>,
}

impl Matmul {
    /// Where the product's store lands.
    pub fn dest(&self) -> ValueId {
        self.residual.map_or(self.out, |r| r.sum)
    }
}

/// The RoPE fused into an attention (the same for its q and k).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeArgs {
    pub rotary_dim: usize,
    pub style: RopeStyle,
    pub theta: f32,
    pub scaling: RopeScaling,
}

/// An attention with what is fused into it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionCall {
    pub q: ValueId,
    pub k: ValueId,
    pub v: ValueId,
    pub out: ValueId,
    pub layer: LayerId,
    pub spec: AttentionSpec,
    /// The RoPE of q and k right before it.
    pub rope: Option<RopeArgs>,
    /// Nothing reads q or k after it (or there is no RoPE): a one-row forward may leave them
    /// unrotated and do RoPE, the append and attention in one kernel.
    pub one_kernel: bool,
    /// The norms of q and of k right before the RoPE (only with `one_kernel`): a one-kernel
    /// decode applies them itself; otherwise the executor runs them as a pair first.
    pub norms: Option<(Norm, Norm)>,
}

/// Resident routed experts with what is fused into them.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertsCall {
    pub x: ValueId,
    pub routing: ValueId,
    pub out: ValueId,
    pub layer: LayerId,
    pub experts: usize,
    pub ffn: usize,
    pub weights: ExpertWeights,
    pub glu: GluKind,
    /// Their input is this norm's output: the activations are normalized as they are quantized
    /// (an executor whose experts take float activations runs the norm first).
    pub norm: Option<Norm>,
    pub residual: Option<Residual>,
    /// The `Op::Route` (no hash table, no shared experts) that writes `routing`, absorbed: an
    /// executor whose experts' first kernel can route the rows from its logits does (no
    /// dispatch of its own); otherwise it records the route first.
    pub route: Option<Op>,
}

impl ExpertsCall {
    /// Where the summed store lands.
    pub fn dest(&self) -> ValueId {
        self.residual.map_or(self.out, |r| r.sum)
    }
}

impl Schedule {
    /// Lowers `frames` (a plan's, in order) into calls: device frames fused as `fuse` decides,
    /// host frames with their `Linear`s grouped.
    pub fn build(program: &Program, frames: &[Frame]) -> Schedule {
        let fused = fuse::fusions(program, frames);
        let frames = frames
            .iter()
            .zip(fused)
            .map(|(f, plan)| FrameCalls {
                frame: f.id,
                place: f.place,
                calls: match f.place {
                    Place::Host => host_calls(program, f),
                    Place::Device(_) => fuse::device_calls(program, f, &plan),
                },
                replayable: fuse::replayable(program, f),
            })
            .collect();
        Schedule { frames }
    }

    /// The schedule of a run on the CPU alone: every op in one host frame.
    pub fn host_only(program: &Program) -> Schedule {
        Schedule::build(program, &[whole_program_frame(program)])
    }

    /// The calls of frame `id`.
    pub fn frame(&self, id: FrameId) -> Option<&FrameCalls> {
        self.frames.iter().find(|f| f.frame == id)
    }
}

/// The whole program as one host frame.
pub fn whole_program_frame(program: &Program) -> Frame {
    use crate::ids::OpId;
    let mut ops: Vec<OpId> =
        (0..program.prologue.len()).map(|i| OpId { part: Part::Prologue, index: i as u32 }).collect();
    for l in &program.layers {
        ops.extend((0..l.ops.len()).map(|i| OpId { part: Part::Layer(l.id), index: i as u32 }));
    }
    ops.extend((0..program.epilogue.len()).map(|i| OpId { part: Part::Epilogue, index: i as u32 }));
    Frame { id: FrameId(0), place: Place::Host, ops, uploads: vec![], downloads: vec![], beside: None, kv_split: None }
}

fn rows_of(part: Part) -> Rows {
    if part == Part::Epilogue {
        Rows::Tail
    } else {
        Rows::All
    }
}

/// A host frame's calls: each op alone, except runs of `Linear`s reading one input (q/k/v,
/// gate/up) to distinct outputs that are not that input, which share a `Linears` call.
fn host_calls(program: &Program, frame: &Frame) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut i = 0;
    while i < frame.ops.len() {
        let id = frame.ops[i];
        let rows = rows_of(id.part);
        if let Op::Linear { x, .. } = op_of(program, id) {
            let mut outs: Vec<LinearOut> = Vec::new();
            while let Some(&next) = frame.ops.get(i + outs.len()) {
                let Op::Linear { x: nx, out, weight, bias } = op_of(program, next) else { break };
                if nx != x || out == x || next.part != id.part || outs.iter().any(|o| o.out == *out) {
                    break;
                }
                outs.push(LinearOut { out: *out, weight: weight.clone(), bias: bias.clone() });
            }
            let taken = outs.len();
            calls.push(Call { kernel: Kernel::Linears { x: *x, outs }, rows });
            i += taken;
            continue;
        }
        calls.push(Call { kernel: Kernel::Op(op_of(program, id).clone()), rows });
        i += 1;
    }
    calls
}
