//! Nothing lost when a driver dies (issue 46): a detached turn whose `caw-box __drive` is
//! SIGKILLed runs on, and whoever comes next records it as its driver would have, once.
//! (The daemon restarted under a detached turn: `restart.rs`, which runs alone.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

fn start_with_fact(rig: &Rig, fact: &str) -> String {
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, &format!("REMEMBER:{fact}"), &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    json["session_id"].as_str().unwrap().to_string()
}

/// `resume -d` of session `id`; returns once its turn runs.
pub fn resume_detached(rig: &Rig, id: &str, prompt: &str) {
    let out = run(rig.resume_cmd(CODEX, id, prompt, &["-d"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

/// SIGKILLs the driver of session `id`'s running turn (its container's driver-pid label).
pub fn kill_driver(rig: &Rig, id: &str) {
    let name = format!("caw-box-{id}");
    let inspect = rig
        .rt
        .block_on(rig.docker.inspect_container(&name, None))
        .unwrap();
    let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
    assert_eq!(
        labels.get("io.caw-box.adoptable").map(String::as_str),
        Some("true"),
        "a detached turn's container is adoptable: {labels:?}"
    );
    let pid = labels["io.caw-box.driver-pid"].clone();
    let killed = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    // Gone (reaped by the caw-box that spawned it, or by init).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
    {
        assert!(Instant::now() < deadline, "driver {pid} still lives");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (at most a minute) until session `id`'s turn container no longer runs.
fn wait_until_ended(rig: &Rig, id: &str) {
    let name = format!("caw-box-{id}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while rig
        .rt
        .block_on(rig.docker.inspect_container(&name, None))
        .unwrap()
        .state
        .unwrap()
        .running
        == Some(true)
    {
        assert!(Instant::now() < deadline, "the turn never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `caw-box wait ID -o json` from a fresh process: exits `code`; its JSON object, and how
/// long it took.
pub fn waited(rig: &Rig, id: &str, code: i32) -> (Value, Duration) {
    let mut c = rig.caw();
    c.args(["wait", id, "-o", "json"]);
    let started = Instant::now();
    let out = run(c);
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}\n{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    (serde_json::from_str(stdout_of(&out).trim()).unwrap(), took)
}

/// The turns `show --json` lists with number `turn`.
fn shown_turns(rig: &Rig, id: &str, turn: u64) -> Vec<Value> {
    let mut c = rig.caw();
    c.args(["show", id, "--json"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let shown: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    shown["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["turn"] == turn)
        .cloned()
        .collect()
}

#[test]
fn a_detached_turn_whose_driver_is_killed_is_recorded_once_by_two_waits() {
    let rig = Rig::new("orphan-wait");
    let id = start_with_fact(&rig, "quince");
    resume_detached(&rig, &id, "HOLD:orphan REMEMBER:plum");
    rig.wait_held("orphan");
    kill_driver(&rig, &id);
    // Two waits at once, from fresh processes, while the turn still runs: one records it.
    let spawn = || {
        let mut c = rig.caw();
        c.args(["wait", &id, "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let (a, b) = (spawn(), spawn());
    std::thread::sleep(Duration::from_millis(500));
    rig.stub_release("orphan");
    let answered = Instant::now();
    for out in [a, b].map(|c| wait_with_deadline(c, Duration::from_secs(60))) {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            stdout_of(&out),
            stderr_of(&out)
        );
        let w: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        assert_eq!(w["turn"], 2, "{w}");
        assert_eq!(w["status"], "success", "{w}");
        assert_eq!(w["result"], "Noted: plum.", "{w}");
    }
    // No minute of grace for a driver that is gone: recorded within 5 s of the answer
    // (0.25 s measured here).
    let took = answered.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let recorded = shown_turns(&rig, &id, 2);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["result"], "Noted: plum.");
    assert_eq!(recorded[0]["status"], "success");
    assert!(recorded[0]["usage"]["output_tokens"].as_u64().unwrap() > 0);
    // Its egress, read by the wait that recorded it from the shared proxy's log (by the
    // agent's address): the model's host reached.
    let egress = &recorded[0]["egress"];
    assert_eq!(egress["policy"], "balanced", "{egress}");
    assert!(
        egress["allowed"].as_array().is_some_and(|a| a
            .iter()
            .any(|e| e["host"] == rig.stub.as_str() && e["connections"].as_u64() > Some(0))),
        "{egress}"
    );
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
    // Its answer is in the conversation the CLI resumes.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 3, "{json}");
    assert!(
        json["result"]
            .as_str()
            .unwrap()
            .contains("You told me to remember plum"),
        "{json}"
    );
}

#[test]
fn an_ended_turn_whose_driver_is_gone_is_recorded_by_show_ls_and_the_next_turn() {
    let rig = Rig::new("orphan-show");
    let id = start_with_fact(&rig, "fig");
    // Nobody waits: the turn ends on its own, its entrypoint hands off to no one.
    resume_detached(&rig, &id, "HOLD:ended REMEMBER:pear");
    rig.wait_held("ended");
    kill_driver(&rig, &id);
    rig.stub_release("ended");
    wait_until_ended(&rig, &id);
    // `ls` records it first: its row tells how the turn ended.
    let mut c = rig.caw();
    c.args(["ls", "--json"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rows: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no row for {id}: {rows}"));
    assert_eq!(row["turns"], 2, "{row}");
    assert_eq!(row["status"], "success", "{row}");
    let recorded = shown_turns(&rig, &id, 2);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["result"], "Noted: pear.");
    assert_eq!(rig.caw_containers(), Vec::<String>::new());

    // Ended with no one looking, and the session's next turn is the first to come.
    resume_detached(&rig, &id, "HOLD:next REMEMBER:lime");
    rig.wait_held("next");
    kill_driver(&rig, &id);
    rig.stub_release("next");
    wait_until_ended(&rig, &id);
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 4, "{json}");
    assert!(
        json["result"]
            .as_str()
            .unwrap()
            .contains("You told me to remember lime"),
        "{json}"
    );
    let recorded = shown_turns(&rig, &id, 3);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["result"], "Noted: lime.");
}

/// SIGKILLs the driver of the warm turn running in session `id`'s container: the pid its
/// exec's command names (`bash -c TURN turn N PID ...`).
fn kill_warm_driver(rig: &Rig, id: &str) {
    let name = format!("caw-box-{id}");
    let pid = rig.rt.block_on(async {
        let c = rig.docker.inspect_container(&name, None).await.unwrap();
        for exec in c.exec_ids.unwrap_or_default() {
            let e = rig.docker.inspect_exec(&exec).await.unwrap();
            let args = e
                .process_config
                .and_then(|p| p.arguments)
                .unwrap_or_default();
            if e.running == Some(true) && args.get(2).map(String::as_str) == Some("turn") {
                return args[4].clone();
            }
        }
        panic!("no warm turn runs in {name}");
    });
    let killed = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
}

#[test]
fn a_detached_warm_turn_whose_driver_is_killed_is_recorded_by_wait() {
    let rig = Rig::new("orphan-warm");
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:olive", &["--keep-warm", "60s"]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    resume_detached(&rig, &id, "HOLD:warm REMEMBER:melon");
    rig.wait_held("warm");
    kill_warm_driver(&rig, &id);
    rig.stub_release("warm");
    let (w, took) = waited(&rig, &id, 0);
    assert_eq!(w["turn"], 2, "{w}");
    assert_eq!(w["result"], "Noted: melon.", "{w}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let recorded = shown_turns(&rig, &id, 2);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["status"], "success");
    // The warm container went with the recording; the next turn runs (cold) and recalls.
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["result"], "You told me to remember melon.", "{json}");
}

#[test]
fn a_detached_turn_whose_container_is_removed_from_outside_is_recorded_as_interrupted() {
    let rig = Rig::new("orphan-rm");
    let id = start_with_fact(&rig, "grape");
    resume_detached(&rig, &id, "HOLD:removed REMEMBER:never");
    rig.wait_held("removed");
    rig.rt
        .block_on(rig.docker.remove_container(
            &format!("caw-box-{id}"),
            // With its anonymous volume (the turn's runtime scratch), which nothing reads
            // once the container is gone: else every run of this test leaves one behind.
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        ))
        .unwrap();
    rig.stub_release("removed");
    let (w, _) = waited(&rig, &id, 130);
    assert_eq!(w["turn"], 2, "{w}");
    assert_eq!(w["status"], "interrupted", "{w}");
    assert_eq!(
        w["result"],
        "the turn was interrupted by its environment: its container is gone (removed from \
         outside caw-box, or by the Docker daemon on a restart); nothing of its output was kept",
        "{w}"
    );
    let recorded = shown_turns(&rig, &id, 2);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["prompt"], "HOLD:removed REMEMBER:never");
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 3, "{json}");
    // grape, or the interrupted turn's word: the CLI kept the prompt it had sent.
    let recalled = json["result"].as_str().unwrap();
    assert!(
        recalled == "You told me to remember grape."
            || recalled == "You told me to remember never.",
        "{json}"
    );
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
}
