//! Compiles every shader variant of `shaders/variants.rs` with shaderc and writes the SPIR-V
//! the runtime embeds: `shaders/spirv/<name>.spv`, plus `shaders/spirv/SOURCES` (the hash of
//! the sources it was compiled from, which the runtime's staleness test compares). Blobs the
//! table no longer names are removed. `--check` compiles into memory and fails if any
//! committed blob differs from what the sources give (the same shaderc: Cargo.lock pins it).
//!
//! Must not: decide anything the device decides at run time (workgroup and subgroup sizes are
//! specialization constants), or be needed to build coli.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

include!("../../../shaders/variants.rs");

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders");
    match run(&root, check) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shaders: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(root: &Path, check: bool) -> Result<(), String> {
    let out = root.join("spirv");
    let compiler = shaderc::Compiler::new().map_err(|e| format!("shaderc did not initialize: {e}"))?;
    let mut failures = Vec::new();
    let mut differ = Vec::new();
    let blobs = blobs();
    for blob in &blobs {
        let path = root.join(blob.file);
        let source = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let words = match compile(&compiler, root, blob.file, &source, &blob.defines) {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{}: {e}", blob.name));
                continue;
            }
        };
        let spv = out.join(format!("{}.spv", blob.name));
        if check {
            if std::fs::read(&spv).ok().as_deref() != Some(&words[..]) {
                differ.push(blob.name.clone());
            }
        } else {
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            std::fs::write(&spv, &words).map_err(|e| format!("{}: {e}", spv.display()))?;
        }
    }
    if !failures.is_empty() {
        return Err(format!("compilation failed:\n{}", failures.join("\n")));
    }
    let hash = sources_hash(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let stamp = format!("sources {hash:016x}\nblobs {}\n", blobs.len());
    let stamp_path = out.join("SOURCES");
    if check {
        if std::fs::read_to_string(&stamp_path).ok().as_deref() != Some(&stamp[..]) {
            differ.push("SOURCES".into());
        }
        if !differ.is_empty() {
            return Err(format!("committed SPIR-V differs from the sources: {}", differ.join(", ")));
        }
        eprintln!("shaders: {} blobs match their sources", blobs.len());
        return Ok(());
    }
    let keep: Vec<PathBuf> = blobs.iter().map(|b| out.join(format!("{}.spv", b.name))).collect();
    for entry in std::fs::read_dir(&out).map_err(|e| e.to_string())? {
        let p = entry.map_err(|e| e.to_string())?.path();
        if p.extension().is_some_and(|x| x == "spv") && !keep.contains(&p) {
            std::fs::remove_file(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    std::fs::write(&stamp_path, stamp).map_err(|e| format!("{}: {e}", stamp_path.display()))?;
    eprintln!("shaders: wrote {} blobs to {}", blobs.len(), out.display());
    Ok(())
}

fn compile(
    compiler: &shaderc::Compiler,
    root: &Path,
    file: &str,
    source: &str,
    defines: &[&str],
) -> Result<Vec<u8>, String> {
    let mut opts = shaderc::CompileOptions::new().map_err(|e| e.to_string())?;
    opts.set_target_env(shaderc::TargetEnv::Vulkan, shaderc::EnvVersion::Vulkan1_2 as u32);
    opts.set_target_spirv(shaderc::SpirvVersion::V1_5);
    opts.set_optimization_level(shaderc::OptimizationLevel::Performance);
    for d in defines {
        opts.add_macro_definition(d, Some("1"));
    }
    let root = root.to_path_buf();
    opts.set_include_callback(move |name, _ty, _from, _depth| {
        let path = root.join(name);
        let content = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(shaderc::ResolvedInclude { resolved_name: path.display().to_string(), content })
    });
    let art = compiler
        .compile_into_spirv(source, shaderc::ShaderKind::Compute, file, "main", Some(&opts))
        .map_err(|e| e.to_string())?;
    Ok(art.as_binary_u8().to_vec())
}
