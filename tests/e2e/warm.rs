//! `--keep-warm` on Docker: a session's turns run in one container kept idle between them,
//! which holds nothing of a turn while idle and ends itself.

use crate::common::*;
use serde_json::Value;

/// The placeholder keys' distinctive part (broker.rs).
const PLACEHOLDER: &str = "cawbox-placeholder";

/// A codex session made warm by its second turn: the third runs in the second one's
/// container without the flag, recalling; idle it holds no key, no placeholder, no CLI
/// process and no runtime file;
/// a turn with another memory limit starts a new one (the old one goes); left idle, it ends
/// itself, and the next turn is cold and recalls.
#[test]
fn warm_turns_share_one_container_that_holds_nothing_idle_and_ends_itself() {
    let rig = Rig::new("warm");
    let p = CODEX;
    // Long enough for the scans below on a busy machine; the fourth turn shortens it.
    let warm = ["--keep-warm", "60s"];
    let turn = |cmd| {
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{json}\n{stderr}");
        assert_eq!(json["status"], "success", "{json}");
        json
    };
    check("first turn");
    // Cold, as the session starts without --keep-warm: the second turn turns it on, and the
    // third keeps it without the flag (a turn's --keep-warm is remembered).
    let first = turn(rig.run_cmd(p, "Please REMEMBER:quince-31 for later.", &[]));
    let id = first["session_id"].as_str().unwrap().to_string();
    let idle = format!("caw-box-{id}-warm");
    assert!(
        rig.caw_containers().is_empty(),
        "a cold turn left a container"
    );
    let second = turn(rig.resume_cmd(p, &id, "RUN:echo warm-tool-7", &warm));
    assert_eq!(second["turn"], 2);
    let container = rig.exec_inspect_id(&idle);
    assert!(!container.is_empty(), "no warm container after the turn");

    check("idle holds nothing");
    let secrets = [TEST_KEY.to_string(), PLACEHOLDER.to_string()];
    assert_holds_no_secret(&idle, "1000", &secrets, "the idle container");
    idle_runs_no_cli(&rig.exec(&idle, &["bash", "-c", IDLE_PROCESSES]));
    let run_dir = rig.exec(&idle, &["ls", "-A", "/run/caw-box"]);
    assert_eq!(run_dir.trim(), "", "runtime files while idle");

    check("ls and show say it is warm");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut ls = rig.caw();
    ls.args(["ls", "--json"]);
    let rows: Value = serde_json::from_str(&stdout_of(&run(ls))).unwrap();
    // (ls lists every session on the daemon: other tests' too.)
    let row = |rows: &Value| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["session_id"] == id.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("no row of {id}: {rows}"))
    };
    let until = row(&rows)["warm_until"]
        .as_u64()
        .unwrap_or_else(|| panic!("{rows}"));
    // `--keep-warm 60` from the turn's end (the scan above takes a while under load: the
    // end, not this moment, is what counts), and still ahead now.
    let ended = row(&rows)["last_activity"]
        .as_u64()
        .unwrap_or_else(|| panic!("{rows}"));
    assert_eq!(
        until,
        ended + 60,
        "warm until {until}, the turn ended {ended}"
    );
    assert!(until > now, "warm until {until}, now {now}");
    let mut show = rig.caw();
    show.args(["show", &id]);
    let shown = stdout_of(&run(show));
    assert!(shown.contains("waits for the next turn until"), "{shown}");

    check("a warm turn");
    let events = rig.watch_events(&container);
    let third = turn(rig.resume_cmd(p, &id, "RECALL", &[]));
    assert!(
        third["result"].as_str().unwrap().contains("quince-31"),
        "no recall in the warm container: {third}"
    );
    assert_eq!(
        rig.exec_inspect_id(&idle),
        container,
        "turn 3 ran elsewhere"
    );
    // Claimed (renamed to the turn's name) and released (renamed back): it ran there.
    assert_eq!(
        events.count("rename"),
        2,
        "turn 3 did not run in the warm container"
    );

    check("settings change");
    let fourth = turn(rig.resume_cmd(p, &id, "RECALL", &["--keep-warm", "3s", "--memory", "700m"]));
    assert!(
        fourth["result"].as_str().unwrap().contains("quince-31"),
        "{fourth}"
    );
    let changed = rig.exec_inspect_id(&idle);
    assert!(
        !changed.is_empty() && changed != container,
        "the memory limit changed, the container did not"
    );
    // (The checkpoint taken behind the turn may still be under way.)
    let ls = rig.caw_containers();
    assert_eq!(ls.len(), 1, "the old warm container stayed: {ls:?}");

    check("expiry");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !rig.caw_containers().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the warm container did not end itself"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let fifth: Value = turn(rig.resume_cmd(p, &id, "RECALL", &["--keep-warm", "off"]));
    assert!(
        fifth["result"].as_str().unwrap().contains("quince-31"),
        "{fifth}"
    );
    assert!(
        rig.caw_containers().is_empty(),
        "a turn with --keep-warm off kept its container"
    );
    let mut ls = rig.caw();
    ls.args(["ls", "--json"]);
    let rows: Value = serde_json::from_str(&stdout_of(&run(ls))).unwrap();
    assert!(row(&rows).get("warm_until").is_none(), "{rows}");
}

/// On a warm session: of two racing resumes one runs (in the warm container) and one exits
/// 2; a detached warm turn is stopped by `caw-box stop` and its end awaited by `caw-box
/// wait` from other processes; the container survives the stop, idle, and the next turn
/// runs in it and recalls; `stop` of the idle session ends its container; `caw-box warm`
/// makes one ahead of a turn, which runs in it (and refuses bad input, making nothing); a
/// warm turn's killed driver does not keep the session busy.
#[test]
fn a_warm_session_keeps_its_lock_and_its_stop() {
    use std::process::Stdio;
    let rig = Rig::new("warm-lock");
    let warm = ["--keep-warm", "60s"];
    let (code, first, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "Please REMEMBER:fig-5 for later.", &warm));
    assert_eq!(code, 0, "{first}\n{stderr}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let idle = format!("caw-box-{id}-warm");
    let container = rig.exec_inspect_id(&idle);

    check("racing resumes");
    let events = rig.watch_events(&container);
    let spawn = || {
        let mut c = rig.resume_cmd(CODEX, &id, "HOLD:warm-race RECALL", &[]);
        c.args(["-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let outs = race_held(&rig, "warm-race", spawn(), spawn());
    let mut codes: Vec<i32> = outs.iter().map(|o| o.status.code().unwrap_or(-1)).collect();
    codes.sort();
    let stderrs: Vec<String> = outs.iter().map(stderr_of).collect();
    assert_eq!(codes, vec![0, 2], "{stderrs:?}");
    let winner = outs.iter().find(|o| o.status.code() == Some(0)).unwrap();
    assert!(stdout_of(winner).contains("fig-5"), "{}", stdout_of(winner));
    assert_eq!(
        rig.exec_inspect_id(&idle),
        container,
        "the race's turn ran elsewhere"
    );
    assert_eq!(
        events.count("rename"),
        2,
        "the race's turn did not run in the warm container"
    );

    check("stop of a detached warm turn");
    let mut cmd = rig.resume_cmd(CODEX, &id, "SLEEP:120", &["--detach"]);
    cmd.args(["-o", "json"]);
    let out = run(cmd);
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "running", "{}", stderr_of(&out));
    let mut stop = rig.caw();
    stop.args(["stop", &id]);
    let out = run(stop);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let mut wait = rig.caw();
    wait.args(["wait", &id, "-o", "json"]);
    let out = run(wait);
    assert_eq!(out.status.code(), Some(130), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "interrupted", "{json}");
    assert_eq!(
        rig.exec_inspect_id(&idle),
        container,
        "the stop ended the container"
    );

    check("after the stop");
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(json["result"].as_str().unwrap().contains("fig-5"), "{json}");
    assert_eq!(rig.exec_inspect_id(&idle), container);

    check("stop of an idle warm session");
    let mut stop = rig.caw();
    stop.args(["stop", &id]);
    let out = run(stop);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("ran no turn: its warm container is removed"),
        "{}",
        stderr_of(&out)
    );
    assert!(
        rig.caw_containers().is_empty(),
        "stop left the warm container"
    );

    check("caw-box warm ahead of a turn");
    for (bad, what) in [
        (vec!["warm", "nosuch"], "an unknown session"),
        (vec!["warm", &id, "--for", "soon"], "a bad duration"),
    ] {
        let mut warm = rig.caw();
        warm.args(&bad);
        let out = run(warm);
        assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr_of(&out));
        assert_eq!(stderr_of(&out).trim().lines().count(), 1, "{what}");
    }
    assert!(
        rig.caw_containers().is_empty(),
        "a refused warm made something"
    );
    let mut warm = rig.caw();
    warm.args(["warm", &id, "--for", "45s"]);
    let out = run(warm);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let ahead = rig.exec_inspect_id(&idle);
    let events = rig.watch_events(&ahead);
    // The session's --keep-warm is 60s; a turn that says nothing runs in the 45s one.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(json["result"].as_str().unwrap().contains("fig-5"), "{json}");
    assert_eq!(
        events.count("rename"),
        2,
        "the turn did not run in the container warmed ahead"
    );

    check("a warm turn whose driver was killed");
    let mut held = rig.resume_cmd(CODEX, &id, "HOLD:orphan RECALL", &[]);
    held.stdout(Stdio::null()).stderr(Stdio::null());
    let mut held = held.spawn().unwrap();
    rig.wait_held("orphan");
    held.kill().unwrap();
    held.wait().unwrap();
    rig.stub_release("orphan");
    // Its container is left under the session's lock, idle again once the CLI ended: the
    // next turn takes the lock over (not busy until the container's time runs out).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
        if code == 0 {
            assert!(json["result"].as_str().unwrap().contains("fig-5"), "{json}");
            break;
        }
        assert!(
            code == 2 && std::time::Instant::now() < deadline,
            "the session stayed busy after its driver was killed: {code} {stderr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    check("every recorded turn has its checkpoint, whole");
    // A warm turn's checkpoint helper waits beside the turn for the word (the killed
    // driver's ended with it, unwritten); each recorded turn's is finished, none is left.
    assert!(
        rig.caw_containers()
            .iter()
            .all(|c| !c.ends_with("-checkpoint")),
        "a checkpoint helper was left"
    );
    let mut show = rig.caw();
    show.args(["show", &id, "--json"]);
    let out = run(show);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let shown: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let turns_of = |key: &str| -> Vec<u64> {
        shown[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["turn"].as_u64().unwrap())
            .collect()
    };
    let turns = turns_of("turns");
    assert_eq!(turns_of("checkpoints"), turns, "{shown}");
    let volumes = rig
        .caw_volumes()
        .into_iter()
        .filter(|v| v.starts_with(&format!("caw-box-{id}-checkpoint-")))
        .count();
    assert_eq!(volumes, turns.len(), "a checkpoint volume too many or few");
}
