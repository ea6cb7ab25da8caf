#version 450
// deltanet_rule.comp: the gated delta rule of a Gated DeltaNet block and its gated RMSNorm.
// One workgroup per value head h (sharing key head h / (nv / nk)); the block's rows in order.
// Per row: q and k of the key head L2-normed (q also times 1/sqrt(dk)) in shared memory,
// beta = sigmoid(b), the decay exp(-exp(A_log) * softplus(a + dt_bias)); each invocation owns
// columns e of the head's dk x dv state S (in the state buffer, row-major by d): S *= decay,
// delta = beta (v - S^T k), S += k delta^T, o = S^T q; then o / rms(o) * w * silu(z).
// Reference: step 3 of `cpu::deltanet::gated_deltanet`, in its order of operations per column.
// `apart` (Qwen3.5's projections): b and a as two planes of `n x nv`, z in `p` as `n x nv*dv`.
// Must not: assume the subgroup size, or take heads wider than MAX_D (the op checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define MAX_D 256
#define WG 64
#define COLS (MAX_D / WG)

layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer CONV { float conv[]; };
layout(std430, binding = 1) readonly buffer P { float pv[]; };
layout(std430, binding = 2) readonly buffer BA { float bav[]; };
layout(std430, binding = 3) readonly buffer ALOG { float alog[]; };
layout(std430, binding = 4) readonly buffer DT { float dtb[]; };
layout(std430, binding = 5) readonly buffer NW { float nw[]; };
layout(std430, binding = 6) buffer ST { float st[]; };
layout(std430, binding = 7) buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint nk; uint nv; uint dk;
    uint dv; float eps; uint state_off; uint conv_off;
    uint p_off; uint ba_off; uint out_off; uint apart;
} pc;

shared float qs[MAX_D];
shared float ks[MAX_D];
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
    uint r = pc.nv / pc.nk;
    uint kh = h / r, j = h % r;
    uint key_dim = pc.nk * pc.dk;
    uint channels = 2u * key_dim + pc.nv * pc.dv;
    uint group = 2u * pc.dk + 2u * r * pc.dv;
    uint pw = pc.nk * group;
    float qscale = 1.0 / sqrt(float(pc.dk));
    float a_exp = exp(alog[h]);
    float dt = dtb[h];
    uint sb = pc.state_off + h * pc.dk * pc.dv;
    for (uint t = 0u; t < pc.n; t++) {
        uint crow = pc.conv_off + t * channels;
        float sq = 0.0, sk = 0.0;
        for (uint d = tid; d < pc.dk; d += WG) {
            float q = conv[crow + kh * pc.dk + d];
            float k = conv[crow + key_dim + kh * pc.dk + d];
            qs[d] = q;
            ks[d] = k;
            sq += q * q;
            sk += k * k;
        }
        sq = wg_sum(sq);
        sk = wg_sum(sk);
        float qinv = 1.0 / sqrt(sq + 1e-6), kinv = 1.0 / sqrt(sk + 1e-6);
        for (uint d = tid; d < pc.dk; d += WG) {
            qs[d] = qs[d] * qinv * qscale;
            ks[d] = ks[d] * kinv;
        }
        barrier();
        // Grouped: per key head group its b's then its a's; apart: a plane of every row's b
        // (one per value head), then a plane of the a's.
        uint b_at = pc.ba_off + t * 2u * pc.nv + kh * 2u * r + j, a_at = b_at + r;
        if (pc.apart != 0u) {
            b_at = pc.ba_off + t * pc.nv + h;
            a_at = b_at + pc.n * pc.nv;
        }
        float beta = sigmoid(bav[b_at]);
        float decay = exp(-a_exp * softplus(bav[a_at] + dt));
        float o[COLS];
        float ss = 0.0;
        [[unroll]] for (uint c = 0u; c < COLS; c++) {
            uint e = tid + c * WG;
            o[c] = 0.0;
            if (e >= pc.dv) continue;
            float acc = conv[crow + 2u * key_dim + h * pc.dv + e];
            for (uint d = 0u; d < pc.dk; d++) {
                float s = st[sb + d * pc.dv + e] * decay;
                st[sb + d * pc.dv + e] = s;
                acc -= ks[d] * s;
            }
            float delta = acc * beta;
            float oo = 0.0;
            for (uint d = 0u; d < pc.dk; d++) {
                float s = st[sb + d * pc.dv + e] + ks[d] * delta;
                st[sb + d * pc.dv + e] = s;
                oo += qs[d] * s;
            }
            o[c] = oo;
            ss += oo * oo;
        }
        ss = wg_sum(ss);
        float inv = 1.0 / sqrt(ss / float(pc.dv) + pc.eps);
        // The output gates: in the fused projection's group, or apart (`p` then holds every
        // row's z, one per value head).
        uint zb = pc.apart != 0u ? pc.p_off + t * pc.nv * pc.dv + h * pc.dv
                                 : pc.p_off + t * pw + kh * group + 2u * pc.dk + r * pc.dv + j * pc.dv;
        uint ob = pc.out_off + t * pc.nv * pc.dv + h * pc.dv;
        [[unroll]] for (uint c = 0u; c < COLS; c++) {
            uint e = tid + c * WG;
            if (e >= pc.dv) continue;
            float z = pv[zb + e];
            outv[ob + e] = o[c] * inv * nw[e] * (z * sigmoid(z));
        }
    }
}
