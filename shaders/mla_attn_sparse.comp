#version 450
// mla_attn_sparse.comp: the absorbed attention core of multi-head latent attention over each
// row's selected positions (DeepSeek Sparse Attention; the body and its notes: mla_attn.glsl).
#extension GL_GOOGLE_include_directive : require
#define SPARSE
#include "mla_attn.glsl"
