// common.glsl: helpers every coli compute shader shares: exactly rounded division (GPUs divide
// to 2.5 ulp; the CPU reference divides exactly, and the q8 activations must match its bits),
// packed byte dot products, half/bfloat unpacking, and a sine/cosine with explicit range
// reduction (the driver's may be accurate only to 2^-11).
// Must not: declare bindings or push constants (each shader owns its interface).

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#ifdef HW_DOT
#extension GL_EXT_integer_dot_product : require
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

// The rounding error of a product: a * b = p + prod_err(a, b, p) exactly, p = a * b rounded
// (Dekker: each factor split into halves of 12 bits, whose products are exact). Correctly
// rounded products and sums only, which Vulkan guarantees; its fma may be a rounded product and
// a rounded sum (Lavapipe's), so no residual here takes it.
float prod_err(float a, float b, float p) {
    precise float ca = 4097.0 * a;
    precise float ah = ca - (ca - a);
    precise float al = a - ah;
    precise float cb = 4097.0 * b;
    precise float bh = cb - (cb - b);
    precise float bl = b - bh;
    precise float e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    return e;
}

// a / b, rounded to nearest as IEEE division (the CPU's): the driver's reciprocal (2.5 ulp),
// one Newton step on the quotient (within an ulp after it), then the quotient moved to its
// neighbour while the exact remainder a - q * b says the neighbour is nearer (a quotient of
// floats is never halfway between two). Each remainder is exact: a - p by Sterbenz (p is
// within a few ulps of a), and a - q * b itself is a float once q is within an ulp of a / b.
// Two steps cover a quotient just above a power of two, where the gap below halves.
float div_rn(float a, float b) {
    precise float y = 1.0 / b;
    precise float q = a * y;
    precise float p = q * b;
    precise float r = (a - p) - prod_err(q, b, p);
    precise float c = r * y;
    q = q + c;
    [[unroll]] for (int i = 0; i < 2; i++) {
        p = q * b;
        r = (a - p) - prod_err(q, b, p);
        if (r == 0.0) break;
        // The neighbour of q towards a / b: away from zero when q and r / b agree in sign.
        bool grow = ((r > 0.0) == (b > 0.0)) == (q > 0.0);
        float n = uintBitsToFloat(floatBitsToUint(q) + (grow ? 1u : 0xffffffffu));
        precise float gap = abs(b) * abs(n - q);
        precise float twice = 2.0 * abs(r);
        if (twice > gap) q = n;
        else break;
    }
    return q;
}

// A q8 block's scale and its inverse from the block's largest |value|: d = amax / 127 and
// 1 / d, both rounded to nearest (div_rn), 0 for an all-zero block. With `q8_code`, the one
// rounding every q8 block a shader writes takes (q8_block, quantize_rows.comp's blocks,
// moe_matvec.comp's h blocks), bit for bit as the CPU's QuantizedActs.
vec2 q8_scale(float amax) {
    float d = div_rn(amax, 127.0);
    return vec2(d, d > 0.0 ? div_rn(1.0, d) : 0.0);
}

// The 8-bit code of x at inverse scale id: round_half_even(x * id) clamped to an i8.
int q8_code(float x, float id) {
    precise float t = x * id;
    return clamp(int(roundEven(t)), -128, 127);
}

// A block of 32 activations to 8 bits (`q8_scale`, `q8_code`); the codes four to a word, as two
// uvec4 (lo: codes 0-15, hi: 16-31); returns (d, d * the codes' sum). Every q8 block a shader
// writes from a whole block in hand comes from here (quantize_q8.comp, moe_glu_q8.comp,
// attn_split.comp).
vec2 q8_block(float v[32], out uvec4 lo, out uvec4 hi) {
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(v[i]));
    vec2 sc = q8_scale(amax);
    float d = sc.x, id = sc.y;
    uint words[8];
    int sum = 0;
    for (uint w = 0u; w < 8u; w++) {
        uint packed = 0u;
        for (uint j = 0u; j < 4u; j++) {
            int q = q8_code(v[4u * w + j], id);
            sum += q;
            packed |= (uint(q) & 0xffu) << (8u * j);
        }
        words[w] = packed;
    }
    lo = uvec4(words[0], words[1], words[2], words[3]);
    hi = uvec4(words[4], words[5], words[6], words[7]);
    return vec2(d, d * float(sum));
}

int sbyte(uint w, uint i) { return bitfieldExtract(int(w), int(8 * i), 8); }

#ifdef HW_DOT
// The device's packed dot products (one instruction each where it accelerates them); the
// same exact integers as the arithmetic below.
int dot4_us(uint a, uint b) { return dotPacked4x8EXT(int(b), a); }
int dot4_ss(uint a, uint b) { return dotPacked4x8EXT(int(a), int(b)); }
int sum4_s(uint b) { return dotPacked4x8EXT(int(b), int(0x01010101)); }
#else
// Sum over 4 bytes of a (unsigned, 0..255) times b (signed).
int dot4_us(uint a, uint b) {
    return int(a & 0xffu) * sbyte(b, 0) + int((a >> 8) & 0xffu) * sbyte(b, 1)
         + int((a >> 16) & 0xffu) * sbyte(b, 2) + int(a >> 24) * sbyte(b, 3);
}

// Sum over 4 bytes of a times b, both signed.
int dot4_ss(uint a, uint b) {
    return sbyte(a, 0) * sbyte(b, 0) + sbyte(a, 1) * sbyte(b, 1)
         + sbyte(a, 2) * sbyte(b, 2) + sbyte(a, 3) * sbyte(b, 3);
}

// Sum of the 4 signed bytes of b.
int sum4_s(uint b) { return sbyte(b, 0) + sbyte(b, 1) + sbyte(b, 2) + sbyte(b, 3); }
#endif

int dot16_us(uvec4 a, uvec4 b) { return dot4_us(a.x, b.x) + dot4_us(a.y, b.y) + dot4_us(a.z, b.z) + dot4_us(a.w, b.w); }
int dot16_ss(uvec4 a, uvec4 b) { return dot4_ss(a.x, b.x) + dot4_ss(a.y, b.y) + dot4_ss(a.z, b.z) + dot4_ss(a.w, b.w); }
int sum16_s(uvec4 b) { return sum4_s(b.x) + sum4_s(b.y) + sum4_s(b.z) + sum4_s(b.w); }

vec2 unpack_bf16x2(uint w) { return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u)); }

// sin and cos of an f32 angle: Cody-Waite reduction by pi/2 with the first three parts of
// 8 significant bits each, so k * part is exact (k < 2^16: angles up to ~1e5) and each
// subtraction exact or rounded at the scale of the result; no fma needed (Lavapipe does not
// fuse GLSL's fma). Then Taylor polynomials on [-pi/4, pi/4]; absolute error about 2e-7.
void sincos_rr(float a, out float s, out float c) {
    float k = roundEven(a * 0.636619772367581343);
    precise float r = a - k * 1.5703125;
    r = r - k * 4.84466552734375e-4;
    r = r - k * -6.407499313354492e-7;
    r = r - k * 9.92093629470503e-10;
    float r2 = r * r;
    float sr = r + r * r2 * (-1.0 / 6.0 + r2 * (1.0 / 120.0 + r2 * (-1.0 / 5040.0 + r2 * (1.0 / 362880.0))));
    float cr = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24.0 + r2 * (-1.0 / 720.0 + r2 * (1.0 / 40320.0 + r2 * (-1.0 / 3628800.0)))));
    int q = int(k) & 3;
    if (q == 0) { s = sr; c = cr; }
    else if (q == 1) { s = cr; c = -sr; }
    else if (q == 2) { s = -sr; c = -cr; }
    else { s = -cr; c = sr; }
}
