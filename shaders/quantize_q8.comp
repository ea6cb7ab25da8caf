#version 450
// quantize_q8.comp: activations to 8 bits per block of 32, bit for bit as the CPU's
// QuantizedActs: d = amax / 127, q = round_half_even(x / d) (as x * (1 / d)), s = d * sum(q).
// Writes q as 2 uvec4 per block and (d, s) per block. One invocation per block.
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
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(xf[base + i]));
    float d = div_rn(amax, 127.0);
    float id = d > 0.0 ? div_rn(1.0, d) : 0.0;
    uint words[8];
    int sum = 0;
    for (uint w = 0u; w < 8u; w++) {
        uint packed = 0u;
        for (uint j = 0u; j < 4u; j++) {
            precise float v = xf[base + 4u * w + j] * id;
            int q = clamp(int(roundEven(v)), -128, 127);
            sum += q;
            packed |= (uint(q) & 0xffu) << (8u * j);
        }
        words[w] = packed;
    }
    xq[2u * b] = uvec4(words[0], words[1], words[2], words[3]);
    xq[2u * b + 1u] = uvec4(words[4], words[5], words[6], words[7]);
    xd[b] = vec2(d, d * float(sum));
}
