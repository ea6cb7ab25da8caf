// attn_split.glsl: the body of attn_split.comp and attn_seqs.comp. Attention with the positions
// split across workgroups (decode: one query row, many positions), the splits joined by the
// last workgroup of each (row, head) to finish.
// Workgroup (head, row, split) covers `chunk` of the row's positions in tiles of 128: a score
// per invocation (the key row read in 16-byte loads where aligned), the tile's max and sum by
// subgroup then shared memory, an online softmax (running max m, sum l, weighted values o);
// values by column, the tile's positions halved between two groups when a head has at most 64
// columns. Each workgroup writes its partial (m, l, o), then counts itself in counter[row,
// head]; the one that counts last joins every partial (the global max over the splits and the
// head's sink, each split's sum and values rescaled to it, the sink in the denominator only),
// writes the output (times the value scale) and sets the counter back to 0 for the next call.
// Relative logits (flags bit 3) as in attn.glsl. The counters must be 0
// before the first call (the op layer zeroes them in the frame).
// With flags bit 1 (one row, the op layer's `attention_decode`), the kernel also does what
// rope_kv.comp would before it: q (as read) and the block's k row are rotated (rope.comp's
// arithmetic; cst: half, interleaved, mscale, then the k and v value offsets), the split that
// holds position p takes that position from the rotated k row and the v row instead of the
// mirror, and that split of each kv head's first q head writes them into mirror row p and the
// read-back rows. No other workgroup reads mirror row p, so nothing waits for those writes.
// With cst[5] != 0 (one row), q and k are first normalized (a layer's q and k RMSNorms,
// absorbed): over groups of cst[6] (q) / cst[7] (k) columns, the whole projected row or one
// head, x / sqrt(mean(x^2) + eps) * (w + offset) (eps, offset: cst[8], cst[9] as bits).
// With cst[10] != 0 (one row, v_head_dim a multiple of 32), the joining workgroup also writes
// its head's output as 8-bit activations for the product after it (quantize_rows.comp's
// arithmetic, bit for bit: blocks of 32 of the row heads * v_head_dim wide).
// The mirror and the read-back rows are KV_T (kv_type.glsl): f32, or 16-bit floats with KV_F16,
// where the position's own k and v rows are rounded to them before use.
// With SEQS (attn_seqs.comp, a batched decode step's one-row sequences in one dispatch):
// workgroup row y is sequence y, each with its own mirror, read-back rows and position, reached
// through buffer device addresses in a table of SEQ_WORDS words a sequence from cst[SEQ_BASE]
// (ops/attention.rs `seq_table`): its q, output, k and v element offsets, its position (fixed,
// or read from an address), and the addresses of its mirror's keys and values and of its k and
// v read-back rows. pc.splits is the most splits (the partials' stride); each sequence's own
// count follows from its position as attn_setup's does. The arithmetic is the one-row kernel's.
// Must not: hold more than MAX_DV value columns, or assume every split saw a position (empty
// splits have m = -inf, l = 0).
#include "kv_type.glsl"
#include "common.glsl"
#include "attn.glsl"

#ifdef SEQS
#define SEQ_BASE 16u
#define SEQ_WORDS 16u
layout(buffer_reference, std430, buffer_reference_align = 16) buffer KvVecs { KV_T4 e[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer KvElems { KV_T e[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint e[]; };
#endif

#define MAX_D 256
#define MAX_DV 256
#define T 128u
layout(local_size_x = 128) in;
layout(std430, binding = 1) readonly buffer K4 { KV_T4 kv4[]; };
layout(std430, binding = 4) coherent buffer PML { vec2 part_ml[]; };
layout(std430, binding = 5) coherent buffer PO { float part_o[]; };
layout(std430, binding = 6) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 8) coherent buffer CNT { uint counter[]; };
layout(std430, binding = 1) buffer MKW { KV_T mkw[]; };
layout(std430, binding = 2) buffer MVW { KV_T mvw[]; };
layout(std430, binding = 9) readonly buffer KVAL { float kval[]; };
layout(std430, binding = 10) readonly buffer VVAL { float vval[]; };
layout(std430, binding = 11) readonly buffer FRQ { float frq[]; };
layout(std430, binding = 12) writeonly buffer SKB { KV_T skb[]; };
layout(std430, binding = 13) writeonly buffer SVB { KV_T svb[]; };
layout(std430, binding = 14) readonly buffer CST { uint cst[]; };
layout(std430, binding = 15) readonly buffer QNW { float qnw[]; };
layout(std430, binding = 16) readonly buffer KNW { float knw[]; };
layout(std430, binding = 17) writeonly buffer OXQ { uvec4 oxq[]; };
layout(std430, binding = 18) writeonly buffer OXD { vec2 oxd[]; };

#ifdef SEQS
// The sequence's buffers (seq_setup) and the element offsets of its rows.
KvVecs g_k4;
KvElems g_k, g_v, g_sk, g_sv;
uint g_q_off, g_o_off, g_k_row, g_v_row;

// Sequence s's entry of the table (words: q, output, k and v offsets; fixed position; whether
// it is read from the address in words 14-15; keys, values, k and v read-back addresses), and
// its split count and chunk as attn_setup makes them for a position read on the device.
void seq_setup(uint s) {
    uint b = SEQ_BASE + s * SEQ_WORDS;
    g_q_off = cst[b];
    g_o_off = cst[b + 1u];
    g_k_row = cst[b + 2u];
    g_v_row = cst[b + 3u];
    g_pos0 = cst[b + 5u] != 0u ? Words(uvec2(cst[b + 14u], cst[b + 15u])).e[0] : cst[b + 4u];
    uvec2 ka = uvec2(cst[b + 6u], cst[b + 7u]);
    g_k4 = KvVecs(ka);
    g_k = KvElems(ka);
    g_v = KvElems(uvec2(cst[b + 8u], cst[b + 9u]));
    g_sk = KvElems(uvec2(cst[b + 10u], cst[b + 11u]));
    g_sv = KvElems(uvec2(cst[b + 12u], cst[b + 13u]));
    uint len = g_pos0 + 1u;
    uint span = pc.window != 0u ? min(pc.window, len) : len;
    g_splits = clamp((span + MIN_CHUNK - 1u) / MIN_CHUNK, 1u, max(pc.splits, 1u));
    g_chunk = (span + g_splits - 1u) / g_splits;
}
#define KV4 g_k4.e
#define KV g_k.e
#define VV g_v.e
#define MKW g_k.e
#define MVW g_v.e
#define SKB g_sk.e
#define SVB g_sv.e
#define K_ROW_OFF g_k_row
#define V_ROW_OFF g_v_row
#define Q_AT(h_) (g_q_off + (h_) * pc.head_dim)
#define O_AT(h_) (g_o_off + (h_) * pc.v_head_dim)
#else
#define KV4 kv4
#define KV kv
#define VV vv
#define MKW mkw
#define MVW mvw
#define SKB skb
#define SVB svb
#define K_ROW_OFF cst[3]
#define V_ROW_OFF cst[4]
#define Q_AT(h_) q_at(row, h_)
#define O_AT(h_) (pc.o_off + row * pc.heads * pc.v_head_dim + (h_) * pc.v_head_dim)
#endif

shared float q_s[MAX_D];
shared float p_s[T];
shared float red_max[T];
shared float red_sum[T];
shared float o_half[64];
shared float k_row[MAX_D];
shared float v_row[MAX_DV];

// Rotates the pairs of `arr`[0..hd) at position p (rope.comp's arithmetic); invocation i <
// half. Made for the query (q_s) and for the block's key row (k_row).
#define ROTATE_SHARED(name, arr)                                                \
    void name(uint p, uint half_, bool inter, float msc) {                      \
        for (uint i = gl_LocalInvocationID.x; i < half_; i += T) {              \
            uint a = inter ? 2u * i : i, b = inter ? a + 1u : a + half_;        \
            float s, c;                                                         \
            sincos_rr(float(p) * frq[i], s, c);                                 \
            c *= msc;                                                           \
            s *= msc;                                                           \
            float x0 = arr[a], x1 = arr[b];                                     \
            arr[a] = x0 * c - x1 * s;                                           \
            arr[b] = x1 * c + x0 * s;                                           \
        }                                                                       \
    }
ROTATE_SHARED(rotate_shared_q, q_s)
ROTATE_SHARED(rotate_shared_k, k_row)

shared bool s_last;
shared float n_red[T];

// The sum of v over the workgroup (every invocation calls it; returns the total to all).
float wg_sum(float v) {
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) n_red[gl_SubgroupID] = v;
    barrier();
    float r = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) r += n_red[s];
    return r;
}

// 1 / rms of a group of `group` columns whose head `hh` (of head_dim `hd`) is in `sh` (shared,
// already loaded) or, for a group wider than a head, of the row at `src` in `buf`.
// (A wider group's loads issue eight at a time: a 2048-wide row is two waits for memory, not
// sixteen.)
#define GROUP_INV(sh, buf, src, hh, hd, group, eps, out_inv) {                              \
        float ss_ = 0.0;                                                                    \
        if ((group) == (hd)) {                                                              \
            for (uint d = gl_LocalInvocationID.x; d < (hd); d += T) ss_ += sh[d] * sh[d];   \
        } else {                                                                            \
            for (uint d0 = gl_LocalInvocationID.x; d0 < (group); d0 += 8u * T) {            \
                float x_[8];                                                                \
                [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++) {                              \
                    uint d = d0 + i_ * T;                                                   \
                    x_[i_] = d < (group) ? buf[(src) + d] : 0.0;                            \
                }                                                                           \
                [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++) ss_ += x_[i_] * x_[i_];        \
            }                                                                               \
        }                                                                                   \
        out_inv = 1.0 / sqrt(wg_sum(ss_) / float(group) + (eps));                           \
    }

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
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, sp = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
#ifdef SEQS
    // Row y is sequence y, at its own position; the partials of every sequence are pc.splits
    // apart.
    seq_setup(row);
    uint p = g_pos0, stride = pc.splits;
#else
    attn_setup();
    uint p = g_pos0 + row, stride = g_splits;
#endif
    if (sp >= g_splits) return;
    uint lo = row_lo(p);
    uint j_begin = lo + sp * g_chunk;
    uint j_end = min(j_begin + g_chunk, p + 1u);
    uint kh = kv_head(h);
    uint hd = pc.head_dim, vhd = pc.v_head_dim;
    bool vec = (hd & 3u) == 0u && (pc.k_off & 3u) == 0u && ((pc.kv_heads * hd) & 3u) == 0u;
    for (uint d = tid; d < hd; d += T) q_s[d] = qv[Q_AT(h) + d];
    bool rope = (pc.flags & 2u) != 0u;
    bool qk_norm = rope && cst[5] != 0u;
    float n_eps = 0.0, n_off = 0.0;
    if (qk_norm) {
        n_eps = uintBitsToFloat(cst[8]);
        n_off = uintBitsToFloat(cst[9]);
        uint qg = cst[6];
        barrier();
        float inv;
        GROUP_INV(q_s, qv, Q_AT(0u), h, hd, qg, n_eps, inv)
        for (uint d = tid; d < hd; d += T) q_s[d] = q_s[d] * inv * (qnw[(h * hd + d) % qg] + n_off);
    }
    uint half_ = 0u;
    bool inter = false;
    float msc = 1.0;
    if (rope) {
        half_ = cst[0];
        inter = cst[1] != 0u;
        msc = uintBitsToFloat(cst[2]);
        barrier();
        rotate_shared_q(p, half_, inter, msc);
    }
    // The split holding position p takes it from the block's own k and v rows.
    bool own = rope && j_begin <= p && p < j_end;
    if (own) {
        for (uint d = tid; d < hd; d += T) k_row[d] = kval[K_ROW_OFF + kh * hd + d];
        for (uint d = tid; d < vhd; d += T) v_row[d] = vval[V_ROW_OFF + kh * vhd + d];
        barrier();
        if (qk_norm) {
            uint kg = cst[7];
            float inv;
            GROUP_INV(k_row, kval, K_ROW_OFF, kh, hd, kg, n_eps, inv)
            barrier();
            for (uint d = tid; d < hd; d += T) k_row[d] = k_row[d] * inv * (knw[(kh * hd + d) % kg] + n_off);
            barrier();
        }
        rotate_shared_k(p, half_, inter, msc);
        barrier();
#ifdef KV_F16
        // The position's own key and value as the mirror keeps them (what later steps read);
        // each lane rounds the columns it writes below, the barrier after those covers the rest.
        for (uint d = tid; d < hd; d += T) k_row[d] = kv_round(k_row[d]);
        for (uint d = tid; d < vhd; d += T) v_row[d] = kv_round(v_row[d]);
#endif
        if (h % (pc.heads / pc.kv_heads) == 0u) {
            for (uint d = tid; d < hd; d += T) {
                MKW[pc.k_off + slot(p) * pc.kv_heads * hd + kh * hd + d] = KV_T(k_row[d]);
                SKB[kh * hd + d] = KV_T(k_row[d]);
            }
            for (uint d = tid; d < vhd; d += T) {
                MVW[pc.v_off + slot(p) * pc.kv_heads * vhd + kh * vhd + d] = KV_T(v_row[d]);
                SVB[kh * vhd + d] = KV_T(v_row[d]);
            }
        }
    }
    uint j_stop = own ? p : j_end;
    barrier();
    // Two groups of 64 over the positions when a head's values fit 64 columns.
    bool halves = vhd <= 64u;
    uint g = halves ? tid >> 6 : 0u, c0 = halves ? tid & 63u : tid;
    float m = NEG_INF, l = 0.0;
    float o[MAX_DV / 128];
    for (uint i = 0u; i < MAX_DV / 128; i++) o[i] = 0.0;
    // A tile's positions lie in consecutive mirror rows: in a ring it ends at the ring's end.
    for (uint j0 = j_begin, tl = run_from(j_begin, T); j0 < j_stop; j0 += tl, tl = run_from(j0, T)) {
        uint j = j0 + tid, t_stop = min(j_stop, j0 + tl);
        float s = NEG_INF;
        if (j < t_stop) {
            uint kb = k_at(j, kh);
            float acc = 0.0;
            if (vec) {
                uint kb4 = kb >> 2;
                // Sixteen 16-byte loads in flight (a 128-wide key in two waits).
                for (uint d4 = 0u; d4 < (hd >> 2); d4 += 16u) {
                    vec4 kk[16];
                    [[unroll]] for (uint i = 0u; i < 16u; i++) kk[i] = d4 + i < (hd >> 2) ? vec4(KV4[kb4 + d4 + i]) : vec4(0.0);
                    [[unroll]] for (uint i = 0u; i < 16u; i++) {
                        uint d = 4u * (d4 + i);
                        if (d < hd) acc += q_s[d] * kk[i].x + q_s[d + 1u] * kk[i].y + q_s[d + 2u] * kk[i].z + q_s[d + 3u] * kk[i].w;
                    }
                }
            } else {
                for (uint d = 0u; d < hd; d++) acc += q_s[d] * float(KV[kb + d]);
            }
            s = acc * pc.scale;
            s += rel_bias(row, h, p - j);
        }
        float m_new = max(m, tile_max(s));
        float alpha = exp(m - m_new);
        float pj = j < t_stop ? exp(s - m_new) : 0.0;
        p_s[tid] = pj;
        l = l * alpha + tile_sum(pj);
        barrier();
        uint cnt = t_stop - j0;
        uint vs = pc.kv_heads * vhd;
        uint vb = v_at(j0, kh);
        if (halves) {
            // Positions g, g + 2, ... of the tile, column c0; eight loads in flight, then four.
            if (c0 < vhd) {
                float acc = 0.0;
                uint t = g;
                for (; t + 14u < cnt; t += 16u) {
                    float vx[8];
                    [[unroll]] for (uint i = 0u; i < 8u; i++) vx[i] = float(VV[vb + (t + 2u * i) * vs + c0]);
                    float a = 0.0;
                    [[unroll]] for (uint i = 0u; i < 8u; i++) a += p_s[t + 2u * i] * vx[i];
                    acc += a;
                }
                for (; t + 6u < cnt; t += 8u) {
                    acc += p_s[t] * float(VV[vb + t * vs + c0]) + p_s[t + 2u] * float(VV[vb + (t + 2u) * vs + c0])
                         + p_s[t + 4u] * float(VV[vb + (t + 4u) * vs + c0]) + p_s[t + 6u] * float(VV[vb + (t + 6u) * vs + c0]);
                }
                for (; t < cnt; t += 2u) acc += p_s[t] * float(VV[vb + t * vs + c0]);
                o[0] = o[0] * alpha + acc;
            }
        } else {
            for (uint i = 0u; i < MAX_DV / 128u; i++) {
                uint d = tid + 128u * i;
                if (d >= vhd) break;
                float acc = 0.0;
                uint t = 0u;
                // Sixteen positions' loads in flight.
                for (; t + 15u < cnt; t += 16u) {
                    float vx[16];
                    [[unroll]] for (uint i = 0u; i < 16u; i++) vx[i] = float(VV[vb + (t + i) * vs + d]);
                    float a = 0.0, b = 0.0;
                    [[unroll]] for (uint i = 0u; i < 8u; i++) {
                        a += p_s[t + i] * vx[i];
                        b += p_s[t + 8u + i] * vx[8u + i];
                    }
                    acc += a + b;
                }
                for (; t + 7u < cnt; t += 8u) {
                    float a = p_s[t] * float(VV[vb + t * vs + d]) + p_s[t + 1u] * float(VV[vb + (t + 1u) * vs + d])
                            + p_s[t + 2u] * float(VV[vb + (t + 2u) * vs + d]) + p_s[t + 3u] * float(VV[vb + (t + 3u) * vs + d]);
                    float b = p_s[t + 4u] * float(VV[vb + (t + 4u) * vs + d]) + p_s[t + 5u] * float(VV[vb + (t + 5u) * vs + d])
                            + p_s[t + 6u] * float(VV[vb + (t + 6u) * vs + d]) + p_s[t + 7u] * float(VV[vb + (t + 7u) * vs + d]);
                    acc += a + b;
                }
                for (; t + 3u < cnt; t += 4u) {
                    acc += p_s[t] * float(VV[vb + t * vs + d]) + p_s[t + 1u] * float(VV[vb + (t + 1u) * vs + d])
                         + p_s[t + 2u] * float(VV[vb + (t + 2u) * vs + d]) + p_s[t + 3u] * float(VV[vb + (t + 3u) * vs + d]);
                }
                for (; t < cnt; t++) acc += p_s[t] * float(VV[vb + t * vs + d]);
                o[i] = o[i] * alpha + acc;
            }
        }
        m = m_new;
        barrier();
    }
    if (own) {
        // Position p, from the block's rows.
        // Its score: the lanes' parts, joined as tile_sum does.
        float part_ = 0.0;
        for (uint d = tid; d < hd; d += T) part_ += q_s[d] * k_row[d];
        float sp_ = tile_sum(part_) * pc.scale;
        sp_ += rel_bias(row, h, 0u);
        float m_new = max(m, sp_);
        float alpha = exp(m - m_new);
        float pp = exp(sp_ - m_new);
        l = l * alpha + pp;
        if (halves) {
            if (c0 < vhd) o[0] = o[0] * alpha + (g == 0u ? pp * v_row[c0] : 0.0);
        } else {
            for (uint i = 0u; i < MAX_DV / 128u; i++) {
                uint d = tid + 128u * i;
                if (d < vhd) o[i] = o[i] * alpha + pp * v_row[d];
            }
        }
        m = m_new;
    }
    // The partial of this split (the two halves of the positions added first).
    uint slot = (row * pc.heads + h) * stride + sp;
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
    uint base = (row * pc.heads + h) * stride;
    // The splits' (m, l) read once into shared memory, each split's factor computed once.
    if (tid < g_splits) {
        vec2 ml = part_ml[base + tid];
        red_max[tid] = ml.x;
        red_sum[tid] = ml.y;
    }
    barrier();
    float mx = NEG_INF;
    for (uint s2 = 0u; s2 < g_splits; s2++) mx = max(mx, red_max[s2]);
    float sink = has_sink() ? sinks[h] : NEG_INF;
    mx = max(mx, sink);
    float lt = 0.0;
    for (uint s2 = 0u; s2 < g_splits; s2++) {
        if (red_sum[s2] > 0.0) lt += red_sum[s2] * exp(red_max[s2] - mx);
    }
    if (has_sink()) lt += exp(sink - mx);
    if (tid < g_splits) p_s[tid] = exp(red_max[tid] - mx);
    barrier();
    float inv = pc.value_scale / lt;
    bool q8 = rope && cst[10] != 0u;
    for (uint d = tid; d < vhd; d += T) {
        float acc = 0.0;
        // Eight splits' partials in flight (an empty split's as 0: its factor is 0 too).
        for (uint s0 = 0u; s0 < g_splits; s0 += 8u) {
            float pv[8];
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                uint s2 = s0 + i;
                pv[i] = s2 < g_splits && red_sum[s2] > 0.0 ? part_o[(base + s2) * vhd + d] : 0.0;
            }
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                if (s0 + i < g_splits) acc += pv[i] * p_s[s0 + i];
            }
        }
        float o = acc * inv;
        outv[O_AT(h) + d] = o;
        if (q8) v_row[d] = o;
    }
    if (tid == 0u) counter[row * pc.heads + h] = 0u;
    if (q8) {
        // A block of 32 per invocation: d = amax / 127, q = round_half_even(x * (1 / d)).
        barrier();
        uint b = tid;
        if (b < vhd / 32u) {
            float v[32];
            for (uint i = 0u; i < 32u; i++) v[i] = v_row[32u * b + i];
            uint blk = (row * pc.heads * vhd + h * vhd) / 32u + b;
            uvec4 lo, hi;
            oxd[blk] = q8_block(v, lo, hi);
            oxq[2u * blk] = lo;
            oxq[2u * blk + 1u] = hi;
        }
    }
}
