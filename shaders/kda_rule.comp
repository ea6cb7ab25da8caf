#version 450
// kda_rule.comp: the channel-wise gated delta rule of a Kimi Delta Attention block and its
// sigmoid-gated output norm. One workgroup per head h; the block's rows in order. Per row: q
// and k of the head L2-normed (q also times 1/sqrt(d)) in shared memory, beta = sigmoid(b),
// the decay of each key channel i, exp(-exp(A_log[h]) * softplus(f[i] + dt_bias[i])), in
// shared memory; each invocation owns columns e of the head's d x d state S (in the state
// buffer, row-major by key channel): S[i, e] *= decay[i], delta = beta (v - S^T k),
// S += k delta^T, o = S^T q; then o / rms(o) * w * sigmoid(gate).
// The `aux` buffer holds, per row, the decay's pre-activations f (`heads * d`, at f_off), the
// output gate's (`heads * d`, at g_off) and b (`heads`, at b_off).
// Reference: step 3 and 4 of `cpu::kda::kda` (before `out_proj`), in its order of operations
// per column.
// Must not: assume the subgroup size, or take heads wider than MAX_D (the op checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define MAX_D 256
#define WG 64
#define COLS (MAX_D / WG)

layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer CONV { float conv[]; };
layout(std430, binding = 1) readonly buffer AUX { float aux[]; };
layout(std430, binding = 2) readonly buffer ALOG { float alog[]; };
layout(std430, binding = 3) readonly buffer DT { float dtb[]; };
layout(std430, binding = 4) readonly buffer NW { float nw[]; };
layout(std430, binding = 5) buffer ST { float st[]; };
layout(std430, binding = 6) buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint d; float eps;
    uint state_off; uint conv_off; uint f_off; uint g_off;
    uint b_off; uint out_off; uint pad0; uint pad1;
} pc;

shared float qs[MAX_D];
shared float ks[MAX_D];
shared float gs[MAX_D];
shared float red[WG];

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// log(1 + x), accurate for small x.
float log1p_(float x) {
    float u = 1.0 + x;
    return u == 1.0 ? x : log(u) * (x / (u - 1.0));
}

// torch's softplus (linear above 20).
float softplus(float x) { return x > 20.0 ? x : log1p_(exp(x)); }

// The workgroup's sum of v (every invocation gets it); leaves `red` free again.
float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) red[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) t += red[s];
    barrier();
    return t;
}

void main() {
    uint h = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint d = pc.d;
    uint hd = pc.heads * d;
    uint channels = 3u * hd;
    float qscale = 1.0 / sqrt(float(d));
    float a_exp = exp(alog[h]);
    uint sb = pc.state_off + h * d * d;
    for (uint t = 0u; t < pc.n; t++) {
        uint crow = pc.conv_off + t * channels;
        uint arow = t * hd + h * d;
        float sq = 0.0, sk = 0.0;
        for (uint i = tid; i < d; i += WG) {
            float q = conv[crow + h * d + i];
            float k = conv[crow + hd + h * d + i];
            qs[i] = q;
            ks[i] = k;
            sq += q * q;
            sk += k * k;
            gs[i] = exp(-a_exp * softplus(aux[pc.f_off + arow + i] + dtb[h * d + i]));
        }
        sq = wg_sum(sq);
        sk = wg_sum(sk);
        float qinv = 1.0 / sqrt(sq + 1e-6), kinv = 1.0 / sqrt(sk + 1e-6);
        for (uint i = tid; i < d; i += WG) {
            qs[i] = qs[i] * qinv * qscale;
            ks[i] = ks[i] * kinv;
        }
        barrier();
        float beta = sigmoid(aux[pc.b_off + t * pc.heads + h]);
        float o[COLS];
        float ss = 0.0;
        [[unroll]] for (uint c = 0u; c < COLS; c++) {
            uint e = tid + c * WG;
            o[c] = 0.0;
            if (e >= d) continue;
            float acc = conv[crow + 2u * hd + h * d + e];
            for (uint i = 0u; i < d; i++) {
                float s = st[sb + i * d + e] * gs[i];
                st[sb + i * d + e] = s;
                acc -= ks[i] * s;
            }
            float delta = acc * beta;
            float oo = 0.0;
            for (uint i = 0u; i < d; i++) {
                float s = st[sb + i * d + e] + ks[i] * delta;
                st[sb + i * d + e] = s;
                oo += qs[i] * s;
            }
            o[c] = oo;
            ss += oo * oo;
        }
        ss = wg_sum(ss);
        float inv = 1.0 / sqrt(ss / float(d) + pc.eps);
        uint ob = pc.out_off + t * hd + h * d;
        [[unroll]] for (uint c = 0u; c < COLS; c++) {
            uint e = tid + c * WG;
            if (e >= d) continue;
            outv[ob + e] = o[c] * inv * nw[e] * sigmoid(aux[pc.g_off + arow + e]);
        }
    }
}
