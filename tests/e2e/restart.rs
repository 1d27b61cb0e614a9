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
    let status = std::process::Command::new(repo_root().join("scripts/rig.sh"))
        .arg("restart")
        .status()
        .unwrap();
    assert!(status.success(), "restarting dockerd failed");
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
