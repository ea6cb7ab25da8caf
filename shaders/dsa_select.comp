#version 450
// dsa_select.comp: DeepSeek Sparse Attention's selection for a block of rows, from the
// indexer's rotated queries (n x heads x dim), its cached keys (the layer's index-key mirror,
// positions 0..pos0 + n) and its head weights (n x heads, already times heads^-0.5). For row i
// (position pos0 + i) and position t <= pos0 + i: score = sum_h w[h] * relu(q[h] . k[t] *
// scale); a position is chosen when fewer than topk positions beat it (a higher score, or an
// equal one at an earlier position); the chosen positions are written ascending as floats, -1
// where the row sees fewer than topk (it then keeps all it sees). One workgroup per row; the
// scores and the chosen flags go through `scratch` (n x 2 x stride). Reference:
// cpu::indexer::select_rows.
// Must not: read a key past pos0 + i.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { float kv[]; };
layout(std430, binding = 2) readonly buffer W { float wv[]; };
layout(std430, binding = 3) buffer S { float sc[]; };
layout(std430, binding = 4) writeonly buffer O { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint dim; uint pos0;
    uint topk; uint stride; float scale; uint q_off;
    uint w_off; uint o_off; uint pad0; uint pad1;
} pc;

void main() {
    uint i = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint seen = pc.pos0 + i + 1u;
    uint ob = pc.o_off + i * pc.topk;
    // Uniform over the workgroup: a row that sees no more than topk keeps every position.
    if (seen <= pc.topk) {
        for (uint t = tid; t < pc.topk; t += 64u) outv[ob + t] = t < seen ? float(t) : -1.0;
        return;
    }
    uint sb = i * 2u * pc.stride, fb = sb + pc.stride;
    uint qb = pc.q_off + i * pc.heads * pc.dim, wb = pc.w_off + i * pc.heads;
    for (uint t = tid; t < seen; t += 64u) {
        float s = 0.0;
        for (uint h = 0u; h < pc.heads; h++) {
            float d = 0.0;
            for (uint k = 0u; k < pc.dim; k++) d += qv[qb + h * pc.dim + k] * kv[t * pc.dim + k];
            s += wv[wb + h] * max(d * pc.scale, 0.0);
        }
        sc[sb + t] = s;
    }
    memoryBarrierBuffer();
    barrier();
    for (uint t = tid; t < seen; t += 64u) {
        float st = sc[sb + t];
        uint rank = 0u;
        for (uint u = 0u; u < seen; u++) {
            float su = sc[sb + u];
            if (su > st || (su == st && u < t)) rank++;
        }
        sc[fb + t] = rank < pc.topk ? 1.0 : 0.0;
    }
    memoryBarrierBuffer();
    barrier();
    for (uint t = tid; t < seen; t += 64u) {
        if (sc[fb + t] != 0.0) {
            uint slot = 0u;
            for (uint u = 0u; u < t; u++) slot += sc[fb + u] != 0.0 ? 1u : 0u;
            outv[ob + slot] = float(t);
        }
    }
}
