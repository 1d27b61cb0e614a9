//! Sessions survive a Docker daemon restart: the state is in named volumes, the record in
//! the volume, and nothing needs the old containers. Restarts the daemon the test setup
//! started (by its PID, through scripts/rig.sh), so `scripts/test.sh` runs this test alone.

use std::time::Duration;

use crate::common::*;

#[test]
fn daemon_restart_keeps_every_provider_resumable() {
    let pid_file = rig_pid_file().expect(
        "this test restarts the Docker daemon that scripts/rig.sh started; none was started by it \
         (run it through `make test`)",
    );
    let rig = Rig::new("restart");
    let mut sessions = Vec::new();
    for (i, p) in ALL.iter().enumerate() {
        let fact = format!("survivor-{i}");
        let (code, json, stderr) = rig.json_turn(rig.run_cmd(*p, &format!("REMEMBER:{fact}"), &[]));
        assert_eq!(code, 0, "{json}\n{stderr}");
        sessions.push((*p, json["session_id"].as_str().unwrap().to_string(), fact));
    }
    let old_pid = std::fs::read_to_string(&pid_file).unwrap();
    restart_daemon();
    let new_pid = std::fs::read_to_string(&pid_file).unwrap();
    assert_ne!(old_pid.trim(), new_pid.trim(), "the daemon did not restart");

    // The stub container stopped with the daemon; bring it back, then resume every session.
    rig.rt.block_on(async {
        let docker = docker().negotiate_version().await.unwrap();
        docker.start_container(&rig.stub, None).await.unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    for (p, id, fact) in sessions {
        let (code, json, stderr) = rig.json_turn(rig.resume_cmd(p, &id, "RECALL", &[]));
        assert_eq!(code, 0, "{} after restart: {json}\n{stderr}", p.name);
        assert!(
            json["result"]
                .as_str()
                .unwrap()
                .contains(&format!("You told me to remember {fact}")),
            "{}: {json}",
            p.name
        );
    }
}

/// A detached turn running when the daemon restarts: its container is stopped with the
/// daemon, and the next caw-box records it as interrupted by its environment at once (no
/// minute of grace), with the reason; the session recalls on its next resume.
#[test]
fn daemon_restart_under_a_detached_turn_cold_or_warm_is_recorded_as_interrupted() {
    let rig = Rig::new("restart-detached");
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:cherry", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let out = run(rig.resume_cmd(CODEX, &id, "HOLD:restart REMEMBER:never", &["-d"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    rig.wait_held("restart");
    restart_daemon();
    // From the daemon's return.
    let (w, took) = crate::orphans::waited(&rig, &id, 130);
    assert_eq!(w["turn"], 2, "{w}");
    assert_eq!(w["status"], "interrupted", "{w}");
    assert!(
        w["result"]
            .as_str()
            .unwrap()
            .starts_with("the turn was interrupted by its environment: its container got SIGTERM from outside caw-box"),
        "{w}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
    rig.rt.block_on(async {
        let docker = docker().negotiate_version().await.unwrap();
        docker.start_container(&rig.stub, None).await.unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 3, "{json}");
    // The conversation goes on: cherry, or the interrupted turn's word when its request
    // reached the model before the restart (the CLI keeps the prompt it sent).
    let recalled = json["result"].as_str().unwrap();
    assert!(
        recalled == "You told me to remember cherry."
            || recalled == "You told me to remember never.",
        "{json}"
    );

    // The same under a warm turn: the daemon's restart removes a warm container (it is
    // removed when it ends), so nothing of the turn's output is left; the turn is recorded
    // as interrupted all the same, at once.
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, &id, "REMEMBER:warmth", &["--keep-warm", "60s"]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let out = run(rig.resume_cmd(CODEX, &id, "HOLD:warm-restart REMEMBER:never", &["-d"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    rig.wait_held("warm-restart");
    restart_daemon();
    // From the daemon's return.
    let (w, took) = crate::orphans::waited(&rig, &id, 130);
    assert_eq!(w["turn"], 5, "{w}");
    assert_eq!(w["status"], "interrupted", "{w}");
    assert!(
        w["result"]
            .as_str()
            .unwrap()
            .starts_with("the turn was interrupted by its environment: its container"),
        "{w}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    rig.rt.block_on(async {
        let docker = docker().negotiate_version().await.unwrap();
        docker.start_container(&rig.stub, None).await.unwrap();
    });
    std::thread::sleep(Duration::from_millis(500));
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 6, "{json}");
    let recalled = json["result"].as_str().unwrap();
    assert!(
        recalled == "You told me to remember warmth."
            || recalled == "You told me to remember never.",
        "{json}"
    );
    // Only the session's idle warm container stays (the last turn kept it, as the
    // session's --keep-warm says).
    let left = rig.caw_containers();
    assert_eq!(left, vec![format!("/caw-box-{id}-warm")]);
}

/// Restarts the Docker daemon scripts/rig.sh started (the test containers stop with it).
fn restart_daemon() {
    let status = std::process::Command::new(repo_root().join("scripts/rig.sh"))
        .arg("restart")
        .status()
        .unwrap();
    assert!(status.success(), "restarting dockerd failed");
}
