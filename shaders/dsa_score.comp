#version 450
// dsa_score.comp: the lightning indexer's score of each (row, position) of a block: row i at
// position pos0 + i against the cached index key of position t <= pos0 + i,
// score = sum_h (w[i, h] * w_scale) * relu(q[i, h] . k[t] * scale) (+ 0, so no score is -0),
// written to scores[i * stride + t]. Workgroups (x, i) cover positions 64x .. 64x + 63 of row
// i, so a decode row's positions spread over the device. pos0 comes from the push constants,
// or from params[0] when `dyn` is set (a recording replayed at every position). With `rate`
// above 1 the keys are a KV compressor's entries (DeepSeek V4's lightning indexer): row i sees
// t < (pos0 + i + 1) / rate (rate 1: t <= pos0 + i).
// Reference: the scores of cpu::indexer::select_rows.
// Must not: read a key the row does not see.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { float kv[]; };
layout(std430, binding = 2) readonly buffer W { float wv[]; };
layout(std430, binding = 3) writeonly buffer S { float sc[]; };
layout(std430, binding = 4) readonly buffer PRM { uint params[]; };
layout(push_constant) uniform PC {
    uint n; uint heads; uint dim; uint pos0;
    uint stride; float scale; float w_scale; uint q_off;
    uint w_off; uint dyn; uint rate; uint pad1;
} pc;

void main() {
    uint i = gl_WorkGroupID.y;
    uint t = gl_WorkGroupID.x * 64u + gl_LocalInvocationID.x;
    uint pos0 = pc.dyn != 0u ? params[0] : pc.pos0;
    if (i >= pc.n || t >= (pos0 + i + 1u) / max(pc.rate, 1u)) return;
    uint qb = pc.q_off + i * pc.heads * pc.dim, wb = pc.w_off + i * pc.heads, kb = t * pc.dim;
    float s = 0.0;
    for (uint h = 0u; h < pc.heads; h++) {
        float d = 0.0;
        for (uint k = 0u; k < pc.dim; k++) d += qv[qb + h * pc.dim + k] * kv[kb + k];
        s += (wv[wb + h] * pc.w_scale) * max(d * pc.scale, 0.0);
    }
    sc[i * pc.stride + t] = s + 0.0;
}
