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
//! A short convolution (Inkling's, `LinearAttentionKind::ShortConv`) keeps no matrix: the host's
//! canonical state is every input row it saw (`store::kv::ConvRows`, by the taps' name within
//! the layer, so a rewind is a truncation), and the device's a ring of the last `kernel - 1`
//! of them, by the same rule: zeros at position 0, else the host's rows before the frame's
//! first position uploaded unless the ring already holds them. The frame copies the block's
//! input rows into a read-back buffer before the convolution (it may run in place), and after
//! the frame the host appends them, scaled by the op's input scale as the CPU scales them.
//!
//! Must not: run a layer whose host state is not at the frame's first position (a typed
//! error; the CPU would refuse it too), or keep a device copy the host's state may have moved
//! away from.

use super::kv::{KvCache, LayerKv};
use super::OpRows;
use crate::bytes::{as_bytes, as_bytes_mut};
use crate::store::kv::ConvRows;
use crate::store::weights::WeightStore;
use crate::vk::{
    Context, DeltaNetCall, DeltaNetIn, DeltaNetMats, DeltaNetScratch, DeltaNetShape, DeviceBuffer, DeviceMatrix,
    Frame as VkFrame, KdaCall, KdaMats, KdaScratch, KdaShape, MemoryUse, RowConv, VkError,
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

/// One short convolution's ring on the device.
struct Conv {
    layer: usize,
    /// The taps' name: the key of the host's rows (`ConvRows::key`).
    key: String,
    width: usize,
    kernel: usize,
    /// Multiplies the input (the op's `input_scale`, else 1).
    scale: f32,
    /// The scaled inputs of the `kernel - 1` positions before the next block, oldest first.
    ring: DeviceBuffer,
    /// Where in the read-back buffer (`Recurrent::conv_back`) the block's input rows go,
    /// unscaled (`rows x width` floats), for the host.
    back_at: usize,
    /// The position the ring is the host's rows at.
    at: Option<usize>,
}

/// The device's recurrent states of one session, by layer.
pub struct Recurrent {
    layers: Vec<Option<Layer>>,
    convs: Vec<Conv>,
    /// Per layer, the indices of its short convolutions in `convs` (a few a layer: looked up
    /// by every frame that runs them).
    convs_of: Vec<Vec<usize>>,
    /// The short convolutions' read-back rows: one frame's after another's, so the
    /// convolutions of one frame side by side (the host takes them before the next frame).
    conv_back: Option<DeviceBuffer>,
    scratch: Option<DeltaNetScratch>,
    kda: Option<KdaScratch>,
}

/// What a frame's recurrent ops touched (`Recurrent::before_frame`), for `after_frame`: the
/// layers whose state it changes, the short convolutions (indices into the session's) and the
/// frame's first position.
pub struct Touched {
    layers: Vec<usize>,
    convs: Vec<usize>,
    pos0: usize,
}

impl Touched {
    /// Whether the frame ran any recurrent layer or short convolution.
    pub fn any(&self) -> bool {
        !self.layers.is_empty() || !self.convs.is_empty()
    }
}

/// A short convolution's taps and input scale by role (`None` for an op of another kind or one
/// without its taps, which the compiler refuses).
fn conv_roles(spec: &LinearAttentionSpec) -> Option<(&str, Option<&str>)> {
    if spec.kind != LinearAttentionKind::ShortConv {
        return None;
    }
    let name = |role: &str| spec.weights.iter().find(|(r, _)| r == role).map(|(_, w)| w.name.as_str());
    Some((name("conv1d")?, name("input_scale")))
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
    /// A short convolution's input scale is read from `weights` (the host's copy).
    pub fn new(
        ctx: &Context,
        (program, weights): (&Program, &WeightStore),
        frames: &[Frame],
        rows: usize,
    ) -> Result<Recurrent, VkError> {
        let mut layers: Vec<Option<Layer>> = (0..program.layers.len()).map(|_| None).collect();
        let mut convs = Vec::new();
        let mut convs_of: Vec<Vec<usize>> = vec![Vec::new(); program.layers.len()];
        let mut back_floats = 0;
        let mut widest: Option<DeltaNetShape> = None;
        let mut widest_kda: Option<KdaShape> = None;
        for f in frames.iter().filter(|f| f.place != Place::Host) {
            let mut back_at = 0;
            for &id in &f.ops {
                let Op::LinearAttention { layer, spec, x, .. } = op_of(program, id) else { continue };
                if spec.kind == LinearAttentionKind::ShortConv {
                    let (taps, by) = conv_roles(spec).ok_or_else(|| bad(format!("{layer}: no conv1d taps")))?;
                    let (width, kernel) = (program.value(*x).width, spec.conv_kernel);
                    let scale = by.map_or(1.0, |n| weights.vector(n).first().copied().unwrap_or(1.0));
                    if let Some(of) = convs_of.get_mut(layer.0 as usize) {
                        of.push(convs.len());
                    }
                    convs.push(Conv {
                        layer: layer.0 as usize,
                        key: taps.to_string(),
                        width,
                        kernel,
                        scale,
                        ring: ctx.f32_buffer((width * kernel.saturating_sub(1)).max(1))?,
                        back_at,
                        at: None,
                    });
                    back_at += rows * width;
                    back_floats = back_floats.max(back_at);
                    continue;
                }
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
        let conv_back = match back_floats {
            0 => None,
            f => Some(ctx.buffer(MemoryUse::Readback, f * 4)?),
        };
        Ok(Recurrent { layers, convs, convs_of, conv_back, scratch, kda })
    }

    /// The short convolution of `layer` whose taps are `key`.
    fn conv_at(&self, layer: usize, key: &str) -> Result<usize, VkError> {
        let of = self.convs_of.get(layer).map_or(&[][..], Vec::as_slice);
        of.iter()
            .copied()
            .find(|&i| self.convs[i].key == key)
            .ok_or_else(|| bad(format!("l{layer}: no device ring for the short convolution {key}")))
    }

    /// Before a frame from `pos0`: a short convolution's ring made the host's rows before
    /// `pos0` (zeros at 0 and before it), unless it holds them.
    fn conv_before(&mut self, ctx: &Context, i: usize, kv: &KvCache, pos0: usize) -> Result<(), VkError> {
        let c = &mut self.convs[i];
        let hist = c.kernel.saturating_sub(1);
        if c.at != Some(pos0) && hist > 0 {
            let mut ring = vec![0f32; hist * c.width];
            if pos0 > 0 {
                let rows = kv.layers.get(c.layer).and_then(|l| l.conv.iter().find(|r| r.key == c.key));
                let have = rows.map_or(0, |r| r.len());
                if have < pos0 || rows.is_some_and(|r| r.width != c.width) {
                    return Err(bad(format!(
                        "l{}: the host holds {have} rows of {}'s input, the step starts at {pos0}",
                        c.layer, c.key
                    )));
                }
                let rows = rows.map_or(&[][..], |r| &r.rows[..]);
                let first = pos0.saturating_sub(hist);
                let skip = hist - (pos0 - first);
                ring[skip * c.width..].copy_from_slice(&rows[first * c.width..pos0 * c.width]);
            }
            ctx.write(&c.ring, 0, as_bytes(&ring))?;
        }
        // The frame changes it: not the host's until its rows are taken.
        c.at = None;
        Ok(())
    }

    /// After the frame: a short convolution's `n` input rows (scaled as the CPU scales them)
    /// appended to the host's rows at `pos0`, and its ring the host's at `pos0 + n`.
    fn conv_after(&mut self, ctx: &Context, i: usize, kv: &mut KvCache, pos0: usize, n: usize) -> Result<(), VkError> {
        let back = self.conv_back.as_ref().ok_or_else(|| bad("no short convolution read-back".into()))?;
        let c = &mut self.convs[i];
        let host = kv.layers.get_mut(c.layer).ok_or_else(|| bad(format!("l{}: no host state", c.layer)))?;
        let at = match host.conv.iter().position(|r| r.key == c.key) {
            Some(at) => at,
            None => {
                host.conv.push(ConvRows { key: c.key.clone(), width: c.width, rows: Vec::new() });
                host.conv.len() - 1
            }
        };
        let rows = &mut host.conv[at];
        if rows.len() < pos0 {
            return Err(bad(format!("l{}: {} rows of {}'s input before {pos0}", c.layer, rows.len(), c.key)));
        }
        rows.rows.truncate(pos0 * c.width);
        let start = rows.rows.len();
        rows.rows.resize(start + n * c.width, 0.0);
        let new = &mut rows.rows[start..];
        ctx.read(back, c.back_at * 4, as_bytes_mut(new))?;
        if c.scale != 1.0 {
            new.iter_mut().for_each(|v| *v *= c.scale);
        }
        c.at = Some(pos0 + n);
        Ok(())
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
    ) -> Result<Touched, VkError> {
        let mut touched = Touched { layers: Vec::new(), convs: Vec::new(), pos0 };
        for &id in &frame.ops {
            let Op::LinearAttention { layer, spec, .. } = op_of(program, id) else { continue };
            let l = layer.0 as usize;
            if let Some((key, _)) = conv_roles(spec) {
                let i = self.conv_at(l, key)?;
                self.conv_before(ctx, i, kv, pos0)?;
                touched.convs.push(i);
                continue;
            }
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
            touched.layers.push(l);
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
        if let Some((key, _)) = conv_roles(spec) {
            let c = &self.convs[self.conv_at(layer.0 as usize, key)?];
            let back = self.conv_back.as_ref().ok_or_else(|| bad("no short convolution read-back".into()))?;
            let taps =
                vecs.get(key).map(DeviceBuffer::all).ok_or_else(|| bad(format!("{layer}: {key} not uploaded")))?;
            // The input rows for the host first: the convolution may overwrite them.
            f.copy(x, back.view(c.back_at, n * c.width))?;
            let ring = c.ring.view(0, c.width * (c.kernel - 1));
            let (width, kernel, input_scale) = (c.width, c.kernel, c.scale);
            return f.row_conv(RowConv { x, taps, ring, out, n, width, kernel, input_scale });
        }
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
        touched: &Touched,
        kv: &mut KvCache,
        len: usize,
    ) -> Result<(), VkError> {
        for &i in &touched.convs {
            self.conv_after(ctx, i, kv, touched.pos0, len - touched.pos0)?;
        }
        let touched = &touched.layers;
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
