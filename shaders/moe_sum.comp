#version 450
// moe_sum.comp: a chunk's expert outputs joined to their rows: out[r][i] = sum over ranks k,
// in rank order from 0, of w[r,k] * y[r*K + k][i] (the CPU's order, cpu/experts.rs). Pairs
// whose expert id is not valid add nothing. With res_on, out = res + that sum (the residual Add
// folded into the store; res laid out as out, from res_off). One invocation per output element.
// Must not: reorder the sum, or let the compiler fuse its multiply-adds (precise).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer RT { float routing[]; };
layout(std430, binding = 2) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 3) readonly buffer RES { float resv[]; };
layout(push_constant) uniform PC { uint n; uint hidden; uint top_k; uint experts; uint r_off; uint out_off; uint res_on; uint res_off; } pc;

#define R_OFF pc.r_off
#define TOP_K pc.top_k
#include "moe.glsl"

void main() {
    uint idx = gl_GlobalInvocationID.x;
    if (idx >= pc.n * pc.hidden) return;
    uint r = idx / pc.hidden, i = idx % pc.hidden;
    precise float o = 0.0;
    for (uint k = 0u; k < pc.top_k; k++) {
        if (moe_expert(r, k, pc.experts) >= pc.experts) continue;
        precise float wt = moe_weight(r, k) * y[(r * pc.top_k + k) * pc.hidden + i];
        o = o + wt;
    }
    outv[pc.out_off + idx] = pc.res_on != 0u ? resv[pc.res_off + idx] + o : o;
}
