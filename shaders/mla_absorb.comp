#version 450
// mla_absorb.comp: each query head's no-position part absorbed into latent space through the
// key rows of kv_b: qlat[i][h][k] = sum_d q[i][h][d] * kv_b[h * (dn + dv) + d][k], d in order,
// each weight decoded as the CPU's dequant_row decodes it (kv_b as uploaded, any format). One
// invocation per (k, head, row). Reference: the first loop of cpu::mla's absorbed form.
// Must not: read past a head's dn query columns.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 2) readonly buffer Q { float qv[]; };
layout(std430, binding = 3) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint dn; uint dr;
    uint dv; uint c; uint qs; uint ss;
    uint q_off; uint out_off; uint pad0; uint pad1;
} pc;

#define QS pc.qs
#define SS pc.ss
#define COLS pc.c
// The weights are decoded one at a time; the activation accessors are never called.
#define XF_OFF(xr) 0u
#define XQ_BLK(xr) 0u
float xf[1];
uvec4 xq[1];
vec2 xd[1];
#include "wformat.glsl"

void main() {
    wformat_init();
    uint id = gl_GlobalInvocationID.x;
    if (id >= pc.n * pc.heads * pc.c) return;
    uint k = id % pc.c, h = (id / pc.c) % pc.heads, i = id / (pc.c * pc.heads);
    uint qb = pc.q_off + (i * pc.heads + h) * (pc.dn + pc.dr);
    uint wrow = h * (pc.dn + pc.dv);
    float acc = 0.0;
    for (uint d = 0u; d < pc.dn; d++) acc += qv[qb + d] * dequant(wrow + d, k);
    outv[pc.out_off + (i * pc.heads + h) * pc.c + k] = acc;
}
