//! `coli` run as a process, the way users and scripts drive it: `exec` with `--prompt-ids` and
//! `--logits-out` against the transformers oracle, chat and plain prompts on the real models,
//! `compile` on a checkpoint, and bad input of each kind giving a clear error (exit 1, no panic).

mod common;

use common::*;
use std::process::{Command, Output};

fn coli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli")).args(args).current_dir(root()).output().expect("coli runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failed run: exit code 1, a `coli: error:` line containing `needle`, and no panic.
fn assert_clean_error(o: &Output, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "expected exit 1; stderr: {e}");
    assert!(!e.contains("panicked"), "panicked: {e}");
    assert!(e.contains("coli: error:") && e.contains(needle), "expected an error mentioning {needle:?}; stderr: {e}");
}

#[test]
fn exec_logits_out_matches_the_oracle() {
    let dir = fixture_dir("olmoe");
    let oracle = read_json(&dir.join("oracle.json"));
    let prompt = ids(&oracle["prompt_ids"]);
    let greedy = ids(&oracle["greedy"]);
    let out = std::env::temp_dir().join(format!("coli-logits-{}.json", std::process::id()));
    let prompt_arg = prompt.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let n = greedy.len().to_string();
    let o = coli(&[
        "exec",
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt_arg,
        "-n",
        &n,
        "--chunk",
        "5",
        "--logits-out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "coli exec failed: {}", stderr(&o));
    let got = read_json(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(ids(&got["prompt_ids"]), prompt);
    assert_eq!(ids(&got["generated"]), greedy, "greedy ids differ from transformers'");
    // Rows: every prompt position, then one per generated token.
    let mut want = matrix(&oracle["logits"]);
    want.extend(matrix(&oracle["greedy_logits"]).into_iter().skip(1));
    let logits = matrix(&got["logits"]);
    assert_eq!(logits.len(), prompt.len() + greedy.len());
    let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
    let err = max_abs_diff(&logits[..want.len()], &want);
    assert!(err <= 1e-4 * max, "max |logit - oracle| = {err}");
    // Without a tokenizer the generated ids are printed.
    assert!(stdout(&o).trim().starts_with(&greedy[0].to_string()));
    assert!(stderr(&o).contains("tok/s"), "the speed line is on stderr");
}

/// `coli exec --device vulkan` of MiMo-V2-Flash's tiny fixture with `extra` flags, its greedy
/// ids as many as transformers' (the oracle's): the run's stderr, the logits it wrote (prompt
/// rows, then a row a generated token), and their error against transformers' relative to the
/// largest |logit|, after checking the greedy ids are transformers'. `None` where the tests are
/// told to skip Vulkan.
fn exec_mimo_on_vulkan(extra: &[&str], tag: &str) -> Option<(String, f32)> {
    if std::env::var("COLI_VK_TESTS").as_deref() == Ok("skip") {
        return None;
    }
    let dir = fixture_dir("mimo_v2_flash");
    let oracle = read_json(&dir.join("oracle.json"));
    let (prompt, greedy) = (ids(&oracle["prompt_ids"]), ids(&oracle["greedy"]));
    let out = std::env::temp_dir().join(format!("coli-mimo-{tag}-{}.json", std::process::id()));
    let prompt_arg = prompt.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let n = greedy.len().to_string();
    let base = ["exec", "--device", "vulkan", "--model", dir.to_str().unwrap(), "--prompt-ids", &prompt_arg, "-n", &n];
    let o = coli(&[&base[..], extra, &["--logits-out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "coli exec failed: {}", stderr(&o));
    let got = read_json(&out);
    let _ = std::fs::remove_file(&out);
    assert_eq!(ids(&got["generated"]), greedy, "{tag}: greedy ids differ from transformers'");
    let mut want = matrix(&oracle["logits"]);
    want.extend(matrix(&oracle["greedy_logits"]).into_iter().skip(1));
    let logits = matrix(&got["logits"]);
    let max = oracle["max_abs_logit"].as_f64().unwrap() as f32;
    Some((stderr(&o), max_abs_diff(&logits[..want.len()], &want) / max))
}

/// `coli exec` on the Vulkan device (Lavapipe in CI) with MiMo-V2-Flash's tiny fixture (sliding
/// windows with sinks, narrow scaled value heads, routing in the frame), the prompt in chunks
/// of 3: every logit row within 1e-4 of the largest |logit| of transformers, greedy identical.
#[test]
fn exec_on_vulkan_runs_mimo_v2_flash_as_transformers_does() {
    let Some((err_text, err)) = exec_mimo_on_vulkan(&["--chunk", "3"], "chunks") else { return };
    assert!(!err_text.contains("running on the CPU"), "the device ran it: {err_text}");
    assert!(err <= 1e-4, "max |logit - oracle| = {err} of the largest");
}

/// `--device-kv f16`: the startup line says the device keeps its K/V cache in f16, and MiMo-V2-
/// Flash (a sliding window's ring, sinks) still decodes transformers' greedy ids, its logits
/// within 3e-3 of the largest |logit| (the keys and values rounded to f16).
#[test]
fn exec_with_an_f16_kv_cache_on_vulkan_decodes_as_transformers_does() {
    let Some((err_text, err)) = exec_mimo_on_vulkan(&["--device-kv", "f16"], "kv16") else { return };
    assert!(err_text.contains("K/V cache on the device in f16"), "{err_text}");
    eprintln!("f16 K/V: max |logit - oracle| = {err:.3e} of the largest (bound 3e-3)");
    assert!(err <= 3e-3, "max |logit - oracle| = {err} of the largest");
}

#[test]
fn exec_chat_answers_on_the_default_model() {
    if default_model_path().is_none() {
        return;
    }
    let o = coli(&[
        "exec",
        "--device",
        "cpu",
        "--chat",
        "--prompt",
        "What is the capital of France? Answer in one sentence.",
        "-n",
        "24",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("Paris"), "answer: {text:?}");
    assert!(!text.contains("<|im_end|>"), "special tokens are not printed: {text:?}");
}

#[test]
fn exec_writes_python_with_the_trained_moe() {
    let Some(dir) = shared_model("pymoe-22m") else { return };
    let o = coli(&[
        "exec",
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "def fibonacci(n):",
        "-n",
        "48",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    // Its greedy continuation (checked token by token against transformers in oracle_cpu.rs)
    // opens a docstring.
    assert!(text.contains("\"\"\""), "continuation: {text:?}");
}

#[test]
fn stop_string_ends_generation_and_is_not_printed() {
    let Some(dir) = shared_model("pymoe-22m") else { return };
    let o = coli(&[
        "exec",
        "--device",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "def fibonacci(n):",
        "-n",
        "48",
        "--stop",
        "\"\"\"",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("\"\"\""), "{:?}", stdout(&o));
}

#[test]
fn compile_prints_a_plan_for_a_checkpoint() {
    let o = coli(&["compile", "graphs/olmoe.ron", "--config", "tests/fixtures/olmoe"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(plan.contains("l1"), "plan: {plan}");
    // Without --ctx, the context exec, serve and chat compile for.
    assert!(plan.contains("options: context 8192,"), "plan: {plan}");
    let o = coli(&["compile", "graphs/olmoe.ron", "--config", "tests/fixtures/olmoe", "--format", "dot"]);
    assert!(o.status.success() && stdout(&o).contains("digraph"), "{}", stderr(&o));
}

/// A path that is not there is one line naming the flag and what was looked for, the path
/// printed once, for each subcommand and path flag.
#[test]
fn missing_model_is_a_clear_error() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["exec", "--model", "no/such/model", "--prompt", "hi"],
            "no model at no/such/model: pass a .gguf file or a directory with config.json (--model)",
        ),
        (
            &["bench", "--model", "no/such/model"],
            "no model at no/such/model: pass a .gguf file or a directory with config.json (--model)",
        ),
        (
            &["compile", "--config", "no/such/model"],
            "no checkpoint at no/such/model: pass a config.json, a .gguf file or a model directory (--model)",
        ),
        (
            &["exec", "--model", "tests/fixtures/llama", "--spec", "no/such/model", "--prompt-ids", "1"],
            "no spec at no/such/model: pass an architecture spec such as graphs/llama.ron (--spec)",
        ),
        (
            &["compile", "no/such/model"],
            "no spec at no/such/model: pass an architecture spec such as graphs/llama.ron (the spec argument)",
        ),
    ];
    for (args, want) in cases {
        let o = coli(args);
        assert_clean_error(&o, want);
        assert_eq!(stderr(&o), format!("coli: error: {want}\n"), "{args:?}");
    }
}

/// `--logits-out` to a path that cannot be written fails before the model loads (no load
/// line, no generation), and a run that fails after the load leaves no empty file behind.
#[test]
fn an_unwritable_logits_file_fails_before_the_run() {
    let dir = std::env::temp_dir().join(format!("coli-unwritable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args = |out: &std::path::Path, ids: &str| {
        let out = out.to_str().unwrap().to_string();
        let ids = ids.to_string();
        move || coli(&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", &ids, "--logits-out", &out])
    };
    for bad in [dir.join("missing/x.json"), dir.clone()] {
        let o = args(&bad, "1,2")();
        assert_clean_error(&o, "--logits-out");
        let e = stderr(&o);
        assert!(!e.contains("loaded in") && !e.contains("tok/s"), "the model ran: {e}");
    }
    let fresh = dir.join("fresh.json");
    let o = args(&fresh, "1,99999")();
    assert_clean_error(&o, "99999");
    assert!(!fresh.exists(), "a failed run left {}", fresh.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sampler settings out of range are refused before the model loads (here, a model that is
/// not there), naming the flag.
#[test]
fn sampler_settings_are_checked_before_the_model_loads() {
    let o = coli(&["exec", "--model", "no/such/model", "--prompt-ids", "1", "--top-p=1.5"]);
    assert_clean_error(&o, "--top-p: top_p must be in (0, 1]");
    let o = coli(&["exec", "--model", "no/such/model", "--prompt-ids", "1", "--temperature=-1"]);
    assert_clean_error(&o, "--temperature");
}

/// Counts where 0 means nothing, and figures that would overflow what they become, are
/// refused by the argument parser with the flag and the reason (exit 2), not adjusted.
#[test]
fn meaningless_numbers_are_refused() {
    let llama = ["--model", "tests/fixtures/llama"];
    let exec = |extra: &[&'static str]| [&["exec"][..], &llama, &["--prompt-ids", "1"], extra].concat();
    let bench = |extra: &[&'static str]| [&["bench"][..], &llama, extra].concat();
    let compile = |extra: &[&'static str]| [&["compile", "graphs/llama.ron"][..], extra].concat();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (exec(&["--ctx", "0"]), "'0' for '--ctx <CTX>': at least 1 position"),
        (exec(&["--ctx", "4294967296"]), "32-bit"),
        (exec(&["--chunk", "0"]), "'0' for '--chunk <CHUNK>': at least 1 row"),
        (exec(&["--kv-block", "0"]), "'0' for '--kv-block <N>': at least 1 position"),
        (exec(&["--device-mem-mib", "0"]), "at least 1 MiB"),
        (exec(&["--device-mem-mib", "17592186044416"]), "at most 17592186044415 MiB"),
        (exec(&["--tier-mib", "17592186044416"]), "at most 17592186044415 MiB"),
        (exec(&["--pool-balance", "1.5"]), "'1.5': auto, off, or a share from 0 to 1"),
        (bench(&["--pool-balance", "some"]), "'some': auto, off, or a share from 0 to 1"),
        (exec(&["--host-pool-mib", "lots"]), "'lots': auto or MiB"),
        (bench(&["--host-pool-mib", "17592186044416"]), "at most 17592186044415 MiB"),
        (exec(&["--device2-mem-mib", "17592186044416"]), "at most 17592186044415 MiB"),
        (exec(&["--device-kv", "f8"]), "'f8' for '--device-kv <DEVICE_KV>'"),
        (bench(&["-p", "0"]), "'0' for '--prompt <PROMPT>': at least 1 token"),
        (bench(&["-n", "0"]), "'0' for '--decode <DECODE>': at least 1 token"),
        (bench(&["-r", "0"]), "at least 1 repetition"),
        (bench(&["--chunk", "0"]), "at least 1 row"),
        (bench(&["--ctx", "0"]), "at least 1 position"),
        (compile(&["--context", "0"]), "at least 1 position"),
        (compile(&["--chunk-rows", "0"]), "at least 1 row"),
        (compile(&["--kv-block", "0"]), "at least 1 position"),
    ];
    for (args, want) in cases {
        let o = coli(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("invalid value") && e.contains(want), "{args:?}: expected {want:?}; stderr: {e}");
    }
}

/// `coli bench -d/-p/-n` must fit the context: past what a context can hold, past `--ctx`, or
/// (without it) past the model's, a clear error naming the flags before anything is
/// allocated; with a `--ctx` that holds them, the bench runs past the model's context.
#[test]
fn bench_positions_are_bounded_by_the_context() {
    let llama = ["bench", "--model", "tests/fixtures/llama"];
    let t = std::time::Instant::now();
    let o = coli(&[&llama[..], &["-d", "1000000000000"]].concat());
    assert_clean_error(&o, "-d 1000000000000 + -p 128 + -n 64 take more positions than a context holds");
    assert!(t.elapsed().as_secs() < 30, "refused only after {:?}", t.elapsed());
    let o = coli(&[&llama[..], &["-d", "1000", "-p", "4", "-n", "2", "-r", "1"]].concat());
    assert_clean_error(&o, "the model's context of 256 positions is too small for -d 1000 + -p 4 + -n 2");
    assert!(stderr(&o).contains("--ctx"), "{}", stderr(&o));
    let o = coli(&[&llama[..], &["-d", "10", "--ctx", "12"]].concat());
    assert_clean_error(&o, "the context of 12 positions (--ctx) is too small for -d 10 + -p 128 + -n 64");
    let o = coli(&[&llama[..], &["-d", "300", "-p", "4", "-n", "2", "-r", "1", "--ctx", "307"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("pp4 @ d300:"), "{}", stdout(&o));
}

#[test]
fn bad_spec_names_file_line_and_column() {
    let spec = std::env::temp_dir().join(format!("coli-bad-{}.ron", std::process::id()));
    std::fs::write(&spec, "Spec(\n    family: \"x\",\n    bogus_field: 3,\n)\n").unwrap();
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--spec", spec.to_str().unwrap(), "--prompt-ids", "1,2"]);
    let _ = std::fs::remove_file(&spec);
    assert_clean_error(&o, ":3:");
}

#[test]
fn token_outside_the_vocabulary_is_a_clear_error() {
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", "1,99999"]);
    assert_clean_error(&o, "99999");
}

#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", "1,2,3,4,5,6", "--ctx", "4"]);
    assert_clean_error(&o, "context");
}

#[test]
fn generation_stops_at_the_end_of_the_context() {
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", "1,2,3", "--ctx", "6", "-n", "50"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("context of 6 positions is full"), "{}", stderr(&o));
}

#[test]
fn text_prompt_without_a_tokenizer_is_a_clear_error() {
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--prompt", "hello"]);
    assert_clean_error(&o, "--prompt-ids");
}

#[test]
fn truncated_checkpoint_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("coli-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture_dir("llama");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let o = coli(&["exec", "--model", dir.to_str().unwrap(), "--prompt-ids", "1,2"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_clean_error(&o, "model.safetensors");
}

#[test]
fn every_spec_under_graphs_is_built_in() {
    let mut on_disk: Vec<String> = std::fs::read_dir(root().join("graphs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ron"))
        .collect();
    on_disk.sort();
    let mut built: Vec<String> = coli::specs::BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    built.sort();
    assert_eq!(built, on_disk, "add new specs to runtime/src/engine/specs.rs");
    for (n, t) in coli::specs::BUILTIN {
        coli::specs::builtin(n, t).unwrap_or_else(|d| panic!("{n}: {d}"));
    }
}

/// `coli bench --profile --streams 3` on the device: the speeds (three streams' batched decode
/// among them), then the device time per kernel of a prompt and of a decode step, the MoE kernels among them (work ran on the device), and the
/// host's time per phase; with two devices, the second's named d1.
#[test]
fn bench_profile_lists_device_time_per_kernel() {
    let dir = fixture_dir("olmoe");
    let o = coli(&[
        "bench",
        "--device",
        "vulkan",
        "--model",
        dir.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
        "--streams",
        "3",
    ]);
    if stderr(&o).contains("no Vulkan device") {
        return;
    }
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("pp8:") && out.contains("tg2:"), "{out}");
    // Three streams' decode steps batched, with their own profile.
    assert!(out.contains("tg2 x 3 streams: ") && out.contains("tok/s aggregate"), "{out}");
    if out.contains("no timestamps") {
        return;
    }
    assert!(
        out.contains("device time, prompt of 8") && out.contains("device time, decode (per token, mean of 2)"),
        "{out}"
    );
    assert!(out.contains("MoeMatvec") || out.contains("MoeMatmul"), "{out}");
    // The host's phases of the frames' runs too.
    assert!(
        out.contains("host time, prompt of 8, phases")
            && out.contains("submit and wait")
            && out.contains("K/V rows into the host's cache"),
        "{out}"
    );
    // Two devices (two logical ones here): the second's kernels and phases named d1.
    let o = coli(&[
        "bench",
        "--device",
        "vulkan",
        "--model",
        dir.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
        "--devices",
        "2",
        "--device-layers",
        "1",
    ]);
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("1 on d0, 1 on d1"), "{out}");
    assert!(out.contains("  d1 Moe") && out.contains("  d1 submit and wait"), "{out}");
}

/// `coli bench -d N` runs its tests after N tokens of context (llama-bench's depth), and with a
/// KV split the decode steps at that depth attend over host positions (the stats line).
#[test]
fn bench_runs_at_a_depth() {
    let dir = fixture_dir("llama");
    let o = coli(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "-d",
        "40",
        "-p",
        "8",
        "-n",
        "3",
        "-r",
        "1",
        "--chunk",
        "16",
    ]);
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("pp8 @ d40:") && out.contains("tg3 @ d40:"), "{out}");
    // --fill-unsplit with nothing split says it changes nothing.
    let o = coli(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "-d",
        "8",
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--fill-unsplit",
    ]);
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    assert!(stderr(&o).contains("--fill-unsplit: no KV split"), "{}", stderr(&o));
    let o = coli(&[
        "bench",
        "--device",
        "vulkan",
        "--model",
        dir.to_str().unwrap(),
        "-d",
        "40",
        "-p",
        "4",
        "-n",
        "3",
        "-r",
        "1",
        "--chunk",
        "16",
        "--kv-device-positions",
        "8",
        "--kv-block",
        "4",
    ]);
    if stderr(&o).contains("no Vulkan device") {
        return;
    }
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.starts_with("kv split, all repetitions")).unwrap_or_else(|| panic!("{out}"));
    let host_steps: u64 = line
        .split(", ")
        .nth(2)
        .and_then(|w| w.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(host_steps > 0, "{line}");
    // The context filled by the model placed without the split; the timed steps still split.
    let o = coli(&[
        "bench",
        "--device",
        "vulkan",
        "--model",
        dir.to_str().unwrap(),
        "-d",
        "40",
        "-p",
        "4",
        "-n",
        "3",
        "-r",
        "1",
        "--chunk",
        "16",
        "--kv-device-positions",
        "8",
        "--kv-block",
        "4",
        "--fill-unsplit",
    ]);
    assert!(o.status.success(), "coli bench failed: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("context of 40 positions filled without the KV split"), "{out}");
    let line = out.lines().find(|l| l.starts_with("kv split, all repetitions")).unwrap_or_else(|| panic!("{out}"));
    let host_steps: u64 = line
        .split(", ")
        .nth(2)
        .and_then(|w| w.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(host_steps > 0, "{line}");
}

/// `--kv-device-positions 0` is refused with a reason (it used to mean one block).
#[test]
fn a_kv_split_of_no_positions_is_refused() {
    let o = coli(&["compile", "graphs/llama.ron", "--kv-device-positions", "0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("at least 1 position"), "{}", stderr(&o));
}

/// A forced KV split says so in one line when the model runs on a device.
#[test]
fn exec_says_when_the_kv_cache_is_split() {
    let dir = fixture_dir("llama");
    let o = coli(&[
        "exec",
        "--device",
        "vulkan",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3,4,5,6,7,8,9,10,11,12",
        "-n",
        "4",
        "--chunk",
        "4",
        "--kv-device-positions",
        "8",
        "--kv-block",
        "4",
    ]);
    if stderr(&o).contains("no Vulkan device") {
        return;
    }
    assert!(o.status.success(), "coli exec failed: {}", stderr(&o));
    assert!(stderr(&o).contains("kv split (forced)"), "{}", stderr(&o));
}

#[test]
fn exec_speculates_with_the_same_output() {
    // A fixture: the flags are taken and the tokens are those without them.
    let prompt = "1,2,3,4,5,6,1,2,3,4,5,6,1,2,3";
    let run = |extra: &[&str]| {
        let o = coli(
            &[&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", prompt, "-n", "24"][..], extra].concat(),
        );
        assert!(o.status.success(), "coli exec failed: {}", stderr(&o));
        o
    };
    assert_eq!(stdout(&run(&["--speculate", "ngram", "--draft-tokens", "3"])), stdout(&run(&[])));
    let o = coli(&[
        "exec",
        "--model",
        "tests/fixtures/llama",
        "--prompt-ids",
        "1",
        "--speculate",
        "ngram",
        "--draft-tokens",
        "99",
    ]);
    assert!(o.status.code() == Some(2) && stderr(&o).contains("between 1 and 32"), "{}", stderr(&o));

    // The trained model on a repetitive code prompt: drafts are made and mostly right.
    let Some(m) = shared_model("pymoe-22m") else { return };
    let m = m.to_str().unwrap();
    let code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n";
    let exec = |extra: &[&str]| coli(&[&["exec", "--model", m, "-p", code, "-n", "48"][..], extra].concat());
    let (plain, fast) = (exec(&[]), exec(&["--speculate", "ngram"]));
    assert!(fast.status.success(), "{}", stderr(&fast));
    assert_eq!(stdout(&fast), stdout(&plain));
    let e = stderr(&fast);
    let line =
        e.lines().find(|l| l.contains("speculation (ngram):")).unwrap_or_else(|| panic!("no speculation line: {e}"));
    assert!(line.contains("accepted"), "{line}");
}

#[test]
fn exec_speculates_with_the_checkpoints_draft_layer() {
    let prompt = "181,61,50,130,216,213,126,9,93,70,164,160,129";
    let run = |extra: &[&str]| {
        coli(
            &[&["exec", "--model", "tests/fixtures/deepseek_v3_mtp", "--prompt-ids", prompt, "-n", "32"][..], extra]
                .concat(),
        )
    };
    let (plain, fast) = (run(&[]), run(&["--speculate", "mtp", "--draft-tokens", "2"]));
    assert!(fast.status.success(), "coli exec failed: {}", stderr(&fast));
    assert_eq!(stdout(&fast), stdout(&plain));
    let e = stderr(&fast);
    let line =
        e.lines().find(|l| l.contains("speculation (mtp):")).unwrap_or_else(|| panic!("no speculation line: {e}"));
    assert!(line.contains("accepted"), "{line}");
    // A model without a draft layer.
    let o = coli(&["exec", "--model", "tests/fixtures/llama", "--prompt-ids", "1,2", "--speculate", "mtp"]);
    assert!(!o.status.success() && stderr(&o).contains("has no draft model"), "{}", stderr(&o));
}

#[test]
fn compile_prints_the_draft_models_plan() {
    let o = coli(&["compile", "graphs/deepseek_v3.ron", "-m", "tests/fixtures/deepseek_v3_mtp", "--draft"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("options: the draft model"), "{out}");
    assert!(
        out.contains("layers 1,") && out.contains("= input") && out.contains("model.layers.2.eh_proj.weight"),
        "{out}"
    );
    let o = coli(&["compile", "graphs/llama.ron", "-m", "tests/fixtures/llama", "--draft"]);
    assert!(!o.status.success() && stderr(&o).contains("has no draft model"), "{}", stderr(&o));
}
