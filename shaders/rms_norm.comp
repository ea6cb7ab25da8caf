#version 450
// rms_norm.comp: out = x / rms(x) * (weight + offset) * scale over consecutive groups of
// `group` columns of each row (group = width: the whole row; group = head_dim: per head); scale
// is 1 but for a scaled norm (Inkling's final norm; reference: `Op::RmsNorm` in `cpu::run_op`).
// With `unweighted` set, the first set reads no weight: a weight of ones (DeepSeek V4's per-head
// query norm; the CPU's `Op::RmsNorm` without a weight).
// One workgroup per (group, row); a subgroup sum, then a shared-memory join of subgroups.
// Two independent norms in one dispatch (workgroup z = 1: bindings 3-5, the second set of
// push constants; eps, offset and scale shared), so a layer's q and k norms cost one launch.
// Must not: assume the subgroup size; in-place (x == out) is allowed.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer W { float wv[]; };
layout(std430, binding = 2) buffer OUT { float outv[]; };
layout(std430, binding = 3) readonly buffer X2 { float xv2[]; };
layout(std430, binding = 4) readonly buffer W2 { float wv2[]; };
layout(std430, binding = 5) buffer OUT2 { float outv2[]; };
layout(push_constant) uniform PC {
    uint width; uint group; float eps; float offset;
    uint x_off; uint out_off; uint width2; uint group2;
    uint x2_off; uint out2_off; float scale; uint unweighted;
} pc;

shared float partial[64];

float join(float ss) {
    ss = subgroupAdd(ss);
    if (subgroupElect()) partial[gl_SubgroupID] = ss;
    barrier();
    float total = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) total += partial[s];
    return total;
}

// The body for one (x, w, out) set: a macro, since GLSL cannot pass buffers.
#define NORM(XV, WV, OV, WIDTH, GROUP, XOFF, OOFF, ONES)                                   \
    {                                                                                       \
        uint g = gl_WorkGroupID.x, r = gl_WorkGroupID.y;                                    \
        if (g >= (WIDTH) / (GROUP)) return;                                                 \
        uint xb = (XOFF) + r * (WIDTH) + g * (GROUP);                                       \
        uint ob = (OOFF) + r * (WIDTH) + g * (GROUP);                                       \
        float ss = 0.0;                                                                     \
        for (uint c = gl_LocalInvocationID.x; c < (GROUP); c += gl_WorkGroupSize.x) {       \
            float v = XV[xb + c];                                                           \
            ss += v * v;                                                                    \
        }                                                                                   \
        float total = join(ss);                                                             \
        float inv = 1.0 / sqrt(total / float(GROUP) + pc.eps);                              \
        for (uint c = gl_LocalInvocationID.x; c < (GROUP); c += gl_WorkGroupSize.x) {       \
            OV[ob + c] = XV[xb + c] * inv * ((ONES ? 1.0 : WV[c]) + pc.offset) * pc.scale;    \
        }                                                                                   \
    }

void main() {
    if (gl_WorkGroupID.z == 0u) {
        NORM(xv, wv, outv, pc.width, pc.group, pc.x_off, pc.out_off, pc.unweighted != 0u)
    } else {
        NORM(xv2, wv2, outv2, pc.width2, pc.group2, pc.x2_off, pc.out2_off, false)
    }
}
