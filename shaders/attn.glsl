// attn.glsl: the interface the attention shaders share: buffers (queries, the layer's cached
// keys and values, output, per-head sinks) and the push constants of one call. Row i of the
// block is at position pos0 + i and sees positions lo(i)..=pos0 + i, lo = max(0, p + 1 - window)
// with a window (window = 0: none). GQA: head h reads kv head h / (heads / kv_heads).
// With flags bit 2 (dyn_pos()), pos0 is params[0] (a recording replayed at every position) and
// the split count and chunk follow from it as the host computes them (ops/attention.rs):
// attn_setup(). `value_scale` multiplies the values, so each head's output (MiMo-V2-Flash's
// attention_value_scale; 1 elsewhere).
// With flags bit 3 (has_rel()), relative-position logits (Inkling's) are added to the scaled
// scores: the logit of block row `row`, head h and backward distance d < extent is
// sum_i r[row, h * d_rel + i] * proj[i, d] (rel_r from rel_c[0], rows of heads * d_rel;
// rel_p `[d_rel, extent]`; rel_c: r offset, d_rel, extent), zero from extent on. Reference:
// `cpu::attention::rel_logits` and `attend_rel` (the same sum in the same order).
// With ring != 0 the mirror is a ring of that many rows: position j is row j % ring (a sliding
// window's mirror, which holds the window and one block; the caller keeps every position a
// row sees in it).
// The mirror's keys and values are KV_T (kv_type.glsl, which the kernel includes first): k_off,
// v_off, k_at and v_at count its elements.
// Must not: define main or workgroup sizes.

layout(std430, binding = 0) readonly buffer Q { float qv[]; };
layout(std430, binding = 1) readonly buffer K { KV_T kv[]; };
layout(std430, binding = 2) readonly buffer V { KV_T vv[]; };
layout(std430, binding = 3) readonly buffer SINK { float sinks[]; };
layout(std430, binding = 7) readonly buffer PRM { uint params[]; };

layout(push_constant) uniform PC {
    uint n; uint heads; uint kv_heads; uint head_dim;
    uint v_head_dim; uint pos0; uint window; uint flags;
    float scale; uint q_off; uint k_off; uint v_off;
    uint o_off; uint splits; uint chunk; float value_scale;
    uint ring; uint pad0; uint pad1; uint pad2;
} pc;

// As ops/attention.rs: positions per split at least MIN_CHUNK; with the position read on the
// device, at most pc.splits splits (the dispatch's, which the partials are sized for).
#define MIN_CHUNK 32u
uint g_pos0, g_splits, g_chunk;

bool dyn_pos() { return (pc.flags & 4u) != 0u; }

void attn_setup() {
    if (!dyn_pos()) {
        g_pos0 = pc.pos0;
        g_splits = pc.splits;
        g_chunk = pc.chunk;
        return;
    }
    g_pos0 = params[0];
    uint len = g_pos0 + pc.n;
    uint span = pc.window != 0u ? min(pc.window, len) : len;
    g_splits = clamp((span + MIN_CHUNK - 1u) / MIN_CHUNK, 1u, max(pc.splits, 1u));
    g_chunk = (span + g_splits - 1u) / g_splits;
}

// flags: bit 0 the heads have sink logits; bit 1 (attn_split.comp) RoPE and the KV append
// are the kernel's (see there); bit 2 the position is read on the device (attn_setup); bit 3
// relative logits (rel_bias; attn_split.comp and attn_block.comp only).
bool has_sink() { return (pc.flags & 1u) != 0u; }

// The relative logits' buffers (bindings 19-21); a kernel without them (attn_coop.comp)
// defines ATTN_NO_REL, so its layout stays at 8 bindings.
#ifndef ATTN_NO_REL
layout(std430, binding = 19) readonly buffer RELR { float rel_r[]; };
layout(std430, binding = 20) readonly buffer RELP { float rel_p[]; };
layout(std430, binding = 21) readonly buffer RELC { uint rel_c[]; };

bool has_rel() { return (pc.flags & 8u) != 0u; }

// The relative logit of block row `row`, head h, `dist` positions back (0 without them).
float rel_bias(uint row, uint h, uint dist) {
    if (!has_rel()) return 0.0;
    uint d_rel = rel_c[1], extent = rel_c[2];
    if (dist >= extent) return 0.0;
    uint rb = rel_c[0] + (row * pc.heads + h) * d_rel;
    float acc = 0.0;
    for (uint i = 0u; i < d_rel; i++) acc += rel_r[rb + i] * rel_p[i * extent + dist];
    return acc;
}
#endif

uint row_lo(uint p) { return (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u; }
uint kv_head(uint h) { return h / (pc.heads / pc.kv_heads); }
uint q_at(uint row, uint h) { return pc.q_off + row * pc.heads * pc.head_dim + h * pc.head_dim; }
// The mirror row of position j.
uint slot(uint j) { return pc.ring != 0u ? j % pc.ring : j; }
// Positions from j on that lie in consecutive rows (to the ring's end), at most `most`.
uint run_from(uint j, uint most) { return pc.ring != 0u ? min(most, pc.ring - j % pc.ring) : most; }
uint k_at(uint j, uint kh) { return pc.k_off + slot(j) * pc.kv_heads * pc.head_dim + kh * pc.head_dim; }
uint v_at(uint j, uint kh) { return pc.v_off + slot(j) * pc.kv_heads * pc.v_head_dim + kh * pc.v_head_dim; }
