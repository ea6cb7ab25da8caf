//! Embeds the committed SPIR-V under `shaders/spirv/` and writes `$OUT_DIR/shaders.rs`: the
//! `Kernel` enum (one variant per shader source), the table of weight-format variants (one
//! source, one `#define` per format) and `spirv(kernel, variant)` / `spirv_dot` returning the
//! embedded words (`include_bytes!`). The table is `shaders/variants.rs`; the blobs are made
//! from it by `tools/shaders` (`bash tools/shaders.sh`), so building coli needs no shader
//! compiler. When the sources no longer hash to what `shaders/spirv/SOURCES` records, the build
//! warns and `runtime/tests/shaders_fresh.rs` fails.
//!
//! Must not: read anything outside `shaders/`, or decide at build time anything the device
//! decides at run time (workgroup and subgroup sizes are specialization constants).

use std::fmt::Write as _;
use std::path::Path;

include!("../shaders/variants.rs");

fn main() {
    // Read when the script runs, not when it is compiled: one compiled script may serve checkouts
    // at other paths that share a target directory.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("../shaders");
    let spirv = root.join("spirv");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-changed={}", spirv.display());
    for dir in [&root, &spirv] {
        for entry in std::fs::read_dir(dir).expect("shaders/ is readable").flatten() {
            println!("cargo:rerun-if-changed={}", entry.path().display());
        }
    }
    let recorded = std::fs::read_to_string(spirv.join("SOURCES")).unwrap_or_default();
    let current = sources_hash(&root).map(|h| format!("sources {h:016x}")).unwrap_or_default();
    if recorded.lines().next() != Some(current.as_str()) {
        println!(
            "cargo:warning=shaders/ changed since shaders/spirv/ was generated: run `bash tools/shaders.sh` to compile them"
        );
    }
    let mut missing = Vec::new();
    let mut arms = String::new();
    let mut dot_arms = String::new();
    for blob in blobs() {
        let spv = spirv.join(format!("{}.spv", blob.name));
        if !spv.is_file() {
            missing.push(blob.name.clone());
            continue;
        }
        let pat = match blob.variant {
            Some(v) => format!("(Kernel::{}, Some(FormatVariant::{v}))", blob.kernel),
            None => format!("(Kernel::{}, None)", blob.kernel),
        };
        let arm = format!("        {pat} => Some(include_bytes!({:?})),\n", spv.display().to_string());
        if blob.dot {
            dot_arms.push_str(&arm);
        } else {
            arms.push_str(&arm);
        }
    }
    if !missing.is_empty() {
        panic!("shaders/spirv/ lacks {}: run `bash tools/shaders.sh` to compile them", missing.join(", "));
    }
    let mut gen = String::new();
    gen.push_str("/// A compute shader source under `shaders/` (generated from `shaders/variants.rs`).\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\npub enum Kernel {\n");
    for &(k, file, _) in KERNELS {
        writeln!(gen, "    /// `shaders/{file}`\n    {k},").expect("a String takes writes");
    }
    for &(k, of) in KV16_KERNELS {
        writeln!(gen, "    /// `{of}` with the K/V mirror in 16-bit floats (`KV_F16`)\n    {k},")
            .expect("a String takes writes");
    }
    gen.push_str("}\n\nimpl Kernel {\n    /// Whether the shader is compiled once per `FormatVariant`.\n");
    gen.push_str("    pub fn per_format(self) -> bool {\n        match self {\n");
    for &(k, _, pf) in KERNELS {
        writeln!(gen, "            Kernel::{k} => {pf},").expect("a String takes writes");
    }
    for &(k, _) in KV16_KERNELS {
        writeln!(gen, "            Kernel::{k} => false,").expect("a String takes writes");
    }
    gen.push_str("        }\n    }\n\n");
    gen.push_str("    /// The twin of this kernel that keeps the K/V mirror in 16-bit floats, if it has one.\n");
    gen.push_str("    pub fn kv16(self) -> Option<Kernel> {\n        match self {\n");
    for &(k, of) in KV16_KERNELS {
        writeln!(gen, "            Kernel::{of} => Some(Kernel::{k}),").expect("a String takes writes");
    }
    gen.push_str("            _ => None,\n        }\n    }\n\n");
    gen.push_str("    /// The kernel whose source this one is compiled from (itself but for a `kv16` twin).\n");
    gen.push_str("    pub fn base(self) -> Kernel {\n        match self {\n");
    for &(k, of) in KV16_KERNELS {
        writeln!(gen, "            Kernel::{k} => Kernel::{of},").expect("a String takes writes");
    }
    gen.push_str("            k => k,\n        }\n    }\n}\n\n");
    gen.push_str("/// The weight-format variants a per-format shader is compiled for.\n");
    gen.push_str("#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\n#[allow(non_camel_case_types)]\npub enum FormatVariant {\n");
    for &(v, d) in FORMATS {
        writeln!(gen, "    /// compiled with `{}`\n    {v},", d.join(", ")).expect("a String takes writes");
    }
    gen.push_str("}\n\n/// The SPIR-V of a kernel (and its variant), as bytes.\n");
    gen.push_str("pub fn spirv(kernel: Kernel, variant: Option<FormatVariant>) -> Option<&'static [u8]> {\n    match (kernel, variant) {\n");
    gen.push_str(&arms);
    gen.push_str("        _ => None,\n    }\n}\n\n");
    gen.push_str(
        "/// The SPIR-V of a kernel variant built with `HW_DOT` (the device's integer dot product), if any.\n",
    );
    gen.push_str("pub fn spirv_dot(kernel: Kernel, variant: Option<FormatVariant>) -> Option<&'static [u8]> {\n    match (kernel, variant) {\n");
    gen.push_str(&dot_arms);
    gen.push_str("        _ => None,\n    }\n}\n");
    std::fs::write(out.join("shaders.rs"), gen).expect("OUT_DIR is writable");
}
