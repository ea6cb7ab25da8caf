// mla_attn.glsl: the body of mla_attn.comp and mla_attn_sparse.comp (which defines SPARSE).
// The absorbed attention core of multi-head latent attention. For query row i
// (position pos0 + i) and head h: scores over every cached position j <= pos0 + i,
// (qlat . lat[j] + qrope . krope[j]) * scale, against the latent mirror and the rope-key
// mirror; the softmax (online, over tiles of 64 positions); the softmax-weighted latent,
// written over the row's absorbed query in `lat` (each workgroup reads its slot before it
// writes it). One workgroup per (head, row), one position per invocation in a tile, the latent
// columns split over the invocations. Reference: the second loop of cpu::mla's absorbed form.
// With dyn_pos the block's first position is read from `posv[0]` (a replayed recording).
// Must not: read a position past pos0 + i, or take a latent wider than MAX_C or a rope part
// wider than MAX_R (the op checks).
// With SPARSE, row i attends over the positions its selection names (binding 5, `topk` per
// row: ascending positions, -1 after the last; DeepSeek Sparse Attention's indexer output)
// instead of every cached one. Reference: cpu::mla with `select`.
#include "common.glsl"

#define T 64u
#define MAX_C 1024u
#define MAX_R 128u
#define PER (MAX_C / T)

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer QL { float qlat[]; };
layout(std430, binding = 1) readonly buffer Q { float qv[]; };
layout(std430, binding = 2) readonly buffer ML { float mlat[]; };
layout(std430, binding = 3) readonly buffer MR { float mrope[]; };
layout(std430, binding = 4) readonly buffer POS { uint posv[]; };
#ifdef SPARSE
layout(std430, binding = 5) readonly buffer SEL { float sel[]; };
#endif
// topk and s_off: the selection's width and offset (SPARSE only).
layout(push_constant) uniform PC {
    uint n; uint heads; uint dn; uint dr;
    uint c; uint pos0; float scale; uint q_off;
    uint l_off; uint dyn_pos; uint topk; uint s_off;
} pc;

shared float sq[MAX_C];
shared float sr[MAX_R];
shared float sp[T];

#ifdef SPARSE
// The jj-th position row i attends over: its selection's (ascending, -1 after the last).
uint at(uint i, uint jj) { return uint(sel[pc.s_off + i * pc.topk + jj]); }
#else
uint at(uint i, uint jj) { return jj; }
#endif

void main() {
    uint h = gl_WorkGroupID.x, i = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint slot = pc.l_off + (i * pc.heads + h) * pc.c;
    uint qb = pc.q_off + (i * pc.heads + h) * (pc.dn + pc.dr) + pc.dn;
    for (uint k = tid; k < pc.c; k += T) sq[k] = qlat[slot + k];
    for (uint k = tid; k < pc.dr; k += T) sr[k] = qv[qb + k];
    barrier();
#ifdef SPARSE
    uint len = 0u;
    while (len < pc.topk && sel[pc.s_off + i * pc.topk + len] >= 0.0) len++;
#else
    uint len = (pc.dyn_pos != 0u ? posv[0] : pc.pos0) + i + 1u;
#endif
    float m = NEG_INF, l = 0.0;
    float acc[PER];
    [[unroll]] for (uint u = 0u; u < PER; u++) acc[u] = 0.0;
    for (uint t0 = 0u; t0 < len; t0 += T) {
        uint j = t0 + tid;
        float s = NEG_INF;
        if (j < len) {
            uint p = at(i, j);
            float a = 0.0, b = 0.0;
            for (uint k = 0u; k < pc.c; k++) a += sq[k] * mlat[p * pc.c + k];
            for (uint k = 0u; k < pc.dr; k++) b += sr[k] * mrope[p * pc.dr + k];
            s = (a + b) * pc.scale;
        }
        sp[tid] = s;
        barrier();
        uint cnt = min(T, len - t0);
        float tmax = NEG_INF;
        for (uint jj = 0u; jj < cnt; jj++) tmax = max(tmax, sp[jj]);
        float mn = max(m, tmax);
        float alpha = exp(m - mn);
        barrier();
        sp[tid] = j < len ? exp(s - mn) : 0.0;
        barrier();
        float ts = 0.0;
        for (uint jj = 0u; jj < cnt; jj++) ts += sp[jj];
        l = l * alpha + ts;
        [[unroll]] for (uint u = 0u; u < PER; u++) {
            uint k = tid + u * T;
            if (k < pc.c) {
                float a = acc[u] * alpha;
                for (uint jj = 0u; jj < cnt; jj++) a += sp[jj] * mlat[at(i, t0 + jj) * pc.c + k];
                acc[u] = a;
            }
        }
        m = mn;
        barrier();
    }
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint k = tid + u * T;
        if (k < pc.c) qlat[slot + k] = acc[u] / l;
    }
}
