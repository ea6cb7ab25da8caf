#version 450
// route.comp: a row's router logits to its top-k (expert, weight) pairs, as the CPU's
// route_row (runtime/src/cpu/route.rs), by route.glsl's arithmetic. One workgroup per row.
// With `hash` (DeepSeek V4's hash routing, route_row_hash): the row's experts are its token's
// row of the table (`tokens[row]`, `table` [vocab, top_k] of expert ids as floats), in order,
// weighed by their scores; a token past the vocabulary or an id past the experts gives the
// expert `n` (which the expert kernels skip) with weight 0.
// With `shared` experts (Inkling's sink, route_row_shared): a row's logits are the `n` routed
// experts' then the shared ones'; the top-k among the routed as above, their weights their
// scores, then the pairs (n + s, sigmoid(logit)); renormalized over all of them (no 1e-20),
// times the scale and `scale_by[0]` where has_scale_by is set.
// Output per row: 2 * (top_k + shared) floats, (expert as float, weight) by rank.
// Must not: take more than RT_MAX_E experts or RT_MAX_K ranks (the host checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) readonly buffer BIAS { float bias[]; };
layout(std430, binding = 2) writeonly buffer OUT { float outv[]; };
layout(std430, binding = 3) readonly buffer TOK { uint tokens[]; };
layout(std430, binding = 4) readonly buffer TAB { float table[]; };
layout(std430, binding = 5) readonly buffer SB { float scale_by[]; };
layout(push_constant) uniform PC {
    uint n; uint top_k; uint scoring; uint renormalize;
    uint has_bias; uint n_group; uint topk_group; float scale;
    uint l_off; uint o_off; uint group_max; uint hash;
    uint vocab; uint t_off; uint shared_; uint has_scale_by;
} pc;

#define RT_MAX_E 1024
#define RT_LOGIT(e) logits[rt_base + (e)]
#define RT_BIAS(e) bias[e]
#include "route.glsl"

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint lb = pc.l_off + r * (pc.n + pc.shared_);
    rt_base = lb;
    RouteArgs a = RouteArgs(pc.n, pc.top_k, pc.scoring, pc.renormalize, pc.has_bias, pc.n_group, pc.topk_group,
        pc.group_max, pc.scale);
    route_scores(a);
    // Hash routing: the token's row of the table, in order.
    if (pc.hash != 0u) {
        if (tid == 0u) {
            uint tok = tokens[pc.t_off + r];
            float s = 0.0;
            for (uint k = 0u; k < pc.top_k; k++) {
                float id = tok < pc.vocab ? table[tok * pc.top_k + k] : -1.0;
                bool ok = id >= 0.0 && id < float(pc.n);
                rt_chosen[k] = ok ? uint(id) : pc.n;
                s += ok ? rt_scores[rt_chosen[k]] : 0.0;
            }
            s = pc.renormalize != 0u ? s + 1e-20 : 1.0;
            uint ob = pc.o_off + r * 2u * pc.top_k;
            for (uint k = 0u; k < pc.top_k; k++) {
                float w = rt_chosen[k] < pc.n ? rt_scores[rt_chosen[k]] : 0.0;
                outv[ob + 2u * k] = float(rt_chosen[k]);
                outv[ob + 2u * k + 1u] = div_rn(w, s) * pc.scale;
            }
        }
        return;
    }
    route_choose(a);
    // Weights (with shared experts: theirs after the routed, then one normalization).
    if (pc.shared_ > 0u) {
        if (tid == 0u) {
            uint ob = pc.o_off + r * 2u * (pc.top_k + pc.shared_);
            float s = 0.0;
            for (uint k = 0u; k < pc.top_k; k++) s += rt_scores[rt_chosen[k]];
            for (uint j = 0u; j < pc.shared_; j++) s += 1.0 / (1.0 + exp(-logits[lb + pc.n + j]));
            float f = pc.renormalize != 0u ? div_rn(1.0, s) : 1.0;
            f = f * pc.scale * (pc.has_scale_by != 0u ? scale_by[0] : 1.0);
            for (uint k = 0u; k < pc.top_k + pc.shared_; k++) {
                bool routed = k < pc.top_k;
                float w = routed ? rt_scores[rt_chosen[k]] : 1.0 / (1.0 + exp(-logits[lb + pc.n + k - pc.top_k]));
                outv[ob + 2u * k] = float(routed ? rt_chosen[k] : pc.n + k - pc.top_k);
                outv[ob + 2u * k + 1u] = w * f;
            }
        }
        return;
    }
    uint ob = pc.o_off + r * 2u * pc.top_k;
    for (uint k = tid; k < pc.top_k; k += gl_WorkGroupSize.x) {
        outv[ob + 2u * k] = float(rt_chosen[k]);
        outv[ob + 2u * k + 1u] = route_weight(a, k);
    }
}
