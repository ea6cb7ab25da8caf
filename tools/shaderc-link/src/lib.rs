//! An empty library whose only job is its build script: it puts the static glslang and
//! SPIRV-Tools libraries on the link line of whatever depends on it (here: the runtime's build
//! script, which runs shaderc to compile `shaders/*.comp`).
//!
//! Why a crate of its own: a build script cannot add libraries to its own link line, and the
//! `shaderc-sys` build script links Debian 12's `libshaderc_combined.a`, which (unlike the
//! upstream archive) does not contain glslang. Without these the link of the runtime's build
//! script fails with `rust-lld: undefined reference: glslang::TProgram::getInfoLog()`.
//! Libraries named by a dependency's build script do reach the dependent's link, and rust-lld
//! resolves archives regardless of their order on the line.
//!
//! Must not: contain code; it is linked only for its side effect.
