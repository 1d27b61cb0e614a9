//! `--on-limit park` (issue 55): a turn the account's usage limit stops is `parked` with
//! `resumes_at`, its work kept; every parking session of that account that would start
//! meanwhile is parked too instead of failing; at the reset each goes on in its own
//! conversation, started by the caw-box process there (here: each session's `__drive`).
//!
//! The real CLIs, brokered with a collected key, against the stub model acting as an
//! account of a few requests per window that refuses past them with the vendor's own
//! usage-limit answer (`STUB_ACCOUNT_ENFORCE`), resetting at the window's end.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::broker::collect_key;
use crate::common::*;

/// `ls --json`'s rows of `ids` (other tests' sessions may be listed too).
fn rows(rig: &Rig, ids: &[String]) -> Vec<Value> {
    let out = rig.caw_run(&["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rows: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| ids.iter().any(|id| r["session_id"] == id.as_str()))
        .cloned()
        .collect()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `sessions` parking sessions of `p`'s account, started together by as many `run -d`
/// processes, on an account of `limit` requests per `window` seconds: some meet the limit
/// or start while the account is parked, are `parked` with `resumes_at`, and none fails;
/// `stop` takes one parked session's turn off; the others end `success` after the reset,
/// and each recalls its own first turn's code word.
fn parked_sessions_go_on_at_the_reset(p: P, sessions: usize, limit: u32, window: u32) {
    let rig = Rig::with_stub_env(
        &format!("park-{}", p.name),
        &[
            format!("STUB_ACCOUNT_REQUESTS={limit}"),
            format!("STUB_ACCOUNT_WINDOW={window}"),
            "STUB_ACCOUNT_ENFORCE=1".to_string(),
        ],
    );
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, p, home.path());
    let started = unix_now();
    let prompts: Vec<String> = (0..sessions).map(|i| format!("REMEMBER:word{i}")).collect();
    let ids: Vec<String> = rig
        .run_detached_together(p, &prompts, &["--on-limit", "park"])
        .iter()
        .map(|json| json["session_id"].as_str().unwrap().to_string())
        .collect();

    // Some are parked until the window's end, as `ls` and `show` say.
    let deadline = Instant::now() + Duration::from_secs(60);
    let parked = loop {
        let listed = rows(&rig, &ids);
        let parked: Vec<Value> = listed
            .iter()
            .filter(|r| r["status"] == "parked")
            .cloned()
            .collect();
        if parked.len() >= 2 {
            break parked;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than 2 sessions parked: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    for r in &parked {
        let at = r["resumes_at"].as_u64().unwrap_or_else(|| panic!("{r}"));
        assert!(
            // The window starts at its first request, a CLI's boot after `started`.
            at > unix_now() && at <= started + u64::from(window) + 15,
            "{r}"
        );
    }
    let shown_id = parked[0]["session_id"].as_str().unwrap().to_string();
    let out = rig.caw_run(&["show", &shown_id, "--json"]);
    let shown: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(shown["status"], "parked", "{shown}");
    assert!(shown["resumes_at"].as_u64().is_some(), "{shown}");
    let out = rig.caw_run(&["show", &shown_id]);
    assert!(
        stdout_of(&out).contains("goes on when it resets"),
        "{}",
        stdout_of(&out)
    );

    // `stop` takes a parked session's turn off: it does not go on.
    let stopped = parked[1]["session_id"].as_str().unwrap().to_string();
    let out = rig.caw_run(&["stop", &stopped]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    // The others end `success` (none failed), once the limit reset.
    for (i, id) in ids.iter().enumerate().filter(|(_, id)| **id != stopped) {
        let out = rig.caw_run(&["wait", id, "-o", "json"]);
        let json: Value = serde_json::from_str(stdout_of(&out).trim())
            .unwrap_or_else(|_| panic!("{i}: {}", stderr_of(&out)));
        assert_eq!(json["status"], "success", "{i}: {json}");
        assert_eq!(out.status.code(), Some(0), "{i}: {json}");
    }
    assert!(
        unix_now() >= started + u64::from(window) - 1,
        "all ended before the limit could reset"
    );
    // Each turn names the account it spent (the one the park was of).
    let out = rig.caw_run(&["show", &shown_id, "--json"]);
    let shown: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let turns = shown["turns"].as_array().unwrap();
    assert!(!turns.is_empty(), "{shown}");
    for t in turns {
        assert_eq!(t["account"], shown["account"], "{shown}");
    }
    assert!(
        shown["account"]
            .as_str()
            .is_some_and(|a| a.starts_with(p.name)),
        "{shown}"
    );
    let after = rows(&rig, std::slice::from_ref(&stopped));
    assert_ne!(after[0]["status"], "parked", "{after:?}");
    assert_ne!(
        after[0]["status"], "success",
        "the stopped one went on: {after:?}"
    );
    // The vendor saw each limited request once, not a retry storm.
    let refused = rig
        .stub_requests()
        .iter()
        .filter(|r| r["directive"] == "quota")
        .count();
    assert!(refused >= 1 && refused <= sessions, "{refused} refused");

    // Each recalls its own first turn's code word, the parked ones included (their
    // conversation kept the turn the limit stopped). `--on-limit wait` sends RECALL again
    // if this account's window is spent meanwhile.
    for (i, id) in ids.iter().enumerate().filter(|(_, id)| **id != stopped) {
        let mut cmd = rig.caw();
        cmd.args(["resume", id, "--on-limit", "wait", "RECALL"]);
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{i}: {json} {stderr}");
        assert_eq!(
            json["result"],
            format!("You told me to remember word{i}."),
            "{i}: {json}"
        );
    }
    rig.cleanup();
}

#[test]
fn codex_sessions_parked_at_a_usage_limit_go_on_at_its_reset() {
    check("codex_sessions_parked_at_a_usage_limit_go_on_at_its_reset");
    parked_sessions_go_on_at_the_reset(CODEX, 7, 4, 20);
}

/// claude as a claude.ai subscriber (an OAuth token collected): the usage limit is a
/// subscription's, which claude reports at once (with an API key it retries a 429 ten
/// times over minutes first: tests/fixtures/README.md, "Subscription limits").
const CLAUDE_SUBSCRIBER: P = P {
    name: "claude_code",
    key_var: "CLAUDE_CODE_OAUTH_TOKEN",
    model: None,
};

#[test]
fn claude_sessions_parked_at_a_usage_limit_go_on_at_its_reset() {
    check("claude_sessions_parked_at_a_usage_limit_go_on_at_its_reset");
    parked_sessions_go_on_at_the_reset(CLAUDE_SUBSCRIBER, 4, 2, 20);
}

#[test]
fn an_mcp_servers_sessions_park_at_a_usage_limit() {
    check("an_mcp_servers_sessions_park_at_a_usage_limit");
    let python = crate::mcp::mcp_python();
    let rig = Rig::with_stub_env(
        "park-mcp",
        &[
            "STUB_ACCOUNT_REQUESTS=2".to_string(),
            "STUB_ACCOUNT_WINDOW=15".to_string(),
            "STUB_ACCOUNT_ENFORCE=1".to_string(),
        ],
    );
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/park.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint()])
        .arg(rig.workspace.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_with_deadline(
        cmd.spawn().expect("spawn the MCP client"),
        Duration::from_secs(240),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("mcp park checks passed"),
        "the MCP client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    rig.cleanup();
}
