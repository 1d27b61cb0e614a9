//! Usage limits, against the real CLIs and the stub model's `LIMIT:<seconds>` (a 429 that
//! names its reset in the API's words until that long after the prompt was first seen):
//! `--on-limit wait` waits for the reset the CLI passed on, says so on stderr, and sends
//! the same prompt again in the same session; `--max-wait` below the reset ends with exit 5.
//! claude and gemini retry a 429 on their own until such a short window passes, so only
//! opencode (which passes the API's words on) is driven into caw-box's wait here.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

fn waits_out_the_limit(p: P) {
    let rig = Rig::new(&format!("lim-{}", p.name));
    let started = Instant::now();
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "LIMIT:6 REMEMBER:heron",
        &["--on-limit", "wait", "--max-wait", "2m"],
    ));
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
    assert_eq!(turns.last().unwrap()["status"], "success", "{shown}");
    assert_eq!(turns.last().unwrap()["prompt"], "LIMIT:6 REMEMBER:heron");
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
