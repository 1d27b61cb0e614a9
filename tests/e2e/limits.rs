//! Usage limits, against the real CLIs and the stub model's `LIMIT:<seconds>` (a 429 that
//! names its reset in the API's words) and `QUOTA:<seconds>` (a subscription usage limit in
//! the vendor's own format: claude's unified rate-limit headers, codex's
//! `usage_limit_reached` with `resets_at`, gemini's `QuotaFailure` with a `RetryInfo`), each
//! until that long after the prompt was first seen. `--on-limit wait` waits for the reset
//! the CLI passed on, says so on stderr, and sends the same prompt again as the same turn:
//! the session records one turn. `--max-wait` below the reset ends with exit 5.
//!
//! Where each CLI passes the reset on (tests/fixtures/README.md, "Usage limits"):
//! - claude logged in to claude.ai (an OAuth token) stops at once: "You've hit your session
//!   limit · resets 2:14pm (UTC)" and a `rate_limit_event` with the exact time: caw-box waits.
//!   With an API key it retries the 429 on its own (10 times, about 3 min) and succeeds
//!   once a short window passed: one turn, no wait of caw-box's.
//! - codex: "… or try again at 2:09 PM." (to the minute): caw-box waits to the minute's end.
//! - opencode quotes the API's body (`resets_in_seconds`, `resets_at`): caw-box waits.
//! - gemini retries a quota error with a `retryDelay` up to 300 s on its own (one turn, no
//!   wait of caw-box's); a longer one it passes on ("Suggested retry after 598s.").

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

/// claude as a claude.ai subscriber: an OAuth token instead of an API key.
const CLAUDE_SUBSCRIBER: P = P {
    name: "claude_code",
    key_var: "CLAUDE_CODE_OAUTH_TOKEN",
    model: None,
};

fn waits_out_the_limit(p: P) {
    waits_out(p, "LIMIT:6 REMEMBER:heron");
}

/// `--on-limit wait` on `prompt` (a `LIMIT:`/`QUOTA:` of a few seconds, `REMEMBER:heron`):
/// caw-box waits, the turn succeeds, and the session records one turn.
fn waits_out(p: P, prompt: &str) {
    let rig = Rig::new(&format!("lim-{}", p.name));
    let started = Instant::now();
    let (code, out, stderr) =
        rig.json_turn(rig.run_cmd(p, prompt, &["--on-limit", "wait", "--max-wait", "2m"]));
    let took = started.elapsed();
    assert_eq!(
        code, 0,
        "the turn did not succeed after the wait: {out}\n{stderr}"
    );
    assert_eq!(out["result"], "Noted: heron.", "{out}");
    assert!(
        stderr.contains("usage limit: waiting"),
        "no progress line on stderr: {stderr}"
    );
    assert!(took >= Duration::from_secs(5), "it did not wait: {took:?}");
    // The same session: its last turn is the one that answered.
    let id = out["session_id"].as_str().unwrap();
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", id, "--json"]))).unwrap();
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(
        turns.len(),
        1,
        "one turn recorded, the one that answered: {shown}"
    );
    assert_eq!(turns[0]["status"], "success", "{shown}");
    assert_eq!(turns[0]["prompt"], prompt);
    assert_eq!(out["turn"], 1, "{out}");
    // The stub did limit the first request.
    let limited = rig
        .stub_requests()
        .iter()
        .filter(|r| r["status"] == 429)
        .count();
    assert!(limited >= 1, "the stub never answered 429");
}

#[test]
fn limits_claude_subscription_waits_for_the_reset() {
    waits_out(CLAUDE_SUBSCRIBER, "QUOTA:6 REMEMBER:heron");
}

/// codex names the reset to the minute: the wait lasts to that minute's end (at most ~65 s).
#[test]
fn limits_codex_subscription_waits_for_the_reset() {
    waits_out(CODEX, "QUOTA:5 REMEMBER:heron");
}

#[test]
fn limits_opencode_subscription_waits_for_the_reset() {
    waits_out(OPENCODE, "QUOTA:6 REMEMBER:heron");
}

/// A CLI that waits out a short limit by itself (gemini's retryDelay, claude's retries with
/// an API key): the turn succeeds after the reset, with one turn recorded and no wait of
/// caw-box's.
fn retries_by_itself(p: P) {
    let rig = Rig::new(&format!("lim-self-{}", p.name));
    let started = Instant::now();
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "QUOTA:6 REMEMBER:heron",
        &["--on-limit", "wait", "--max-wait", "2m"],
    ));
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert_eq!(out["result"], "Noted: heron.", "{out}");
    assert!(
        !stderr.contains("usage limit: waiting"),
        "caw-box waited itself: {stderr}"
    );
    assert!(started.elapsed() >= Duration::from_secs(5));
    let requests = rig.stub_requests();
    assert!(
        requests.iter().any(|r| r["status"] == 429),
        "the stub never answered 429"
    );
    let id = out["session_id"].as_str().unwrap();
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", id, "--json"]))).unwrap();
    assert_eq!(shown["turns"].as_array().unwrap().len(), 1, "{shown}");
}

#[test]
fn limits_gemini_quota_retried_by_the_cli() {
    retries_by_itself(GEMINI);
}

#[test]
fn limits_claude_api_key_quota_retried_by_the_cli() {
    retries_by_itself(CLAUDE);
}

#[test]
fn limits_opencode_waits_for_the_reset() {
    waits_out_the_limit(OPENCODE);
}

/// codex passes on no words of an API 429 ("exceeded retry limit, last status: 429 Too
/// Many Requests"): nothing to wait for, so exit 5 at once, saying so.
#[test]
fn limits_codex_without_a_named_reset_exits_5() {
    let rig = Rig::new("lim-codex");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "LIMIT:60 hello",
        &["--on-limit", "wait", "--max-wait", "2m"],
    ));
    assert_eq!(code, 5, "{out}\n{stderr}");
    assert_eq!(out["status"], "usage_limit", "{out}");
    assert!(stderr.contains("named no reset time"), "{stderr}");
}

/// A reset further off than `--max-wait`: exit 5 at once, saying why.
#[test]
fn limits_max_wait_exits_5() {
    let rig = Rig::new("lim-max");
    let started = Instant::now();
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        OPENCODE,
        "LIMIT:120 hello",
        &["--on-limit", "wait", "--max-wait", "1s"],
    ));
    assert_eq!(code, 5, "{out}\n{stderr}");
    assert!(stderr.contains("beyond --max-wait 1s"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// `--on-limit fallback=claude_code` on a codex session limited on OpenAI's wire only: the
/// same prompt goes to a new claude session, which answers; both sessions show the link.
#[test]
fn limits_fallback_answers_through_claude() {
    let rig = Rig::new("lim-fb");
    let anthropic_key = format!("ANTHROPIC_API_KEY={TEST_KEY}");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "LIMIT:600@openai REMEMBER:kite",
        &[
            "--on-limit",
            "fallback=claude_code",
            "--env",
            &anthropic_key,
        ],
    ));
    assert_eq!(code, 0, "the fallback did not answer: {out}\n{stderr}");
    assert_eq!(out["provider"], "claude_code", "{out}");
    assert_eq!(out["result"], "Noted: kite.", "{out}");
    assert!(
        stderr.contains("falling back to claude_code")
            && stderr.contains("answered by claude_code"),
        "{stderr}"
    );
    let claude_id = out["session_id"].as_str().unwrap();
    let listed: Value = serde_json::from_str(&stdout_of(&rig.caw_run(&["ls", "--json"]))).unwrap();
    let codex_row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["provider"] == "codex" && r["fallback_to"][0] == claude_id)
        .unwrap_or_else(|| panic!("no codex session links to {claude_id}: {listed}"));
    let codex_id = codex_row["session_id"].as_str().unwrap();
    assert_eq!(codex_row["status"], "usage_limit", "{codex_row}");
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", claude_id, "--json"]))).unwrap();
    assert_eq!(shown["fallback_of"], codex_id, "{shown}");
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", codex_id, "--json"]))).unwrap();
    assert_eq!(shown["fallback_to"][0], claude_id, "{shown}");
    let text = stdout_of(&rig.caw_run(&["show", codex_id]));
    assert!(
        text.contains(&format!("fell back to {claude_id}")),
        "{text}"
    );
}

/// A later turn waited out: the session keeps its earlier turn and records the limited one
/// once, as the turn that answered (which still knows the conversation).
#[test]
fn limits_a_resumed_turn_waits_as_the_same_turn() {
    let rig = Rig::new("lim-resume");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(OPENCODE, "REMEMBER:puffin", &[]));
    assert_eq!(code, 0, "{out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(
        OPENCODE,
        &id,
        "QUOTA:6 RECALL",
        &["--on-limit", "wait", "--max-wait", "2m"],
    ));
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert!(stderr.contains("usage limit: waiting"), "{stderr}");
    assert_eq!(out["turn"], 2, "{out}");
    assert_eq!(out["result"], "You told me to remember puffin.", "{out}");
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", &id, "--json"]))).unwrap();
    let turns = shown["turns"].as_array().unwrap();
    let numbers: Vec<_> = turns.iter().map(|t| t["turn"].clone()).collect();
    assert_eq!(numbers, [1, 2], "{shown}");
    assert_eq!(turns[1]["status"], "success", "{shown}");
    assert_eq!(turns[1]["prompt"], "QUOTA:6 RECALL", "{shown}");
    let logs = stdout_of(&rig.caw_run(&["logs", &id, "--turn", "2"]));
    assert!(
        logs.contains("puffin"),
        "turn 2's logs are the answering run's: {logs}"
    );
}
