// kv_type.glsl: the element type of an attention layer's K/V mirror and of its read-back rows:
// f32, or with KV_F16 16-bit floats (half the bytes a decode step reads over the context).
// KV_T is the stored type and KV_T4 four of them; a load widens with float() / vec4(), a store
// narrows with KV_T() (round to nearest even, as the host's f16 of the same value). Offsets and
// indices count elements of KV_T.
// kv_round(x) is x as the mirror would keep it, as a float: for f16, round to nearest even done
// on the bits (NVIDIA's compiler folded float(float16_t(x)) back to x).
// Must not: be included after a declaration (it may enable an extension).
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#define KV_T float16_t
#define KV_T4 f16vec4
float kv_round(float x) {
    uint b = floatBitsToUint(x);
    uint s = b & 0x80000000u, a = b & 0x7fffffffu;
    // Infinities and NaNs as they are; from 65520 (halfway past the largest half) infinity.
    if (a >= 0x7f800000u) return x;
    if (a >= 0x477ff000u) return uintBitsToFloat(s | 0x7f800000u);
    if (a < 0x38800000u) {
        // Below 2^-14: the subnormal halves, steps of 2^-24 (the scalings are exact).
        float m = roundEven(uintBitsToFloat(a) * 16777216.0) * (1.0 / 16777216.0);
        return uintBitsToFloat(s | floatBitsToUint(m));
    }
    // Ten mantissa bits kept, ties to even.
    return uintBitsToFloat(s | ((a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu));
}
#else
#define KV_T float
#define KV_T4 vec4
float kv_round(float x) { return x; }
#endif
