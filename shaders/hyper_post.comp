#version 450
// hyper_post.comp: DeepSeek V4's hyper-connections, the mix out of a sublayer. Reference:
// cpu::hyper::hyper_post: out[k] = post[k] * x + sum_j comb[j][k] * residual[j] per row (x:
// `hidden`, residual and out: `streams * hidden`, mix: [post (S), comb (S x S)]); without
// mix_on, x copied into every stream. One invocation per (row, column): it reads every
// stream's residual value of its column before it writes any, so with in_place (the residual
// read from `out` itself) each value is read before it is overwritten.
// Must not: take more than MAX_S streams (the op layer checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define MAX_S 8u

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer RES { float resv[]; };
layout(std430, binding = 2) readonly buffer MIX { float mixv[]; };
layout(std430, binding = 3) buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint streams; uint hidden; uint mix_on;
    uint in_place; uint x_off; uint res_off; uint mix_off;
    uint out_off; uint pad0; uint pad1; uint pad2;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    uint s = pc.streams, h = pc.hidden;
    if (i >= pc.n * h) return;
    uint r = i / h, d = i % h;
    float x = xv[pc.x_off + i];
    uint ob = pc.out_off + r * s * h + d;
    if (pc.mix_on == 0u) {
        for (uint k = 0u; k < s; k++) outv[ob + k * h] = x;
        return;
    }
    float res[MAX_S];
    for (uint j = 0u; j < s; j++) {
        res[j] = pc.in_place != 0u ? outv[ob + j * h] : resv[pc.res_off + r * s * h + d + j * h];
    }
    uint mo = pc.mix_off + r * s * (s + 1u);
    float o[MAX_S];
    for (uint k = 0u; k < s; k++) {
        float mixed = 0.0;
        for (uint j = 0u; j < s; j++) mixed += mixv[mo + s + j * s + k] * res[j];
        o[k] = mixv[mo + k] * x + mixed;
    }
    for (uint k = 0u; k < s; k++) outv[ob + k * h] = o[k];
}
