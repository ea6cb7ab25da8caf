//! The Hugging Face cache: fake caches laid out here as the hub makes them (refs naming
//! commits, snapshot files as symbolic links into `blobs/`), resolved by id, revision and
//! file, and opened; each way of finding nothing is its own error saying where it looked.

use super::*;
use crate::model::hub::{locate, resolve, HubEnv, HubError, ModelRef};
use std::os::unix::fs::symlink;

/// Puts `bytes` in the repo's `blobs/` and links `snapshots/<commit>/<file>` to it, as the hub
/// does (a relative link).
fn put(repo: &Path, commit: &str, file: &str, bytes: &[u8]) {
    let blob = format!("{:016x}{}", bytes.len(), file.len());
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(repo.join("blobs").join(&blob), bytes).unwrap();
    let link = repo.join("snapshots").join(commit).join(file);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    let up = "../".repeat(file.matches('/').count() + 2);
    symlink(format!("{up}blobs/{blob}"), &link).unwrap();
}

fn set_ref(repo: &Path, name: &str, commit: &str) {
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join(name), commit).unwrap();
}

fn r(s: &str) -> ModelRef {
    ModelRef::parse(s).unwrap_or_else(|| panic!("{s} parses"))
}

#[test]
fn hub_ids_parse_and_paths_do_not() {
    let m = r("HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_eq!(
        (m.org.as_str(), m.name.as_str(), m.revision, m.file),
        ("HuggingFaceTB", "SmolLM2-135M-Instruct", None, None)
    );
    let m = r("unsloth/Kimi-K2-GGUF@v1.0:Q4_K_M/Kimi-K2-Q4_K_M-00001-of-00013.gguf");
    assert_eq!(m.revision.as_deref(), Some("v1.0"));
    assert_eq!(m.file.as_deref(), Some("Q4_K_M/Kimi-K2-Q4_K_M-00001-of-00013.gguf"));
    assert_eq!(m.to_string(), "unsloth/Kimi-K2-GGUF@v1.0:Q4_K_M/Kimi-K2-Q4_K_M-00001-of-00013.gguf");
    assert_eq!(r("a/b:x.gguf").to_string(), "a/b:x.gguf");
    for not in [
        "model", "a/b/c", "./a", "../a/b", "/a/b", "a/", "/b", "a/b:", "a/b:../x", "a/b@", "a--x/b", "a/b c",
        "a/b@../x",
    ] {
        assert_eq!(ModelRef::parse(not), None, "{not}");
    }
    let env = |c: Option<&str>, h: Option<&str>, home: Option<&str>| HubEnv {
        hf_hub_cache: c.map(PathBuf::from),
        hf_home: h.map(PathBuf::from),
        home: home.map(PathBuf::from),
    };
    assert_eq!(env(Some("/c"), Some("/h"), Some("/u")).cache_dir().unwrap(), Path::new("/c"));
    assert_eq!(env(None, Some("/h"), Some("/u")).cache_dir().unwrap(), Path::new("/h/hub"));
    assert_eq!(env(None, None, Some("/u")).cache_dir().unwrap(), Path::new("/u/.cache/huggingface/hub"));
    assert!(matches!(env(None, None, None).cache_dir(), Err(HubError::NoCache)));
}

#[test]
fn a_cached_safetensors_snapshot_opens_by_id_revision_and_commit() {
    let cache = tmp();
    let repo = cache.path().join("models--org--tiny");
    let st = st_bytes(&[("w", "F32", vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))]);
    let old = st_bytes(&[("w", "F32", vec![1], f32_bytes(&[9.0]))]);
    for (commit, bytes) in [("c0ffee", &st), ("0ldc0de", &old)] {
        put(&repo, commit, "config.json", br#"{"architectures": ["LlamaForCausalLM"]}"#);
        put(&repo, commit, "model.safetensors", bytes);
    }
    set_ref(&repo, "main", "c0ffee\n");
    set_ref(&repo, "v1", "0ldc0de");
    let snap = resolve(&r("org/tiny"), cache.path()).unwrap();
    assert_eq!(snap, repo.join("snapshots/c0ffee"));
    assert_eq!(open(&snap).unwrap().tensor("w").unwrap().to_f32_vec().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(resolve(&r("org/tiny@v1"), cache.path()).unwrap(), repo.join("snapshots/0ldc0de"));
    assert_eq!(resolve(&r("org/tiny@0ldc0de"), cache.path()).unwrap(), repo.join("snapshots/0ldc0de"));
    assert_eq!(
        resolve(&r("org/tiny:model.safetensors"), cache.path()).unwrap(),
        repo.join("snapshots/c0ffee/model.safetensors")
    );
    // locate: a hub id goes to the cache; a path that exists, or no id, stays as it is.
    assert_eq!(locate(Path::new("org/tiny"), Some(cache.path())).unwrap(), snap);
    assert_eq!(locate(&repo, Some(cache.path())).unwrap(), repo);
    assert_eq!(locate(Path::new("no/such/dir"), Some(cache.path())).unwrap(), Path::new("no/such/dir"));

    // Nothing found: each error says where it looked.
    let e = resolve(&r("org/absent"), cache.path()).unwrap_err();
    assert!(matches!(e, HubError::NotCached { .. }) && e.to_string().contains("models--org--absent"), "{e}");
    let e = resolve(&r("org/tiny@v2"), cache.path()).unwrap_err();
    assert!(matches!(e, HubError::NoRevision { .. }), "{e}");
    assert!(e.to_string().contains("refs/v2") && e.to_string().contains("0ldc0de/, c0ffee/"), "{e}");
    let e = resolve(&r("org/tiny:nope.gguf"), cache.path()).unwrap_err();
    assert!(matches!(e, HubError::NoFile { .. }) && e.to_string().contains("config.json, model.safetensors"), "{e}");
    set_ref(&repo, "gone", "deadbeef");
    assert!(matches!(resolve(&r("org/tiny@gone"), cache.path()), Err(HubError::NoSnapshot { .. })));
    set_ref(&repo, "bad", "../../x");
    assert!(matches!(resolve(&r("org/tiny@bad"), cache.path()), Err(HubError::BadRef { .. })));
}

#[test]
fn a_cached_gguf_snapshot_opens_its_one_checkpoint_or_lists_them() {
    let cache = tmp();
    let repo = cache.path().join("models--org--m-GGUF");
    set_ref(&repo, "main", "abc");
    put(&repo, "abc", "README.md", b"# m");
    put(&repo, "abc", "m-Q8_0.gguf", &sample_gguf());
    let one = resolve(&r("org/m-GGUF"), cache.path()).unwrap();
    assert_eq!(one, repo.join("snapshots/abc/m-Q8_0.gguf"));
    assert!(open(&one).unwrap().has("norm.weight"));

    // A split set one folder down, beside the single file: several checkpoints, listed.
    let d = tmp();
    let (kv, tensors) = super::split::small();
    for p in super::split::write_split(d.path(), "m-Q4_K_M", &kv, &tensors, &[2, 2], 4) {
        let name = p.file_name().unwrap().to_str().unwrap();
        put(&repo, "abc", &format!("Q4_K_M/{name}"), &std::fs::read(&p).unwrap());
    }
    let e = resolve(&r("org/m-GGUF"), cache.path()).unwrap_err();
    assert!(matches!(e, HubError::SeveralGguf { .. }), "{e}");
    assert!(
        e.to_string().ends_with("pick one: org/m-GGUF:Q4_K_M/m-Q4_K_M-00001-of-00002.gguf, org/m-GGUF:m-Q8_0.gguf"),
        "{e}"
    );
    // Picked by file (any shard of the set), it opens whole through the links.
    let p = resolve(&r("org/m-GGUF:Q4_K_M/m-Q4_K_M-00002-of-00002.gguf"), cache.path()).unwrap();
    assert_eq!(open(&p).unwrap().names().count(), 4);
    // A link whose blob is missing: a download cut short.
    let blobs: Vec<PathBuf> = std::fs::read_dir(repo.join("blobs")).unwrap().map(|e| e.unwrap().path()).collect();
    let q8 = std::fs::read_link(repo.join("snapshots/abc/m-Q8_0.gguf")).unwrap();
    let q8_blob = blobs.iter().find(|b| q8.ends_with(b.file_name().unwrap())).unwrap();
    std::fs::remove_file(q8_blob).unwrap();
    assert!(matches!(resolve(&r("org/m-GGUF:m-Q8_0.gguf"), cache.path()), Err(HubError::Incomplete { .. })));
    // A snapshot with no checkpoint in it.
    let repo = cache.path().join("models--org--docs");
    set_ref(&repo, "main", "d0c");
    put(&repo, "d0c", "README.md", b"# m");
    let e = resolve(&r("org/docs"), cache.path()).unwrap_err();
    assert!(matches!(e, HubError::NoCheckpoint { .. }) && e.to_string().contains("README.md"), "{e}");
}
