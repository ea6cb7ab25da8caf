#version 450
// moe_glu_q8.comp: the routed experts' gated unit after moe_matmul_coop.comp's mode 0, which
// stores each pair's raw gate and up sums side by side (gu[p] = gate[0..F] then up[0..F]):
// h[p][c] = glu(gate + bg, up + bu) with the biases of the pair's expert (from the routing), and
// h's 8-bit blocks (q, (d, s)) exactly as quantize_q8.comp makes them from h, for the down
// product. A workgroup takes 8 blocks of 32, an invocation an element (the loads and h's
// stores coalesced); one invocation a block then quantizes it from shared memory (one
// invocation a block reading its own 32 floats from memory took 10x as long on the H100).
// Must not: run with F not a multiple of 32.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer GU { float gu[]; };
layout(std430, binding = 1) writeonly buffer H { float h[]; };
layout(std430, binding = 2) writeonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 3) writeonly buffer XD { vec2 xd[]; };
layout(std430, binding = 4) readonly buffer RT { float routing[]; };
layout(std430, binding = 5) readonly buffer BS { float bias[]; };
layout(push_constant) uniform PC {
    uint blocks; uint ffn; uint top_k; uint experts;
    uint r_off; uint glu; float limit; float alpha;
    uint bias_off; uint pad0; uint pad1; uint pad2;
} pc;

#define NONE 0xffffffffu
#define R_OFF pc.r_off
#define TOP_K pc.top_k
#include "moe.glsl"

shared float vs[256];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint b = gl_WorkGroupID.x * 8u + tid / 32u;
    uint f = pc.ffn, nb = f >> 5;
    if (b < pc.blocks) {
        uint p = b / nb, c = (b % nb) * 32u + tid % 32u;
        float g = gu[p * 2u * f + c], u = gu[p * 2u * f + f + c];
        if (pc.bias_off != NONE) {
            uint e = moe_expert(p / pc.top_k, p % pc.top_k, pc.experts);
            if (e < pc.experts) {
                g += bias[pc.bias_off + e * 2u * f + c];
                u += bias[pc.bias_off + e * 2u * f + f + c];
            }
        }
        float v = moe_glu(pc.glu, g, u, pc.limit, pc.alpha);
        h[p * f + c] = v;
        vs[tid] = v;
    }
    barrier();
    uint qb = gl_WorkGroupID.x * 8u + tid;
    if (tid >= 8u || qb >= pc.blocks) return;
    // quantize_q8.comp's arithmetic, on the block's values as h holds them.
    float v[32];
    for (uint i = 0u; i < 32u; i++) v[i] = vs[tid * 32u + i];
    uvec4 lo, hi;
    xd[qb] = q8_block(v, lo, hi);
    xq[2u * qb] = lo;
    xq[2u * qb + 1u] = hi;
}
