#version 450
// hyper_pre.comp: DeepSeek V4's manifold-constrained hyper-connections, the mix into a sublayer,
// in two dispatches. Reference: cpu::hyper::hyper_pre, in its order of operations. Phase 0, a
// workgroup per (row, logit): the unweighted RMSNorm of the row's `streams * hidden` values and
// one mixing logit m[k] = fn[k] . normed (fn in f32, `rows` of it) into `logits`. Phase 1, a
// workgroup per row: pre = sigmoid(m[..S] * scale[0] + base) + eps collapsing the streams into
// `out`; with mix_on, post = 2 sigmoid(m[S..2S] * scale[1] + base) and the Sinkhorn projection
// of comb (softmax rows + eps, columns, then iters - 1 rounds of rows and columns, every sum
// + eps) into `mix` as [post (S), comb (S x S)] by one invocation.
// Must not: take more than MAX_S streams or MAX_R logits (the op layer checks); assume the
// subgroup size.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define WG 128u
#define MAX_S 8u
#define MAX_R 64u

layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer X { float xv[]; };
layout(std430, binding = 1) readonly buffer FN { float fnv[]; };
layout(std430, binding = 2) readonly buffer BASE { float basev[]; };
layout(std430, binding = 3) readonly buffer SCALE { float scalev[]; };
layout(std430, binding = 4) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 5) writeonly buffer MIX { float mixv[]; };
layout(std430, binding = 6) buffer LOGITS { float lv[]; };
layout(push_constant) uniform PC {
    uint streams; uint hidden; uint rows; uint mix_on;
    uint iters; float eps; float norm_eps; uint x_off;
    uint out_off; uint mix_off; uint phase; uint pad1;
} pc;

shared float partial[WG];
shared float logits[MAX_R];
shared float pre[MAX_S];

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

float sigmoid(float x) { return div_rn(1.0, 1.0 + exp(-x)); }

// comb's columns over S rows normalised, each sum + eps (cpu::hyper::sinkhorn's `columns`).
void columns(inout float c[MAX_S * MAX_S], uint s) {
    for (uint k = 0u; k < s; k++) {
        float sum = 0.0;
        for (uint j = 0u; j < s; j++) sum += c[j * s + k];
        sum += pc.eps;
        for (uint j = 0u; j < s; j++) c[j * s + k] = div_rn(c[j * s + k], sum);
    }
}

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint s = pc.streams, h = pc.hidden, width = s * h;
    uint xb = pc.x_off + r * width;
    if (pc.phase == 0u) {
        // 1. The unweighted RMSNorm's scale over the flattened streams, then logit k.
        uint k = gl_WorkGroupID.y;
        float ss = 0.0;
        for (uint c = tid; c < width; c += WG) {
            float v = xv[xb + c];
            ss += v * v;
        }
        float inv = div_rn(1.0, sqrt(join(ss) / float(width) + pc.norm_eps));
        float acc = 0.0;
        for (uint c = tid; c < width; c += WG) acc += fnv[k * width + c] * (xv[xb + c] * inv);
        float total = join(acc);
        if (tid == 0u) lv[r * pc.rows + k] = total;
        return;
    }
    // 2. The row's logits.
    if (tid < pc.rows) logits[tid] = lv[r * pc.rows + tid];
    barrier();
    // 3. The coefficients, by one invocation in the CPU's order.
    if (tid == 0u) {
        for (uint i = 0u; i < s; i++) pre[i] = sigmoid(logits[i] * scalev[0] + basev[i]) + pc.eps;
        if (pc.mix_on != 0u) {
            uint mo = pc.mix_off + r * s * (s + 1u);
            for (uint i = 0u; i < s; i++) mixv[mo + i] = 2.0 * sigmoid(logits[s + i] * scalev[1] + basev[s + i]);
            float c[MAX_S * MAX_S];
            for (uint i = 0u; i < s * s; i++) c[i] = logits[2u * s + i] * scalev[2] + basev[2u * s + i];
            for (uint j = 0u; j < s; j++) {
                float m = NEG_INF;
                for (uint k = 0u; k < s; k++) m = max(m, c[j * s + k]);
                float sum = 0.0;
                for (uint k = 0u; k < s; k++) {
                    c[j * s + k] = exp(c[j * s + k] - m);
                    sum += c[j * s + k];
                }
                for (uint k = 0u; k < s; k++) c[j * s + k] = div_rn(c[j * s + k], sum) + pc.eps;
            }
            columns(c, s);
            for (uint it = 1u; it < pc.iters; it++) {
                for (uint j = 0u; j < s; j++) {
                    float sum = 0.0;
                    for (uint k = 0u; k < s; k++) sum += c[j * s + k];
                    sum += pc.eps;
                    for (uint k = 0u; k < s; k++) c[j * s + k] = div_rn(c[j * s + k], sum);
                }
                columns(c, s);
            }
            for (uint i = 0u; i < s * s; i++) mixv[mo + s + i] = c[i];
        }
    }
    barrier();
    // 4. The streams collapsed by `pre`.
    for (uint d = tid; d < h; d += WG) {
        float v = 0.0;
        for (uint i = 0u; i < s; i++) v += pre[i] * xv[xb + i * h + d];
        outv[pc.out_off + r * h + d] = v;
    }
}
