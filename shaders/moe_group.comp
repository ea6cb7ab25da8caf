#version 450
// moe_group.comp: a chunk's (row, rank) pairs grouped by expert, for moe_matmul.comp. One
// workgroup: counts per expert (shared atomics), offsets by a prefix sum, then each pair id
// p = r*K + k written into its expert's range. Output: groups[0..=E] the offsets, then
// groups[E + 1 + offsets[e] ..] expert e's pairs (in no particular order: each pair's result
// does not depend on its place in a tile). Pairs whose expert id is not valid are left out.
// Must not: take more than 1024 experts (the caller checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer RT { float routing[]; };
layout(std430, binding = 1) writeonly buffer GR { uint groups[]; };
layout(push_constant) uniform PC { uint n; uint top_k; uint experts; uint r_off; } pc;

#define R_OFF pc.r_off
#define TOP_K pc.top_k
#include "moe.glsl"

shared uint cnt[1024];
shared uint base[1025];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint pairs = pc.n * pc.top_k;
    for (uint e = tid; e < pc.experts; e += 256u) cnt[e] = 0u;
    barrier();
    for (uint p = tid; p < pairs; p += 256u) {
        uint e = moe_expert(p / pc.top_k, p % pc.top_k, pc.experts);
        if (e < pc.experts) atomicAdd(cnt[e], 1u);
    }
    barrier();
    if (tid == 0u) {
        uint s = 0u;
        for (uint e = 0u; e < pc.experts; e++) {
            base[e] = s;
            s += cnt[e];
            cnt[e] = 0u;
        }
        base[pc.experts] = s;
    }
    barrier();
    for (uint e = tid; e <= pc.experts; e += 256u) groups[e] = base[e];
    for (uint p = tid; p < pairs; p += 256u) {
        uint e = moe_expert(p / pc.top_k, p % pc.top_k, pc.experts);
        if (e < pc.experts) groups[pc.experts + 1u + base[e] + atomicAdd(cnt[e], 1u)] = p;
    }
}
