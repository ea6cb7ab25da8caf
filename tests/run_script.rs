//! The README's main command, `bash tools/run.sh`, as a user meets it: its stdout is exactly the
//! model's answer (every message of setup, fetching, loading and speed goes to stderr). Runs the
//! script with `COLI_BIN` set to the binary under test, so it does not build a second one.

use std::process::Command;

#[test]
fn run_sh_prints_only_the_answer_on_stdout() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/tools/run.sh"))
        .env("COLI_BIN", env!("CARGO_BIN_EXE_coli"))
        .output()
        .expect("bash runs tools/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run.sh failed: {stderr}");
    assert_eq!(stdout, "The capital of France is Paris.\n", "stderr was: {stderr}");
    assert!(stderr.contains("coli: prompt "), "the speed line goes to stderr: {stderr}");
}
