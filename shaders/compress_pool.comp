#version 450
// compress_pool.comp: DeepSeek V4's KV compressor closing windows into entries. Entry
// e = e0 + workgroup (of `count`) pools window e (positions e * rate ..+ rate) of the layer's
// projection mirrors: per channel, the softmax over the window's slots of gate + ape[slot]
// weighs the slots' kv; without overlap the slots are the window's rows (columns 0..dim); with
// overlap this window's second halves (columns dim..2 dim) and, after the first window, the
// previous window's first halves (columns 0..dim), `half` the rows' width. Then the entry's
// RMSNorm (weight `norm`, eps) and RoPE on its last `rope_dim` columns (adjacent pairs, the
// CPU's inverse frequencies, angle (e * rate) * freq, sin/cos from sincos_rr, times mscale).
// Written to the entry mirror at e and to the read-back rows at e - e0. One workgroup per
// entry, the channels split over the invocations. Reference: cpu::compress (pool_window, then
// its norm and rotation).
// Must not: read a position past the window's last, or take an entry wider than MAX_D (the op
// checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define T 64u
#define MAX_D 512u
#define PER (MAX_D / T)

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer KV { float kv[]; };
layout(std430, binding = 1) readonly buffer G { float gate[]; };
layout(std430, binding = 2) readonly buffer A { float ape[]; };
layout(std430, binding = 3) readonly buffer N { float norm[]; };
layout(std430, binding = 4) readonly buffer F { float freq[]; };
layout(std430, binding = 5) writeonly buffer E { float ent[]; };
layout(std430, binding = 6) writeonly buffer B { float back[]; };
layout(push_constant) uniform PC {
    uint dim; uint half_; uint rate; uint overlap;
    uint e0; uint count; uint rope_dim; float eps;
    float mscale; uint pad0; uint pad1; uint pad2;
} pc;

shared float red[T];
shared float se[MAX_D];

// Slot j of window e's pooling for a channel: (position, column offset, ape row). Slots
// 0..rate are the window's own rows, rate..2 rate the previous window's (overlap, e > 0).
uvec3 slot(uint e, uint j) {
    uint own = pc.overlap != 0u ? pc.dim : 0u;
    if (j < pc.rate) return uvec3(e * pc.rate + j, own, j);
    uint jj = j - pc.rate;
    return uvec3((e - 1u) * pc.rate + jj, 0u, jj);
}

void main() {
    uint e = pc.e0 + gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint slots = (pc.overlap != 0u && e > 0u) ? 2u * pc.rate : pc.rate;
    float val[PER];
    float ss = 0.0;
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint ch = tid + u * T;
        val[u] = 0.0;
        if (ch < pc.dim) {
            float m = NEG_INF;
            for (uint j = 0u; j < slots; j++) {
                uvec3 s = slot(e, j);
                m = max(m, gate[s.x * pc.half_ + s.y + ch] + ape[s.z * pc.half_ + s.y + ch]);
            }
            float num = 0.0, den = 0.0;
            for (uint j = 0u; j < slots; j++) {
                uvec3 s = slot(e, j);
                float p = exp(gate[s.x * pc.half_ + s.y + ch] + ape[s.z * pc.half_ + s.y + ch] - m);
                den += p;
                num += p * kv[s.x * pc.half_ + s.y + ch];
            }
            val[u] = num / den;
            ss += val[u] * val[u];
        }
    }
    red[tid] = ss;
    barrier();
    for (uint w = T / 2u; w > 0u; w >>= 1u) {
        if (tid < w) red[tid] += red[tid + w];
        barrier();
    }
    float inv = 1.0 / sqrt(red[0] / float(pc.dim) + pc.eps);
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint ch = tid + u * T;
        if (ch < pc.dim) se[ch] = val[u] * inv * norm[ch];
    }
    barrier();
    uint lo = pc.dim - pc.rope_dim;
    float pos = float(e * pc.rate);
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint ch = tid + u * T;
        if (ch >= pc.dim) continue;
        float x = se[ch];
        if (ch >= lo) {
            uint i = (ch - lo) / 2u;
            float s, c;
            sincos_rr(pos * freq[i], s, c);
            c *= pc.mscale;
            s *= pc.mscale;
            x = ((ch - lo) % 2u == 0u) ? x * c - se[ch + 1u] * s : x * c + se[ch - 1u] * s;
        }
        ent[e * pc.dim + ch] = x;
        back[gl_WorkGroupID.x * pc.dim + ch] = x;
    }
}
