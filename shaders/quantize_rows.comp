#version 450
// quantize_rows.comp: activations to 8 bits per block of 32, as quantize_q8.comp (bit for bit
// the CPU's QuantizedActs: d = amax / 127, q = round_half_even(x / d) (as x * (1 / d)),
// s = d * sum(q); q as 2 uvec4 per block, (d, s) per block). An invocation per element: a
// workgroup takes 8 blocks of one row (workgroup (x, row)); the block's max, sum and packed
// bytes are joined in shared memory with integer atomics, which are exact in any order. The
// input may be transformed first, as fuse_in.glsl's modes (1: the row's RMSNorm, each
// workgroup summing the row's squares first; 2-4: a gated unit of x and aux), in the CPU's
// arithmetic, so the q8 values are those of the transformed row.
// Must not: use the driver's division (not exact; see div_rn), or reorder the rounding steps.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "act.glsl"

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XF { float xf[]; };
layout(std430, binding = 1) writeonly buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) writeonly buffer XD { vec2 xd[]; };
layout(std430, binding = 3) readonly buffer AUX { float auxv[]; };
layout(push_constant) uniform PC {
    uint rows; uint cols; uint x_off; uint in_mode;
    uint aux_off; float p0; float p1; uint pad;
} pc;

shared float partial[256];
shared uint s_max[8];
shared int s_sum[8];
shared uint s_words[64];

void main() {
    uint r = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint nb = pc.cols >> 5;
    uint lb = tid >> 5, e = tid & 31u;
    uint b = gl_WorkGroupID.x * 8u + lb;
    uint xb = pc.x_off + r * pc.cols;
    if (tid < 8u) {
        s_max[tid] = 0u;
        s_sum[tid] = 0;
    }
    if (tid < 64u) s_words[tid] = 0u;
    float inv = 1.0;
    if (pc.in_mode == 1u) {
        float ss = 0.0;
        for (uint k = tid; k < pc.cols; k += 256u) {
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
    bool ok = b < nb;
    uint k = b * 32u + e;
    float x = 0.0;
    if (ok) {
        x = xf[xb + k];
        if (pc.in_mode == 1u) x = x * inv * (auxv[pc.aux_off + k] + pc.p1);
        else if (pc.in_mode >= 2u) x = glu_apply(pc.in_mode - 2u, x, auxv[pc.aux_off + r * pc.cols + k], pc.p0, pc.p1);
    }
    barrier();
    // |x| >= 0 orders as its bits.
    if (ok) atomicMax(s_max[lb], floatBitsToUint(abs(x)));
    barrier();
    vec2 sc = q8_scale(uintBitsToFloat(s_max[lb]));
    float d = sc.x;
    int q = q8_code(x, sc.y);
    if (ok) {
        atomicAdd(s_sum[lb], q);
        atomicOr(s_words[lb * 8u + (e >> 2)], (uint(q) & 0xffu) << (8u * (e & 3u)));
    }
    barrier();
    uint blk = r * nb + b;
    if (ok && e < 2u) {
        uint w = lb * 8u + 4u * e;
        xq[2u * blk + e] = uvec4(s_words[w], s_words[w + 1u], s_words[w + 2u], s_words[w + 3u]);
    }
    if (ok && e == 0u) xd[blk] = vec2(d, d * float(s_sum[lb]));
}
