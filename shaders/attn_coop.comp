#version 450
// attn_coop.comp: attention for a prompt chunk on f16 cooperative matrices (16 x 16 x 16, f32
// sums), flash style, the same arithmetic as attn_block.comp with the products on tensor cores.
// A workgroup (four subgroups) owns BQ = 64 query rows of one head, each subgroup 16 of them;
// it walks the keys in tiles of BK = 64 positions:
//   1. the key tile is staged as f16 in shared memory; each subgroup multiplies its rows'
//      queries (f16, held in registers for the whole walk) by it: 16 x 64 scores in f32;
//   2. each subgroup masks its rows' scores (causality, the window), scales them and runs the
//      online softmax per row (running max and sum in f32, in the row's lanes), writing the
//      probabilities as f16; then the value tile is staged where the key tile was;
//   3. each subgroup rescales its output sums by the rows' factors (a stride-0 load broadcasts
//      them along the rows) and adds probabilities x values.
// At the end the sums are scaled by 1 / the row's sum (the sink in the denominator, the value
// scale) and written in f32. Queries, keys, values and probabilities are rounded to f16 (the
// host dispatches this kernel under `CoopMatUse::Auto` only; its tests state the tolerance).
// Must not: run where the device lacks the f16 shape, on head dims above 128 or not multiples of
// 16, or be entered from non-uniform control flow (barriers).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "kv_type.glsl"
#include "common.glsl"
// No relative logits here (the op layer refuses them for this kernel).
#define ATTN_NO_REL
#include "attn.glsl"

layout(local_size_x_id = 0) in;
layout(std430, binding = 6) writeonly buffer OUT { float outv[]; };

#define BQ 64u
#define BK 64u
#define MAXD 128u
#define ND (MAXD / 16u)
// Padded row strides (16-byte multiples): f16 tiles, the f32 score tile, the f16 probabilities.
#define SD (MAXD + 8u)
#define SS (BK + 4u)
#define SP (BK + 8u)

#define MA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The query rows at the start, then each key tile and each value tile.
shared float16_t qk_t[BQ * SD];
// The scores of the tile; at the end the output rows.
shared float s_t[BQ * SS];
shared float16_t p_t[BQ * SP];
// Per row: this tile's factor for the sums (then the final scale).
shared float f_t[BQ];

// The mirror again, four elements a load, for staging where the offsets allow it: f32 as
// vec4; f16 as two 32-bit words (NVIDIA's 16-bit storage loads ran the f16 kernel at half the
// f32 kernel's speed at depth; words load as the f32 mirror's do).
#ifdef KV_F16
#define KV_W uvec2
layout(std430, binding = 1) readonly buffer K4 { uvec2 kv4[]; };
layout(std430, binding = 2) readonly buffer V4 { uvec2 vv4[]; };
f16vec4 half4(uvec2 w) { return f16vec4(unpackFloat2x16(w.x), unpackFloat2x16(w.y)); }
#else
#define KV_W vec4
layout(std430, binding = 1) readonly buffer K4 { vec4 kv4[]; };
layout(std430, binding = 2) readonly buffer V4 { vec4 vv4[]; };
f16vec4 half4(vec4 w) { return f16vec4(w); }
#endif

// Loads a thread has in flight at once when staging (independent loads issued before the
// first store: one at a time, each tile waited on the memory's latency 64 times a thread).
#define LOADS 16u
// The same for the four-element loads (a tile is BK * MAXD / 4 of them).
#define LOADS4 8u

// Rows first..last of the keys (or values) at base + row * stride, `width` columns, as f16
// rows of qk_t (zeros past them). Four elements a load when base is a multiple of four (the
// stride and the width are multiples of 16); one at a time otherwise.
void stage_rows(uint tid, uint nt, uint width, uint base, uint stride, uint first, uint last, bool keys) {
    if ((base & 3u) == 0u) {
        const uint Q = MAXD / 4u;
        for (uint e0 = tid; e0 < BK * Q; e0 += nt * LOADS4) {
            KV_W x[LOADS4];
            [[unroll]] for (uint i = 0u; i < LOADS4; i++) {
                uint e = e0 + i * nt, t = e / Q, d = (e % Q) * 4u;
                bool in_ = e < BK * Q && d < width && first + t <= last;
                uint at = (base + slot(first + t) * stride + d) / 4u;
                x[i] = in_ ? (keys ? kv4[at] : vv4[at]) : KV_W(0);
            }
            [[unroll]] for (uint i = 0u; i < LOADS4; i++) {
                uint e = e0 + i * nt;
                if (e < BK * Q) {
                    uint at = (e / Q) * SD + (e % Q) * 4u;
                    f16vec4 y = half4(x[i]);
                    qk_t[at] = y.x;
                    qk_t[at + 1u] = y.y;
                    qk_t[at + 2u] = y.z;
                    qk_t[at + 3u] = y.w;
                }
            }
        }
        return;
    }
    for (uint e0 = tid; e0 < BK * MAXD; e0 += nt * LOADS) {
        float x[LOADS];
        [[unroll]] for (uint i = 0u; i < LOADS; i++) {
            uint e = e0 + i * nt, t = e / MAXD, d = e % MAXD;
            bool in_ = e < BK * MAXD && d < width && first + t <= last;
            uint at = base + slot(first + t) * stride + d;
            x[i] = in_ ? float(keys ? kv[at] : vv[at]) : 0.0;
        }
        [[unroll]] for (uint i = 0u; i < LOADS; i++) {
            uint e = e0 + i * nt;
            if (e < BK * MAXD) qk_t[(e / MAXD) * SD + e % MAXD] = float16_t(x[i]);
        }
    }
}

void main() {
    uint h = gl_WorkGroupID.x, q0 = gl_WorkGroupID.y * BQ;
    uint tid = gl_LocalInvocationID.x, nt = gl_WorkGroupSize.x;
    uint sr = gl_SubgroupID * 16u;
    attn_setup();
    uint kh = kv_head(h);
    uint nd = pc.head_dim / 16u, nv = pc.v_head_dim / 16u;
    uint last = min(q0 + BQ, pc.n) - 1u;
    uint j_lo = row_lo(g_pos0 + q0), j_hi = g_pos0 + last;
    // The softmax runs in each subgroup over its own 16 rows: lpr lanes a row (consecutive
    // lanes), each over kpt keys of the tile; a row's running max and sum live in its lanes.
    uint lane = gl_SubgroupInvocationID, lpr = gl_SubgroupSize / 16u;
    uint rr = lane / lpr, part = lane % lpr, kpt = BK / lpr;
    uint r = sr + rr;
    bool row_ok = q0 + r < pc.n;
    uint p = g_pos0 + q0 + r, lo = row_lo(p);
    float m_run = NEG_INF, l_run = 0.0;
    // The queries: staged as f16, then held as A matrices.
    for (uint e0 = tid; e0 < BQ * MAXD; e0 += nt * LOADS) {
        float x[LOADS];
        [[unroll]] for (uint i = 0u; i < LOADS; i++) {
            uint e = e0 + i * nt, t = e / MAXD, d = e % MAXD;
            x[i] = (e < BQ * MAXD && d < pc.head_dim && q0 + t < pc.n) ? qv[q_at(q0 + t, h) + d] : 0.0;
        }
        [[unroll]] for (uint i = 0u; i < LOADS; i++) {
            uint e = e0 + i * nt;
            if (e < BQ * MAXD) qk_t[(e / MAXD) * SD + e % MAXD] = float16_t(x[i]);
        }
    }
    barrier();
    MA qa[ND];
    [[unroll]] for (uint i = 0u; i < ND; i++) {
        if (i < nd) coopMatLoad(qa[i], qk_t, sr * SD + i * 16u, SD, gl_CooperativeMatrixLayoutRowMajor);
    }
    MC o[ND];
    [[unroll]] for (uint i = 0u; i < ND; i++) o[i] = MC(0.0);
    uint kstride = pc.kv_heads * pc.head_dim, vstride = pc.kv_heads * pc.v_head_dim;
    for (uint j0 = j_lo; j0 <= j_hi; j0 += BK) {
        barrier();
        stage_rows(tid, nt, pc.head_dim, pc.k_off + kh * pc.head_dim, kstride, j0, j_hi, true);
        barrier();
        // 1. Scores of the subgroup's 16 rows against the tile's 64 keys.
        [[unroll]] for (uint kt = 0u; kt < BK / 16u; kt++) {
            MC s = MC(0.0);
            [[unroll]] for (uint i = 0u; i < ND; i++) {
                if (i < nd) {
                    MB kb;
                    coopMatLoad(kb, qk_t, kt * 16u * SD + i * 16u, SD, gl_CooperativeMatrixLayoutColumnMajor);
                    s = coopMatMulAdd(qa[i], kb, s);
                }
            }
            coopMatStore(s, s_t, sr * SS + kt * 16u, SS, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        // 2. The online softmax of the subgroup's rows (its own part of s_t and p_t).
        float mx = NEG_INF;
        for (uint c = 0u; c < kpt; c++) {
            uint k = part * kpt + c, j = j0 + k;
            float sc = (row_ok && j <= p && j >= lo) ? s_t[r * SS + k] * pc.scale : NEG_INF;
            s_t[r * SS + k] = sc;
            mx = max(mx, sc);
        }
        for (uint off = 1u; off < lpr; off <<= 1) mx = max(mx, subgroupShuffleXor(mx, off));
        float m_new = max(m_run, mx);
        float psum = 0.0;
        for (uint c = 0u; c < kpt; c++) {
            uint k = part * kpt + c;
            float sc = s_t[r * SS + k];
            float pv = sc == NEG_INF ? 0.0 : exp(sc - m_new);
            p_t[r * SP + k] = float16_t(pv);
            psum += pv;
        }
        for (uint off = 1u; off < lpr; off <<= 1) psum += subgroupShuffleXor(psum, off);
        float alpha = m_new == NEG_INF ? 1.0 : exp(m_run - m_new);
        l_run = l_run * alpha + psum;
        m_run = m_new;
        if (part == 0u) f_t[r] = alpha;
        // Every subgroup is done with the key tile: the value tile takes its place.
        barrier();
        stage_rows(tid, nt, pc.v_head_dim, pc.v_off + kh * pc.v_head_dim, vstride, j0, j_hi, false);
        barrier();
        // 3. The sums rescaled, plus probabilities x values.
        MC fm;
        coopMatLoad(fm, f_t, sr, 0u, gl_CooperativeMatrixLayoutColumnMajor);
        MA pa[BK / 16u];
        [[unroll]] for (uint kt = 0u; kt < BK / 16u; kt++)
            coopMatLoad(pa[kt], p_t, sr * SP + kt * 16u, SP, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint i = 0u; i < ND; i++) {
            if (i < nv) {
                o[i] = o[i] * fm;
                [[unroll]] for (uint kt = 0u; kt < BK / 16u; kt++) {
                    MB vb;
                    coopMatLoad(vb, qk_t, kt * 16u * SD + i * 16u, SD, gl_CooperativeMatrixLayoutRowMajor);
                    o[i] = coopMatMulAdd(pa[kt], vb, o[i]);
                }
            }
        }
    }
    // The final scale per row: the sink in the denominator, the value scale.
    if (part == 0u) {
        float m = m_run, l = l_run;
        float sink = has_sink() ? sinks[h] : NEG_INF;
        float mf = max(m, sink);
        float lf = l * exp(m - mf) + (has_sink() ? exp(sink - mf) : 0.0);
        f_t[r] = row_ok && lf > 0.0 ? exp(m - mf) / lf * pc.value_scale : 0.0;
    }
    barrier();
    MC fm;
    coopMatLoad(fm, f_t, sr, 0u, gl_CooperativeMatrixLayoutColumnMajor);
    // Through the score tile, 64 columns at a time.
    for (uint c0 = 0u; c0 < nv; c0 += BK / 16u) {
        [[unroll]] for (uint i = 0u; i < BK / 16u; i++) {
            [[unroll]] for (uint g = 0u; g < ND; g++) {
                if (g == c0 + i && g < nv) {
                    MC v = o[g] * fm;
                    coopMatStore(v, s_t, sr * SS + i * 16u, SS, gl_CooperativeMatrixLayoutRowMajor);
                }
            }
        }
        barrier();
        uint cols = min(BK, pc.v_head_dim - c0 * 16u);
        for (uint e = tid; e < BQ * cols; e += nt) {
            uint t = e / cols, d = e % cols;
            if (q0 + t < pc.n) {
                outv[pc.o_off + (q0 + t) * pc.heads * pc.v_head_dim + h * pc.v_head_dim + c0 * 16u + d] = s_t[t * SS + d];
            }
        }
        barrier();
    }
}
