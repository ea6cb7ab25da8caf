#version 450
// route.comp: a row's router logits to its top-k (expert, weight) pairs (route.glsl, the
// CPU's route_row). One workgroup per row. Output per row: 2 * top_k floats, (expert as
// float, weight) by rank.
// Must not: take more than MAX_E experts or MAX_K ranks (the host checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) readonly buffer BIAS { float bias[]; };
layout(std430, binding = 2) writeonly buffer OUT { float outv[]; };
layout(push_constant) uniform PC {
    uint n; uint top_k; uint sigmoid_; uint renormalize;
    uint has_bias; uint n_group; uint topk_group; float scale;
    uint l_off; uint o_off; uint pad0; uint pad1;
} pc;

uint g_lb;
#define ROUTE_LOGIT(e) logits[g_lb + (e)]
#define ROUTE_BIAS(e) bias[e]
#include "route.glsl"

void main() {
    uint r = gl_WorkGroupID.x;
    g_lb = pc.l_off + r * pc.n;
    RouteArgs a = RouteArgs(pc.n, pc.top_k, pc.sigmoid_, pc.renormalize, pc.has_bias, pc.n_group, pc.topk_group, pc.scale);
    route_row(a);
    if (gl_LocalInvocationID.x == 0u) {
        uint ob = pc.o_off + r * 2u * pc.top_k;
        for (uint k = 0u; k < pc.top_k; k++) {
            outv[ob + 2u * k] = float(r_chosen[k]);
            outv[ob + 2u * k + 1u] = route_weight(a, k);
        }
    }
}
