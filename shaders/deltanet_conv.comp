#version 450
// deltanet_conv.comp: the causal depthwise convolution of a Gated DeltaNet block, then SiLU.
// One invocation per channel of [q | k | v] (key heads' q, key heads' k, value heads' v), all
// rows in order: the channel's input at row t is read from the fused projection `p` (per key
// head group: q, k, the group's values, the group's output gates), the `kernel - 1` inputs
// before the block from the ring (oldest first, `channels` floats a row), and the ring is left
// holding the last `kernel - 1` inputs. Reference: step 2 of `cpu::deltanet::gated_deltanet`.
// With `planar` set (Kimi Delta Attention, step 2 of `cpu::kda::kda`) the input is three
// planes one after another instead: every row's q (`nk * dk` wide), then every row's k, then
// every row's v (`nv * dv` wide), as three separate projections write them; the math per
// channel is the same. With `planar` 2 (Qwen3.5's projections apart) the input is already in
// the channels' order, one row of `channels` per position (`in_proj_qkv`'s output).
// With `planar` 3 (a short convolution on a row stream, Inkling's `*_sconv`; reference:
// `cpu::short_conv::short_conv` as `cpu::run_short_conv` calls it) the input is rows of `dv`
// channels, each input first times `scale` (the op's `input_scale`, else 1), and the output
// is that input plus the convolution, without SiLU; the ring keeps the scaled inputs. Each
// invocation reads its channel's input of a row before it writes that row's output, so `p`
// and `conv` may be the same rows (in place).
// Must not: assume the subgroup size, or take a kernel longer than MAX_K (the op checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define MAX_K 8

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer P { float pv[]; };
layout(std430, binding = 1) readonly buffer CW { float cw[]; };
layout(std430, binding = 2) buffer RING { float ring[]; };
layout(std430, binding = 3) buffer CONV { float conv[]; };
layout(push_constant) uniform PC {
    uint n; uint nk; uint nv; uint dk;
    uint dv; uint kk; uint p_off; uint ring_off;
    uint conv_off; uint planar; float scale; uint pad2;
} pc;

float silu(float x) { return x * (1.0 / (1.0 + exp(-x))); }

// `planar` 3: out[t] = x[t] + sum_k w[c, k] * x[t - kk + 1 + k] over scaled inputs, added in
// the order the CPU adds them (the input first, then the taps oldest first).
void row_conv(uint c) {
    uint width = pc.dv;
    if (c >= width) return;
    uint hist = pc.kk - 1u;
    float win[MAX_K];
    for (uint i = 0u; i < hist; i++) win[i] = ring[pc.ring_off + i * width + c];
    for (uint t = 0u; t < pc.n; t++) {
        float x = pv[pc.p_off + t * width + c] * pc.scale;
        win[hist] = x;
        float acc = x;
        for (uint k = 0u; k < pc.kk; k++) acc += cw[c * pc.kk + k] * win[k];
        conv[pc.conv_off + t * width + c] = acc;
        for (uint i = 0u; i < hist; i++) win[i] = win[i + 1u];
    }
    for (uint i = 0u; i < hist; i++) ring[pc.ring_off + i * width + c] = win[i];
}

void main() {
    if (pc.planar == 3u) {
        row_conv(gl_GlobalInvocationID.x);
        return;
    }
    uint key_dim = pc.nk * pc.dk;
    uint channels = 2u * key_dim + pc.nv * pc.dv;
    uint c = gl_GlobalInvocationID.x;
    if (c >= channels) return;
    uint r = pc.nv / pc.nk;
    uint group = 2u * pc.dk + 2u * r * pc.dv;
    uint pw = pc.nk * group;
    // The channel's column of `p` and the stride of its rows.
    uint col;
    if (pc.planar == 2u) {
        col = c;
        pw = channels;
    } else if (pc.planar != 0u) {
        uint part = min(c / key_dim, 2u);
        uint width = part < 2u ? key_dim : pc.nv * pc.dv;
        col = part * pc.n * key_dim + (c - part * key_dim);
        pw = width;
    } else if (c < key_dim) {
        col = (c / pc.dk) * group + c % pc.dk;
    } else if (c < 2u * key_dim) {
        uint cc = c - key_dim;
        col = (cc / pc.dk) * group + pc.dk + cc % pc.dk;
    } else {
        uint cc = c - 2u * key_dim;
        col = (cc / (r * pc.dv)) * group + 2u * pc.dk + cc % (r * pc.dv);
    }
    uint hist = pc.kk - 1u;
    float old[MAX_K];
    for (uint i = 0u; i < hist; i++) old[i] = ring[pc.ring_off + i * channels + c];
    for (uint t = 0u; t < pc.n; t++) {
        float acc = 0.0;
        for (uint k = 0u; k < pc.kk; k++) {
            uint i = t + k;
            float x = i < hist ? old[i] : pv[pc.p_off + (i - hist) * pw + col];
            acc += cw[c * pc.kk + k] * x;
        }
        conv[pc.conv_off + t * channels + c] = silu(acc);
    }
    // The ring keeps the last `hist` inputs of ring ++ block.
    for (uint i = 0u; i < hist; i++) {
        uint src = pc.n + i;
        float x = src < hist ? old[src] : pv[pc.p_off + (src - hist) * pw + col];
        ring[pc.ring_off + i * channels + c] = x;
    }
}
