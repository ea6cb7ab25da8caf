// mla_attn.glsl: the body of mla_attn.comp and mla_attn_sparse.comp (which defines SPARSE).
// The absorbed attention core of multi-head latent attention. For query row i
// (position pos0 + i) and head h: scores over every cached position j <= pos0 + i,
// (qlat . lat[j] + qrope . krope[j]) * scale, against the latent mirror and the rope-key
// mirror; the softmax (online, over tiles of TP positions); the softmax-weighted latent,
// written over the row's absorbed query in `lat`. Reference: the second loop of cpu::mla's
// absorbed form.
// Every head reads the same cached latents, so a workgroup takes `group` heads of one row
// (their queries in shared memory, group * c <= QCAP) and reads each position's latent once
// for all of them: a subgroup per position for the scores (the latent's columns across its
// lanes, coalesced), then each invocation a column of every head's weighted sum. Workgroup
// (head group, row, split) covers a `splits`-th of the row's positions; with several splits
// each writes its partial (m, l, unnormalized sums) and the last of a (row, head group) to
// count itself in counter[row * groups + group] joins them (the global max, each split's sum
// and values rescaled to it), writes the heads' outputs and sets the counter back to 0 (the
// counters must be 0 before the first call; the op layer zeroes them in the frame). A split
// reads every query of its group before it counts itself, so the joiner's writes over them
// come after every read.
// With dyn_pos the block's first position is read from `posv[0]` (a replayed recording).
// Must not: read a position past pos0 + i, or take a latent wider than MAX_C or a rope part
// wider than MAX_R (the op checks), or more than GMAX heads a group or QCAP query floats (the
// op chooses the group within both).
// With SPARSE, row i attends over the positions its selection names (binding 5, `topk` per
// row: ascending positions, -1 after the last; DeepSeek Sparse Attention's indexer output)
// instead of every cached one. Reference: cpu::mla with `select`.
#include "common.glsl"

#define WG 128u
#define TP 32u
#define GMAX 8u
#define QCAP 4096u
#define MAX_C 1024u
#define MAX_R 128u
#define PER (MAX_C / WG)

layout(local_size_x = 128) in;
layout(std430, binding = 0) buffer QL { float qlat[]; };
layout(std430, binding = 1) readonly buffer Q { float qv[]; };
layout(std430, binding = 2) readonly buffer ML { float mlat[]; };
layout(std430, binding = 3) readonly buffer MR { float mrope[]; };
layout(std430, binding = 4) readonly buffer POS { uint posv[]; };
#ifdef SPARSE
layout(std430, binding = 5) readonly buffer SEL { float sel[]; };
#endif
layout(std430, binding = 6) coherent buffer PML { vec2 part_ml[]; };
layout(std430, binding = 7) coherent buffer PO { float part_o[]; };
layout(std430, binding = 8) coherent buffer CNT { uint counter[]; };
// topk and s_off: the selection's width and offset (SPARSE only); group: heads a workgroup;
// splits: workgroups a (row, head group).
layout(push_constant) uniform PC {
    uint n; uint heads; uint dn; uint dr;
    uint c; uint pos0; float scale; uint q_off;
    uint l_off; uint dyn_pos; uint topk; uint s_off;
    uint group; uint splits; uint pad0; uint pad1;
} pc;

shared float sq[QCAP];
shared float sr[GMAX * MAX_R];
shared float sp[GMAX * TP];
shared uint spos[TP];
shared float sm[GMAX];
shared float sl[GMAX];
shared float salpha[GMAX];
shared bool s_last;
// The joiner's factor of each (head, split): exp(m_split - m), 0 for a split that saw nothing.
#define JMAX 32u
shared float sjf[GMAX * JMAX];

#ifdef SPARSE
// The jj-th position row i attends over: its selection's (ascending, -1 after the last).
uint at(uint i, uint jj) { return uint(sel[pc.s_off + i * pc.topk + jj]); }

// How many positions row i's selection names: the -1s are all after the last, so the first
// is found by bisection.
uint selected(uint i) {
    uint lo = 0u, hi = pc.topk;
    while (lo < hi) {
        uint mid = (lo + hi) / 2u;
        if (sel[pc.s_off + i * pc.topk + mid] >= 0.0) lo = mid + 1u; else hi = mid;
    }
    return lo;
}
#else
uint at(uint i, uint jj) { return jj; }
#endif

void main() {
    uint grp = gl_WorkGroupID.x, i = gl_WorkGroupID.y, split = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x;
    uint h0 = grp * pc.group;
    uint G = min(pc.group, pc.heads - h0);
    uint c = pc.c, dr = pc.dr;
    // The group's query slots are consecutive: heads h0 .. h0 + G of row i.
    uint base = pc.l_off + (i * pc.heads + h0) * c;
    for (uint e = tid; e < G * c; e += WG) sq[e] = qlat[base + e];
    for (uint e = tid; e < G * dr; e += WG) {
        uint g = e / dr, k = e - g * dr;
        sr[e] = qv[pc.q_off + (i * pc.heads + h0 + g) * (pc.dn + dr) + pc.dn + k];
    }
    if (tid < GMAX) {
        sm[tid] = NEG_INF;
        sl[tid] = 0.0;
    }
#ifdef SPARSE
    uint len = selected(i);
#else
    uint len = (pc.dyn_pos != 0u ? posv[0] : pc.pos0) + i + 1u;
#endif
    uint chunk = (len + pc.splits - 1u) / pc.splits;
    uint j_begin = min(len, split * chunk), j_end = min(len, j_begin + chunk);
    barrier();
    float acc[GMAX * PER];
    [[unroll]] for (uint v = 0u; v < GMAX * PER; v++) acc[v] = 0.0;
    for (uint t0 = j_begin; t0 < j_end; t0 += TP) {
        uint cnt = min(TP, j_end - t0);
        // Scores: a subgroup a position, its lanes across the latent's columns.
        for (uint jj = gl_SubgroupID; jj < cnt; jj += gl_NumSubgroups) {
            uint p = at(i, t0 + jj);
            float part[GMAX];
            [[unroll]] for (uint g = 0u; g < GMAX; g++) part[g] = 0.0;
            for (uint k = gl_SubgroupInvocationID; k < c; k += gl_SubgroupSize) {
                float x = mlat[p * c + k];
                [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                    if (g < G) part[g] += sq[g * c + k] * x;
                }
            }
            for (uint k = gl_SubgroupInvocationID; k < dr; k += gl_SubgroupSize) {
                float x = mrope[p * dr + k];
                [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                    if (g < G) part[g] += sr[g * dr + k] * x;
                }
            }
            [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                if (g < G) {
                    float s = subgroupAdd(part[g]);
                    if (subgroupElect()) sp[g * TP + jj] = s * pc.scale;
                }
            }
            if (subgroupElect()) spos[jj] = p;
        }
        barrier();
        // The online softmax, an invocation a head.
        if (tid < G) {
            float tmax = NEG_INF;
            for (uint jj = 0u; jj < cnt; jj++) tmax = max(tmax, sp[tid * TP + jj]);
            float mn = max(sm[tid], tmax);
            float alpha = exp(sm[tid] - mn);
            float ts = 0.0;
            for (uint jj = 0u; jj < cnt; jj++) {
                float e = exp(sp[tid * TP + jj] - mn);
                sp[tid * TP + jj] = e;
                ts += e;
            }
            sl[tid] = sl[tid] * alpha + ts;
            sm[tid] = mn;
            salpha[tid] = alpha;
        }
        barrier();
        // The weighted latents: an invocation a column of every head of the group.
        [[unroll]] for (uint u = 0u; u < PER; u++) {
            [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                if (g < G) acc[g * PER + u] *= salpha[g];
            }
        }
        for (uint jj = 0u; jj < cnt; jj++) {
            uint p = spos[jj];
            [[unroll]] for (uint u = 0u; u < PER; u++) {
                uint k = tid + u * WG;
                if (k < c) {
                    float x = mlat[p * c + k];
                    [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                        if (g < G) acc[g * PER + u] += sp[g * TP + jj] * x;
                    }
                }
            }
        }
        barrier();
    }
    if (pc.splits == 1u) {
        [[unroll]] for (uint u = 0u; u < PER; u++) {
            uint k = tid + u * WG;
            [[unroll]] for (uint g = 0u; g < GMAX; g++) {
                if (g < G && k < c) qlat[base + g * c + k] = acc[g * PER + u] / sl[g];
            }
        }
        return;
    }
    // This split's partial, then the last split of (row, group) joins them all.
    uint slot0 = (i * pc.heads + h0) * pc.splits + split;
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint k = tid + u * WG;
        [[unroll]] for (uint g = 0u; g < GMAX; g++) {
            if (g < G && k < c) part_o[(slot0 + g * pc.splits) * c + k] = acc[g * PER + u];
        }
    }
    if (tid < G) part_ml[slot0 + tid * pc.splits] = vec2(sm[tid], sl[tid]);
    memoryBarrierBuffer();
    barrier();
    uint groups = (pc.heads + pc.group - 1u) / pc.group;
    if (tid == 0u) s_last = atomicAdd(counter[i * groups + grp], 1u) == pc.splits - 1u;
    barrier();
    if (!s_last) return;
    memoryBarrierBuffer();
    // Per head the global max (sm) and the sum rescaled to it (sl).
    uint first = (i * pc.heads + h0) * pc.splits;
    if (tid < G) {
        float mx = NEG_INF;
        for (uint s = 0u; s < pc.splits; s++) mx = max(mx, part_ml[first + tid * pc.splits + s].x);
        float lt = 0.0;
        for (uint s = 0u; s < pc.splits; s++) {
            vec2 ml = part_ml[first + tid * pc.splits + s];
            if (ml.y > 0.0) lt += ml.y * exp(ml.x - mx);
        }
        sm[tid] = mx;
        sl[tid] = lt;
    }
    barrier();
    for (uint e = tid; e < G * pc.splits; e += WG) {
        uint g = e / pc.splits;
        vec2 ml = part_ml[first + e];
        sjf[e] = ml.y > 0.0 ? exp(ml.x - sm[g]) : 0.0;
    }
    barrier();
    for (uint e = tid; e < G * c; e += WG) {
        uint g = e / c, k = e - g * c;
        uint ob = (first + g * pc.splits) * c + k;
        float o = 0.0;
        uint s = 0u;
        // Eight splits' loads in flight.
        for (; s + 8u <= pc.splits; s += 8u) {
            float x[8];
            [[unroll]] for (uint t = 0u; t < 8u; t++) x[t] = sjf[g * pc.splits + s + t] != 0.0 ? part_o[ob + (s + t) * c] : 0.0;
            [[unroll]] for (uint t = 0u; t < 8u; t++) o += x[t] * sjf[g * pc.splits + s + t];
        }
        for (; s < pc.splits; s++) {
            float f = sjf[g * pc.splits + s];
            if (f != 0.0) o += part_o[ob + s * c] * f;
        }
        qlat[base + e] = o / sl[g];
    }
    if (tid == 0u) counter[i * groups + grp] = 0u;
}
