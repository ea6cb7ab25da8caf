//! Tidy: the crate's habits, enforced under `cargo test`. Every source file opens with a `//!`
//! paragraph and stays under 800 lines; the crate depends on no GPU or threading crate; the
//! library code outside tests has no `unwrap()`, `panic!` or `todo!`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_file_opens_with_a_doc_paragraph_and_stays_small() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("tests"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.starts_with("//!"), "{} does not open with a //! paragraph", f.display());
        assert!(text.lines().count() < 800, "{} has {} lines", f.display(), text.lines().count());
    }
}

#[test]
fn no_gpu_or_thread_pool_dependency() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    for banned in ["ash", "shaderc", "rayon"] {
        assert!(
            !manifest.lines().any(|l| l.trim_start().starts_with(banned)),
            "compiler/Cargo.toml depends on {banned}"
        );
    }
}

#[test]
fn library_code_does_not_panic_on_purpose() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (i, line) in code.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("//") {
                continue;
            }
            for bad in [".unwrap()", "panic!(", "todo!(", "unimplemented!("] {
                assert!(!l.contains(bad), "{}:{}: `{bad}` in library code", f.display(), i + 1);
            }
        }
    }
}
