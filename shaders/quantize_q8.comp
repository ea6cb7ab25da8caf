#version 450
// quantize_q8.comp: activations to 8 bits per block of 32, bit for bit as the CPU's
// QuantizedActs: d = amax / 127, q = round_half_even(x / d) (as x * (1 / d)), s = d * sum(q).
// Writes q as 2 uvec4 per block and (d, s) per block (common.glsl's q8_block). One invocation
// per block.
// Must not: use the driver's division (not exact; see div_rn), or reorder the rounding steps.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XF { float xf[]; };
layout(std430, binding = 1) writeonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) writeonly buffer XD { vec2 xd[]; };
layout(push_constant) uniform PC { uint blocks; uint cols; uint x_off; uint pad; } pc;

void main() {
    uint b = gl_GlobalInvocationID.x;
    if (b >= pc.blocks) return;
    uint nb = pc.cols >> 5;
    uint base = pc.x_off + (b / nb) * pc.cols + (b % nb) * 32u;
    float v[32];
    for (uint i = 0u; i < 32u; i++) v[i] = xf[base + i];
    uvec4 lo, hi;
    xd[b] = q8_block(v, lo, hi);
    xq[2u * b] = lo;
    xq[2u * b + 1u] = hi;
}
