//! One account, many boxes (issue 55): `--per-account N` lets at most N turns of one
//! account be in flight at once across every caw-box process of the host. A turn over the
//! cap is `queued` (in `run -d`'s answer, `ls`, `show`) and starts when one ends; `wait`
//! waits for a queued turn as for a running one; `stop` takes a queued turn off the queue.
//!
//! The real codex CLI, brokered with a collected key, against the stub model: each turn's
//! request holds at the stub (`HOLD:<name>`) until the test lets it go, so the stub's own
//! count of the requests it holds (and of the model requests in flight, `/_stub/inflight`)
//! is the number of turns in flight.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::broker::collect_key;
use crate::common::*;

/// `ls --json`'s status of each of `ids` (other tests' sessions may be listed too).
fn statuses(rig: &Rig, ids: &[String]) -> Vec<(String, String)> {
    let out = rig.caw_run(&["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rows: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["session_id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .filter(|(id, _)| ids.contains(id))
        .collect()
}

#[test]
fn separate_processes_keep_one_accounts_turns_in_flight_to_its_cap() {
    check("separate_processes_keep_one_accounts_turns_in_flight_to_its_cap");
    let rig = Rig::new("acct-cap");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let stub = rig.stub_control();
    // Eight `run -d`, each its own caw-box process, started together.
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("HOLD:fleet{i} REMEMBER:word{i}"))
        .collect();
    let mut ids = Vec::new();
    let mut said = BTreeSet::new();
    for json in rig.run_detached_together(CODEX, &prompts, &["--per-account", "2"]) {
        said.insert(json["status"].as_str().unwrap().to_string());
        ids.push(json["session_id"].as_str().unwrap().to_string());
    }
    // Some had to wait, and said so when they returned.
    assert!(said.contains("queued"), "{said:?}");

    // Two held at a time, never more; the rest queued; each let go in turn lets one in.
    let mut released = BTreeSet::new();
    let mut stopped = None;
    let mut removed = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while released.len() < 6 {
        let want = (6 - released.len()).min(2);
        let now = stub.held();
        let total: u64 = now.iter().map(|(_, n)| n).sum();
        assert!(
            total <= 2,
            "more than 2 turns of the account in flight: {now:?}"
        );
        if now.len() < want {
            assert!(
                Instant::now() < deadline,
                "the queue stalled: {now:?}, released {released:?}, {:?}",
                statuses(&rig, &ids)
            );
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        if released.is_empty() {
            let rows = statuses(&rig, &ids);
            let count = |s: &str| rows.iter().filter(|(_, st)| st == s).count();
            assert_eq!((count("running"), count("queued")), (2, 6), "{rows:?}");
            let out = rig.caw_run(&["ls", "--json"]);
            let listed: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
            let mut places: Vec<u64> = listed
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["status"] == "queued")
                .filter_map(|r| r["queue_position"].as_u64())
                .collect();
            places.sort();
            assert_eq!(places, (1..=6).collect::<Vec<u64>>(), "{listed}");
            // `show` of a queued one says where it waits.
            let queued = rows.iter().find(|(_, s)| s == "queued").unwrap().0.clone();
            let out = rig.caw_run(&["show", &queued, "--json"]);
            let shown: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
            assert_eq!(shown["status"], "queued", "{shown}");
            assert!(shown["queue_position"].as_u64().is_some(), "{shown}");
            assert!(
                shown["account"].as_str().unwrap().starts_with("codex-"),
                "{shown}"
            );
            // `stop` takes it off the queue: it never runs.
            let out = rig.caw_run(&["stop", &queued]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
            assert!(
                stderr_of(&out).contains("will not run"),
                "{}",
                stderr_of(&out)
            );
            let after = statuses(&rig, &ids);
            let st = &after.iter().find(|(id, _)| *id == queued).unwrap().1;
            assert_eq!(st, "new", "{after:?}");
            stopped = Some(queued);
            // `rm` refuses a session whose turn waits, as one whose turn runs; `--force`
            // removes it, and its turn never runs.
            let other = after.iter().find(|(_, s)| s == "queued").unwrap().0.clone();
            let out = rig.caw_run(&["rm", &other]);
            assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
            assert!(stderr_of(&out).contains("queued"), "{}", stderr_of(&out));
            let out = rig.caw_run(&["rm", "--force", &other]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
            removed = Some(other);
        }
        let (name, _) = &now[0];
        stub.release(name);
        released.insert(name.clone());
    }
    let stopped = stopped.unwrap();
    let stopped_at = ids.iter().position(|id| *id == stopped).unwrap();
    let prompts: Vec<String> = rig
        .stub_requests()
        .iter()
        .map(|r| r["body"].to_string())
        .collect();
    let mark = format!("HOLD:fleet{stopped_at} ");
    assert!(
        !prompts.iter().any(|b| b.contains(&mark)),
        "the stopped turn ran"
    );
    let removed = removed.unwrap();
    let removed_at = ids.iter().position(|id| *id == removed).unwrap();
    let mark = format!("HOLD:fleet{removed_at} ");
    assert!(
        !prompts.iter().any(|b| b.contains(&mark)),
        "the removed one's turn ran"
    );
    assert!(
        !statuses(&rig, &ids).iter().any(|(id, _)| *id == removed),
        "the removed session is listed"
    );

    // Every other one ends, recorded, with its own answer.
    for (i, id) in ids
        .iter()
        .enumerate()
        .filter(|(_, id)| **id != stopped && **id != removed)
    {
        let out = rig.caw_run(&["wait", id, "-o", "json"]);
        assert_eq!(out.status.code(), Some(0), "{i}: {}", stderr_of(&out));
        let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        assert_eq!(json["status"], "success", "{json}");
        assert_eq!(json["result"], format!("Noted: word{i}."), "{json}");
    }
    let inflight = stub.json("GET", "/_stub/inflight");
    assert!(
        inflight["max"].as_u64().unwrap() <= 2,
        "the stub saw more than 2 model requests at once: {inflight}"
    );
    let done = statuses(&rig, &ids);
    assert_eq!(
        done.iter().filter(|(_, s)| s == "success").count(),
        6,
        "{done:?}"
    );
    rig.cleanup();
}

/// The windows of `provider`'s account in `auth status --json`.
fn windows_of(rig: &Rig, provider: &str) -> Value {
    let out = rig.caw_run(&["auth", "status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rows: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["provider"] == provider)
        .unwrap()
        .clone();
    assert!(
        row["account"].as_str().unwrap().starts_with(provider),
        "{row}"
    );
    row["windows"].clone()
}

#[test]
fn auth_status_shows_what_each_account_has_left_after_a_brokered_turn() {
    check("auth_status_shows_what_each_account_has_left_after_a_brokered_turn");
    // The stub answers as an account of 50 requests a 10-minute window, in each vendor's
    // headers (one count for every wire: both CLIs spend it).
    let rig = Rig::with_stub_env(
        "acct-win",
        &[
            "STUB_ACCOUNT_REQUESTS=50".to_string(),
            "STUB_ACCOUNT_WINDOW=600".to_string(),
        ],
    );
    let home = tempfile::tempdir().unwrap();
    for p in [CODEX, CLAUDE] {
        collect_key(&rig, p, home.path());
        assert!(windows_of(&rig, p.name).is_null(), "known before any turn");
        let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(p, "REMEMBER:tern", &[]));
        assert_eq!(code, 0, "{json} {stderr}");
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (p, extra) in [(CODEX, "primary"), (CLAUDE, "5h")] {
        let w = windows_of(&rig, p.name);
        let window = |name: &str| {
            w["windows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == name)
                .unwrap_or_else(|| panic!("no {name} window: {w}"))
                .clone()
        };
        let requests = window("requests");
        assert_eq!(requests["limit"], 50, "{w}");
        let left = requests["remaining"].as_u64().unwrap();
        assert!(left < 50, "{w}");
        let resets = requests["resets_at"].as_u64().unwrap();
        assert!(resets > now && resets <= now + 600, "{w}");
        assert!(window(extra)["used_percent"].as_f64().unwrap() > 0.0, "{w}");
    }
    let out = rig.caw_run(&["auth", "status"]);
    let text = stdout_of(&out);
    assert!(text.contains("/50 left, resets in"), "{text}");
    assert!(
        text.contains("codex-") && text.contains("claude_code-"),
        "{text}"
    );
    rig.cleanup();
}

/// The queued turns' tickets in the rig's data directory: (session, the waiting pid).
fn tickets(rig: &Rig) -> Vec<(String, u32)> {
    let root = rig.data_dir.path().join("accounts");
    let mut out = Vec::new();
    for account in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for t in std::fs::read_dir(account.path().join("queue"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if !t.file_name().to_string_lossy().ends_with(".json") {
                continue;
            }
            let q: Value = serde_json::from_slice(&std::fs::read(t.path()).unwrap()).unwrap();
            out.push((
                q["session_id"].as_str().unwrap().to_string(),
                q["pid"].as_u64().unwrap() as u32,
            ));
        }
    }
    out
}

#[test]
fn a_queued_turn_outlives_the_process_that_queued_it() {
    check("a_queued_turn_outlives_the_process_that_queued_it");
    let rig = Rig::new("acct-orphan");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let start = |prompt: &str| {
        let cmd = rig.run_cmd_stored_key(CODEX, prompt, &["-d", "--per-account", "1"]);
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{json} {stderr}");
        (
            json["session_id"].as_str().unwrap().to_string(),
            json["status"].clone(),
        )
    };
    let (first, _) = start("HOLD:first REMEMBER:alpha");
    rig.wait_held("first");
    let (second, status) = start("HOLD:second REMEMBER:beta");
    assert_eq!(status, "queued");
    // Its driver dies while it waits (the OOM killer, a CI runner's cleanup).
    let (_, pid) = tickets(&rig)
        .into_iter()
        .find(|(s, _)| *s == second)
        .expect("the second turn's ticket");
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Gone, or a zombie not yet reaped by whoever adopted it: its locks are released.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z "), "{stat}");
    let ids = [first.clone(), second.clone()];
    assert_eq!(
        statuses(&rig, &ids)
            .into_iter()
            .find(|(s, _)| *s == second)
            .unwrap()
            .1,
        "queued",
        "a queued turn whose driver died is still in line"
    );
    // `wait` starts it again, in its place; it runs once the first turn ends.
    let mut waiting = rig.caw();
    waiting
        .args(["wait", &second, "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let waiting = waiting.spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let (_, new_pid) = tickets(&rig)
        .into_iter()
        .find(|(s, _)| *s == second)
        .expect("the second turn's ticket, taken over");
    assert_ne!(new_pid, pid, "a new driver waits in its place");
    stub_release_all(&rig, &["first", "second"]);
    let out = wait_with_deadline(waiting, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["result"], "Noted: beta.", "{json}");
    assert_eq!(json["turn"], 1, "{json}");
    let out = rig.caw_run(&["wait", &first, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // Nothing of the queue is left: no ticket, no kept job.
    assert!(tickets(&rig).is_empty());
    let jobs = rig.data_dir.path().join("accounts").join(".jobs");
    assert_eq!(std::fs::read_dir(jobs).map(|d| d.count()).unwrap_or(0), 0);
    rig.cleanup();
}

fn stub_release_all(rig: &Rig, names: &[&str]) {
    for n in names {
        rig.stub_release(n);
    }
}

/// Two `caw-box mcp --per-account 2` servers side by side, each starting 4 codex sessions of
/// one collected key, through the official MCP Python SDK (tests/mcp/accounts.py): the stub
/// never holds more than 2 turns across both; the waiting ones are `queued` in `status`;
/// all 8 end with their own answers.
#[test]
fn two_mcp_servers_share_one_accounts_cap() {
    check("two_mcp_servers_share_one_accounts_cap");
    let python = crate::mcp::mcp_python();
    let rig = Rig::new("acct-mcp");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/accounts.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint(), &rig.stub])
        .arg(rig.workspace.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_with_deadline(
        cmd.spawn().expect("spawn the MCP client"),
        Duration::from_secs(400),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("mcp accounts checks passed"),
        "the MCP client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    rig.cleanup();
}
