#version 450
// attn_part.comp: a KV split's device part of attention (cpu::attn_part::attend_part over the
// row's device share). Workgroup (head h, row r): the query at p = pos0 + r attends over the
// positions from max(device_from(p), window start) to p, device_from(p) = max(0, floor(p / B)
// * B + B - D), walked in tiles of T from that start (so a row's arithmetic depends on p
// alone, never on the step it is in): a score per invocation, the tile's max and sum by a
// fixed shared-memory tree, an online softmax (m, l, acc rescaled). Writes the unnormalized
// acc, and (m, l); no sink (the host's part holds it). Mirror row of position j: j % ring
// (ring = 0: j), the ring written by rope_kv.comp with the same rule.
// Must not: hold more than MAX_D key or MAX_DV value columns, or read a position outside the
// row's share.
#extension GL_GOOGLE_include_directive : require
#include "kv_type.glsl"
#include "common.glsl"

#define MAX_D 256
#define MAX_DV 256
#define T 128u
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { KV_T kv[]; };
layout(std430, binding = 2) readonly buffer V { KV_T vv[]; };
layout(std430, binding = 3) writeonly buffer ACC { float acc[]; };
layout(std430, binding = 4) writeonly buffer ML { float ml[]; };
layout(std430, binding = 5) readonly buffer PRM { uint params[]; };

layout(push_constant) uniform PC {
    uint n; uint heads; uint kv_heads; uint head_dim;
    uint v_head_dim; uint pos0; uint window; uint dyn;
    float scale; uint q_off; uint ring; uint positions;
    uint block; uint acc_off; uint ml_off; uint pad0;
} pc;

shared float q_s[MAX_D];
shared float p_s[T];
shared float red[T];

uint slot(uint j) { return pc.ring != 0u ? j % pc.ring : j; }

// The tree reduction of red[0..T) (max or sum), the same order on every device.
float reduce(float x, bool is_max) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = x;
    barrier();
    for (uint st = T / 2u; st > 0u; st >>= 1u) {
        if (tid < st) red[tid] = is_max ? max(red[tid], red[tid + st]) : red[tid] + red[tid + st];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    uint p = pos0 + row;
    uint b = max(pc.block, 1u);
    uint top = (p / b) * b + b;
    uint from = top > pc.positions ? top - pc.positions : 0u;
    if (pc.window != 0u && p + 1u > pc.window) from = max(from, p + 1u - pc.window);
    uint kh = h / (pc.heads / pc.kv_heads);
    uint hd = pc.head_dim, vhd = pc.v_head_dim;
    uint kw = pc.kv_heads * hd, vw = pc.kv_heads * vhd;
    for (uint d = tid; d < hd; d += T) q_s[d] = qv[pc.q_off + row * pc.heads * hd + h * hd + d];
    barrier();
    float m = NEG_INF, l = 0.0;
    float o[MAX_DV / T];
    for (uint i = 0u; i < MAX_DV / T; i++) o[i] = 0.0;
    for (uint j0 = from; j0 <= p; j0 += T) {
        uint j = j0 + tid;
        bool ok = j <= p;
        float s = NEG_INF;
        if (ok) {
            uint kb = slot(j) * kw + kh * hd;
            float a = 0.0;
            for (uint d = 0u; d < hd; d++) a += q_s[d] * float(kv[kb + d]);
            s = a * pc.scale;
        }
        float m_new = max(m, reduce(s, true));
        float alpha = m == NEG_INF ? 0.0 : exp(m - m_new);
        float pj = ok ? exp(s - m_new) : 0.0;
        p_s[tid] = pj;
        l = l * alpha + reduce(pj, false);
        m = m_new;
        uint cnt = min(T, p + 1u - j0);
        for (uint i = 0u; i * T + tid < vhd; i++) {
            uint d = i * T + tid;
            float a = 0.0;
            for (uint t = 0u; t < cnt; t++) a += p_s[t] * float(vv[slot(j0 + t) * vw + kh * vhd + d]);
            o[i] = o[i] * alpha + a;
        }
        barrier();
    }
    uint ob = pc.acc_off + (row * pc.heads + h) * vhd;
    for (uint i = 0u; i * T + tid < vhd; i++) acc[ob + i * T + tid] = o[i];
    if (tid == 0u) {
        ml[pc.ml_off + (row * pc.heads + h) * 2u] = m;
        ml[pc.ml_off + (row * pc.heads + h) * 2u + 1u] = l;
    }
}
