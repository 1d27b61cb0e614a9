//! No turn hangs: a CLI that cannot reach its model is stopped (`unreachable`, exit 3) and
//! its session stays resumable; a silent CLI is stopped by `--idle-timeout`; a network on
//! which no model can be reached is refused before anything is created.

use std::time::{Duration, Instant};

use crate::common::*;

/// How the endpoint fails to answer.
#[derive(Clone, Copy)]
enum Dead {
    /// A name that does not resolve on the test's network.
    NoSuchHost,
    /// The stub's host on a port where nothing listens: every connection is refused.
    Refused,
}

/// How long the CLI may fail to reach its model.
#[derive(Clone, Copy)]
enum Patience {
    /// `--connect-timeout 20s`: the CLI fails well before it runs out.
    Some,
    /// `--connect-timeout 2s`: it has run out before the CLI first tries (as on a machine too
    /// loaded for a CLI to start in time), so the egress proxy reports the failure at the
    /// moment the CLI meets it. The CLI still gets the seconds to take it in and say what
    /// it made of it: opencode names its new session only there (CI once stopped it before,
    /// and its resume started a new conversation).
    RunOut,
}

/// A run whose endpoint does not answer ends within 35 s (15 s past a 20 s
/// `--connect-timeout`), with exit 3 and status `unreachable`, naming the host; nothing is
/// left running; a resume with the working endpoint recalls what the failed turn was told.
fn unreachable_then_resume(p: P, how: Dead, patience: Patience) {
    let rig = Rig::new(&format!("unreach-{}", p.name.replace('_', "-")));
    let dead = match how {
        Dead::NoSuchHost => format!("nohost-{}:8080", rig.run_id),
        Dead::Refused => format!("{}:9", rig.stub),
    };
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", p.name, "--network", &rig.network])
        .args(["--endpoint", &format!("http://{dead}")])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(["--timeout", "5m", "--connect-timeout"])
        .arg(match patience {
            Patience::Some => "20s",
            Patience::RunOut => "2s",
        });
    if let Some(m) = p.model {
        cmd.args(["--model", m]);
    }
    cmd.arg("REMEMBER:lighthouse");
    let started = Instant::now();
    let (code, json, stderr) = rig.json_turn(cmd);
    let took = started.elapsed();
    assert_eq!(code, 3, "{json}\n{stderr}");
    assert_eq!(json["status"], "unreachable", "{json}");
    assert_eq!(json["exit_code"], 3, "{json}");
    let result = json["result"].as_str().unwrap_or("");
    assert!(result.contains(&dead), "the host is not named: {result}");
    assert!(
        took <= Duration::from_secs(20 + 15),
        "an unreachable model took {took:?} to end the turn"
    );
    let line = stderr.lines().last().unwrap_or("");
    assert!(
        line.contains(&dead) && line.contains("--endpoint") && line.contains("--allow-host"),
        "the error line does not name the host and what to check: {stderr}"
    );
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );
    assert!(rig.stub_requests().is_empty(), "the stub was reached");

    let id = json["session_id"].as_str().unwrap().to_string();
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(p, &id, "RECALL", &["--endpoint", &rig.endpoint()]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 2, "{json}");
    // (On a miss: the conversation the CLI sent, as the stub saw it.)
    let sent = || {
        let last = rig.stub_requests().pop().unwrap_or_default();
        let body = &last["body"];
        let items = [&body["messages"], &body["input"], &body["contents"]];
        let items = items.into_iter().find(|v| v.is_array()).cloned();
        serde_json::to_string(&items.unwrap_or_default()).unwrap_or_default()
    };
    assert_eq!(
        json["result"].as_str().map(str::trim),
        Some("You told me to remember lighthouse."),
        "{json}\nthe resume sent: {}",
        sent()
    );
}

#[test]
fn claude_code_stops_when_its_model_is_unreachable() {
    unreachable_then_resume(CLAUDE, Dead::NoSuchHost, Patience::Some);
}

#[test]
fn codex_stops_when_its_model_is_unreachable() {
    unreachable_then_resume(CODEX, Dead::NoSuchHost, Patience::Some);
}

#[test]
fn opencode_stops_when_its_model_is_unreachable() {
    unreachable_then_resume(OPENCODE, Dead::Refused, Patience::RunOut);
}

#[test]
fn gemini_stops_when_its_model_is_unreachable() {
    unreachable_then_resume(GEMINI, Dead::Refused, Patience::Some);
}

/// An opencode turn stopped before its model answered (here by `--timeout`) has made its
/// session without naming it (opencode does once the model answers, or in the error it
/// logs): the resume continues that conversation all the same, the stopped prompt in it.
#[test]
fn an_opencode_turn_stopped_before_its_model_answered_resumes_its_conversation() {
    let rig = Rig::new("stopped-unnamed");
    let run = rig.run_cmd(OPENCODE, "HOLD:never REMEMBER:kiwi", &["--timeout", "25s"]);
    let (code, json, stderr) = rig.json_turn(run);
    assert_eq!(code, 124, "{json}\n{stderr}");
    assert_eq!(json["status"], "timeout", "{json}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(OPENCODE, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 2, "{json}");
    assert_eq!(
        json["result"].as_str().map(str::trim),
        Some("You told me to remember kiwi."),
        "{json}"
    );
}

/// `--network none` can only hang: refused with exit 2 before anything exists, for `run`
/// and for a `resume` that asks for it.
#[test]
fn network_none_is_refused_before_anything_is_created() {
    let rig = Rig::new("netnone");
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", "codex", "--network", "none"])
        .args(["--endpoint", &rig.endpoint()])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .arg("hi");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--network none") && err.contains("--egress locked"),
        "{err}"
    );
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    assert!(rig.caw_containers().is_empty());

    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:x", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let volumes = rig.caw_volumes();
    let out = run(rig.resume_cmd(CODEX, &id, "RECALL", &["--network", "none"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let mut after = rig.caw_volumes();
    after.sort();
    let mut before = volumes;
    before.sort();
    assert_eq!(
        after, before,
        "a refused resume changed the session's volumes"
    );
    assert!(rig.caw_containers().is_empty());
}

/// A CLI that prints nothing past `--idle-timeout` is stopped like `--timeout` (exit 124),
/// saying which limit fired; the session resumes.
#[test]
fn a_silent_turn_is_stopped_by_the_idle_timeout() {
    let rig = Rig::new("idle");
    let started = Instant::now();
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "SLEEP:120 REMEMBER:quiet", &["--idle-timeout", "5s"]));
    let took = started.elapsed();
    assert_eq!(code, 124, "{json}\n{stderr}");
    assert_eq!(json["status"], "timeout", "{json}");
    assert!(
        json["result"]
            .as_str()
            .is_some_and(|r| r.contains("--idle-timeout")),
        "{json}"
    );
    assert!(stderr.contains("--idle-timeout"), "{stderr}");
    assert!(took < Duration::from_secs(100), "took {took:?}");
    assert!(rig.caw_containers().is_empty());
    let id = json["session_id"].as_str().unwrap().to_string();
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, &id, "REMEMBER:loud", &["--idle-timeout", "off"]));
    assert_eq!(code, 0, "{json}\n{stderr}");
}

/// `opencode --endpoint` with no `--model`: the endpoint's first listed model is used and
/// remembered, so a run and a resume work and recall.
#[test]
fn opencode_without_a_model_uses_the_endpoints_first() {
    let rig = Rig::with_stub_env("oc-models", &["STUB_MODELS=stub-model,other".to_string()]);
    let no_model = P {
        model: None,
        ..OPENCODE
    };
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(no_model, "REMEMBER:otter", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(OPENCODE, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(
        json["result"].as_str().map(str::trim),
        Some("You told me to remember otter."),
        "{json}"
    );
    let chats: Vec<_> = rig
        .stub_requests()
        .into_iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert!(!chats.is_empty());
    for r in &chats {
        assert_eq!(r["body"]["model"], "stub-model", "{r}");
    }
}

/// When the endpoint cannot tell a model (it lists none, or cannot be reached), `run`
/// says to pass `--model`: exit 2, one line, nothing created.
#[test]
fn opencode_without_a_model_and_no_list_is_refused() {
    let rig = Rig::new("oc-nomodels");
    let dead = format!("http://nohost-{}:8080", rig.run_id);
    for endpoint in [rig.endpoint(), dead] {
        let mut cmd = rig.caw();
        cmd.args(["run", "--provider", "opencode", "--network", &rig.network])
            .args(["--endpoint", &endpoint])
            .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
            .arg("hi");
        let out = run(cmd);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--model"), "{err}");
        assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
        assert!(rig.caw_containers().is_empty());
    }
}

/// `--egress locked` with an `--allow-host` list that does not name the model's host: the
/// model's API is always the agent's (here the `--endpoint` host, reached through the proxy
/// with an injected key), and the turn's record says so.
#[test]
fn locked_egress_always_reaches_the_model() {
    let rig = Rig::new("allow-miss");
    for p in [CODEX, CLAUDE] {
        let (code, json, stderr) = rig.json_turn(rig.run_cmd(
            p,
            "hi",
            &[
                "--egress",
                "locked",
                "--allow-host",
                "elsewhere.example:443",
            ],
        ));
        assert_eq!(code, 0, "{json}\n{stderr}");
        let egress = &json["egress"];
        assert_eq!(egress["policy"], "locked", "{json}");
        assert!(
            egress["allowed"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["host"] == rig.stub && e["port"] == 8080),
            "{json}"
        );
    }
}
