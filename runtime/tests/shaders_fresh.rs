//! The committed SPIR-V is what the shader sources give: `shaders/spirv/SOURCES` records the
//! hash of the sources and the variant table it was compiled from (`bash tools/shaders.sh`
//! writes it), and every blob the table names is there. A shader edited without regenerating
//! fails here. `tools/shaders.sh --check` recompiles and compares byte for byte where shaderc
//! is at hand.

use std::path::Path;

include!("../../shaders/variants.rs");

fn shaders_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders")
}

#[test]
fn committed_spirv_was_compiled_from_these_sources() {
    let root = shaders_dir();
    let recorded = std::fs::read_to_string(root.join("spirv/SOURCES")).expect("shaders/spirv/SOURCES");
    let hash = sources_hash(&root).expect("shaders/ is readable");
    assert_eq!(
        recorded.lines().next(),
        Some(format!("sources {hash:016x}").as_str()),
        "shaders/ changed since shaders/spirv/ was generated: run `bash tools/shaders.sh`"
    );
    assert_eq!(recorded.lines().nth(1), Some(format!("blobs {}", blobs().len()).as_str()));
}

#[test]
fn every_variant_has_a_blob_and_no_blob_is_stale() {
    let spirv = shaders_dir().join("spirv");
    let names: Vec<String> = blobs().iter().map(|b| format!("{}.spv", b.name)).collect();
    for n in &names {
        let bytes = std::fs::read(spirv.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(&bytes[..4], &[0x03, 0x02, 0x23, 0x07], "{n} is not SPIR-V");
    }
    for entry in std::fs::read_dir(&spirv).expect("shaders/spirv/") {
        let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
        assert!(name == "SOURCES" || names.contains(&name), "{name} is not in shaders/variants.rs");
    }
}

#[test]
fn the_hash_sees_a_changed_source() {
    let dir = std::env::temp_dir().join(format!("coli-shaders-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("a.comp"), "void main() {}\n").expect("write");
    let before = sources_hash(&dir).expect("hash");
    std::fs::write(dir.join("a.comp"), "void main() { }\n").expect("write");
    let edited = sources_hash(&dir).expect("hash");
    std::fs::write(dir.join("a.comp"), "void main() {}\r\n").expect("write");
    let crlf = sources_hash(&dir).expect("hash");
    std::fs::write(dir.join("b.glsl"), "").expect("write");
    let added = sources_hash(&dir).expect("hash");
    std::fs::remove_dir_all(&dir).ok();
    assert_ne!(before, edited);
    assert_eq!(before, crlf, "line ends do not count");
    assert_ne!(before, added);
}
