//! Backing off together (issue 55): a burst of 429s refuses every request of an account for a
//! while; the boxes of the account back off as one (`auth::backoff`: the first refusal halves
//! the turns that may send, each refusal of a request sent under the back-off halves them
//! again, one more turn sends every `retry-after` after that), instead of each CLI retrying
//! on its own.
//!
//! Six real claude CLIs, each in its own `caw-box run -d` (its own process, its own broker),
//! brokered with one collected key, start into a burst: the stub refuses everything for
//! `BURST` seconds from the first request with `retry-after: RETRY` (claude honours it, so
//! each CLI alone sends again every `RETRY` s until the burst ends: up to `BOXES * (BURST /
//! RETRY + 1)`, 36, in all). With the back-off the stub sees at most: the first request of
//! each (sent before any refusal was known), then waves of at most half the previous wave,
//! one wave every `RETRY` at most. Stated: `BOXES + BOXES / 2 + BURST / RETRY` (14).

use serde_json::Value;

use crate::broker::collect_key;
use crate::common::*;

const BOXES: u64 = 6;
const BURST: u64 = 15;
const RETRY: u64 = 3;

#[test]
#[allow(clippy::print_stderr)] // the test's own captured stderr: what the stub counted
fn boxes_of_one_account_back_off_together_from_a_burst_of_429s() {
    check("boxes_of_one_account_back_off_together_from_a_burst_of_429s");
    let rig = Rig::new("acct-burst");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CLAUDE, home.path());
    let stub = rig.stub_control();
    let started = stub.json(
        "POST",
        &format!("/_stub/burst?seconds={BURST}&retry_after={RETRY}"),
    );
    assert_eq!(started["active"], true, "{started}");
    let prompts: Vec<String> = (0..BOXES).map(|i| format!("REMEMBER:gust{i}")).collect();
    let ids: Vec<String> = rig
        .run_detached_together(CLAUDE, &prompts, &[])
        .iter()
        .map(|json| json["session_id"].as_str().unwrap().to_string())
        .collect();
    // While it holds them, `auth status` says so (`backoff` in `--json`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let holding = loop {
        let out = rig.caw_run(&["auth", "status", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let rows: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["provider"] == CLAUDE.name)
            .unwrap()
            .clone();
        if !row["backoff"].is_null() {
            break row["backoff"].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "auth status never said the account backs off: {row}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(holding["step"], RETRY * 1000, "{holding}");
    assert!(holding["in_flight"].as_u64().unwrap() >= 1, "{holding}");
    let text = stdout_of(&rig.caw_run(&["auth", "status"]));
    assert!(text.contains("backing off after a 429/529"), "{text}");

    // Every turn ends well, with its own answer: a burst costs time, not work.
    for (i, id) in ids.iter().enumerate() {
        let out = rig.caw_run(&["wait", id, "-o", "json"]);
        assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr_of(&out));
        let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        assert_eq!(json["status"], "success", "{json}");
        assert_eq!(json["result"], format!("Noted: gust{i}."), "{json}");
    }
    let burst = stub.json("GET", "/_stub/burst");
    let refused = burst["refused"].as_u64().unwrap();
    let bound = BOXES + BOXES / 2 + BURST / RETRY;
    eprintln!("the burst refused {refused} requests (bound {bound})");
    assert!(refused >= 1, "the burst refused nothing: {burst}");
    assert!(
        refused <= bound,
        "the account's boxes sent {refused} requests into the burst, more than the back-off's {bound}: {burst}"
    );
    // The schedule they kept, in the data directory: what the refusals set.
    let accounts = rig.data_dir.path().join("accounts");
    let schedule = std::fs::read_dir(&accounts)
        .unwrap()
        .flatten()
        .find_map(|a| std::fs::read(a.path().join("backoff.json")).ok())
        .expect("a back-off schedule of the account");
    let schedule: Value = serde_json::from_slice(&schedule).unwrap();
    assert_eq!(schedule["step"], RETRY * 1000, "{schedule}");
    rig.cleanup();
}
