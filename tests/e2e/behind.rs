//! A cold turn ends once its record is in: the entrypoint has killed whatever the agent left
//! running and says so, and the turn's container then finishes the turn's checkpoint and
//! exits behind the turn (renamed, the session's lock free), removed by the `caw-box
//! __settle` the turn started; the session's next command waits for it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A codex turn in a copy-mode workspace of 64 MiB (its first checkpoint holds all of it):
/// the command has ended before the turn's container did, which was renamed to finish
/// behind it, wrote the checkpoint whole, and was removed with nothing left; the next turn,
/// started at once, waited for the checkpoint and recalls. And in a bind-mode session whose
/// first checkpoint (HOME's 64 MiB) is slow, a process the agent left running, writing the
/// time every 20 ms, wrote nothing after its turn's command ended. And `rm` right after
/// such a turn waits for the container finishing it, and removes every volume.
#[test]
fn a_cold_turn_ends_before_its_container_which_finishes_the_checkpoint_behind_it() {
    let rig = Rig::new("behind");
    let p = CODEX;
    let ws = rig.workspace.path();
    // Random bytes: the checkpoint's tar of them takes a while.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..16 {
        let mut bytes = vec![0u8; 4 << 20];
        for b in bytes.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        std::fs::write(ws.join(format!("blob-{i}.bin")), bytes).unwrap();
    }
    let events = rig.watch_test_events();

    check("the turn ends before its container");
    let (code, first, stderr) =
        rig.json_turn(rig.run_cmd(p, "REMEMBER:behind-7", &["--workspace-mode", "copy"]));
    let ended = now_nanos();
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(first["status"], "success", "{first}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let behind = format!("caw-box-probe-{id}-checkpoint");

    check("the next turn, at once, waits for the checkpoint and recalls");
    let (code, second, stderr) = rig.json_turn(rig.resume_cmd(p, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"]
            .as_str()
            .unwrap_or_default()
            .contains("behind-7"),
        "{second}"
    );

    check("the containers went, each after its command ended");
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers_now()
    );
    let seen = events.all();
    let renamed = events
        .first("rename", &behind)
        .unwrap_or_else(|| panic!("no turn container was renamed to {behind}: {seen:?}"));
    let died = events
        .first("die", &behind)
        .unwrap_or_else(|| panic!("{behind} did not end: {seen:?}"));
    assert!(events.first("destroy", &behind).is_some(), "{seen:?}");
    assert!(renamed < ended, "renamed after the command ended: {seen:?}");
    assert!(
        died > ended,
        "the turn's container ended before its command did ({} ms before): {seen:?}",
        (ended - died) / 1_000_000
    );

    check("both checkpoints are whole");
    let out = rig.caw_run(&["show", &id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let shown: serde_json::Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let checkpoints = shown["checkpoints"].as_array().cloned().unwrap_or_default();
    let turns: Vec<_> = checkpoints.iter().map(|c| c["turn"].as_u64()).collect();
    assert_eq!(turns, [Some(1), Some(2)], "{shown}");
    // The first holds the workspace: its 64 MiB were written behind the turn.
    assert!(
        checkpoints[0]["bytes"].as_u64().unwrap_or_default() > 64 << 20,
        "{shown}"
    );

    check("nothing the agent started runs on after its turn ended");
    for i in 0..16 {
        std::fs::remove_file(ws.join(format!("blob-{i}.bin"))).unwrap();
    }
    let ticks = ws.join("ticks");
    // 64 MiB of random bytes in HOME: the session's first checkpoint (HOME's, compressed)
    // takes a while behind the turn, while a process the agent left would tick on.
    let (code, third, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "RUN:head -c 67108864 /dev/urandom > ~/big; setsid nohup sh -c 'while :; do date +%s%N >> /workspace/ticks; sleep 0.02; done' >/dev/null 2>&1 & sleep 0.3; echo started",
        &["--workspace-mode", "bind"],
    ));
    let ended = now_nanos();
    assert_eq!(code, 0, "{third}\n{stderr}");
    std::thread::sleep(Duration::from_secs(1));
    let written = std::fs::read_to_string(&ticks).unwrap_or_default();
    let last: i64 = written
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or_else(|| panic!("the agent's process never ran: {third}"));
    check(&format!(
        "the agent's process wrote {} ticks, the last {} ms before its turn's command ended",
        written.lines().count(),
        (ended - last) / 1_000_000
    ));
    assert!(
        last < ended,
        "the agent's process wrote {} ms after its turn's command ended",
        (last - ended) / 1_000_000
    );

    check("rm, at once, waits for the container finishing behind the turn and leaves nothing");
    let (code, fourth, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "RUN:head -c 67108864 /dev/urandom > ~/big; echo big",
        &["--workspace-mode", "bind"],
    ));
    assert_eq!(code, 0, "{fourth}\n{stderr}");
    let id = fourth["session_id"].as_str().unwrap().to_string();
    let behind = format!("caw-box-probe-{id}-checkpoint");
    // What makes this a test of the wait: the container still held the volumes.
    let there = rig.caw_containers_now();
    assert!(
        there.iter().any(|n| n.trim_start_matches('/') == behind),
        "the turn's container had already gone: {there:?}"
    );
    let out = rig.caw_run(&["rm", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let left: Vec<_> = rig
        .caw_volumes()
        .into_iter()
        .filter(|v| v.contains(&id))
        .collect();
    assert!(left.is_empty(), "volumes of the removed session: {left:?}");
    rig.cleanup();
}
