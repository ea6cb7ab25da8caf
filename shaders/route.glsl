// route.glsl: a row's router logits to its top-k experts in shared memory, as the CPU's
// route_row (runtime/src/cpu/route.rs): softmax, sigmoid or sqrt(softplus) scores (`scoring`
// 0, 1, 2; softplus as torch's, x past 20 as x); a correction bias that steers the choice
// only; group-limited top-k (a group scores the sum of its two best choices, or its best with
// group_max); ties toward the lower index; renormalization; a scale. The whole workgroup
// routes one row: route_scores, then route_choose (the ranks in rt_chosen), then
// route_weight(k) for any rank. The top-k by ranks (each expert counts who beats it), not by
// rounds of arg-max.
// Included by route.comp (one workgroup a row) and moe_matvec.comp (mode 0 routing its pair's
// row itself, so no Route dispatch runs between the router's GEMV and the experts).
// The includer defines RT_MAX_E (the most experts it holds), RT_LOGIT(e) (the row's logit of
// expert e, from `rt_base`) and RT_BIAS(e) (the correction bias).
// Must not: be called in non-uniform control flow (barriers), or with more than RT_MAX_E
// experts, RT_MAX_K ranks or RT_MAX_G groups (the host checks); assume a workgroup size.

#define RT_MAX_K 64
#define RT_MAX_G 64

struct RouteArgs {
    uint n; uint top_k; uint scoring; uint renormalize;
    uint has_bias; uint n_group; uint topk_group; uint group_max;
    float scale;
};

shared float rt_scores[RT_MAX_E];
shared float rt_choice[RT_MAX_E];
shared float rt_part[128];
shared float rt_sum;
shared uint rt_chosen[RT_MAX_K];
shared float rt_gscore[RT_MAX_G];
shared uint rt_keep[RT_MAX_G];
// The first element of the row's logits (RT_LOGIT reads from it).
uint rt_base = 0u;

bool rt_better(float v1, uint i1, float v2, uint i2) { return v1 > v2 || (v1 == v2 && i1 < i2); }

// ln(1 + e^x) as torch computes it (x past 20: x), log1p by the quotient that keeps its
// relative precision where e^x is tiny.
float rt_softplus(float x) {
    if (x > 20.0) return x;
    float u = exp(x);
    float w = 1.0 + u;
    return w == 1.0 ? u : log(w) * (u / (w - 1.0));
}

// 1. The row's scores in rt_scores (softmax: normalized by their sum, added in expert order).
void route_scores(RouteArgs a) {
    uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    float m = NEG_INF;
    for (uint e = tid; e < a.n; e += wg) m = max(m, RT_LOGIT(e));
    m = subgroupMax(m);
    if (subgroupElect()) rt_part[gl_SubgroupID] = m;
    barrier();
    m = NEG_INF;
    for (uint s = 0u; s < gl_NumSubgroups; s++) m = max(m, rt_part[s]);
    for (uint e = tid; e < a.n; e += wg) {
        float l = RT_LOGIT(e);
        rt_scores[e] = a.scoring == 1u ? 1.0 / (1.0 + exp(-l)) : a.scoring == 2u ? sqrt(rt_softplus(l)) : exp(l - m);
    }
    barrier();
    if (a.scoring == 0u) {
        if (tid == 0u) {
            float s = 0.0;
            for (uint e = 0u; e < a.n; e++) s += rt_scores[e];
            rt_sum = s;
        }
        barrier();
        float s = rt_sum;
        for (uint e = tid; e < a.n; e += wg) rt_scores[e] = div_rn(rt_scores[e], s);
        barrier();
    }
}

// 2. The top-k by the scores plus the bias, within the best groups: rt_chosen[rank].
void route_choose(RouteArgs a) {
    uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    for (uint e = tid; e < a.n; e += wg) rt_choice[e] = a.has_bias != 0u ? rt_scores[e] + RT_BIAS(e) : rt_scores[e];
    barrier();
    if (a.n_group > 0u) {
        uint per = a.n / a.n_group;
        for (uint g = tid; g < a.n_group; g += wg) {
            float b1 = NEG_INF, b2 = NEG_INF;
            for (uint e = g * per; e < (g + 1u) * per; e++) {
                float v = rt_choice[e];
                if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) { b2 = v; }
            }
            rt_gscore[g] = per >= 2u && a.group_max == 0u ? b1 + b2 : b1;
            rt_keep[g] = 0u;
        }
        barrier();
        if (tid == 0u) {
            for (uint t = 0u; t < a.topk_group; t++) {
                uint bi = 0xffffffffu; float bv = NEG_INF;
                for (uint g = 0u; g < a.n_group; g++) {
                    if (rt_keep[g] == 0u && (bi == 0xffffffffu || rt_better(rt_gscore[g], g, bv, bi))) { bv = rt_gscore[g]; bi = g; }
                }
                rt_keep[bi] = 1u;
            }
        }
        barrier();
        for (uint e = tid; e < a.n; e += wg) if (rt_keep[e / per] == 0u) rt_choice[e] = NEG_INF;
        barrier();
    }
    // An expert's rank is how many experts beat it in a strict order (by value, then the lower
    // index), so the k best are the ranks below k: the same choice as k rounds of arg-max, in
    // one pass and one barrier (a count stops at k).
    for (uint e = tid; e < a.n; e += wg) {
        float v = rt_choice[e];
        uint rank = 0u;
        for (uint o = 0u; o < a.n && rank < a.top_k; o++) {
            if (rt_better(rt_choice[o], o, v, e)) rank++;
        }
        if (rank < a.top_k) rt_chosen[rank] = e;
    }
    barrier();
}

// 3. Rank k's weight (after route_choose): its score, renormalized over the chosen ones' sum
//    (added in rank order) where asked, times the scale.
float route_weight(RouteArgs a, uint k) {
    float s = 0.0;
    for (uint j = 0u; j < a.top_k; j++) s += rt_scores[rt_chosen[j]];
    if (a.scoring != 0u) s += 1e-20;
    float w = rt_scores[rt_chosen[k]];
    if (a.renormalize != 0u) w = div_rn(w, s);
    return w * a.scale;
}
