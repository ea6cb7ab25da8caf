#version 450
// mla_attn.comp: the absorbed attention core of multi-head latent attention over every cached
// position at or before each row (the body and its notes: mla_attn.glsl).
#extension GL_GOOGLE_include_directive : require
#include "mla_attn.glsl"
