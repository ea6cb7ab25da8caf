#version 450
// layer_norm.comp: out = (x - mean) / sqrt(var + eps) * weight + bias over each row of `width`
// (var the population variance; no bias where has_bias = 0). Reference: cpu::norm::layer_norm
// (DeepSeek Sparse Attention's index keys). One workgroup per row: subgroup sums joined in
// shared memory, the mean first, then the centered squares.
// Must not: assume the subgroup size; in-place (x == out) is allowed.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer W { float wv[]; };
layout(std430, binding = 2) readonly buffer B { float bv[]; };
layout(std430, binding = 3) buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint width; float eps; uint x_off; uint out_off;
    uint has_bias; uint pad0; uint pad1; uint pad2;
} pc;

shared float partial[64];

// The workgroup's sum of `v`; every invocation gets it. Safe to call twice in a row.
float join(float v) {
    barrier();
    v = subgroupAdd(v);
    if (subgroupElect()) partial[gl_SubgroupID] = v;
    barrier();
    float total = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) total += partial[s];
    return total;
}

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint xb = pc.x_off + r * pc.width, ob = pc.out_off + r * pc.width;
    float s = 0.0;
    for (uint c = tid; c < pc.width; c += 64u) s += xv[xb + c];
    float mean = join(s) / float(pc.width);
    float ss = 0.0;
    for (uint c = tid; c < pc.width; c += 64u) {
        float d = xv[xb + c] - mean;
        ss += d * d;
    }
    float inv = 1.0 / sqrt(join(ss) / float(pc.width) + pc.eps);
    barrier();
    for (uint c = tid; c < pc.width; c += 64u) {
        float b = pc.has_bias != 0u ? bv[c] : 0.0;
        outv[ob + c] = (xv[xb + c] - mean) * inv * wv[c] + b;
    }
}
