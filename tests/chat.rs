//! `coli chat` end to end on the default model, lines piped in: the first answer equals
//! `Engine::generate` on the same chat prompt (greedy); the second turn sees the first (its
//! answer differs from the same question asked alone); `/reset` forgets the history (the next
//! answer equals a fresh conversation's); Ctrl-C stops an answer, not the program.

mod common;

use coli_runtime::engine::{Engine, Prompt};
use coli_runtime::generate::GenerateOptions;
use coli_runtime::sample::{Sampler, SamplerConfig};
use common::default_model_path;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn reference(engine: &Engine, user: &str, max: usize) -> String {
    let ids = engine.prompt_ids(&Prompt::Chat { system: None, user }).unwrap();
    let mut session = engine.session().unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy()).unwrap();
    let opts = GenerateOptions { max_new_tokens: max, ..GenerateOptions::default() };
    let mut text = String::new();
    engine.generate(&mut session, &mut sampler, &ids, &opts, &mut |t| text.push_str(t)).unwrap();
    text
}

fn chat(model: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.args(["chat", "-q", "--model", model, "--temperature", "0", "-n", "16", "--ctx", "1024"]);
    c
}

#[test]
fn turns_see_the_history_until_reset() {
    let Some(path) = default_model_path() else { return };
    let engine = common::load_model(&path);
    let mut child = chat(path.to_str().unwrap()).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let lines = "What is the capital of France?\nAnd of Italy?\n/reset\nAnd of Italy?\n/exit\n";
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(answers.len(), 3, "{text}");
    assert_eq!(answers[0], reference(&engine, "What is the capital of France?", 16).trim_end());
    let alone = reference(&engine, "And of Italy?", 16);
    assert_eq!(answers[2], alone.trim_end(), "after /reset the question is asked afresh");
    assert_ne!(answers[1], answers[2], "the second turn saw the first");
}

#[test]
fn ctrl_c_stops_the_answer_and_not_the_program() {
    let Some(path) = default_model_path() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["chat", "-q", "--model", path.to_str().unwrap(), "-n", "100000", "--ctx", "4096"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Write a very long story about a dragon.\n").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"/exit\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the program ended with {status}");
    assert!(rest.contains("[stopped]"), "{rest}");
}
