//! The SIGBUS guard over mapped checkpoints, tested in child processes (this test binary run
//! again, its role chosen by `COLI_TEST_SIGBUS_ROLE`): a checkpoint file truncated under a
//! running coli makes the next read of a lost page exit with code 74 and one line naming the
//! file, instead of a crash (exit 135); a SIGBUS outside every checkpoint's map still ends the
//! process as the signal would have without the guard.
//!
//! Must not: run the faulting roles in the test process itself.

use coli_runtime::model::{Checkpoint, LoadOptions, SIGBUS_EXIT_CODE};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

const ROLE: &str = "COLI_TEST_SIGBUS_ROLE";
const DIR: &str = "COLI_TEST_SIGBUS_DIR";
const VALUES: usize = 1 << 16;

/// A safetensors checkpoint of one F32 tensor `w` of 256 KiB.
fn write_checkpoint(dir: &Path) {
    let header = format!(r#"{{"w": {{"dtype": "F32", "shape": [{VALUES}], "data_offsets": [0, {}]}}}}"#, VALUES * 4);
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend((0..VALUES).flat_map(|i| (i as f32).to_le_bytes()));
    std::fs::write(dir.join("model.safetensors"), b).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"architectures": ["LlamaForCausalLM"]}"#).unwrap();
}

/// Reads every byte of `b` (volatile: the reads happen), returning their sum.
fn touch(b: &[u8]) -> u64 {
    b.iter().map(|x| unsafe { std::ptr::read_volatile(x) } as u64).sum()
}

fn truncate(p: &Path) {
    std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(0).unwrap();
}

/// The child roles: each faults, and should never return.
fn child(role: &str, dir: &Path) {
    let ck = Checkpoint::open(dir, &LoadOptions::default()).unwrap();
    let w = ck.tensor("w").unwrap();
    match role {
        "checkpoint" => {
            truncate(&dir.join("model.safetensors"));
            println!("sum {}", touch(w.bytes()));
        }
        "elsewhere" => {
            // A map of coli's own making, outside the checkpoint's: not the guard's business.
            let p = dir.join("other.bin");
            std::fs::write(&p, vec![1u8; 1 << 16]).unwrap();
            let f = std::fs::File::open(&p).unwrap();
            let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
            truncate(&p);
            println!("sum {} {}", touch(&map), w.bytes().len());
        }
        _ => panic!("unknown role {role}"),
    }
    eprintln!("the child's read did not fault");
    std::process::exit(3);
}

fn run_child(test: &str, role: &str, dir: &Path) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(DIR, dir)
        .output()
        .unwrap()
}

#[test]
fn a_checkpoint_truncated_while_mapped_is_a_one_line_error_and_exit_74() {
    if let (Some(role), Some(dir)) = (std::env::var_os(ROLE), std::env::var_os(DIR)) {
        return child(role.to_str().unwrap(), Path::new(&dir));
    }
    let d = tempfile::tempdir().unwrap();
    write_checkpoint(d.path());
    let out = run_child("a_checkpoint_truncated_while_mapped_is_a_one_line_error_and_exit_74", "checkpoint", d.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(SIGBUS_EXIT_CODE), "{:?}\n{stderr}", out.status);
    assert_eq!(SIGBUS_EXIT_CODE, 74);
    let file = d.path().join("model.safetensors");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(&file.display().to_string()) && lines[0].contains("shrank while in use"), "{stderr}");
    assert!(lines[0].contains("byte "), "{stderr}");
}

#[test]
fn a_sigbus_outside_the_checkpoint_maps_is_left_to_the_signal() {
    if let (Some(role), Some(dir)) = (std::env::var_os(ROLE), std::env::var_os(DIR)) {
        return child(role.to_str().unwrap(), Path::new(&dir));
    }
    let d = tempfile::tempdir().unwrap();
    write_checkpoint(d.path());
    let out = run_child("a_sigbus_outside_the_checkpoint_maps_is_left_to_the_signal", "elsewhere", d.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}\n{stderr}", out.status);
    assert!(!stderr.contains("shrank while in use"), "{stderr}");
}
