//! `make soak` (not part of `make test`: it restarts the Docker daemon and takes minutes):
//! N sessions (`CAW_BOX_SOAK_SESSIONS`, default 16) each start a detached turn at once; the
//! drivers of half of them are SIGKILLed; half the turns get their answer, and the daemon
//! restarts under the other half. Then every session is waited for at once, and the report
//! says how many turns were recorded with their answer, how many as interrupted, how many
//! were lost (the target is 0: the test fails on any), how long the waits took, and what
//! was left running.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;
use crate::orphans::{kill_driver, resume_detached};

/// What one session's `wait` said.
#[derive(Debug)]
enum Outcome {
    Answered,
    Interrupted,
    Lost(String),
}

#[test]
#[ignore = "`make soak`: restarts the Docker daemon, minutes long"]
#[allow(clippy::print_stdout)]
fn soak_killed_drivers_and_a_daemon_restart_lose_no_turn() {
    let n: usize = std::env::var("CAW_BOX_SOAK_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    assert!(rig_pid_file().is_some(), "run it through `make soak`");
    let rig = Rig::new("soak");
    let started = Instant::now();
    // The sessions, a few at a time.
    let mut ids = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(4) {
        let children: Vec<Child> = chunk
            .iter()
            .map(|i| {
                let mut c = rig.run_cmd(CODEX, &format!("REMEMBER:first{i}"), &["-o", "json"]);
                c.stdout(Stdio::piped()).stderr(Stdio::piped());
                c.spawn().unwrap()
            })
            .collect();
        for child in children {
            let out = wait_with_deadline(child, Duration::from_secs(120));
            assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
            let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
            ids.push(json["session_id"].as_str().unwrap().to_string());
        }
    }
    // N detached turns at once, each held at the stub.
    std::thread::scope(|s| {
        for (i, id) in ids.iter().enumerate() {
            let rig = &rig;
            s.spawn(move || resume_detached(rig, id, &format!("HOLD:soak{i} REMEMBER:second{i}")));
        }
    });
    for i in 0..n {
        rig.wait_held(&format!("soak{i}"));
    }
    // Half the drivers SIGKILLed (every other session).
    for id in ids.iter().step_by(2) {
        kill_driver(&rig, id);
    }
    // The first half answer; the daemon restarts under the second half.
    for i in 0..n / 2 {
        rig.stub_release(&format!("soak{i}"));
    }
    let answered = &ids[..n / 2];
    let deadline = Instant::now() + Duration::from_secs(120);
    while answered.iter().any(|id| {
        rig.rt
            .block_on(rig.docker.inspect_container(&format!("caw-box-{id}"), None))
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.running)
            .unwrap_or(false)
    }) {
        assert!(Instant::now() < deadline, "the answered turns never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = std::process::Command::new(repo_root().join("scripts/rig.sh"))
        .arg("restart")
        .status()
        .unwrap();
    assert!(status.success(), "restarting dockerd failed");
    // Every session waited for at once.
    let back = Instant::now();
    let mut waits: Vec<(usize, Child, Option<Duration>)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut c = rig.caw();
            c.args(["wait", id, "-o", "json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            (i, c.spawn().unwrap(), None)
        })
        .collect();
    while waits.iter().any(|(_, _, took)| took.is_none()) {
        for (_, child, took) in waits.iter_mut().filter(|w| w.2.is_none()) {
            if child.try_wait().unwrap().is_some() {
                *took = Some(back.elapsed());
            }
        }
        assert!(back.elapsed() < Duration::from_secs(600), "waits hang");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut outcomes = Vec::new();
    let mut times = Vec::new();
    for (i, child, took) in waits {
        let out = child.wait_with_output().unwrap();
        times.push(took.unwrap());
        let json: Option<Value> = serde_json::from_str(stdout_of(&out).trim()).ok();
        let status = json.as_ref().map(|j| j["status"].clone());
        let outcome = match (out.status.code(), status.as_ref().and_then(Value::as_str)) {
            (Some(0), Some("success"))
                if json.as_ref().unwrap()["result"] == format!("Noted: second{i}.").as_str() =>
            {
                Outcome::Answered
            }
            (Some(130), Some("interrupted")) if i >= n / 2 => Outcome::Interrupted,
            _ => Outcome::Lost(format!(
                "session {i}: exit {:?}: {}{}",
                out.status.code(),
                stdout_of(&out),
                stderr_of(&out)
            )),
        };
        outcomes.push(outcome);
    }
    let left = rig.caw_containers();
    times.sort();
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    let (answered, interrupted) = (
        count(|o| matches!(o, Outcome::Answered)),
        count(|o| matches!(o, Outcome::Interrupted)),
    );
    let lost: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Lost(why) => Some(why),
            _ => None,
        })
        .collect();
    println!("soak: {n} sessions, {n} detached turns, {} drivers SIGKILLed, the daemon restarted under {}", n.div_ceil(2), n - n / 2);
    println!("  recorded with their answer   {answered} (of {})", n / 2);
    println!(
        "  recorded as interrupted      {interrupted} (of {})",
        n - n / 2
    );
    println!("  lost                         {} (target 0)", lost.len());
    println!(
        "  waits, all at once after the daemon was back: median {:.2} s, slowest {:.2} s",
        times[times.len() / 2].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
    println!("  left running                 {} {left:?}", left.len());
    println!(
        "  whole soak                   {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(lost.is_empty(), "lost turns: {lost:#?}");
    assert_eq!(answered, n / 2);
    assert_eq!(left, Vec::<String>::new());
}
