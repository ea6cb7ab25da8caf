#version 450
// attn_split.comp: attention with the positions split across workgroups (decode: one query
// row, many positions). Workgroup (head, row, split) covers `chunk` of the row's positions,
// keeping an online softmax (running max m, sum l, weighted values o), and writes its partial
// (m, l, o) for attn_join.comp to combine. Tiles of 64 positions: a score per invocation,
// then the value sum with one invocation per output column.
// Must not: write the output itself, or hold more than MAX_DV value columns.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn.glsl"

#define MAX_D 256
#define MAX_DV 256
layout(local_size_x = 64) in;
layout(std430, binding = 4) writeonly buffer PML { vec2 part_ml[]; };
layout(std430, binding = 5) writeonly buffer PO { float part_o[]; };

shared float q_s[MAX_D];
shared float p_s[64];
shared float red[64];

void main() {
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, sp = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
    attn_setup();
    if (sp >= g_splits) return;
    uint p = g_pos0 + row, lo = row_lo(p);
    uint j_begin = lo + sp * g_chunk;
    uint j_end = min(j_begin + g_chunk, p + 1u);
    uint kh = kv_head(h);
    for (uint d = tid; d < pc.head_dim; d += 64u) q_s[d] = qv[q_at(row, h) + d];
    barrier();
    float m = NEG_INF, l = 0.0;
    float o[MAX_DV / 64];
    for (uint i = 0u; i < MAX_DV / 64; i++) o[i] = 0.0;
    for (uint j0 = j_begin; j0 < j_end; j0 += 64u) {
        uint j = j0 + tid;
        float s = NEG_INF;
        if (j < j_end) {
            s = 0.0;
            uint kb = k_at(j, kh);
            for (uint d = 0u; d < pc.head_dim; d++) s += q_s[d] * kv[kb + d];
            s *= pc.scale;
        }
        red[tid] = s;
        barrier();
        float tmax = NEG_INF;
        for (uint t = 0u; t < 64u; t++) tmax = max(tmax, red[t]);
        float m_new = max(m, tmax);
        float alpha = exp(m - m_new);
        p_s[tid] = j < j_end ? exp(s - m_new) : 0.0;
        barrier();
        float psum = 0.0;
        for (uint t = 0u; t < 64u; t++) psum += p_s[t];
        l = l * alpha + psum;
        uint cnt = min(64u, j_end - j0);
        for (uint i = 0u; i * 64u + tid < pc.v_head_dim; i++) {
            uint d = i * 64u + tid;
            float acc = 0.0;
            for (uint t = 0u; t < cnt; t++) acc += p_s[t] * vv[v_at(j0 + t, kh) + d];
            o[i] = o[i] * alpha + acc;
        }
        m = m_new;
        barrier();
    }
    uint slot = (row * pc.heads + h) * g_splits + sp;
    if (tid == 0u) part_ml[slot] = vec2(m, l);
    for (uint i = 0u; i * 64u + tid < pc.v_head_dim; i++) part_o[slot * pc.v_head_dim + i * 64u + tid] = o[i];
}
