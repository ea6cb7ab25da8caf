//! Tidy: the habits of every crate (the compiler, the runtime, the `coli` tool), enforced under
//! `cargo test`:
//! - every `.rs` file opens with a `//!` paragraph;
//! - a file stays within its crate's line limit, or within its ceiling in `KNOWN_LONG`;
//! - library code (under `src/`, outside `#[cfg(test)]` items and test modules) has no
//!   `unwrap()`, `panic!`, `todo!` or `unimplemented!`, or at most its count in `KNOWN_PANICS`;
//! - the compiler depends on no GPU or thread-pool crate (ash, shaderc, rayon): not in its
//!   manifest, not in its code;
//! - no import circle between modules: the `crate::`/`super::` paths of each file (in `use`
//!   lines and in code) give a graph between the modules (a file or a directory under `src/`)
//!   of each directory, and no two of them may reach each other, except inside a circle of
//!   `KNOWN_CIRCLES`. A module and its own submodules are one module: a child naming its
//!   parent's items (through its facade) and the parent naming its children make no edge.
//!
//! The KNOWN lists hold the debts of today. They may only shrink: a file past its ceiling or a
//! circle outside the list fails, and so does an entry that no longer applies (remove it).
//! This test must not read anything outside the repository or build anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate: its directory, its `src/`, the other places its `.rs` files live, its line limit.
struct Crate {
    name: &'static str,
    src: &'static str,
    others: &'static [&'static str],
    max_lines: usize,
}

const CRATES: &[Crate] = &[
    Crate { name: "coli-compiler", src: "compiler/src", others: &["compiler/tests"], max_lines: 800 },
    Crate {
        name: "coli-runtime",
        src: "runtime/src",
        others: &["runtime/tests", "runtime/examples", "runtime/build.rs"],
        max_lines: 800,
    },
    Crate { name: "coli", src: "tools/coli/src", others: &["tests"], max_lines: 800 },
];

/// Files longer than their crate's limit today, with their line count then: the ceiling.
const KNOWN_LONG: &[(&str, usize)] = &[];

/// Library files that still unwrap or panic, with their count then: the ceiling.
// The format kernels: fixed-size slice conversions (`try_into().unwrap()` on a slice of the
// exact length) and the documented panics of the hot entry points, whose callers checked sizes.
// The readers: fixed-size conversions of bytes already bounded. The rest: the executors' own.
const KNOWN_PANICS: &[(&str, usize)] = &[
    ("runtime/src/cpu/elementwise.rs", 1),
    ("runtime/src/store/weights.rs", 1),
    ("runtime/src/format/dequant.rs", 2),
    ("runtime/src/format/dot.rs", 5),
    ("runtime/src/format/kquant.rs", 8),
    ("runtime/src/format/matmul.rs", 5),
    ("runtime/src/format/matrix.rs", 1),
    ("runtime/src/format/mod.rs", 1),
    ("runtime/src/format/prim.rs", 1),
    ("runtime/src/format/q8.rs", 5),
    ("runtime/src/model/gguf.rs", 2),
    ("runtime/src/model/safetensors.rs", 1),
    ("runtime/src/model/tensor.rs", 1),
    ("runtime/src/vk/arena.rs", 2),
    ("runtime/src/vk/context.rs", 1),
];

/// Import circles of today, each the set of modules (paths under `src/`) that reach each other.
const KNOWN_CIRCLES: &[(&str, &[&str])] = &[
    // The Vulkan context records frames, and a frame holds its context's buffers.
    ("coli-runtime", &["vk/context", "vk/frame"]),
];

const PANICS: [&str; 4] = [".unwrap()", "panic!(", "todo!(", "unimplemented!("];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files at `path` (a file, or a directory walked in name order), relative to the
/// repository.
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|x| x == "rs") {
            out.push(path.strip_prefix(repo()).expect("under the repository").to_path_buf());
        }
        return;
    }
    let Ok(dir) = std::fs::read_dir(path) else { return };
    let mut entries: Vec<PathBuf> = dir.map(|e| e.expect("a directory entry").path()).collect();
    entries.sort();
    for p in entries {
        rust_files(&p, out);
    }
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()))
}

fn show(rel: &Path) -> String {
    rel.to_string_lossy().replace('\\', "/")
}

/// The code of a file outside `#[cfg(test)]` items and comments, as (line number, text), and
/// the names of the test modules it declares in files of their own (`#[cfg(test)] mod tests;`).
fn code_lines(text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut code, mut test_mods) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim();
        if t == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            let item = lines.get(j).map_or("", |l| l.trim());
            let module = item.strip_prefix("pub(crate) ").unwrap_or(item).strip_prefix("mod ");
            if let Some(name) = module.and_then(|m| m.strip_suffix(';')) {
                test_mods.push(name.trim().to_string());
                i = j + 1;
                continue;
            }
            // Skip the item: to its `;`, or to the brace that closes its first one.
            let (mut depth, mut opened) = (0i32, false);
            while j < lines.len() {
                for c in lines[j].chars() {
                    match c {
                        '{' => (depth, opened) = (depth + 1, true),
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        if !t.starts_with("//") {
            let line = lines[i];
            let cut = line.find(" // ").unwrap_or(line.len());
            code.push((i + 1, line[..cut].to_string()));
        }
        i += 1;
    }
    (code, test_mods)
}

/// The module path of a file under `src/`: `vk/frame.rs` is `vk/frame`, `vk/mod.rs` is `vk`,
/// `lib.rs` and `main.rs` are the crate root.
fn module_of(rel_to_src: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel_to_src.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_string());
    }
    parts
}

#[test]
fn every_file_opens_with_a_doc_paragraph_and_stays_small() {
    let known: BTreeMap<&str, usize> = KNOWN_LONG.iter().copied().collect();
    let mut failures = Vec::new();
    let mut seen = BTreeSet::new();
    for c in CRATES {
        let mut files = Vec::new();
        for dir in std::iter::once(&c.src).chain(c.others) {
            rust_files(&repo().join(dir), &mut files);
        }
        for f in files {
            let text = read(&f);
            let name = show(&f);
            if !text.starts_with("//!") {
                failures.push(format!("{name}: does not open with a //! paragraph"));
            }
            let lines = text.lines().count();
            match known.get(name.as_str()) {
                Some(&ceiling) => {
                    seen.insert(name.clone());
                    if lines > ceiling {
                        failures.push(format!("{name}: {lines} lines, past its ceiling {ceiling} in KNOWN_LONG"));
                    } else if lines <= c.max_lines {
                        failures
                            .push(format!("{name}: {lines} lines, within {}: remove it from KNOWN_LONG", c.max_lines));
                    }
                }
                None if lines > c.max_lines => {
                    failures.push(format!("{name}: {lines} lines, more than {} ({}): split it", c.max_lines, c.name))
                }
                None => {}
            }
        }
    }
    for (name, _) in KNOWN_LONG {
        if !seen.contains(*name) {
            failures.push(format!("{name}: in KNOWN_LONG but not found: remove it"));
        }
    }
    assert!(failures.is_empty(), "tidy:\n{}", failures.join("\n"));
}

#[test]
fn library_code_does_not_panic_on_purpose() {
    let known: BTreeMap<&str, usize> = KNOWN_PANICS.iter().copied().collect();
    let mut failures = Vec::new();
    let mut counts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in CRATES {
        for file in library_files(c) {
            let name = show(&file.path);
            for (n, line) in &file.code {
                for bad in PANICS {
                    if line.contains(bad) {
                        counts.entry(name.clone()).or_default().push(format!("{name}:{n}: `{bad}`"));
                    }
                }
            }
        }
    }
    for (name, hits) in &counts {
        match known.get(name.as_str()) {
            Some(&ceiling) if hits.len() <= ceiling => {}
            Some(&ceiling) => failures.push(format!(
                "{name}: {} unwraps or panics, past its ceiling {ceiling} in KNOWN_PANICS:\n  {}",
                hits.len(),
                hits.join("\n  ")
            )),
            None => failures.push(format!("library code panics on purpose:\n  {}", hits.join("\n  "))),
        }
    }
    for (name, _) in KNOWN_PANICS {
        if !counts.contains_key(*name) {
            failures.push(format!("{name}: in KNOWN_PANICS but clean (or gone): remove it"));
        }
    }
    assert!(failures.is_empty(), "tidy:\n{}", failures.join("\n"));
}

#[test]
fn the_compiler_depends_on_no_gpu_or_thread_pool_crate() {
    const BANNED: [&str; 3] = ["ash", "shaderc", "rayon"];
    let mut failures = Vec::new();
    let manifest = read(Path::new("compiler/Cargo.toml"));
    for (n, line) in manifest.lines().enumerate() {
        let l = line.trim_start();
        for banned in BANNED {
            let rest = l.strip_prefix(banned).map(str::trim_start);
            if rest.is_some_and(|r| r.starts_with('=') || r.starts_with('.')) {
                failures.push(format!("compiler/Cargo.toml:{}: depends on {banned}", n + 1));
            }
        }
    }
    let mut files = Vec::new();
    rust_files(&repo().join("compiler"), &mut files);
    for f in files {
        for (n, line) in read(&f).lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for banned in BANNED {
                let path = format!("{banned}::");
                let named = line.match_indices(&path).any(|(at, _)| {
                    !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':' || c == '$')
                });
                if named {
                    failures.push(format!("{}:{}: names {banned}", show(&f), n + 1));
                }
            }
        }
    }
    assert!(failures.is_empty(), "tidy:\n{}", failures.join("\n"));
}

/// A library file: its path and its code outside tests.
struct LibraryFile {
    path: PathBuf,
    module: Vec<String>,
    code: Vec<(usize, String)>,
}

/// The files under a crate's `src/`, less its test modules, with their code outside tests.
fn library_files(c: &Crate) -> Vec<LibraryFile> {
    let src = repo().join(c.src);
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let mut files = Vec::new();
    let mut test_modules = Vec::new();
    for path in paths {
        let module = module_of(path.strip_prefix(c.src).expect("under src"));
        let (code, tests) = code_lines(&read(&path));
        test_modules.extend(tests.into_iter().map(|t| [module.clone(), vec![t]].concat()));
        files.push(LibraryFile { path, module, code });
    }
    files.retain(|f| !test_modules.iter().any(|t| f.module.starts_with(t)));
    files
}

/// One token of a `use` tree.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Open,
    Close,
    Comma,
    Star,
}

fn tokens(s: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in s.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(Tok::Ident(std::mem::take(&mut word)));
        }
        match c {
            '{' => out.push(Tok::Open),
            '}' => out.push(Tok::Close),
            ',' => out.push(Tok::Comma),
            '*' => out.push(Tok::Star),
            _ => {}
        }
    }
    if !word.is_empty() {
        out.push(Tok::Ident(word));
    }
    out
}

/// Expands a `use` tree (`crate::{a::X, b::{self, Y as Z}}`) into its paths.
fn expand(t: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        match t.get(*i) {
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 2;
                break;
            }
            Some(Tok::Ident(s)) => {
                if s != "self" {
                    path.push(s.clone());
                }
                *i += 1;
            }
            Some(Tok::Open) => {
                *i += 1;
                while !matches!(t.get(*i), None | Some(Tok::Close)) {
                    expand(t, i, path.clone(), out);
                    if t.get(*i) == Some(&Tok::Comma) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Star) => {
                *i += 1;
                break;
            }
            _ => break,
        }
    }
    out.push(path);
}

/// The `crate::`, `super::` and `self::` paths a file names, with their line: `use` trees
/// whole, and the paths written in code.
fn paths_named(code: &[(usize, String)]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < code.len() {
        let (n, line) = &code[k];
        let t = line.trim_start();
        let t = t.strip_prefix("pub").map_or(t, |r| r.strip_prefix(|c| c == ' ').unwrap_or(r));
        let t = if t.starts_with('(') { t.split_once(") ").map_or(t, |(_, r)| r) } else { t };
        if let Some(tree) = t.strip_prefix("use ") {
            let mut text = tree.to_string();
            while !text.contains(';') && k + 1 < code.len() {
                k += 1;
                text.push_str(&code[k].1);
            }
            let toks = tokens(&text);
            let mut paths = Vec::new();
            expand(&toks, &mut 0, Vec::new(), &mut paths);
            out.extend(paths.into_iter().map(|p| (*n, p)));
        } else {
            for root in ["crate::", "super::"] {
                for (at, _) in line.match_indices(root) {
                    let before = &line[..at];
                    if before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
                        continue;
                    }
                    let rest = &line[at..];
                    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
                    let segs = rest[..end].split("::").filter(|s| !s.is_empty()).map(String::from).collect();
                    out.push((*n, segs));
                }
            }
        }
        k += 1;
    }
    out.retain(|(_, p)| matches!(p.first().map(String::as_str), Some("crate" | "super" | "self")));
    out
}

/// The module a path from `from` names: the longest module prefix of it, or `None` when it
/// leaves the crate.
/// `super` in `vk/frame.rs` (module `vk/frame`) is `vk`; in `vk/mod.rs` (module `vk`), the root.
fn resolve(from: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segs = path.iter().peekable();
    let mut base: Vec<String> = match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            Vec::new()
        }
        _ => from.to_vec(),
    };
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segs.next();
    }
    for s in segs {
        let mut next = base.clone();
        next.push(s.clone());
        if !modules.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// An edge of a directory's module graph: the child that names, the child named, and where.
type Edges = BTreeMap<(String, String), String>;

/// Per directory (its module path), the edges between its children.
fn module_graphs(c: &Crate) -> BTreeMap<Vec<String>, Edges> {
    let files = library_files(c);
    let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
    for f in &files {
        for k in 0..=f.module.len() {
            modules.insert(f.module[..k].to_vec());
        }
    }
    let mut graphs: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
    for f in &files {
        for (n, path) in paths_named(&f.code) {
            let Some(to) = resolve(&f.module, &path, &modules) else { continue };
            let common = f.module.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == f.module.len() || common == to.len() {
                continue; // a module and its own submodules
            }
            let level = f.module[..common].to_vec();
            let edge = (f.module[common].clone(), to[common].clone());
            graphs.entry(level).or_default().entry(edge).or_insert_with(|| format!("{}:{n}", show(&f.path)));
        }
    }
    graphs
}

/// The circles of a graph: each set of two or more nodes that all reach each other.
fn circles(edges: &Edges) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(x) = todo.pop() {
            for &y in next.get(x).into_iter().flatten() {
                if seen.insert(y) {
                    todo.push(y);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&k| (k, reach(k))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (&a, r) in &reached {
        if !r.contains(a) || out.iter().any(|c| c.contains(a)) {
            continue;
        }
        let circle = r.iter().filter(|b| reached.get(*b).is_some_and(|rb| rb.contains(a))).map(|b| b.to_string());
        out.push(circle.collect());
    }
    out
}

#[test]
fn no_import_circle_between_modules() {
    let mut failures = Vec::new();
    let mut matched = BTreeSet::new();
    for c in CRATES {
        for (level, edges) in module_graphs(c) {
            for circle in circles(&edges) {
                let full = |m: &String| [level.as_slice(), std::slice::from_ref(m)].concat().join("/");
                let members: BTreeSet<String> = circle.iter().map(full).collect();
                let known = KNOWN_CIRCLES
                    .iter()
                    .position(|(name, known)| *name == c.name && members.iter().all(|m| known.contains(&m.as_str())));
                if let Some(k) = known {
                    matched.insert(k);
                    continue;
                }
                let why: Vec<String> = edges
                    .iter()
                    .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                    .map(|((a, b), at)| format!("  {} -> {} ({at})", full(a), full(b)))
                    .collect();
                failures.push(format!(
                    "{}: import circle between {}:\n{}",
                    c.name,
                    members.into_iter().collect::<Vec<_>>().join(", "),
                    why.join("\n")
                ));
            }
        }
    }
    for (k, (name, known)) in KNOWN_CIRCLES.iter().enumerate() {
        if !matched.contains(&k) {
            failures.push(format!("{name}: the circle {known:?} in KNOWN_CIRCLES is gone: remove it"));
        }
    }
    assert!(failures.is_empty(), "tidy:\n{}", failures.join("\n"));
}

#[test]
fn use_trees_expand_into_their_paths() {
    let mut out = Vec::new();
    expand(&tokens("crate::{a::X, b::{self, Y as Z}, c::*};"), &mut 0, Vec::new(), &mut out);
    let want: Vec<Vec<String>> =
        [vec!["crate", "a", "X"], vec!["crate", "b"], vec!["crate", "b", "Y"], vec!["crate", "c"]]
            .iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect();
    assert_eq!(out, want);
    let (code, tests) = code_lines("//! doc\nuse a;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nfn f() {\n    x.unwrap();\n}\nlet y = 1; // z.unwrap()\n");
    assert_eq!(tests, vec!["tests".to_string()]);
    assert_eq!(code, vec![(2, "use a;".to_string()), (9, "let y = 1;".to_string())]);
}
