#version 450
// quantize_rows.comp: activations to 8 bits per block of 32, as quantize_q8.comp (bit for bit
// the CPU's QuantizedActs: d = amax / 127, q = round_half_even(x / d) (as x * (1 / d)),
// s = d * sum(q); q as 2 uvec4 per block, (d, s) per block), one workgroup per activation
// row, an invocation per block in turn. The input may be transformed first, as fuse_in.glsl's modes
// (1: the row's RMSNorm, a workgroup sum of squares first; 2-4: a gated unit of x and aux),
// in the CPU's arithmetic, so the q8 values are those of the transformed row.
// Must not: use the driver's division (not exact; see div_rn), or reorder the rounding steps.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "act.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XF { float xf[]; };
layout(std430, binding = 1) writeonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) writeonly buffer XD { vec2 xd[]; };
layout(std430, binding = 3) readonly buffer AUX { float auxv[]; };
layout(push_constant) uniform PC {
    uint rows; uint cols; uint x_off; uint in_mode;
    uint aux_off; float p0; float p1; uint pad;
} pc;

shared float partial[64];

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint nb = pc.cols >> 5;
    uint xb = pc.x_off + r * pc.cols;
    float inv = 1.0;
    if (pc.in_mode == 1u) {
        float ss = 0.0;
        for (uint k = tid; k < pc.cols; k += 64u) {
            float v = xf[xb + k];
            ss += v * v;
        }
        ss = subgroupAdd(ss);
        if (subgroupElect()) partial[gl_SubgroupID] = ss;
        barrier();
        float total = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) total += partial[s];
        inv = 1.0 / sqrt(total / float(pc.cols) + pc.p0);
    }
    for (uint b = tid; b < nb; b += 64u) {
        uint base = b * 32u;
        float v[32];
        for (uint i = 0u; i < 32u; i++) {
            float x = xf[xb + base + i];
            if (pc.in_mode == 1u) x = x * inv * (auxv[pc.aux_off + base + i] + pc.p1);
            else if (pc.in_mode >= 2u) x = glu_apply(pc.in_mode - 2u, x, auxv[pc.aux_off + r * pc.cols + base + i], pc.p0, pc.p1);
            v[i] = x;
        }
        float amax = 0.0;
        for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(v[i]));
        float d = div_rn(amax, 127.0);
        float id = d > 0.0 ? div_rn(1.0, d) : 0.0;
        uint words[8];
        int sum = 0;
        for (uint w = 0u; w < 8u; w++) {
            uint packed = 0u;
            for (uint j = 0u; j < 4u; j++) {
                precise float t = v[4u * w + j] * id;
                int q = clamp(int(roundEven(t)), -128, 127);
                sum += q;
                packed |= (uint(q) & 0xffu) << (8u * j);
            }
            words[w] = packed;
        }
        uint blk = r * nb + b;
        xq[2u * blk] = uvec4(words[0], words[1], words[2], words[3]);
        xq[2u * blk + 1u] = uvec4(words[4], words[5], words[6], words[7]);
        xd[blk] = vec2(d, d * float(sum));
    }
}
