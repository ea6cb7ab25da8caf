//! Names the static libraries Debian 12's `libshaderc_combined.a` leaves out (see `src/lib.rs`),
//! from `SHADERC_LIB_DIR` (set for every build in `.cargo/config.toml`).
//!
//! Must not: search for libraries anywhere but the one directory, or build anything.

fn main() {
    println!("cargo:rerun-if-env-changed=SHADERC_LIB_DIR");
    let dir = std::env::var("SHADERC_LIB_DIR").unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu".into());
    println!("cargo:rustc-link-search=native={dir}");
    // Each is needed: glslang's front end and code generation, its SPIR-V back end and the
    // optimizer shaderc runs. A directory where libglslang.a is missing (a shaderc built from
    // source bundles everything) gets nothing extra.
    if !std::path::Path::new(&dir).join("libglslang.a").exists() {
        return;
    }
    for lib in [
        "glslang",
        "MachineIndependent",
        "GenericCodeGen",
        "OSDependent",
        "OGLCompiler",
        "HLSL",
        "SPIRV",
        "glslang-default-resource-limits",
        "SPIRV-Tools-opt",
        "SPIRV-Tools",
    ] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
}
