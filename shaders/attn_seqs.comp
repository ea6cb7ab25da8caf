#version 450
// attn_seqs.comp: attn_split.comp's one-row decode for each sequence of a batched step in one
// dispatch, each over its own mirror (attn_split.glsl with SEQS; buffer device addresses).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
#define SEQS
#include "attn_split.glsl"
