// moe.glsl: what the routed-expert kernels (moe_*.comp) share: the expert of a (row, rank)
// pair read from the routing buffer (Route's output: per row top_k pairs (expert as a float,
// weight), by rank), and the gated unit, in the formulas of the CPU (runtime/src/cpu/
// elementwise.rs) and glu.comp: kinds 0 SwiGLU, 1 GeGLU, 2 clamped SwiGLU (gpt-oss), 3 limited
// SwiGLU (DeepSeek V4: the same clamps, g * sigmoid(g) * u).
// A shader that reads the routing declares `routing[]` and defines R_OFF (the routing view's
// first element) and TOP_K.
// Must not: declare bindings, or trust an expert id: one outside 0..experts is reported as
// `experts` and the kernels skip the pair.

float moe_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float moe_silu(float x) { return x / (1.0 + exp(-x)); }
float moe_erf(float xf) {
    float x = abs(xf);
    float t = 1.0 / (1.0 + 0.5 * x);
    float y = 1.0 - t * exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
    return xf >= 0.0 ? y : -y;
}

float moe_glu(uint kind, float g, float u, float limit, float alpha) {
    if (kind == 0u) return moe_silu(g) * u;
    if (kind == 1u) return 0.5 * g * (1.0 + moe_erf(g / 1.41421356237309515)) * u;
    float gg = min(g, limit);
    float uu = clamp(u, -limit, limit);
    if (kind == 3u) return gg * moe_sigmoid(gg) * uu;
    return gg * moe_sigmoid(alpha * gg) * (uu + 1.0);
}

#ifdef R_OFF
// The expert of pair (row r, rank k), or `experts` when the id is not a valid expert.
uint moe_expert(uint r, uint k, uint experts) {
    float e = routing[R_OFF + r * 2u * TOP_K + 2u * k];
    return (e >= 0.0 && e < float(experts)) ? uint(e) : experts;
}

float moe_weight(uint r, uint k) { return routing[R_OFF + r * 2u * TOP_K + 2u * k + 1u]; }
#endif
