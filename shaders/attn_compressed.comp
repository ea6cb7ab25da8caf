#version 450
// attn_compressed.comp: DeepSeek V4's attention over a layer's cached rows and its compressed
// entries. For query row i (position p = pos0 + i) and head h: scores over the cached rows of
// the window, positions lo ..= p (lo = p + 1 - window, or 0 without one), q . k * scale, then
// over the compressed entries the row sees, e < (p + 1) / rate: all of them, or with a
// selection (binding 5, `topk` per row, -1 padded) those it names that are in range; an entry
// is both key and value. The softmax (online, over tiles of 64 keys) with the head's sink
// logit in the denominator, and the weighted values. One workgroup per (head, row), one key
// per invocation in a tile, the head's columns split over the invocations. One KV head: the
// mirrors hold rows of dim floats. Reference: cpu::compress::attend.
// pos0 comes from the push constants, or from params[0] when `dyn` is set (a replayed
// recording).
// Must not: read a cached row past p or an entry at or past (p + 1) / rate, or take a head
// wider than MAX_D (the op checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define T 64u
#define MAX_D 512u
#define PER (MAX_D / T)

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { float kc[]; };
layout(std430, binding = 2) readonly buffer V { float vc[]; };
layout(std430, binding = 3) readonly buffer E { float ent[]; };
layout(std430, binding = 4) readonly buffer S { float sinks[]; };
layout(std430, binding = 5) readonly buffer SEL { float sel[]; };
layout(std430, binding = 6) writeonly buffer O { float outv[]; };
layout(std430, binding = 7) readonly buffer PRM { uint params[]; };
// window 0: none; topk 0: no selection; has_sinks 0: no sinks; ring 0: the cached rows are
// positions, else a ring of that many rows (position j in row j % ring).
layout(push_constant) uniform PC {
    uint n; uint heads; uint dim; uint pos0;
    uint window; uint rate; float scale; uint q_off;
    uint o_off; uint dyn; uint topk; uint s_off;
    uint has_sinks; uint ring; uint pad1; uint pad2;
} pc;

shared float sq[MAX_D];
shared float sp[T];

// Key jj of row i: a cached row (1, its position) below wlen, else an entry (2, its index),
// or none (0: a selection's padding or an entry the row does not see).
uvec2 key_of(uint i, uint jj, uint lo, uint wlen, uint seen) {
    if (jj < wlen) return uvec2(1u, lo + jj);
    uint e = jj - wlen;
    if (pc.topk != 0u) {
        float s = sel[pc.s_off + i * pc.topk + e];
        if (s < 0.0 || uint(s) >= seen) return uvec2(0u, 0u);
        return uvec2(2u, uint(s));
    }
    return uvec2(2u, e);
}

// The mirror row of a cached position (ring != 0: a ring of that many rows).
uint slot(uint j) { return pc.ring != 0u ? j % pc.ring : j; }

float column(uvec2 key, uint k) {
    return key.x == 1u ? vc[slot(key.y) * pc.dim + k] : ent[key.y * pc.dim + k];
}

void main() {
    uint h = gl_WorkGroupID.x, i = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint p = (pc.dyn != 0u ? params[0] : pc.pos0) + i;
    uint lo = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint wlen = p + 1u - lo;
    uint seen = (p + 1u) / pc.rate;
    uint len = wlen + (pc.topk != 0u ? pc.topk : seen);
    uint qb = pc.q_off + (i * pc.heads + h) * pc.dim;
    for (uint k = tid; k < pc.dim; k += T) sq[k] = qv[qb + k];
    barrier();
    float m = NEG_INF, l = 0.0;
    float acc[PER];
    [[unroll]] for (uint u = 0u; u < PER; u++) acc[u] = 0.0;
    for (uint t0 = 0u; t0 < len; t0 += T) {
        uint j = t0 + tid;
        float s = NEG_INF;
        if (j < len) {
            uvec2 key = key_of(i, j, lo, wlen, seen);
            if (key.x != 0u) {
                float a = 0.0;
                if (key.x == 1u) {
                    for (uint k = 0u; k < pc.dim; k++) a += sq[k] * kc[slot(key.y) * pc.dim + k];
                } else {
                    for (uint k = 0u; k < pc.dim; k++) a += sq[k] * ent[key.y * pc.dim + k];
                }
                s = a * pc.scale;
            }
        }
        sp[tid] = s;
        barrier();
        uint cnt = min(T, len - t0);
        float tmax = NEG_INF;
        for (uint jj = 0u; jj < cnt; jj++) tmax = max(tmax, sp[jj]);
        barrier();
        // A tile of padding only (uniform: every invocation read the same scores).
        if (tmax == NEG_INF) continue;
        float mn = max(m, tmax);
        float alpha = exp(m - mn);
        sp[tid] = s == NEG_INF ? 0.0 : exp(s - mn);
        barrier();
        float ts = 0.0;
        for (uint jj = 0u; jj < cnt; jj++) ts += sp[jj];
        l = l * alpha + ts;
        [[unroll]] for (uint u = 0u; u < PER; u++) {
            uint k = tid + u * T;
            if (k < pc.dim) {
                float a = acc[u] * alpha;
                for (uint jj = 0u; jj < cnt; jj++) {
                    float w = sp[jj];
                    if (w != 0.0) a += w * column(key_of(i, t0 + jj, lo, wlen, seen), k);
                }
                acc[u] = a;
            }
        }
        m = mn;
        barrier();
    }
    // The sink's share of the denominator.
    if (pc.has_sinks != 0u) {
        float sk = sinks[h];
        float mn = max(m, sk);
        float alpha = exp(m - mn);
        l = l * alpha + exp(sk - mn);
        [[unroll]] for (uint u = 0u; u < PER; u++) acc[u] *= alpha;
    }
    uint ob = pc.o_off + (i * pc.heads + h) * pc.dim;
    [[unroll]] for (uint u = 0u; u < PER; u++) {
        uint k = tid + u * T;
        if (k < pc.dim) outv[ob + k] = acc[u] / l;
    }
}
