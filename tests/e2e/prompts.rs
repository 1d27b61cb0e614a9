//! Large prompts: a prompt of any size up to caw-box's cap (1 MiB) reaches each CLI whole, on
//! a first turn and on a resume (never through a command line, where Linux takes at most
//! 128 KiB in one argument), and one over the cap is refused before anything is created.
//!
//! Cost: one rig, the four CLIs side by side (a run and a resume each, as the sessions tests
//! run them); the refusals run no turn.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::*;

/// The cap (`MAX_TURN_PROMPT_BYTES`), as the docs state it.
const CAP: usize = 1024 * 1024;

/// A prompt of exactly `len` bytes: lines a reader can follow, a marker at its start and at
/// its end, and no stub directive in it (the stub says hello).
fn prompt(marker: &str, len: usize) -> String {
    let head = format!("BEGIN-{marker}\n");
    let tail = format!("END-{marker}");
    let mut text = head;
    let mut line = 0;
    while text.len() + tail.len() < len {
        text.push_str(&format!("line {line:07} of {marker}: keep all of it\n"));
        line += 1;
    }
    text.truncate(len - tail.len());
    text.push_str(&tail);
    assert_eq!(text.len(), len);
    text
}

/// Runs `cmd` with `input` on its stdin (written beside it: caw-box reads it all first).
fn run_with_stdin(mut cmd: Command, input: &str) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn caw-box");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || {
        // caw-box may refuse before it read all of it: a closed pipe is its answer.
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = wait_with_deadline(child, std::time::Duration::from_secs(300));
    writer.join().unwrap();
    out
}

/// The `-o json` object a turn printed, its exit code asserted.
fn json_of(out: &Output, code: i32) -> Value {
    let json = serde_json::from_str(stdout_of(out).trim()).unwrap_or_else(|e| {
        panic!(
            "-o json printed no JSON object ({e}):\nstdout: {}\nstderr: {}",
            stdout_of(out),
            stderr_of(out)
        )
    });
    assert_eq!(out.status.code(), Some(code), "{json}\n{}", stderr_of(out));
    json
}

/// Asserts that some model request carried `prompt` whole (in one string of its body).
fn assert_the_stub_got(requests: &[Value], who: &str, prompt: &str) {
    fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            Value::Object(o) => o.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let (begin, end) = (
        prompt.lines().next().unwrap(),
        prompt.lines().last().unwrap(),
    );
    let mut seen = Vec::new();
    for r in requests {
        let mut found = Vec::new();
        strings(&r["body"], &mut found);
        if found.iter().any(|s| s.contains(prompt)) {
            return;
        }
        // What arrived of it, for the failure's message.
        seen.extend(
            found
                .iter()
                .filter(|s| s.contains(begin) || s.contains(end))
                .map(|s| (s.len(), s.contains(begin), s.contains(end))),
        );
    }
    panic!(
        "{who}: no request carried the whole {} byte prompt; strings with its markers (length, begin, end): {seen:?}",
        prompt.len()
    );
}

/// A turn of `cmd` (a `run` or `resume` with `-o json`, given what goes where its PROMPT
/// does, last) with `text` as its prompt, from a file named `file` or on stdin: its JSON, the
/// turn a success.
fn turn_with(rig: &Rig, cmd: impl Fn(&str) -> Command, text: &str, file: Option<&str>) -> Value {
    let out = match file {
        Some(name) => {
            let file = rig.data_dir.path().join(name);
            std::fs::write(&file, text).unwrap();
            let mut cmd = cmd("--prompt-file");
            cmd.arg(&file);
            run(cmd)
        }
        None => run_with_stdin(cmd("-"), text),
    };
    let json = json_of(&out, 0);
    assert_eq!(json["status"], "success", "{json}");
    json
}

/// One CLI's session: a 512 KiB first turn and a large resume (`resume_len` bytes), both
/// successful. Returns the session id.
fn run_and_resume(rig: &Rig, p: P, resume_len: usize) -> String {
    // Both ways a large prompt is given: on stdin, or in a file.
    let file = |turn: &str| {
        matches!(p.name, "codex" | "opencode").then(|| format!("{}-{turn}.txt", p.name))
    };
    // codex's resume runs in its warm container: the runtime files go in by exec.
    let warm: &[&str] = match p.name {
        "codex" => &["--keep-warm", "2m"],
        _ => &[],
    };
    let first = prompt(&format!("{}-first", p.name), 512 * 1024);
    let run = |at: &str| rig.run_cmd(p, at, &[warm, &["-o", "json"]].concat());
    let json = turn_with(rig, run, &first, file("first").as_deref());
    let id = json["session_id"].as_str().unwrap().to_string();
    if p.name == "codex" {
        let warm = format!("caw-box-{id}-warm");
        assert!(
            rig.caw_containers().iter().any(|c| c.ends_with(&warm)),
            "no warm container for the resume: {:?}",
            rig.caw_containers()
        );
    }
    let next = prompt(&format!("{}-resume", p.name), resume_len);
    let resume = |at: &str| rig.resume_cmd(p, &id, at, &["-o", "json"]);
    let json = turn_with(rig, resume, &next, file("resume").as_deref());
    assert_eq!(json["turn"], 2, "{}: {json}", p.name);
    id
}

#[test]
fn a_prompt_of_512_kib_reaches_each_cli_whole_on_run_and_resume() {
    let rig = Rig::new("big-prompts");
    check("512 KiB prompts, run and resume, four CLIs");
    // gemini's resume is the cap itself: the largest prompt taken reaches it whole too.
    let resume_len = |p: P| if p.name == "gemini" { CAP } else { 512 * 1024 };
    let sessions: Vec<(P, String)> = std::thread::scope(|s| {
        let runs: Vec<_> = ALL
            .iter()
            .map(|&p| {
                let rig = &rig;
                s.spawn(move || (p, run_and_resume(rig, p, resume_len(p))))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let requests = rig.stub_requests();
    for (p, _) in &sessions {
        assert_the_stub_got(
            &requests,
            p.name,
            &prompt(&format!("{}-first", p.name), 512 * 1024),
        );
        assert_the_stub_got(
            &requests,
            p.name,
            &prompt(&format!("{}-resume", p.name), resume_len(*p)),
        );
    }
}

/// Asserts a usage error as `-o json` prints it: exit 2, kind `usage`, the size and the cap
/// in its one line.
fn assert_over_the_cap(out: &Output, len: usize) {
    let json = json_of(out, 2);
    assert_eq!(json["status"], "error", "{json}");
    assert_eq!(json["exit_code"], 2, "{json}");
    assert_eq!(json["error"]["kind"], "usage", "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{len} bytes")) && message.contains(&format!("{CAP} bytes")),
        "{json}"
    );
    assert!(
        json["error"]["hint"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{json}"
    );
    let lines: Vec<String> = stderr_of(out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
}

#[test]
fn a_prompt_over_the_cap_is_refused_and_nothing_is_created() {
    let rig = Rig::new("prompt-cap");
    let over = prompt("over", CAP + 1);
    check("run, on stdin and from a file, foreground and detached");
    let mut cmd = rig.run_cmd(CODEX, "-", &["-o", "json"]);
    assert_over_the_cap(&run_with_stdin(cmd, &over), CAP + 1);
    let file = rig.data_dir.path().join("over.txt");
    std::fs::write(&file, &over).unwrap();
    cmd = rig.run_cmd(CLAUDE, "--prompt-file", &["-o", "json", "--detach"]);
    cmd.arg(&file);
    assert_over_the_cap(&run(cmd), CAP + 1);
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );

    check("resume of a session");
    let (code, first, stderr) = rig.json_turn(rig.run_cmd(GEMINI, "hello", &[]));
    assert_eq!(code, 0, "{first}\n{stderr}");
    let id = first["session_id"].as_str().unwrap().to_string();
    // (Docker lists volumes in no set order.)
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let volumes = sorted(rig.caw_volumes());
    let cmd = rig.resume_cmd(GEMINI, &id, "-", &["-o", "json"]);
    assert_over_the_cap(&run_with_stdin(cmd, &over), CAP + 1);
    let cmd = rig.resume_cmd(GEMINI, &id, "-", &["-o", "json", "--detach"]);
    assert_over_the_cap(&run_with_stdin(cmd, &over), CAP + 1);
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );
    assert_eq!(
        sorted(rig.caw_volumes()),
        volumes,
        "a volume was made or taken"
    );
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", &id, "--json"]))).unwrap();
    assert_eq!(shown["turns"].as_array().map(Vec::len), Some(1), "{shown}");
}
