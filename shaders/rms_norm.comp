#version 450
// rms_norm.comp: out = x / rms(x) * (weight + offset) over consecutive groups of `group`
// columns of each row (group = width: the whole row; group = head_dim: per head).
// One workgroup per (group, row); a subgroup sum, then a shared-memory join of subgroups.
// Must not: assume the subgroup size; in-place (x == out) is allowed.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer W { float wv[]; };
layout(std430, binding = 2) buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint width; uint group; float eps; float offset;
    uint x_off; uint out_off; uint pad0; uint pad1;
} pc;

shared float partial[64];

void main() {
    uint g = gl_WorkGroupID.x, r = gl_WorkGroupID.y;
    uint xb = pc.x_off + r * pc.width + g * pc.group;
    uint ob = pc.out_off + r * pc.width + g * pc.group;
    float ss = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < pc.group; c += gl_WorkGroupSize.x) {
        float v = xv[xb + c];
        ss += v * v;
    }
    ss = subgroupAdd(ss);
    if (subgroupElect()) partial[gl_SubgroupID] = ss;
    barrier();
    float total = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) total += partial[s];
    float inv = 1.0 / sqrt(total / float(pc.group) + pc.eps);
    for (uint c = gl_LocalInvocationID.x; c < pc.group; c += gl_WorkGroupSize.x) {
        outv[ob + c] = xv[xb + c] * inv * (wv[c] + pc.offset);
    }
}
