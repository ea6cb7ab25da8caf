#version 450
// attn_split.comp: attention with the positions split across workgroups (decode: one query
// row, many positions), the splits joined by the last workgroup of each (row, head) to finish.
// Workgroup (head, row, split) covers `chunk` of the row's positions in tiles of 128: a score
// per invocation (the key row read in 16-byte loads where aligned), the tile's max and sum by
// subgroup then shared memory, an online softmax (running max m, sum l, weighted values o);
// values by column, the tile's positions halved between two groups when a head has at most 64
// columns. Each workgroup writes its partial (m, l, o), then counts itself in counter[row,
// head]; the one that counts last joins every partial (the global max over the splits and the
// head's sink, each split's sum and values rescaled to it, the sink in the denominator only),
// writes the output and sets the counter back to 0 for the next call. The counters must be 0
// before the first call (the op layer zeroes them in the frame).
// Must not: hold more than MAX_DV value columns, or assume every split saw a position (empty
// splits have m = -inf, l = 0).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn.glsl"

#define MAX_D 256
#define MAX_DV 256
#define T 128u
layout(local_size_x = 128) in;
layout(std430, binding = 1) readonly buffer K4 { vec4 kv4[]; };
layout(std430, binding = 4) coherent buffer PML { vec2 part_ml[]; };
layout(std430, binding = 5) coherent buffer PO { float part_o[]; };
layout(std430, binding = 6) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 8) coherent buffer CNT { uint counter[]; };

shared float q_s[MAX_D];
shared float p_s[T];
shared float red_max[T];
shared float red_sum[T];
shared float o_half[64];
shared bool s_last;

float tile_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) red_max[gl_SubgroupID] = v;
    barrier();
    float r = NEG_INF;
    for (uint s = 0u; s < gl_NumSubgroups; s++) r = max(r, red_max[s]);
    return r;
}

float tile_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) red_sum[gl_SubgroupID] = v;
    barrier();
    float r = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) r += red_sum[s];
    return r;
}

void main() {
    attn_setup();
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, sp = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
    if (sp >= g_splits) return;
    uint p = g_pos0 + row, lo = row_lo(p);
    uint j_begin = lo + sp * g_chunk;
    uint j_end = min(j_begin + g_chunk, p + 1u);
    uint kh = kv_head(h);
    uint hd = pc.head_dim, vhd = pc.v_head_dim;
    bool vec = (hd & 3u) == 0u && (pc.k_off & 3u) == 0u && ((pc.kv_heads * hd) & 3u) == 0u;
    for (uint d = tid; d < hd; d += T) q_s[d] = qv[q_at(row, h) + d];
    barrier();
    // Two groups of 64 over the positions when a head's values fit 64 columns.
    bool halves = vhd <= 64u;
    uint g = halves ? tid >> 6 : 0u, c0 = halves ? tid & 63u : tid;
    float m = NEG_INF, l = 0.0;
    float o[MAX_DV / 128];
    for (uint i = 0u; i < MAX_DV / 128; i++) o[i] = 0.0;
    for (uint j0 = j_begin; j0 < j_end; j0 += T) {
        uint j = j0 + tid;
        float s = NEG_INF;
        if (j < j_end) {
            uint kb = k_at(j, kh);
            float acc = 0.0;
            if (vec) {
                uint kb4 = kb >> 2;
                for (uint d4 = 0u; d4 < (hd >> 2); d4 += 4u) {
                    vec4 kk[4];
                    [[unroll]] for (uint i = 0u; i < 4u; i++) kk[i] = d4 + i < (hd >> 2) ? kv4[kb4 + d4 + i] : vec4(0.0);
                    [[unroll]] for (uint i = 0u; i < 4u; i++) {
                        uint d = 4u * (d4 + i);
                        if (d < hd) acc += q_s[d] * kk[i].x + q_s[d + 1u] * kk[i].y + q_s[d + 2u] * kk[i].z + q_s[d + 3u] * kk[i].w;
                    }
                }
            } else {
                for (uint d = 0u; d < hd; d++) acc += q_s[d] * kv[kb + d];
            }
            s = acc * pc.scale;
        }
        float m_new = max(m, tile_max(s));
        float alpha = exp(m - m_new);
        float pj = j < j_end ? exp(s - m_new) : 0.0;
        p_s[tid] = pj;
        l = l * alpha + tile_sum(pj);
        barrier();
        uint cnt = min(T, j_end - j0);
        uint vs = pc.kv_heads * vhd;
        uint vb = v_at(j0, kh);
        if (halves) {
            // Positions g, g + 2, ... of the tile, column c0; four loads in flight.
            if (c0 < vhd) {
                float acc = 0.0;
                uint t = g;
                for (; t + 6u < cnt; t += 8u) {
                    acc += p_s[t] * vv[vb + t * vs + c0] + p_s[t + 2u] * vv[vb + (t + 2u) * vs + c0]
                         + p_s[t + 4u] * vv[vb + (t + 4u) * vs + c0] + p_s[t + 6u] * vv[vb + (t + 6u) * vs + c0];
                }
                for (; t < cnt; t += 2u) acc += p_s[t] * vv[vb + t * vs + c0];
                o[0] = o[0] * alpha + acc;
            }
        } else {
            for (uint i = 0u; i < MAX_DV / 128u; i++) {
                uint d = tid + 128u * i;
                if (d >= vhd) break;
                float acc = 0.0;
                uint t = 0u;
                for (; t + 3u < cnt; t += 4u) {
                    acc += p_s[t] * vv[vb + t * vs + d] + p_s[t + 1u] * vv[vb + (t + 1u) * vs + d]
                         + p_s[t + 2u] * vv[vb + (t + 2u) * vs + d] + p_s[t + 3u] * vv[vb + (t + 3u) * vs + d];
                }
                for (; t < cnt; t++) acc += p_s[t] * vv[vb + t * vs + d];
                o[i] = o[i] * alpha + acc;
            }
        }
        m = m_new;
        barrier();
    }
    // The partial of this split (the two halves of the positions added first).
    uint slot = (row * pc.heads + h) * g_splits + sp;
    if (halves) {
        if (g == 1u && c0 < vhd) o_half[c0] = o[0];
        barrier();
        if (g == 0u && c0 < vhd) part_o[slot * vhd + c0] = o[0] + o_half[c0];
    } else {
        for (uint i = 0u; i < MAX_DV / 128u && tid + 128u * i < vhd; i++) part_o[slot * vhd + tid + 128u * i] = o[i];
    }
    if (tid == 0u) part_ml[slot] = vec2(m, l);
    // The last split of (row, head) to finish joins them all.
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) s_last = atomicAdd(counter[row * pc.heads + h], 1u) == g_splits - 1u;
    barrier();
    if (!s_last) return;
    memoryBarrierBuffer();
    uint base = (row * pc.heads + h) * g_splits;
    float mx = NEG_INF;
    for (uint s2 = 0u; s2 < g_splits; s2++) mx = max(mx, part_ml[base + s2].x);
    float sink = pc.has_sinks != 0u ? sinks[h] : NEG_INF;
    mx = max(mx, sink);
    float lt = 0.0;
    for (uint s2 = 0u; s2 < g_splits; s2++) {
        vec2 ml = part_ml[base + s2];
        if (ml.y > 0.0) lt += ml.y * exp(ml.x - mx);
    }
    if (pc.has_sinks != 0u) lt += exp(sink - mx);
    float inv = 1.0 / lt;
    for (uint d = tid; d < vhd; d += T) {
        float acc = 0.0;
        for (uint s2 = 0u; s2 < g_splits; s2++) {
            vec2 ml = part_ml[base + s2];
            if (ml.y > 0.0) acc += part_o[(base + s2) * vhd + d] * exp(ml.x - mx);
        }
        outv[pc.o_off + row * pc.heads * vhd + h * vhd + d] = acc * inv;
    }
    if (tid == 0u) counter[row * pc.heads + h] = 0u;
}
