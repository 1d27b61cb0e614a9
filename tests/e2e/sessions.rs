//! Run and resume, per provider: a fact told in turn 1 is recalled later, a tool call shows
//! as events, the turn container is gone after each turn, the handle alone resumes the
//! session after the host's caw-box data directory was deleted, and usage is reported.

use serde_json::Value;

use crate::common::*;

fn run_tool_and_recall(p: P) {
    let rig = Rig::new(&format!("rr-{}", p.name));

    // Turn 1: tell it a fact. (Names are unique per Docker host, so per test here.)
    check("run");
    let name = format!("n-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "Please REMEMBER:papaya-17 for later.",
        &["--name", &name],
    ));
    assert_eq!(code, 0, "turn 1 failed: {first}\n{stderr}");
    assert_eq!(first["status"], "success");
    assert_eq!(first["provider"], p.name);
    assert_eq!(first["turn"], 1);
    assert_eq!(first["name"], name.as_str());
    assert!(
        first["result"]
            .as_str()
            .unwrap()
            .contains("Noted: papaya-17"),
        "{first}"
    );
    let id = first["session_id"].as_str().unwrap().to_string();
    assert!(
        rig.caw_containers().is_empty(),
        "a turn container was left behind"
    );
    // The state volume, the turn's checkpoint (none on Podman yet), and the turn-record
    // volume whose labels summarise the last turn.
    let mut volumes = rig.caw_volumes();
    volumes.sort();
    let mut want = vec![
        format!("caw-box-{id}"),
        format!("caw-box-{id}-checkpoint-1"),
        format!("caw-box-{id}-turn-1"),
    ];
    if rig.is_podman() {
        want.remove(1);
    }
    assert_eq!(volumes, want);

    // Turn 2, by name: a tool call, as unified stream-json events.
    check("tool call");
    let mut cmd = rig.resume_cmd(p, &name, "RUN:printf 'tool-marker-%s\\n' 42", &[]);
    cmd.args(["-o", "stream-json"]);
    let out = run(cmd);
    let events: Vec<Value> = stdout_of(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(
        out.status.code(),
        Some(0),
        "turn 2 failed: {}",
        stderr_of(&out)
    );
    let call = events
        .iter()
        .find(|e| e["type"] == "tool_call")
        .unwrap_or_else(|| panic!("no tool_call event in {events:#?}"));
    assert!(call["id"].as_str().is_some_and(|s| !s.is_empty()), "{call}");
    assert!(
        call["name"].as_str().is_some_and(|s| !s.is_empty()),
        "{call}"
    );
    let result = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result event in {events:#?}"));
    assert!(
        result["output"]
            .as_str()
            .unwrap_or("")
            .contains("tool-marker-42"),
        "the shell command did not run: {result}"
    );
    assert_eq!(result["is_error"], false);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "result", "{last}");
    assert_eq!(last["status"], "success");
    assert_eq!(last["turn"], 2);
    assert!(
        last["result"].as_str().unwrap().contains("tool-marker-42"),
        "{last}"
    );
    assert_eq!(events[0]["type"], "session", "{:?}", events[0]);
    assert!(
        rig.caw_containers().is_empty(),
        "a turn container was left behind"
    );

    // Turn 3 from the handle alone, with the host's data directory gone.
    check("resume recall");
    let handle = last["resume_handle"].as_str().unwrap().to_string();
    let h: Value = serde_json::from_str(&handle).unwrap();
    assert_eq!(h["volume"], format!("caw-box-{id}"));
    assert_eq!(h["provider"], p.name);
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();
    let (code, third, stderr) = rig.json_turn(rig.resume_cmd(p, &handle, "RECALL", &[]));
    assert_eq!(code, 0, "turn 3 failed: {third}\n{stderr}");
    assert_eq!(
        third["turn"], 3,
        "the turn count lives in the volume: {third}"
    );
    assert!(
        third["result"]
            .as_str()
            .unwrap()
            .contains("You told me to remember papaya-17"),
        "the CLI did not send turn 1's history: {third}"
    );
    // Every model request carried the injected key (the stub refuses others).
    let requests = rig.stub_requests();
    assert!(!requests.is_empty());
    assert!(
        requests.iter().all(|r| r["status"] != 401),
        "a request lacked the key: {requests:#?}"
    );
    // The key never shows in caw-box's own output.
    assert!(!stderr.contains(TEST_KEY) && !third.to_string().contains(TEST_KEY));

    // Every turn reports the tokens the model said it used (the stub always sends usage).
    check("usage");
    for turn in [&first, &third] {
        for k in ["input_tokens", "output_tokens"] {
            assert!(
                turn["usage"][k].as_u64().is_some_and(|n| n > 0),
                "usage.{k} of turn {}: {turn}",
                turn["turn"]
            );
        }
    }
}

#[test]
fn claude_code_runs_a_tool_and_recalls_after_resume() {
    run_tool_and_recall(CLAUDE);
}

#[test]
fn codex_runs_a_tool_and_recalls_after_resume() {
    run_tool_and_recall(CODEX);
}

#[test]
fn opencode_runs_a_tool_and_recalls_after_resume() {
    run_tool_and_recall(OPENCODE);
}

#[test]
fn gemini_runs_a_tool_and_recalls_after_resume() {
    run_tool_and_recall(GEMINI);
}

/// The `json` object has exactly SPEC.md's keys, and `text` output streams the answer on
/// stdout with the resume line on stderr.
#[test]
fn output_shapes_match_the_spec() {
    let rig = Rig::new("shapes");
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:shape", &[]));
    assert_eq!(code, 0, "{stderr}");
    let mut redacted = json.clone();
    for k in ["session_id", "resume_handle", "duration_ms"] {
        redacted[k] = Value::String(format!("[{k}]"));
    }
    for k in [
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
    ] {
        assert!(redacted["usage"][k].is_u64(), "usage.{k}: {json}");
        redacted["usage"][k] = Value::String("[n]".into());
    }
    // gpt-5.5 is in the pricing table: a cost, whatever the token counts were.
    assert!(
        redacted["usage"]["cost_usd"].is_f64(),
        "usage.cost_usd: {json}"
    );
    redacted["usage"]["cost_usd"] = Value::String("[usd]".into());
    // The turn's egress: the model's host (the stub) reached, its counts.
    for e in redacted["egress"]["allowed"].as_array_mut().unwrap() {
        assert_eq!(e["host"], rig.stub.as_str(), "{json}");
        for k in ["connections", "bytes_out", "bytes_in"] {
            assert!(e[k].as_u64() > Some(0), "egress {k}: {json}");
            e[k] = Value::String("[n]".into());
        }
        e["host"] = Value::String("[stub]".into());
    }
    insta::assert_json_snapshot!("json_output_codex", redacted);

    let id = json["session_id"].as_str().unwrap();
    let out = run(rig.resume_cmd(CODEX, id, "REMEMBER:again", &[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), "Noted: again.");
    assert!(
        stderr_of(&out).contains(&format!("resume with: caw-box resume {id}")),
        "{}",
        stderr_of(&out)
    );

    let mut cmd = rig.resume_cmd(CODEX, id, "RUN:echo shape", &[]);
    cmd.args(["-o", "stream-json"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // The shape of each event: its type and its keys.
    let shapes: Vec<String> = stdout_of(&out)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort();
            format!("{}: {}", v["type"].as_str().unwrap(), keys.join(","))
        })
        .collect();
    insta::assert_snapshot!("stream_json_shapes_codex", shapes.join("\n"));
}
