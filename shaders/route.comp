#version 450
// route.comp: a row's router logits to its top-k (expert, weight) pairs, as the CPU's
// route_row (runtime/src/cpu/route.rs): softmax, sigmoid or sqrt(softplus) scores (`scoring`
// 0, 1, 2; softplus as torch's, x past 20 as x); a correction bias that
// steers the choice only; group-limited top-k (a group scores the sum of its two best
// choices, or its best with group_max); ties toward the lower index; renormalization; a scale. One workgroup per row;
// the top-k by ranks (each expert counts who beats it), not by rounds of arg-max.
// With `hash` (DeepSeek V4's hash routing, route_row_hash): the row's experts are its token's
// row of the table (`tokens[row]`, `table` [vocab, top_k] of expert ids as floats), in order,
// weighed by their scores; a token past the vocabulary or an id past the experts gives the
// expert `n` (which the expert kernels skip) with weight 0.
// With `shared` experts (Inkling's sink, route_row_shared): a row's logits are the `n` routed
// experts' then the shared ones'; the top-k among the routed as above, their weights their
// scores, then the pairs (n + s, sigmoid(logit)); renormalized over all of them (no 1e-20),
// times the scale and `scale_by[0]` where has_scale_by is set.
// Output per row: 2 * (top_k + shared) floats, (expert as float, weight) by rank.
// Must not: take more than MAX_E experts or MAX_K ranks (the host checks).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define MAX_E 1024
#define MAX_K 64
#define MAX_G 64
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

shared float scores[MAX_E];
shared float choice[MAX_E];
shared float red_v[64];
shared uint chosen[MAX_K];
shared float gscore[MAX_G];
shared uint keep[MAX_G];

bool better(float v1, uint i1, float v2, uint i2) { return v1 > v2 || (v1 == v2 && i1 < i2); }

// ln(1 + e^x) as torch computes it (x past 20: x), log1p by the quotient that keeps its
// relative precision where e^x is tiny.
float softplus(float x) {
    if (x > 20.0) return x;
    float u = exp(x);
    float w = 1.0 + u;
    return w == 1.0 ? u : log(w) * (u / (w - 1.0));
}

void main() {
    uint r = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint lb = pc.l_off + r * (pc.n + pc.shared_);
    // 1. scores
    float m = NEG_INF;
    for (uint e = tid; e < pc.n; e += 64u) m = max(m, logits[lb + e]);
    red_v[tid] = m;
    barrier();
    if (tid == 0u) {
        float mm = NEG_INF;
        for (uint t = 0u; t < 64u; t++) mm = max(mm, red_v[t]);
        red_v[0] = mm;
    }
    barrier();
    m = red_v[0];
    barrier();
    for (uint e = tid; e < pc.n; e += 64u) {
        float l = logits[lb + e];
        scores[e] = pc.scoring == 1u ? 1.0 / (1.0 + exp(-l)) : pc.scoring == 2u ? sqrt(softplus(l)) : exp(l - m);
    }
    barrier();
    if (pc.scoring == 0u) {
        if (tid == 0u) {
            float s = 0.0;
            for (uint e = 0u; e < pc.n; e++) s += scores[e];
            red_v[0] = s;
        }
        barrier();
        float s = red_v[0];
        for (uint e = tid; e < pc.n; e += 64u) scores[e] = div_rn(scores[e], s);
        barrier();
    }
    // Hash routing: the token's row of the table, in order.
    if (pc.hash != 0u) {
        if (tid == 0u) {
            uint tok = tokens[pc.t_off + r];
            float s = 0.0;
            for (uint k = 0u; k < pc.top_k; k++) {
                float id = tok < pc.vocab ? table[tok * pc.top_k + k] : -1.0;
                bool ok = id >= 0.0 && id < float(pc.n);
                chosen[k] = ok ? uint(id) : pc.n;
                s += ok ? scores[chosen[k]] : 0.0;
            }
            s = pc.renormalize != 0u ? s + 1e-20 : 1.0;
            uint ob = pc.o_off + r * 2u * pc.top_k;
            for (uint k = 0u; k < pc.top_k; k++) {
                float w = chosen[k] < pc.n ? scores[chosen[k]] : 0.0;
                outv[ob + 2u * k] = float(chosen[k]);
                outv[ob + 2u * k + 1u] = div_rn(w, s) * pc.scale;
            }
        }
        return;
    }
    for (uint e = tid; e < pc.n; e += 64u) choice[e] = pc.has_bias != 0u ? scores[e] + bias[e] : scores[e];
    barrier();
    // 2. group limit
    if (pc.n_group > 0u) {
        uint per = pc.n / pc.n_group;
        for (uint g = tid; g < pc.n_group; g += 64u) {
            float b1 = NEG_INF, b2 = NEG_INF;
            for (uint e = g * per; e < (g + 1u) * per; e++) {
                float v = choice[e];
                if (v > b1) { b2 = b1; b1 = v; } else if (v > b2) { b2 = v; }
            }
            gscore[g] = per >= 2u && pc.group_max == 0u ? b1 + b2 : b1;
            keep[g] = 0u;
        }
        barrier();
        if (tid == 0u) {
            for (uint t = 0u; t < pc.topk_group; t++) {
                uint bi = 0xffffffffu; float bv = NEG_INF;
                for (uint g = 0u; g < pc.n_group; g++) {
                    if (keep[g] == 0u && (bi == 0xffffffffu || better(gscore[g], g, bv, bi))) { bv = gscore[g]; bi = g; }
                }
                keep[bi] = 1u;
            }
        }
        barrier();
        for (uint e = tid; e < pc.n; e += 64u) if (keep[e / per] == 0u) choice[e] = NEG_INF;
        barrier();
    }
    // 3. top-k: an expert's rank is how many experts beat it in a strict order (by value,
    //    then the lower index), so the k best are the ranks below k: the same choice as k
    //    rounds of arg-max, in one pass and one barrier (a count stops at k).
    for (uint e = tid; e < pc.n; e += 64u) {
        float v = choice[e];
        uint rank = 0u;
        for (uint o = 0u; o < pc.n && rank < pc.top_k; o++) {
            if (better(choice[o], o, v, e)) rank++;
        }
        if (rank < pc.top_k) chosen[rank] = e;
    }
    barrier();
    // 4. weights (with shared experts: theirs after the routed, then one normalization)
    if (tid == 0u && pc.shared_ > 0u) {
        uint ob = pc.o_off + r * 2u * (pc.top_k + pc.shared_);
        float s = 0.0;
        for (uint k = 0u; k < pc.top_k; k++) s += scores[chosen[k]];
        for (uint j = 0u; j < pc.shared_; j++) s += 1.0 / (1.0 + exp(-logits[lb + pc.n + j]));
        float f = pc.renormalize != 0u ? div_rn(1.0, s) : 1.0;
        f = f * pc.scale * (pc.has_scale_by != 0u ? scale_by[0] : 1.0);
        for (uint k = 0u; k < pc.top_k + pc.shared_; k++) {
            bool routed = k < pc.top_k;
            float w = routed ? scores[chosen[k]] : 1.0 / (1.0 + exp(-logits[lb + pc.n + k - pc.top_k]));
            outv[ob + 2u * k] = float(routed ? chosen[k] : pc.n + k - pc.top_k);
            outv[ob + 2u * k + 1u] = w * f;
        }
        return;
    }
    if (tid == 0u) {
        float s = 0.0;
        for (uint k = 0u; k < pc.top_k; k++) s += scores[chosen[k]];
        if (pc.scoring != 0u) s += 1e-20;
        uint ob = pc.o_off + r * 2u * pc.top_k;
        for (uint k = 0u; k < pc.top_k; k++) {
            float w = scores[chosen[k]];
            if (pc.renormalize != 0u) w = div_rn(w, s);
            outv[ob + 2u * k] = float(chosen[k]);
            outv[ob + 2u * k + 1u] = w * pc.scale;
        }
    }
}
