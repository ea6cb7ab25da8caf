#version 450
// attn_split.comp: decode and long-context attention with the positions split across
// workgroups (attn_split.glsl).
#extension GL_GOOGLE_include_directive : require
#include "attn_split.glsl"
