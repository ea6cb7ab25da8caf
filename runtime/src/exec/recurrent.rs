//! The recurrent state of a device's linear-attention layers (Gated DeltaNet, Kimi Delta
//! Attention) in one session: per layer, the state on the device (the heads' matrices and the
//! convolution ring, in the CPU's layout) and a host-cached read-back buffer; one scratch per
//! kind for the op's intermediates.
//!
//! The host's state (`LayerKv::state`) stays canonical, as the KV cache does. Before a frame
//! that runs a layer, the device's state is made the host's at the frame's first position:
//! zeros at position 0 (where the CPU resets), else the host's uploaded unless the device
//! already holds it (`at`: the position the device's copy is the host's state of; `None`
//! while a frame may have changed it). The frame copies the new state into the read-back
//! buffer in the same submission, and after it the host takes it (`LayerKv::commit_state`:
//! buffers swapped, the old state kept as the one to go back to), so a device lost later in
//! the forward leaves the host able to re-run the forward on the CPU.
//!
//! Must not: run a layer whose host state is not at the frame's first position (a typed
//! error; the CPU would refuse it too), or keep a device copy the host's state may have moved
//! away from.

use super::kv::{KvCache, LayerKv};
use super::OpRows;
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::vk::{
    Context, DeltaNetCall, DeltaNetIn, DeltaNetMats, DeltaNetScratch, DeltaNetShape, DeviceBuffer, DeviceMatrix,
    Frame as VkFrame, KdaCall, KdaMats, KdaScratch, KdaShape, MemoryUse, VkError,
};
use coli_compiler::frames::{op_of, Frame};
use coli_compiler::ids::Place;
use coli_compiler::ir::{LayerId, LinearAttentionKind, LinearAttentionSpec, Op, Program};
use rayon::prelude::*;
use std::collections::HashMap;

/// One layer's state on the device.
struct Layer {
    state: DeviceBuffer,
    back: DeviceBuffer,
    floats: usize,
    /// The position the device's state is the host's state at.
    at: Option<usize>,
    /// A buffer for the next read-back (the host's previous back buffer, reused).
    staged: Vec<f32>,
}

/// The device's recurrent states of one session, by layer.
pub struct Recurrent {
    layers: Vec<Option<Layer>>,
    scratch: Option<DeltaNetScratch>,
    kda: Option<KdaScratch>,
}

/// A KDA op's taps on the device: the key of its three convolutions' taps side by side (q's,
/// k's, v's: the order of the channels) among the device's vectors, and the three tensors'
/// names in that order; `None` for an op of another kind (or one without the roles, which the
/// compiler refuses).
pub fn kda_taps(spec: &LinearAttentionSpec) -> Option<(String, [&str; 3])> {
    if spec.kind != LinearAttentionKind::Kda {
        return None;
    }
    let name = |role: &str| spec.weights.iter().find(|(r, _)| r == role).map(|(_, w)| w.name.as_str());
    let parts = [name("q_conv")?, name("k_conv")?, name("v_conv")?];
    // `#`: a derived name, as the weight store's row selections.
    Some((format!("{}#kda_taps", parts[0]), parts))
}

fn bad(msg: String) -> VkError {
    VkError::BadArgument { op: "linear_attention", msg }
}

impl Recurrent {
    /// States for the `LinearAttention` ops of `frames` that run on a device, and a scratch
    /// for steps of at most `rows` rows.
    pub fn new(ctx: &Context, program: &Program, frames: &[Frame], rows: usize) -> Result<Recurrent, VkError> {
        let mut layers: Vec<Option<Layer>> = (0..program.layers.len()).map(|_| None).collect();
        let mut widest: Option<DeltaNetShape> = None;
        let mut widest_kda: Option<KdaShape> = None;
        for f in frames.iter().filter(|f| f.place != Place::Host) {
            for &id in &f.ops {
                let Op::LinearAttention { layer, spec, .. } = op_of(program, id) else { continue };
                let floats = spec.state_floats();
                let slot = layers
                    .get_mut(layer.0 as usize)
                    .ok_or_else(|| bad(format!("{layer} is not a layer of the program")))?;
                *slot = Some(Layer {
                    state: ctx.f32_buffer(floats.max(1))?,
                    back: ctx.buffer(MemoryUse::Readback, floats.max(1) * 4)?,
                    floats,
                    at: None,
                    staged: Vec::new(),
                });
                if spec.kind == LinearAttentionKind::Kda {
                    let s = KdaShape::of(spec);
                    widest_kda = Some(widest_kda.map_or(s, |w| KdaShape {
                        heads: w.heads.max(s.heads),
                        head_dim: w.head_dim.max(s.head_dim),
                        conv_kernel: w.conv_kernel.max(s.conv_kernel),
                        ..w
                    }));
                    continue;
                }
                let s = DeltaNetShape::of(spec);
                widest = Some(match widest {
                    None => s,
                    Some(w) => DeltaNetShape {
                        key_heads: w.key_heads.max(s.key_heads),
                        value_heads: w.value_heads.max(s.value_heads),
                        key_head_dim: w.key_head_dim.max(s.key_head_dim),
                        value_head_dim: w.value_head_dim.max(s.value_head_dim),
                        ..w
                    },
                });
            }
        }
        let scratch = widest.map(|s| DeltaNetScratch::new(ctx, rows, s)).transpose()?;
        let kda = widest_kda.map(|s| KdaScratch::new(ctx, rows, s)).transpose()?;
        Ok(Recurrent { layers, scratch, kda })
    }

    /// Before `frame` runs from `pos0`: the device state of each of its recurrent layers made
    /// the host's (zeros at position 0). Returns those layers, for `after_frame`.
    pub fn before_frame(
        &mut self,
        ctx: &Context,
        program: &Program,
        frame: &Frame,
        kv: &KvCache,
        pos0: usize,
    ) -> Result<Vec<usize>, VkError> {
        let mut touched = Vec::new();
        for &id in &frame.ops {
            let Op::LinearAttention { layer, .. } = op_of(program, id) else { continue };
            let l = layer.0 as usize;
            let m = self
                .layers
                .get_mut(l)
                .and_then(Option::as_mut)
                .ok_or_else(|| bad(format!("{layer}: no device state")))?;
            if pos0 == 0 {
                if m.at != Some(0) {
                    ctx.write(&m.state, 0, &vec![0u8; m.floats * 4])?;
                }
            } else if m.at != Some(pos0) {
                let host = kv.layers.get(l).ok_or_else(|| bad(format!("{layer}: no host state")))?;
                if host.state_len != Some(pos0) || host.state.len() != m.floats {
                    let at = host.state_len.map_or("unknown".to_string(), |s| format!("at position {s}"));
                    return Err(bad(format!("{layer}: the host's recurrent state is {at}, the step starts at {pos0}")));
                }
                ctx.write(&m.state, 0, as_bytes(&host.state))?;
            }
            // The frame changes it: not the host's until it is read back.
            m.at = None;
            touched.push(l);
        }
        Ok(touched)
    }

    /// Records the op of `layer` over `io` (its weights from the device's `mats` and `vecs`),
    /// then the copy of its new state into the read-back buffer.
    pub fn record<'a>(
        &'a self,
        f: &mut VkFrame<'a>,
        mats: &'a HashMap<String, DeviceMatrix>,
        vecs: &'a HashMap<String, DeviceBuffer>,
        spec: &LinearAttentionSpec,
        layer: LayerId,
        io: OpRows<'a>,
    ) -> Result<(), VkError> {
        let OpRows { x, out, n, precision } = io;
        let m = self
            .layers
            .get(layer.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| bad(format!("{layer}: no device state")))?;
        let name = |role: &str| {
            spec.weights
                .iter()
                .find(|(r, _)| r == role)
                .map(|(_, w)| w.name.as_str())
                .ok_or_else(|| bad(format!("{layer}: no weight for role {role}")))
        };
        let mat =
            |role: &str| name(role).and_then(|n| mats.get(n).ok_or_else(|| bad(format!("{layer}: {n} not uploaded"))));
        let vec = |role: &str| {
            name(role).and_then(|n| {
                vecs.get(n).map(DeviceBuffer::all).ok_or_else(|| bad(format!("{layer}: {n} not uploaded")))
            })
        };
        let state = m.state.view(0, m.floats);
        if spec.kind == LinearAttentionKind::Kda {
            let scratch = self.kda.as_ref().ok_or_else(|| bad("no KDA scratch".into()))?;
            let w = KdaMats {
                q: mat("q_proj")?,
                k: mat("k_proj")?,
                v: mat("v_proj")?,
                f_a: mat("f_a")?,
                f_b: mat("f_b")?,
                b: mat("b_proj")?,
                g_a: mat("g_a")?,
                g_b: mat("g_b")?,
                out: mat("out_proj")?,
                conv: kda_taps(spec)
                    .and_then(|(key, _)| vecs.get(&key))
                    .map(DeviceBuffer::all)
                    .ok_or_else(|| bad(format!("{layer}: the KDA taps not uploaded")))?,
                dt_bias: vec("dt_bias")?,
                a_log: vec("a_log")?,
                norm: vec("norm")?,
            };
            f.kda(KdaCall { shape: KdaShape::of(spec), weights: w, scratch, precision }, x, n, state, out)?;
            return f.copy(state, m.back.view(0, m.floats));
        }
        let scratch = self.scratch.as_ref().ok_or_else(|| bad("no scratch".into()))?;
        let input = if spec.projections_apart() {
            DeltaNetIn::Apart {
                qkv: mat("in_proj_qkv")?,
                z: mat("in_proj_z")?,
                b: mat("in_proj_b")?,
                a: mat("in_proj_a")?,
            }
        } else {
            DeltaNetIn::Grouped { qkvz: mat("in_proj_qkvz")?, ba: mat("in_proj_ba")? }
        };
        let w = DeltaNetMats {
            input,
            out: mat("out_proj")?,
            conv: vec("conv1d")?,
            dt_bias: vec("dt_bias")?,
            a_log: vec("a_log")?,
            norm: vec("norm")?,
        };
        let call = DeltaNetCall { shape: DeltaNetShape::of(spec), weights: w, scratch, precision };
        f.deltanet(call, x, n, state, out)?;
        f.copy(state, m.back.view(0, m.floats))
    }

    /// After the frame ran: each touched layer's new state (position `len`) into the host's,
    /// the layers' read-backs side by side (a state is megabytes: Kimi Linear's 32 heads of
    /// 128 x 128 are 2 MiB a layer, copied out of host memory the device wrote).
    pub fn after_frame(
        &mut self,
        ctx: &Context,
        touched: &[usize],
        kv: &mut KvCache,
        len: usize,
    ) -> Result<(), VkError> {
        for &l in touched {
            if self.layers.get(l).and_then(Option::as_ref).is_none() {
                return Err(bad(format!("l{l}: no device state")));
            }
            if kv.layers.get(l).is_none() {
                return Err(bad(format!("l{l}: no host state")));
            }
        }
        let pairs: Vec<(&mut Layer, &mut LayerKv)> = self
            .layers
            .iter_mut()
            .zip(kv.layers.iter_mut())
            .enumerate()
            .filter(|(l, _)| touched.contains(l))
            .filter_map(|(_, (m, host))| Some((m.as_mut()?, host)))
            .collect();
        pairs.into_par_iter().try_for_each(|(m, host)| {
            m.staged.resize(m.floats, 0.0);
            ctx.read(&m.back, 0, as_bytes_mut(&mut m.staged))?;
            host.commit_state(&mut m.staged, len);
            m.at = Some(len);
            Ok(())
        })
    }
}
