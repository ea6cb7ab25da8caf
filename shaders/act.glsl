// act.glsl: the activation functions of the elementwise kernels and of the fused inputs of
// the matrix kernels, with the CPU's formulas (runtime/src/cpu/elementwise.rs): SiLU, sigmoid,
// GELU (erf and tanh forms), and glu_apply, the gated unit of each GluKind.
// Must not: declare bindings or push constants.

float sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
float silu(float x) { return x / (1.0 + exp(-x)); }
float erf_cf(float xf) {
    float x = abs(xf);
    float t = 1.0 / (1.0 + 0.5 * x);
    float y = 1.0 - t * exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
    return xf >= 0.0 ? y : -y;
}
float gelu(float x) { return 0.5 * x * (1.0 + erf_cf(x / 1.41421356237309515)); }
float gelu_tanh(float x) {
    float c = 0.797884560802865406;
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

// kind: 0 SwiGLU, 1 GeGLU, 2 clamped SwiGLU (gate clamped above at `limit`, up to
// [-limit, limit], g * sigmoid(alpha g) * (u + 1)), 3 DeepSeek V4's limited SwiGLU (the same
// clamps, g * sigmoid(g) * u).
float glu_apply(uint kind, float g, float u, float limit, float alpha) {
    if (kind == 0u) return silu(g) * u;
    if (kind == 1u) return gelu(g) * u;
    float gg = min(g, limit);
    if (kind == 3u) return gg * sigmoid(gg) * clamp(u, -limit, limit);
    return gg * sigmoid(alpha * gg) * (clamp(u, -limit, limit) + 1.0);
}
