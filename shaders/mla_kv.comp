#version 450
// mla_kv.comp: the cache rows of a block of multi-head latent attention, and RoPE on the
// queries. Per row r (position pos0 + r) of the kv_a output `ckv` (latent, then the shared
// rope key, c + dr floats a row): the latent's RMSNorm (times its weight) and the rotated rope
// key, each written to row pos0 + r of its mirror and to row r of its read-back buffer; and
// the rope part (the last dr floats) of every query head of row r rotated in place. Pairs are
// (2i, 2i + 1) (interleaved) or (i, i + dr/2); the inverse frequencies (YaRN included) and
// mscale come from the host (cpu::rope::inv_freq), angles pos * freq in f32 as on the CPU.
// One workgroup per row; with dyn_pos the first position is read from `posv[0]` (a replayed
// recording). With no_back the read-back rows are left to the host's copy commands (from the
// mirrors, after). Reference: steps 2 to 4 of cpu::mla::mla.
// Must not: assume the subgroup size, or touch a query's no-position part.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer CKV { float ckv[]; };
layout(std430, binding = 1) readonly buffer NW { float nw[]; };
layout(std430, binding = 2) readonly buffer F { float freq[]; };
layout(std430, binding = 3) buffer Q { float qv[]; };
layout(std430, binding = 4) writeonly buffer ML { float mlat[]; };
layout(std430, binding = 5) writeonly buffer MR { float mrope[]; };
layout(std430, binding = 6) writeonly buffer SL { float slat[]; };
layout(std430, binding = 7) writeonly buffer SR { float srope[]; };
layout(std430, binding = 8) readonly buffer POS { uint posv[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint dn; uint dr;
    uint c; float eps; uint interleaved; uint pos0;
    float mscale; uint ckv_off; uint q_off; uint dyn_pos;
    uint no_back;
} pc;

shared float partial[64];

void main() {
    uint r = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint xb = pc.ckv_off + r * (pc.c + pc.dr);
    uint pos = (pc.dyn_pos != 0u ? posv[0] : pc.pos0) + r;
    // The latent's RMSNorm.
    float ss = 0.0;
    for (uint k = tid; k < pc.c; k += 64u) {
        float v = ckv[xb + k];
        ss += v * v;
    }
    ss = subgroupAdd(ss);
    if (subgroupElect()) partial[gl_SubgroupID] = ss;
    barrier();
    float total = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) total += partial[s];
    float inv = 1.0 / sqrt(total / float(pc.c) + pc.eps);
    for (uint k = tid; k < pc.c; k += 64u) {
        float v = ckv[xb + k] * inv * nw[k];
        mlat[pos * pc.c + k] = v;
        if (pc.no_back == 0u) slat[r * pc.c + k] = v;
    }
    // RoPE on the shared key (into the cache rows) and on every head's rope part (in place).
    uint half_ = pc.dr / 2u;
    uint dq = pc.dn + pc.dr;
    for (uint id = tid; id < (pc.heads + 1u) * half_; id += 64u) {
        uint i = id % half_, h = id / half_;
        float s, co;
        sincos_rr(float(pos) * freq[i], s, co);
        co *= pc.mscale;
        s *= pc.mscale;
        uint a = pc.interleaved != 0u ? 2u * i : i;
        uint b = pc.interleaved != 0u ? a + 1u : a + half_;
        if (h < pc.heads) {
            uint base = pc.q_off + r * pc.heads * dq + h * dq + pc.dn;
            float x0 = qv[base + a], x1 = qv[base + b];
            qv[base + a] = x0 * co - x1 * s;
            qv[base + b] = x1 * co + x0 * s;
        } else {
            float x0 = ckv[xb + pc.c + a], x1 = ckv[xb + pc.c + b];
            float y0 = x0 * co - x1 * s, y1 = x1 * co + x0 * s;
            mrope[pos * pc.dr + a] = y0;
            mrope[pos * pc.dr + b] = y1;
            if (pc.no_back == 0u) {
                srope[r * pc.dr + a] = y0;
                srope[r * pc.dr + b] = y1;
            }
        }
    }
}
