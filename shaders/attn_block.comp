#version 450
// attn_block.comp: attention for a prompt chunk, flash style: a workgroup owns BQ query rows
// of one head and walks the keys in tiles of BK, staging each key tile and then each value
// tile in shared memory, with an online softmax per row (running max, sum, rescaled values).
// Causality, the sliding window, the sink (denominator only), the value scale and the relative
// logits as in attn.glsl.
// Must not: hold more than MAX_D key or value columns, or materialize the score matrix.
#extension GL_GOOGLE_include_directive : require
#include "kv_type.glsl"
#include "common.glsl"
#include "attn.glsl"

#define BQ 16
#define BK 16
#define MAX_D 256
layout(local_size_x = 256) in;
layout(std430, binding = 6) writeonly buffer OUT { float outv[]; };

shared float tile[BK][MAX_D];
shared float s_s[BQ][BK + 1];
shared float alpha_s[BQ];

void main() {
    uint h = gl_WorkGroupID.x, q0 = gl_WorkGroupID.y * BQ, tid = gl_LocalInvocationID.x;
    attn_setup();
    uint qi = tid / BK, kj = tid % BK;
    uint kh = kv_head(h);
    uint last = min(q0 + BQ, pc.n) - 1u;
    uint j_lo = row_lo(g_pos0 + q0), j_hi = g_pos0 + last;
    bool row_ok = q0 + qi < pc.n;
    uint p = g_pos0 + q0 + qi, lo = row_lo(p);
    float m = NEG_INF, l = 0.0;
    float o[MAX_D / BK];
    for (uint i = 0u; i < MAX_D / BK; i++) o[i] = 0.0;
    for (uint j0 = j_lo; j0 <= j_hi; j0 += BK) {
        // keys
        for (uint e = tid; e < BK * pc.head_dim; e += 256u) {
            uint t = e / pc.head_dim, d = e % pc.head_dim;
            tile[t][d] = j0 + t <= j_hi ? float(kv[k_at(j0 + t, kh) + d]) : 0.0;
        }
        barrier();
        uint j = j0 + kj;
        float s = NEG_INF;
        if (row_ok && j <= p && j >= lo) {
            s = 0.0;
            uint qb = q_at(q0 + qi, h);
            for (uint d = 0u; d < pc.head_dim; d++) s += qv[qb + d] * tile[kj][d];
            s *= pc.scale;
            s += rel_bias(q0 + qi, h, p - j);
        }
        s_s[qi][kj] = s;
        barrier();
        // online softmax, one invocation per row
        if (kj == 0u) {
            float tmax = NEG_INF;
            for (uint t = 0u; t < BK; t++) tmax = max(tmax, s_s[qi][t]);
            float m_new = max(m, tmax);
            float alpha = m_new == NEG_INF ? 1.0 : exp(m - m_new);
            float psum = 0.0;
            for (uint t = 0u; t < BK; t++) {
                float pv = s_s[qi][t] == NEG_INF ? 0.0 : exp(s_s[qi][t] - m_new);
                s_s[qi][t] = pv;
                psum += pv;
            }
            l = l * alpha + psum;
            m = m_new;
            alpha_s[qi] = alpha;
        }
        barrier();
        // values
        for (uint e = tid; e < BK * pc.v_head_dim; e += 256u) {
            uint t = e / pc.v_head_dim, d = e % pc.v_head_dim;
            tile[t][d] = j0 + t <= j_hi ? float(vv[v_at(j0 + t, kh) + d]) : 0.0;
        }
        barrier();
        float alpha = alpha_s[qi];
        for (uint i = 0u; i * BK + kj < pc.v_head_dim; i++) {
            uint d = i * BK + kj;
            float acc = 0.0;
            for (uint t = 0u; t < BK; t++) acc += s_s[qi][t] * tile[t][d];
            o[i] = o[i] * alpha + acc;
        }
        barrier();
    }
    // m and l live in the row's kj == 0 invocation; share them for the final scaling.
    if (kj == 0u) { s_s[qi][0] = m; s_s[qi][1] = l; }
    barrier();
    if (!row_ok) return;
    m = s_s[qi][0];
    l = s_s[qi][1];
    float sink = has_sink() ? sinks[h] : NEG_INF;
    float mf = max(m, sink);
    float lf = l * exp(m - mf) + (has_sink() ? exp(sink - mf) : 0.0);
    float f = exp(m - mf) / lf * pc.value_scale;
    uint ob = pc.o_off + (q0 + qi) * pc.heads * pc.v_head_dim + h * pc.v_head_dim;
    for (uint i = 0u; i * BK + kj < pc.v_head_dim; i++) outv[ob + i * BK + kj] = o[i] * f;
}
