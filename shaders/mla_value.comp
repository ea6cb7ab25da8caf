#version 450
// mla_value.comp: the value rows of kv_b on the softmax-weighted latent of each head:
// out[i][h][e] = sum_k kv_b[h * (dn + dv) + dn + e][k] * olat[i][h][k], in the arithmetic of
// the format's GEMV (matvec.comp: integer formats against the latent rows quantized to 8 bits
// per block as the CPU quantizes them, float formats and ACTS_F32 in f32). One subgroup per
// (head, value column); workgroups stride over them; activation row i = gl_WorkGroupID.y.
// Reference: the last loop of cpu::mla's absorbed form (cpu::linear per head).
// Must not: assume a subgroup size.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 2) readonly buffer XF { float xf[]; };
layout(std430, binding = 3) readonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 4) readonly buffer XD { vec2 xd[]; };
layout(std430, binding = 5) writeonly buffer OUT { float outv[]; };

layout(push_constant) uniform PC {
    uint n; uint heads; uint dn; uint dv;
    uint c; uint qs; uint ss; uint x_off;
    uint out_off; uint pad0; uint pad1; uint pad2;
} pc;

#define QS pc.qs
#define SS pc.ss
#define COLS pc.c
#define XF_OFF(xr) (pc.x_off + (xr) * pc.c)
#define XQ_BLK(xr) ((xr) * (pc.c >> 5))
#include "wformat.glsl"

void main() {
    wformat_init();
    uint i = gl_WorkGroupID.y;
    uint units = units_per_row();
    uint step = gl_NumWorkGroups.x * gl_NumSubgroups;
    uint total = pc.heads * pc.dv;
    for (uint g = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; g < total; g += step) {
        uint h = g / pc.dv, e = g % pc.dv;
        uint row = h * (pc.dn + pc.dv) + pc.dn + e;
        uint xr = i * pc.heads + h;
        float acc = 0.0;
        for (uint u = gl_SubgroupInvocationID; u < units; u += gl_SubgroupSize) acc += unit_dot(row, u, xr);
        acc = subgroupAdd(acc);
        if (subgroupElect()) outv[pc.out_off + xr * pc.dv + e] = row_finish(row, acc);
    }
}
