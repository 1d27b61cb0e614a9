//! Turn control: timeout (124), Ctrl-C (130), a crashing CLI (1), a concurrent turn on a
//! busy session (2). Each leaves no container and a resumable session that still recalls.
//! Also checks the hardening of a running turn's container and that no secret shows in it.

use std::time::{Duration, Instant};

use crate::common::*;

fn start_with_fact(rig: &Rig, p: P, fact: &str) -> String {
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(p, &format!("REMEMBER:{fact}"), &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    json["session_id"].as_str().unwrap().to_string()
}

fn assert_recalls(rig: &Rig, p: P, id: &str, fact: &str) {
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(p, id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"]
            .as_str()
            .unwrap()
            .contains(&format!("You told me to remember {fact}")),
        "{json}"
    );
}

#[test]
fn timeout_stops_the_turn_and_keeps_the_session() {
    let rig = Rig::new("timeout");
    let id = start_with_fact(&rig, CODEX, "kiwi");
    let started = Instant::now();
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, &id, "SLEEP:120 then answer", &["--timeout", "4s"]));
    assert_eq!(code, 124, "{json}\n{stderr}");
    assert_eq!(json["status"], "timeout");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(stderr.contains("timed out"), "{stderr}");
    assert!(rig.caw_containers().is_empty(), "container left behind");
    assert_recalls(&rig, CODEX, &id, "kiwi");
}

#[test]
fn interrupt_and_busy_session() {
    let rig = Rig::new("interrupt");
    let id = start_with_fact(&rig, CLAUDE, "plum");

    let mut cmd = rig.resume_cmd(
        CLAUDE,
        &id,
        "SLEEP:120 then answer",
        &[
            "-o",
            "json",
            "--memory",
            "768m",
            "--cpus",
            "1.5",
            "--pids-limit",
            "300",
        ],
    );
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(Some(&id), Duration::from_secs(60));

    // The running container is locked down and carries no secret.
    let inspect = rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .unwrap();
    let hc = inspect.host_config.clone().unwrap();
    assert_eq!(hc.readonly_rootfs, Some(true));
    // No capability can ever be had: the bounding set is empty. (Docker's inspect says
    // CapDrop ["ALL"]; Podman's lists every capability it dropped.)
    let status = rig.exec(&container, &["cat", "/proc/1/status"]);
    assert!(
        status.contains("CapBnd:\t0000000000000000"),
        "capabilities left: {status}"
    );
    assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
    assert_eq!(hc.privileged, Some(false));
    assert_eq!(hc.pids_limit, Some(300));
    assert_eq!(hc.memory, Some(768 << 20));
    assert_eq!(hc.nano_cpus, Some(1_500_000_000));
    assert_eq!(
        inspect.config.as_ref().unwrap().user.as_deref(),
        Some("1000:1000")
    );
    let inspect_json = serde_json::to_string(&inspect).unwrap();
    assert!(
        !inspect_json.contains(TEST_KEY),
        "the key shows in docker inspect"
    );
    assert!(!inspect_json.contains("docker.sock"));

    // A second turn of the same session is refused while this one runs.
    let out = run(rig.resume_cmd(CLAUDE, &id, "hi", &[]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("is busy"), "{}", stderr_of(&out));

    // Ctrl-C: the container stops within 10 s and caw-box exits 130.
    let pid = child.id() as i32;
    let sent = Instant::now();
    assert_eq!(
        std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap()
            .code(),
        Some(0)
    );
    let out = wait_with_deadline(child, Duration::from_secs(30));
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "took {:?}",
        sent.elapsed()
    );
    assert_eq!(out.status.code(), Some(130), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "interrupted");
    assert!(rig.caw_containers().is_empty(), "container left behind");
    assert_recalls(&rig, CLAUDE, &id, "plum");
}

#[test]
fn a_crashing_cli_is_an_error_and_the_session_survives() {
    let rig = Rig::new("crash");
    let id = start_with_fact(&rig, GEMINI, "fig");
    // Held at the stub (never released): the CLI is mid-request when it is killed.
    let mut cmd = rig.resume_cmd(GEMINI, &id, "HOLD:crash then answer", &["-o", "json"]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(Some(&id), Duration::from_secs(60));
    rig.wait_held("crash");
    // Kill every process of the agent user but the container's init: the CLI dies hard.
    rig.exec(&container, &["bash", "-c", "kill -KILL -1"]);
    let out = wait_with_deadline(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "error");
    assert!(rig.caw_containers().is_empty(), "container left behind");
    assert_recalls(&rig, GEMINI, &id, "fig");
}

#[test]
fn the_leftover_of_a_hard_killed_caw_box_is_cleared_by_the_next_turn() {
    let rig = Rig::new("killed");
    let id = start_with_fact(&rig, CODEX, "quince");
    let mut cmd = rig.resume_cmd(CODEX, &id, "HOLD:killed then say hello", &[]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(Some(&id), Duration::from_secs(60));
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    // The CLI finishes on its own once the stub answers; its container stays, with no
    // process driving it.
    rig.stub_release("killed");
    let deadline = Instant::now() + Duration::from_secs(60);
    while rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .unwrap()
        .state
        .and_then(|s| s.running)
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "the turn never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        rig.caw_containers().len(),
        1,
        "the leftover should still be there"
    );
    // The next turn records the killed one first (its answer came), then runs as turn 3.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 3, "{json}");
    assert_eq!(json["result"], "You told me to remember quince.", "{json}");
    let mut show = rig.caw();
    show.args(["show", &id, "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&stdout_of(&run(show))).unwrap();
    assert_eq!(shown["turns"][1]["turn"], 2, "{shown}");
    assert_eq!(shown["turns"][1]["status"], "success", "{shown}");
    assert!(rig.caw_containers().is_empty());
}

/// A first turn whose container is removed from under it (`docker rm -f`, a prune) fails
/// with an error that says so, and the session it started keeps its state volume: the
/// agent may have worked there.
#[test]
fn a_first_turn_that_ran_and_failed_keeps_its_session() {
    let rig = Rig::new("rmfirst");
    // Held at the stub until its container is gone (never released).
    let mut cmd = rig.run_cmd(CODEX, "HOLD:gone REMEMBER:gone", &[]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    rig.rt
        .block_on(rig.docker.remove_container(
            &container,
            // With its anonymous volume (the turn's runtime scratch), which nothing reads
            // once the container is gone: else every run of this test leaves one behind.
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        ))
        .unwrap();
    let out = wait_with_deadline(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("was removed while the turn ran"),
        "{}",
        stderr_of(&out)
    );
    let volume = container.clone(); // the state volume has the container's name
    assert!(
        rig.caw_volumes().contains(&volume),
        "the state volume went: {:?}\n{}",
        rig.caw_volumes(),
        stderr_of(&out)
    );
    rig.cleanup();
}

/// The runtime scratch (its prompt) of the running turn container `container`: the name of
/// the volume it mounts there.
fn scratch_volume_of(rig: &Rig, container: &str) -> String {
    rig.mounts_of(container)
        .into_iter()
        .find(|m| m.destination.as_deref() == Some("/run/caw-box"))
        .and_then(|m| m.name)
        .expect("the turn's runtime scratch volume")
}

/// Removes the running turn `container` as a person does from outside: `docker rm -f`,
/// without `-v`, which leaves its anonymous volumes behind; `child`, its driver, ends.
fn remove_without_volumes(rig: &Rig, container: &str, child: std::process::Child) {
    let no_v = bollard::query_parameters::RemoveContainerOptions {
        force: true,
        v: false,
        ..Default::default()
    };
    rig.rt
        .block_on(rig.docker.remove_container(container, Some(no_v)))
        .unwrap();
    let out = wait_with_deadline(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
}

fn volume_labels(rig: &Rig, volume: &str) -> Option<std::collections::HashMap<String, String>> {
    match rig.rt.block_on(rig.docker.inspect_volume(volume)) {
        Ok(v) => Some(v.labels),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => None,
        Err(e) => panic!("inspect volume {volume}: {e}"),
    }
}

/// A turn container removed from outside without its volumes (`docker rm -f`) leaves its
/// runtime scratch, the turn's prompt in it, labelled as the session's runtime: the
/// session's next turn removes it as it starts, and `gc` one left by that turn in turn;
/// `gc` leaves a running turn's (in use) alone. Two held codex turns (~10 s).
#[test]
fn a_turn_removed_without_its_volumes_leaves_a_labelled_scratch_that_goes() {
    let rig = Rig::new("scratchgone");
    let mut first = rig.run_cmd(CODEX, "HOLD:one REMEMBER:kept", &[]);
    first
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = first.spawn().unwrap();
    let container = rig.wait_for_running_turn(None, HELD_WITHIN);
    rig.wait_held("one");
    let id = rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .unwrap()
        .config
        .and_then(|c| c.labels)
        .and_then(|l| l.get("io.caw-box.session").cloned())
        .expect("the turn's session label");
    let scratch = scratch_volume_of(&rig, &container);
    remove_without_volumes(&rig, &container, child);

    let labels = volume_labels(&rig, &scratch).expect("the scratch was left behind");
    let label = |k: &str| labels.get(k).map(String::as_str);
    assert_eq!(label("io.caw-box.managed"), Some("true"), "{labels:?}");
    assert_eq!(label("io.caw-box.session"), Some(id.as_str()), "{labels:?}");
    assert_eq!(label("io.caw-box.role"), Some("runtime"), "{labels:?}");
    assert_eq!(label("io.caw-box.turn"), Some("1"), "{labels:?}");
    // The extra labels (`CAW_BOX_LABELS`) too: a CI job's sweep finds it.
    assert_eq!(label(TEST_LABEL), Some(rig.run_id.as_str()), "{labels:?}");

    // The next turn of the session removes it as it starts.
    let mut second = rig.resume_cmd(CODEX, &id, "HOLD:two", &[]);
    second
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = second.spawn().unwrap();
    rig.wait_held("two");
    assert_eq!(volume_labels(&rig, &scratch), None, "the next turn left it");
    let container = rig.wait_for_running_turn(None, HELD_WITHIN);
    let running = scratch_volume_of(&rig, &container);

    // `gc` leaves the running turn's scratch (in use), and says nothing of it.
    let out = rig.caw_run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(!stdout_of(&out).contains("runtime"), "{}", stdout_of(&out));
    assert!(
        volume_labels(&rig, &running).is_some(),
        "gc took a running turn's"
    );

    remove_without_volumes(&rig, &container, child);
    assert!(volume_labels(&rig, &running).is_some(), "left behind");
    let out = rig.caw_run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("removed 1 unused runtime volume\n"),
        "{}",
        stdout_of(&out)
    );
    assert_eq!(volume_labels(&rig, &running), None, "gc left it");
    rig.cleanup();
}
