#version 450
// dsa_select.comp: DeepSeek Sparse Attention's selection for a block of rows from their scores
// (dsa_score.comp: row i at position pos0 + i, scores[i * stride + t] for t <= pos0 + i). A
// position is chosen when fewer than topk positions beat it (a higher score, or an equal one
// at an earlier position); the chosen positions are written ascending as floats, -1 where the
// row sees fewer than topk (it then keeps all it sees).
// One workgroup per row: the topk-th best score found bit by bit on the scores' ordered
// integer keys (32 counting passes), then the positions above it and the first ones equal to
// it, their slots from a scan over contiguous chunks of positions. pos0 comes from the push
// constants, or from params[0] when `dyn` is set. Reference: cpu::indexer::select_rows. With
// `rate` above 1 a row sees the first (pos0 + i + 1) / rate scores (a KV compressor's entries,
// DeepSeek V4's lightning indexer; reference cpu::compress's choice).
// Must not: read a score the row does not see.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer S { float sc[]; };
layout(std430, binding = 1) writeonly buffer O { float outv[]; };
layout(std430, binding = 2) readonly buffer PRM { uint params[]; };
layout(push_constant) uniform PC {
    uint n; uint pos0; uint topk; uint stride;
    uint o_off; uint dyn; uint rate; uint pad1;
} pc;

shared uint total;
shared uint eq_in[64];
shared uint chosen_in[64];

// Scores as unsigned keys in the same order (no score is -0 or NaN).
uint key(float s) {
    uint b = floatBitsToUint(s);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

// The workgroup's sum of `v`; every invocation gets it.
uint sum_all(uint v) {
    barrier();
    if (gl_LocalInvocationID.x == 0u) total = 0u;
    barrier();
    atomicAdd(total, v);
    barrier();
    return total;
}

void main() {
    uint i = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    uint seen = (pos0 + i + 1u) / max(pc.rate, 1u);
    uint ob = pc.o_off + i * pc.topk;
    // Uniform over the workgroup: a row that sees no more than topk keeps every position.
    if (seen <= pc.topk) {
        for (uint t = tid; t < pc.topk; t += 64u) outv[ob + t] = t < seen ? float(t) : -1.0;
        return;
    }
    uint sb = i * pc.stride;
    // The largest key with at least topk keys at or above it: the topk-th best.
    uint cut = 0u;
    for (int bit = 31; bit >= 0; bit--) {
        uint cand = cut | (1u << uint(bit));
        uint c = 0u;
        for (uint t = tid; t < seen; t += 64u) c += key(sc[sb + t]) >= cand ? 1u : 0u;
        if (sum_all(c) >= pc.topk) cut = cand;
    }
    uint above = 0u;
    for (uint t = tid; t < seen; t += 64u) above += key(sc[sb + t]) > cut ? 1u : 0u;
    // Of the positions equal to the cut, the earliest `ties` are chosen.
    uint ties = pc.topk - sum_all(above);
    uint chunk = (seen + 63u) / 64u;
    uint t0 = min(seen, tid * chunk), t1 = min(seen, t0 + chunk);
    uint eq = 0u;
    for (uint t = t0; t < t1; t++) eq += key(sc[sb + t]) == cut ? 1u : 0u;
    eq_in[tid] = eq;
    barrier();
    uint eq_before = 0u;
    for (uint u = 0u; u < tid; u++) eq_before += eq_in[u];
    uint chosen = 0u, e = eq_before;
    for (uint t = t0; t < t1; t++) {
        uint k = key(sc[sb + t]);
        if (k > cut || (k == cut && e++ < ties)) chosen++;
    }
    chosen_in[tid] = chosen;
    barrier();
    uint slot = 0u;
    for (uint u = 0u; u < tid; u++) slot += chosen_in[u];
    e = eq_before;
    for (uint t = t0; t < t1; t++) {
        uint k = key(sc[sb + t]);
        if (k > cut || (k == cut && e++ < ties)) outv[ob + slot++] = float(t);
    }
}
