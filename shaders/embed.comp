#version 450
// embed.comp: embedding gather, out[i] = scale * table[token[i]] for a block of tokens, the
// table in any weight format (decoded as the CPU's dequant_row does). One workgroup per token.
// Must not: read a row past the table (the host checks token ids; a bad one writes zeros).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WS { uint ws[]; };
layout(std430, binding = 2) readonly buffer TOK { uint tokens[]; };
layout(std430, binding = 3) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint rows; uint cols; uint qs; uint ss;
    uint out_off; float scale; uint pad0; uint pad1;
} pc;

#define QS pc.qs
#define SS pc.ss
#define COLS pc.cols
// The gather reads weights only; the activation accessors are never called.
#define XF_OFF(xr) 0u
#define XQ_BLK(xr) 0u
float xf[1];
uvec4 xq[1];
vec2 xd[1];
#include "wformat.glsl"

void main() {
    wformat_init();
    uint i = gl_WorkGroupID.x;
    uint tok = tokens[i];
    for (uint c = gl_LocalInvocationID.x; c < pc.cols; c += gl_WorkGroupSize.x) {
        float v = tok < pc.rows ? dequant(tok, c) : 0.0;
        outv[pc.out_off + i * pc.cols + c] = pc.scale == 1.0 ? v : v * pc.scale;
    }
}
