//! The pure parts: label mapping and pod specs. What the API server does with them is
//! proved by the e2e tests against the lab cluster (tests/e2e/kubernetes.rs).

use std::collections::HashMap;

use super::meta::{label_selector, matches, merged, split, valid_label_value};
use super::*;
use crate::backend::{Limits, Scratch};

#[test]
fn only_valid_values_become_labels_and_every_pair_an_annotation() {
    let labels = HashMap::from([
        ("io.caw-box.session".to_string(), "0f6d".to_string()),
        (
            "io.caw-box.settings".to_string(),
            r#"{"image":"caw-box/codex:latest"}"#.to_string(),
        ),
    ]);
    let (k8s, annotations) = split(&labels);
    assert_eq!(
        k8s.get("io.caw-box.session").map(String::as_str),
        Some("0f6d")
    );
    assert!(!k8s.contains_key("io.caw-box.settings"));
    assert_eq!(k8s.get(MANAGED_BY.0).map(String::as_str), Some("caw-box"));
    assert_eq!(annotations.len(), 2);
    let meta = ObjectMeta {
        labels: Some(k8s),
        annotations: Some(annotations),
        ..Default::default()
    };
    assert_eq!(merged(&meta), labels);
}

#[test]
fn label_values_follow_kubernetes_rules() {
    assert!(valid_label_value("caw-box"));
    assert!(valid_label_value(""));
    assert!(!valid_label_value("-x"));
    assert!(!valid_label_value("a b"));
    assert!(!valid_label_value(&"a".repeat(64)));
}

#[test]
fn the_selector_keeps_what_kubernetes_can_select_and_matches_checks_the_rest() {
    let filter = vec![
        "io.caw-box.session=abc".to_string(),
        "io.caw-box.name=has space".to_string(),
    ];
    assert_eq!(
        label_selector(&filter),
        "app.kubernetes.io/managed-by=caw-box,io.caw-box.session=abc"
    );
    let labels = HashMap::from([
        ("io.caw-box.session".to_string(), "abc".to_string()),
        ("io.caw-box.name".to_string(), "has space".to_string()),
    ]);
    assert!(matches(&labels, &filter));
    assert!(!matches(&labels, &["io.caw-box.session=other".to_string()]));
}

fn turn() -> TurnSpec {
    TurnSpec {
        image: "caw-box/codex:latest".into(),
        argv: vec!["codex".into(), "exec".into()],
        env: vec!["HOME=/home/agent".into()],
        user: (1000, 1000),
        working_dir: "/workspace".into(),
        labels: HashMap::new(),
        home: MountSpec::volume("caw-box-x", "/home/agent"),
        workspace: Some(MountSpec::volume("caw-box-x-workspace", "/workspace")),
        runtime: Scratch {
            mount: "/run/caw-box".into(),
            ..Default::default()
        },
        runtime_over_stdin: true,
        limits: Limits {
            memory: Some(1 << 30),
            cpus: Some(1.5),
            pids: 512,
        },
        network: NetworkPolicy::Default,
        interactive: None,
        broker: None,
    }
}

#[test]
fn a_turn_pod_is_hardened_and_carries_no_secret_path() {
    let spec = turn_pod_spec(&turn()).unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let seccomp = spec
        .security_context
        .as_ref()
        .unwrap()
        .seccomp_profile
        .as_ref();
    assert_eq!(seccomp.unwrap().type_, "RuntimeDefault");
    let c = &spec.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(1000));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert_eq!(c.stdin, Some(true));
    // Open across attachments (a driver that is gone, another caw-box hands the record in),
    // and the entrypoint waits long for it.
    assert_eq!(c.stdin_once, Some(false));
    let env = c.env.as_ref().unwrap();
    assert!(
        env.iter().any(|e| e.name == "CAW_BOX_HANDOFF_WAIT"
            && e.value.as_deref().unwrap_or("").parse::<u64>().unwrap_or(0) >= 3600),
        "{env:?}"
    );
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "1500m");
    assert_eq!(limits["memory"].0, (1u64 << 30).to_string());
    let volumes = spec.volumes.as_ref().unwrap();
    let runtime = volumes.iter().find(|v| v.name == "runtime").unwrap();
    assert_eq!(
        runtime.empty_dir.as_ref().unwrap().medium.as_deref(),
        Some("Memory")
    );
    assert!(volumes
        .iter()
        .all(|v| v.secret.is_none() && v.host_path.is_none()));
}

#[test]
fn a_host_directory_and_a_named_network_are_refused() {
    let mut bind = turn();
    bind.workspace = Some(MountSpec::host_dir("/src", "/workspace"));
    assert!(turn_pod_spec(&bind).is_err());
    let mut net = turn();
    net.network = NetworkPolicy::Named("gw".into());
    assert!(turn_pod_spec(&net).is_err());
}

/// The turn's image missing shows first on its init container (the main one only says
/// PodInitializing): that is a missing image, not a pod still on its way.
#[test]
fn an_init_container_without_its_image_is_a_missing_image() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [{"name": "seed-home", "image": "x", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "never pull"}}}],
            "containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}}}]
        }
    }))
    .unwrap();
    match pod_progress(&pod) {
        Progress::ImageMissing(why) => assert!(why.contains("ErrImageNeverPull"), "{why}"),
        _ => panic!("not taken for a missing image"),
    }
}

/// A TUI's pod has a terminal and a stdin, and starts the image's entrypoint only once its
/// runtime files are in (they are put in after it runs).
#[test]
fn a_tui_pod_has_a_terminal_and_waits_for_its_runtime_files() {
    let mut tui = turn();
    tui.interactive = Some(Some((120, 40)));
    tui.runtime_over_stdin = false;
    tui.runtime.files = vec![crate::backend::ScratchFile {
        path: "env".into(),
        contents: b"K=V".to_vec(),
        mode: 0o600,
    }];
    let spec = turn_pod_spec(&tui).unwrap();
    let c = &spec.containers[0];
    assert_eq!(c.tty, Some(true));
    assert_eq!(c.stdin, Some(true));
    let command = c.command.as_ref().unwrap().join(" ");
    assert!(command.contains("/run/caw-box/.caw-box-ready"), "{command}");
    assert!(command.contains("exec /usr/bin/tini -- /usr/local/bin/caw-box-entry"));
    assert_eq!(c.args.as_deref(), Some(&tui.argv[..]));
    // A headless turn keeps the image's entrypoint and no terminal.
    let headless = turn_pod_spec(&turn()).unwrap();
    assert_eq!(headless.containers[0].tty, Some(false));
    assert_eq!(headless.containers[0].command, None);
}

#[test]
fn oom_kills_are_read_from_cgroup_v1_and_v2_counters() {
    let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
    assert_eq!(oom_kills(v1), 2);
    let v2 = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n";
    assert_eq!(oom_kills(v2), 1);
    assert_eq!(oom_kills("oom_kill_disable 0\noom_kill 0\n"), 0);
    assert_eq!(oom_kills(""), 0);
}

#[test]
fn an_evicted_or_oom_killed_pod_names_its_cause() {
    let evicted: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "reason": "Evicted",
                   "message": "The node was low on resource: memory."}
    }))
    .unwrap();
    let why = pod_failure(&evicted).unwrap();
    assert!(
        why.contains("evicted") && why.contains("low on resource"),
        "{why}"
    );
    let oom: Pod = serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "agent",
                 "resources": {"limits": {"memory": "134217728"}}}]},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "agent", "image": "x",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
    }))
    .unwrap();
    let why = pod_failure(&oom).unwrap();
    assert!(
        why.contains("OOM-killed") && why.contains("128Mi (--memory)"),
        "{why}"
    );
    let ended: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "containerStatuses": [{"name": "agent", "image": "x",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    }))
    .unwrap();
    assert_eq!(pod_failure(&ended), None);
    assert_eq!(readable_bytes("1073741824"), "1Gi");
    assert_eq!(readable_bytes("1000"), "1000");
}

/// A brokered turn's pod: the broker is a second container of the same image and sandbox,
/// its spec holds no key (its keys come on its stdin), it sees only the shared end marker
/// (read-only), and the agent's entrypoint runs under the wrapper that leaves that marker.
#[test]
fn a_brokered_turn_pod_has_the_broker_beside_the_agent_and_no_key_in_its_spec() {
    let mut t = turn();
    t.broker = Some(crate::session::sidecar_entrypoint());
    let spec = turn_pod_spec(&t).unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", "broker"]);
    let (agent, broker) = (&spec.containers[0], &spec.containers[1]);
    assert_eq!(agent.command.as_deref(), Some(&marked_entry()[..]));
    assert_eq!(agent.args.as_deref(), Some(&t.argv[..]));
    assert_eq!(broker.stdin, Some(true));
    assert_eq!(broker.env, None);
    let sc = broker.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let mounts = broker.volume_mounts.as_ref().unwrap();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].mount_path, POD_END_DIR);
    assert_eq!(mounts[0].read_only, Some(true));
    assert!(agent
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .any(|m| m.mount_path == POD_END_DIR && m.read_only != Some(true)));
    let json = serde_json::to_string(&spec).unwrap();
    assert!(!json.contains("sk-"), "{json}");
    // Without a broker: the image's own entrypoint, one container.
    let plain = turn_pod_spec(&turn()).unwrap();
    assert_eq!(plain.containers.len(), 1);
    assert_eq!(plain.containers[0].command, None);
    // A TUI beside a broker waits for its files, then runs the same wrapper.
    t.interactive = Some(Some((80, 24)));
    let tui = turn_pod_spec(&t).unwrap();
    let script = &tui.containers[0].command.as_ref().unwrap()[2];
    assert!(script.contains("CAW_BOX_POD_END="), "{script}");
    assert!(script.contains(".caw-box-ready"), "{script}");
}

/// The wrapper (run by the real bash here) passes on stdin, the entrypoint's exit code and a
/// stop signal, and leaves the end marker in every case.
#[test]
fn the_marked_entry_passes_stdin_exit_code_and_signals_and_leaves_the_marker() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ended");
    let wrapped = |inner: &str| {
        let mut c = Command::new("bash");
        c.env("CAW_BOX_POD_END", &marker)
            .args(["-c", MARKED_ENTRY, "caw-box-agent", "bash", "-c", inner])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        c
    };
    let mut child = wrapped("read -r x; echo \"got $x\"; exit 7")
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got hello\n");
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    // SIGTERM to the wrapper reaches the entrypoint, whose own exit code counts.
    let mut child = wrapped("trap 'exit 3' TERM; echo up; while :; do sleep 0.1; done")
        .spawn()
        .unwrap();
    let mut first = [0u8; 3];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let code = (0..100).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        child.try_wait().unwrap().map(|s| s.code())
    });
    if code.is_none() {
        let _ = child.kill();
    }
    assert_eq!(code, Some(Some(3)), "the wrapper did not pass SIGTERM on");
    assert!(marker.exists());
}
