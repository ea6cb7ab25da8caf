#version 450
// attn_join.comp: joins attn_split.comp's partials of each (row, head): the global max over
// the splits (and the head's sink logit), each split's sum and values rescaled to it, the sink
// adding to the denominator only. One workgroup per (head, row).
// Must not: assume every split saw a position (empty splits have m = -inf, l = 0).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 4) readonly buffer PML { vec2 part_ml[]; };
layout(std430, binding = 5) readonly buffer PO { float part_o[]; };
layout(std430, binding = 6) writeonly buffer OUT { float outv[]; };

void main() {
    uint h = gl_WorkGroupID.x, row = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    attn_setup();
    uint base = (row * pc.heads + h) * g_splits;
    float m = NEG_INF;
    for (uint s = 0u; s < g_splits; s++) m = max(m, part_ml[base + s].x);
    float sink = pc.has_sinks != 0u ? sinks[h] : NEG_INF;
    m = max(m, sink);
    float l = 0.0;
    for (uint s = 0u; s < g_splits; s++) {
        vec2 ml = part_ml[base + s];
        if (ml.y > 0.0) l += ml.y * exp(ml.x - m);
    }
    if (pc.has_sinks != 0u) l += exp(sink - m);
    float inv = 1.0 / l;
    for (uint d = tid; d < pc.v_head_dim; d += 64u) {
        float acc = 0.0;
        for (uint s = 0u; s < g_splits; s++) {
            vec2 ml = part_ml[base + s];
            if (ml.y > 0.0) acc += part_o[(base + s) * pc.v_head_dim + d] * exp(ml.x - m);
        }
        outv[pc.o_off + row * pc.heads * pc.v_head_dim + h * pc.v_head_dim + d] = acc * inv;
    }
}
