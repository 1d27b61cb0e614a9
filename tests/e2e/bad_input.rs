//! Bad input: one clear line on stderr, the documented exit code, nothing created.

use std::collections::HashMap;

use bollard::models::VolumeCreateRequest;

use crate::common::*;

/// Asserts a one-line error with the exit code, mentioning `needle`.
fn assert_refused(out: &std::process::Output, code: i32, needle: &str) {
    let stderr = stderr_of(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one line, got: {stderr}");
    assert!(lines[0].contains(needle), "'{needle}' not in: {stderr}");
    assert!(stdout_of(out).is_empty(), "stdout: {}", stdout_of(out));
}

#[test]
fn bad_input_is_refused_cleanly_and_creates_nothing() {
    let rig = Rig::new("bad-input");

    let out = run(rig.run_cmd(
        P {
            name: "gpt",
            ..CODEX
        },
        "hi",
        &[],
    ));
    assert_refused(&out, 2, "unknown provider 'gpt'");
    assert!(stderr_of(&out).contains("claude_code") && stderr_of(&out).contains("gemini"));

    let out = run(rig.run_cmd(CODEX, "   ", &[]));
    assert_refused(&out, 2, "the prompt is empty");

    // No PROMPT and no terminal (stdin is /dev/null here): nothing to open a TUI on.
    let mut no_prompt = rig.caw();
    no_prompt.args(["run", "--provider", "codex", "--network", &rig.network]);
    assert_refused(&run(no_prompt), 2, "no terminal for an interactive session");
    let mut group_without_prompt = rig.caw();
    group_without_prompt.args(["resume", "--group", "team"]);
    assert_refused(&run(group_without_prompt), 2, "--group needs a PROMPT");

    let out = run(rig.resume_cmd(CODEX, r#"{"version":1,"provider":"codex""#, "hi", &[]));
    assert_refused(&out, 2, "malformed resume handle");

    let ghost = uuid::Uuid::new_v4();
    let handle = format!(
        r#"{{"version":1,"provider":"codex","session_id":"{ghost}","resume_key":"k","volume":"caw-box-{ghost}"}}"#
    );
    let out = run(rig.resume_cmd(CODEX, &handle, "hi", &[]));
    assert_refused(&out, 2, "does not exist");

    // A volume that belongs to a codex session, and a handle that claims claude_code.
    let other = uuid::Uuid::new_v4();
    rig.rt.block_on(async {
        rig.docker
            .create_volume(VolumeCreateRequest {
                name: Some(format!("caw-box-{other}")),
                labels: Some(HashMap::from([
                    ("io.caw-box.managed".to_string(), "true".to_string()),
                    ("io.caw-box.session".to_string(), other.to_string()),
                    ("io.caw-box.provider".to_string(), "codex".to_string()),
                    ("io.caw-box.role".to_string(), "state".to_string()),
                    (TEST_LABEL.to_string(), rig.run_id.clone()),
                ])),
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let handle = format!(
        r#"{{"version":1,"provider":"claude_code","session_id":"{other}","resume_key":"k","volume":"caw-box-{other}"}}"#
    );
    let out = run(rig.resume_cmd(CLAUDE, &handle, "hi", &[]));
    assert_refused(&out, 2, "belongs to a codex session");

    let out = run(rig.resume_cmd(
        CODEX,
        &other.to_string(),
        "hi",
        &["--image", "caw-box-test/absent:latest"],
    ));
    assert_refused(&out, 3, "image 'caw-box-test/absent:latest' is not present");
    // Under --allow-host the first container made is the egress proxy, of the same image.
    let allow = format!("{}:8080", rig.stub);
    let out = run(rig.resume_cmd(
        CODEX,
        &other.to_string(),
        "hi",
        &[
            "--image",
            "caw-box-test/absent:latest",
            "--allow-host",
            &allow,
        ],
    ));
    assert_refused(&out, 3, "image 'caw-box-test/absent:latest' is not present");

    let out = run(rig.resume_cmd(CODEX, "no-such-session", "hi", &[]));
    assert_refused(&out, 2, "no session matches 'no-such-session'");

    let out = run(rig.run_cmd(CODEX, "hi", &["--image", "caw-box-test/absent:latest"]));
    assert_refused(&out, 3, "image 'caw-box-test/absent:latest' is not present");

    let out = run(rig.run_cmd(CODEX, "hi", &["--timeout", "soon"]));
    assert_refused(&out, 2, "--timeout 'soon'");

    // A runtime the engine would not run the agent on: exit 3 naming it. Docker lacks it;
    // Podman's API chooses no runtime per container, so there gVisor's is refused too.
    let out = run(rig.run_cmd(CODEX, "hi", &["--runtime", "caw-box-no-such-runtime"]));
    assert_refused(&out, 3, "--runtime caw-box-no-such-runtime: ");
    if rig.is_podman() {
        let out = run(rig.run_cmd(CODEX, "hi", &["--runtime", "runsc"]));
        assert_refused(
            &out,
            3,
            "Podman's Docker-compatible API does not choose a container's runtime",
        );
    }

    let mut cmd = rig.run_cmd(CODEX, "hi", &[]);
    cmd.env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    let out = run(cmd);
    assert_refused(&out, 3, "is Docker running?");

    // None of that left anything behind but the volume this test made itself.
    assert_eq!(rig.caw_volumes(), vec![format!("caw-box-{other}")]);
    assert!(rig.caw_containers().is_empty());

    // A name that a session has already: refused before anything is made.
    let (code, _, stderr) = rig.json_turn(rig.run_cmd(CODEX, "hi", &["--name", "taken"]));
    assert_eq!(code, 0, "{stderr}");
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let before = sorted(rig.caw_volumes());
    let out = run(rig.run_cmd(CODEX, "hi", &["--name", "taken"]));
    assert_refused(&out, 2, "a session named 'taken' exists already");
    assert_eq!(sorted(rig.caw_volumes()), before);
}

/// SPEC's five failure kinds before a turn, under `-o json` (and `stream-json`): one
/// `{"status":"error","error":{"kind","message","hint"},"exit_code"}` object as the last
/// line of stdout, the same exit code, and the usual line on stderr.
#[test]
fn failures_before_the_turn_answer_with_one_json_object() {
    let rig = Rig::new("json-failures");
    let check =
        |mut cmd: std::process::Command, format: &str, code: i32, kind: &str, needle: &str| {
            cmd.args(["-o", format]);
            let out = run(cmd);
            let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
            assert_eq!(
                out.status.code(),
                Some(code),
                "stdout: {stdout}\nstderr: {stderr}"
            );
            let last = stdout.lines().last().unwrap_or_default();
            let object: serde_json::Value = serde_json::from_str(last)
                .unwrap_or_else(|e| panic!("no JSON object ({e}): {stdout}"));
            assert_eq!(object["status"], "error", "{object}");
            assert_eq!(object["exit_code"], code, "{object}");
            assert_eq!(object["error"]["kind"], kind, "{object}");
            let message = object["error"]["message"].as_str().unwrap();
            assert!(message.contains(needle), "'{needle}' not in {object}");
            assert!(object["error"].get("hint").is_some(), "{object}");
            assert!(
                stderr.contains(message),
                "stderr lacks the message: {stderr}"
            );
            object
        };
    // A bad flag value (clap's), and one caw-box refuses itself.
    check(
        rig.run_cmd(CODEX, "hi", &["--cpus", "lots"]),
        "json",
        2,
        "usage",
        "'lots'",
    );
    check(
        rig.run_cmd(CODEX, "hi", &["--memory", "lots"]),
        "stream-json",
        2,
        "usage",
        "--memory",
    );
    // An unknown handle.
    check(
        rig.resume_cmd(CODEX, "no-such-session", "hi", &[]),
        "json",
        2,
        "not_found",
        "no session matches 'no-such-session'",
    );
    // No daemon.
    let mut no_daemon = rig.run_cmd(CODEX, "hi", &[]);
    no_daemon.env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    let o = check(
        no_daemon,
        "json",
        3,
        "environment",
        "cannot reach the Docker daemon",
    );
    assert!(o["error"]["hint"]
        .as_str()
        .unwrap()
        .contains("is Docker running?"));
    // A missing image.
    let absent = ["--image", "caw-box-test/absent:latest"];
    let o = check(
        rig.run_cmd(CODEX, "hi", &absent),
        "json",
        3,
        "environment",
        "is not present",
    );
    assert!(o["error"]["hint"].is_string(), "{o}");
    check(
        rig.run_cmd(CODEX, "hi", &absent),
        "stream-json",
        3,
        "environment",
        "is not present",
    );
    // No credentials: nothing collected, no --env key.
    let o = check(
        rig.run_cmd_stored_key(CODEX, "hi", &[]),
        "json",
        4,
        "credentials",
        "codex",
    );
    let hint = o["error"]["hint"].as_str().unwrap_or_default();
    assert!(
        hint.contains("caw-box auth collect --provider codex"),
        "{o}"
    );
    // Refusals leave nothing behind.
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    assert!(rig.caw_containers().is_empty());
}
