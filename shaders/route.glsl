// route.glsl: one row's router logits to its top-k choice, as the CPU's route_row
// (runtime/src/cpu/route.rs): softmax or sigmoid scores; a correction bias that steers the
// choice only; group-limited top-k (a group scores the sum of its two best choices); ties
// toward the lower index; renormalization; a scale. The top-k by ranks (each expert counts
// who beats it), not by rounds of arg-max. Shared by route.comp (a workgroup a row) and
// moe_matvec.comp (each workgroup of the experts' first product routes its own row).
// The includer defines ROUTE_LOGIT(e) and ROUTE_BIAS(e): the row's logit and the correction
// bias of expert e. Every invocation of the workgroup calls route_row (it has barriers).
// Must not: take more than MAX_E experts, MAX_K ranks, MAX_G groups or ROUTE_MAX_WG
// invocations (the host checks the first three; the workgroups that include this are smaller).

#define MAX_E 1024
#define MAX_K 64
#define MAX_G 64
#define ROUTE_MAX_WG 256

struct RouteArgs {
    uint n; uint top_k; uint sigmoid_; uint renormalize;
    uint has_bias; uint n_group; uint topk_group; float scale;
};

shared float r_scores[MAX_E];
shared float r_choice[MAX_E];
shared float r_red[ROUTE_MAX_WG];
shared uint r_chosen[MAX_K];
shared float r_gscore[MAX_G];
shared uint r_keep[MAX_G];
shared float r_wsum;

bool route_better(float v1, uint i1, float v2, uint i2) { return v1 > v2 || (v1 == v2 && i1 < i2); }

// Leaves rank k's expert in r_chosen[k] (k < top_k), the scores in r_scores and the
// renormalization's divisor in r_wsum, for every invocation to read.
void route_row(RouteArgs a) {
    uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    // 1. scores
    float m = NEG_INF;
    for (uint e = tid; e < a.n; e += wg) m = max(m, ROUTE_LOGIT(e));
    r_red[tid] = m;
    barrier();
    if (tid == 0u) {
        float mm = NEG_INF;
        for (uint t = 0u; t < wg; t++) mm = max(mm, r_red[t]);
        r_red[0] = mm;
    }
    barrier();
    m = r_red[0];
    barrier();
    for (uint e = tid; e < a.n; e += wg) {
        float l = ROUTE_LOGIT(e);
        r_scores[e] = a.sigmoid_ != 0u ? 1.0 / (1.0 + exp(-l)) : exp(l - m);
    }
    barrier();
    if (a.sigmoid_ == 0u) {
        // The CPU's order: one sum from expert 0 up.
        if (tid == 0u) {
            float s = 0.0;
            for (uint e = 0u; e < a.n; e++) s += r_scores[e];
            r_red[0] = s;
        }
        barrier();
        float s = r_red[0];
        for (uint e = tid; e < a.n; e += wg) r_scores[e] = div_rn(r_scores[e], s);
        barrier();
    }
    for (uint e = tid; e < a.n; e += wg) r_choice[e] = a.has_bias != 0u ? r_scores[e] + ROUTE_BIAS(e) : r_scores[e];
    barrier();
    // 2. group limit
    if (a.n_group > 0u) {
        uint per = a.n / a.n_group;
        for (uint g = tid; g < a.n_group; g += wg) {
            float b1 = NEG_INF, b2 = NEG_INF;
            for (uint e = g * per; e < (g + 1u) * per; e++) {
                float v = r_choice[e];
                if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) { b2 = v; }
            }
            r_gscore[g] = per >= 2u ? b1 + b2 : b1;
            r_keep[g] = 0u;
        }
        barrier();
        if (tid == 0u) {
            for (uint t = 0u; t < a.topk_group; t++) {
                uint bi = 0xffffffffu; float bv = NEG_INF;
                for (uint g = 0u; g < a.n_group; g++) {
                    if (r_keep[g] == 0u && (bi == 0xffffffffu || route_better(r_gscore[g], g, bv, bi))) { bv = r_gscore[g]; bi = g; }
                }
                r_keep[bi] = 1u;
            }
        }
        barrier();
        for (uint e = tid; e < a.n; e += wg) if (r_keep[e / per] == 0u) r_choice[e] = NEG_INF;
        barrier();
    }
    // 3. top-k: an expert's rank is how many experts beat it in a strict order (by value,
    //    then the lower index), so the k best are the ranks below k: the same choice as k
    //    rounds of arg-max, in one pass and one barrier (a count stops at k).
    for (uint e = tid; e < a.n; e += wg) {
        float v = r_choice[e];
        uint rank = 0u;
        for (uint o = 0u; o < a.n && rank < a.top_k; o++) {
            if (route_better(r_choice[o], o, v, e)) rank++;
        }
        if (rank < a.top_k) r_chosen[rank] = e;
    }
    barrier();
    // 4. the renormalization's divisor, in rank order
    if (tid == 0u) {
        float s = 0.0;
        for (uint k = 0u; k < a.top_k; k++) s += r_scores[r_chosen[k]];
        if (a.sigmoid_ != 0u) s += 1e-20;
        r_wsum = s;
    }
    barrier();
}

// Rank k's weight, after route_row.
float route_weight(RouteArgs a, uint k) {
    float w = r_scores[r_chosen[k]];
    if (a.renormalize != 0u) w = div_rn(w, r_wsum);
    return w * a.scale;
}
