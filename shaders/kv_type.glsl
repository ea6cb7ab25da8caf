// kv_type.glsl: the element type of an attention layer's K/V mirror and of its read-back rows:
// f32, or with KV_F16 16-bit floats (half the bytes a decode step reads over the context).
// KV_T is the stored type and KV_T4 four of them; a load widens with float() / vec4(), a store
// narrows with KV_T() (round to nearest even, as the host's f16 of the same value). Offsets and
// indices count elements of KV_T.
// Must not: be included after a declaration (it may enable an extension).
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#define KV_T float16_t
#define KV_T4 f16vec4
#else
#define KV_T float
#define KV_T4 vec4
#endif
