//! The push-constant structs (`vk::PUSH_LAYOUTS`) against the shader sources: for every kernel
//! of `shaders/variants.rs`, the `layout(push_constant)` block of its source (its `#include`s
//! expanded) is parsed and must declare the fields of the one struct pushed to that kernel,
//! by name, GLSL type and order, and the struct's size must be the block's (4 bytes a scalar).
//! No device is needed: only the sources and the Rust tables are read.
//!
//! Must not: accept a block it cannot read fully (a type other than `uint`, `int`, `float`,
//! an array, or a preprocessor conditional around or inside the block fails the test).

use coli_runtime::vk::{PushLayout, PUSH_LAYOUTS};
use std::path::{Path, PathBuf};

#[allow(dead_code)]
mod variants {
    include!("../../shaders/variants.rs");
}

fn shaders_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders")
}

/// `file` with its `#include "..."` lines replaced by the files they name (recursively).
fn expand(dir: &Path, file: &str, depth: usize) -> String {
    assert!(depth < 16, "{file}: includes nest too deep");
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("shaders/{file}: {e}"));
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#include") {
            let name = rest.trim().trim_matches('"');
            out.push_str(&expand(dir, name, depth + 1));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// `src` without `//` and `/* */` comments (newlines kept, so lines still count).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

/// The fields (name, GLSL type) of the one `layout(push_constant)` block of `src`.
fn push_block(src: &str) -> Result<Vec<(String, String)>, String> {
    let src = strip_comments(src);
    // 1. Find the block's body, noting the preprocessor conditionals it sits in.
    let mut depth = 0usize;
    let mut body: Option<String> = None;
    let mut open = false;
    let mut blocks = 0;
    for (i, line) in src.lines().enumerate() {
        let t = line.trim();
        if let Some(directive) = t.strip_prefix('#') {
            let d = directive.trim_start();
            let conditional = ["if", "ifdef", "ifndef", "elif", "else", "endif"]
                .iter()
                .any(|k| d.split_whitespace().next() == Some(*k) || d.starts_with(&format!("{k}(")));
            if open && conditional {
                return Err(format!("line {}: a preprocessor conditional inside the push block", i + 1));
            }
            if d.starts_with("if") {
                depth += 1;
            } else if d.starts_with("endif") {
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        let compact: String = t.chars().filter(|c| !c.is_whitespace()).collect();
        let mut rest = t;
        if !open && compact.contains("layout(push_constant)") {
            blocks += 1;
            if depth > 0 {
                return Err(format!("line {}: the push block is inside a preprocessor conditional", i + 1));
            }
            let at = t.find('{').ok_or_else(|| format!("line {}: the push block's `{{` is not on its line", i + 1))?;
            rest = &t[at + 1..];
            open = true;
            body = Some(String::new());
        } else if !open {
            continue;
        }
        let b = body.as_mut().expect("open block");
        match rest.find('}') {
            Some(end) => {
                b.push_str(&rest[..end]);
                open = false;
            }
            None => {
                b.push_str(rest);
                b.push(' ');
            }
        }
    }
    if open {
        return Err("the push block does not close".into());
    }
    if blocks != 1 {
        return Err(format!("{blocks} push blocks"));
    }
    // 2. Declarations: `type a;`, `type a, b;`, several on a line.
    let mut fields = Vec::new();
    for decl in body.expect("one block").split(';').map(str::trim).filter(|d| !d.is_empty()) {
        let (ty, names) =
            decl.split_once(char::is_whitespace).ok_or_else(|| format!("`{decl}` is not a declaration"))?;
        if !matches!(ty, "uint" | "int" | "float") {
            return Err(format!("`{decl}`: only uint, int and float fields are read"));
        }
        for name in names.split(',').map(str::trim) {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`{decl}`: `{name}` is not a scalar field name"));
            }
            fields.push((name.to_string(), ty.to_string()));
        }
    }
    Ok(fields)
}

/// Whether `layout` matches the block's `fields`; the first difference otherwise.
fn compare(layout: &PushLayout, fields: &[(String, String)]) -> Result<(), String> {
    let rust: Vec<(String, String)> =
        layout.fields.iter().map(|(n, t)| (n.strip_prefix("r#").unwrap_or(n).to_string(), t.to_string())).collect();
    if rust.len() != fields.len() {
        return Err(format!("{} fields, the shader declares {}", rust.len(), fields.len()));
    }
    for (i, (r, g)) in rust.iter().zip(fields).enumerate() {
        if r != g {
            return Err(format!("field {i} is `{} {}`, the shader declares `{} {}`", r.1, r.0, g.1, g.0));
        }
    }
    if layout.size != 4 * fields.len() {
        return Err(format!("{} bytes, the shader's block is {}", layout.size, 4 * fields.len()));
    }
    Ok(())
}

#[test]
fn every_kernel_pushes_the_struct_its_shader_declares() {
    let dir = shaders_dir();
    let mut failures = Vec::new();
    for &(kernel, file, _) in variants::KERNELS {
        let takes: Vec<&PushLayout> =
            PUSH_LAYOUTS.iter().filter(|l| l.kernels.iter().any(|k| format!("{k:?}") == kernel)).collect();
        let [layout] = takes[..] else {
            failures.push(format!("{kernel} ({file}): {} push structs name it", takes.len()));
            continue;
        };
        let checked = push_block(&expand(&dir, file, 0)).and_then(|fields| compare(layout, &fields));
        if let Err(e) = checked {
            failures.push(format!("{} for {kernel} (shaders/{file}): {e}", layout.name));
        }
    }
    assert!(failures.is_empty(), "push constants differ from the shaders:\n{}", failures.join("\n"));
}

#[test]
fn every_struct_is_pushed_to_some_kernel_and_fits_the_layout() {
    for l in PUSH_LAYOUTS {
        assert!(!l.kernels.is_empty(), "{} names no kernel", l.name);
        let most = coli_runtime::vk::PUSH_BYTES as usize;
        assert!(l.size <= most, "{} is {} bytes, past the pipelines' {most}", l.name, l.size);
        assert_eq!(l.size, 4 * l.fields.len(), "{}: fields are 4-byte scalars", l.name);
    }
}

#[test]
fn the_parser_reads_comments_lists_and_several_fields_a_line() {
    let src = "#version 450\n#ifdef X\nfloat junk;\n#endif\n\
               layout(push_constant) uniform PC { uint a; /* b */ float b, c; // d\n  int d; } pc;\n";
    let got = push_block(src).expect("a readable block");
    let want = [("a", "uint"), ("b", "float"), ("c", "float"), ("d", "int")];
    assert_eq!(got, want.map(|(n, t)| (n.to_string(), t.to_string())));
    let bad = "layout(push_constant) uniform PC {\n#ifdef X\n uint a;\n#endif\n} pc;\n";
    assert!(push_block(bad).is_err(), "a conditional inside the block is refused");
    assert!(push_block("layout(push_constant) uniform PC { vec4 a; } pc;").is_err(), "vectors are refused");
}

#[test]
fn a_struct_that_differs_from_its_shader_fails() {
    let fields: Vec<(String, String)> =
        [("count", "uint"), ("kind", "uint"), ("limit", "float")].map(|(n, t)| (n.into(), t.into())).into();
    let layout = |fields: &'static [(&'static str, &'static str)]| PushLayout {
        name: "Test",
        kernels: &[],
        size: 4 * fields.len(),
        fields,
    };
    assert!(compare(&layout(&[("count", "uint"), ("kind", "uint"), ("limit", "float")]), &fields).is_ok());
    assert!(compare(&layout(&[("kind", "uint"), ("count", "uint"), ("limit", "float")]), &fields).is_err());
    assert!(compare(&layout(&[("count", "uint"), ("kind", "uint"), ("limit", "uint")]), &fields).is_err());
    assert!(compare(&layout(&[("count", "uint"), ("kind", "uint")]), &fields).is_err());
    let mut wide = layout(&[("count", "uint"), ("kind", "uint"), ("limit", "float")]);
    wide.size = 16;
    assert!(compare(&wide, &fields).is_err());
}
