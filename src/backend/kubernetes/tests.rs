//! The pure parts: label mapping and pod specs. What the API server does with them is
//! proved by the e2e tests against the lab cluster (tests/e2e/kubernetes.rs).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::meta::{label_selector, matches, merged, split, valid_label_value};
use super::sidecars::{POD_END_DIR, POD_END_FILE, PROXY_SIDECAR};
use super::spec::{marked_entry, MARKED_ENTRY};
use super::status::{
    egress_init_failed, oom_kills, pod_failure, pod_progress, readable_bytes, Progress,
};
use super::*;
use crate::backend::{Limits, MountSpec, NetworkPolicy, Scratch, TurnSpec};

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
    let mut annotations = annotations;
    // The backend's own note on a seeded state claim is none of caw-box's labels.
    annotations.insert(super::meta::HOME_SEEDED.to_string(), "true".to_string());
    let meta = ObjectMeta {
        labels: Some(k8s),
        annotations: Some(annotations),
        ..Default::default()
    };
    assert_eq!(merged(&meta), labels);
}

#[test]
fn waits_poll_fast_at_first_then_gently() {
    let now = std::time::Instant::now();
    assert_eq!(poll_after(now), std::time::Duration::from_millis(100));
    let long_ago = now - std::time::Duration::from_secs(11);
    assert_eq!(poll_after(long_ago), POLL);
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

pub(super) fn turn() -> TurnSpec {
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
        egress_allow: vec![],
        egress_policy: Default::default(),
        extra_hosts: Vec::new(),
        oci_runtime: None,
        hand_over: Vec::new(),
        checkpoint: Vec::new(),
        protected: Vec::new(),
    }
}

/// `--runtime`: the pod's RuntimeClass; none: the cluster's default handler.
#[test]
fn a_turn_pods_runtime_class_is_the_sessions_runtime() {
    assert_eq!(turn_pod_spec(&turn()).unwrap().runtime_class_name, None);
    let mut t = turn();
    t.oci_runtime = Some("gvisor".into());
    assert_eq!(
        turn_pod_spec(&t).unwrap().runtime_class_name.as_deref(),
        Some("gvisor")
    );
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
    // A headless turn has no terminal, and the image's entrypoint under the wrapper that
    // announces its end; a TUI's does not (it would show on the terminal).
    let headless = turn_pod_spec(&turn()).unwrap();
    assert_eq!(headless.containers[0].tty, Some(false));
    assert_eq!(
        headless.containers[0].command.as_deref(),
        Some(&marked_entry(false, true)[..])
    );
    assert!(!command.contains("CAW_BOX_ANNOUNCE_END"), "{command}");
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
    t.broker = Some(crate::session::BROKER_LOADER.to_string());
    let spec = turn_pod_spec(&t).unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", "broker"]);
    let (agent, broker) = (&spec.containers[0], &spec.containers[1]);
    assert_eq!(
        agent.command.as_deref(),
        Some(&marked_entry(true, true)[..])
    );
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
    // The broker's program, which exits once the agent's container left the end marker.
    let command = broker.command.as_deref().unwrap();
    assert_eq!(command[..2], ["node", "-e"]);
    assert!(command[2].starts_with(crate::session::BROKER_LOADER));
    assert!(command[2].contains(&format!("{POD_END_DIR}/{POD_END_FILE}")));
    let json = serde_json::to_string(&spec).unwrap();
    assert!(!json.contains("sk-"), "{json}");
    // Without a broker: one container, the wrapper announcing its end without a marker.
    let plain = turn_pod_spec(&turn()).unwrap();
    assert_eq!(plain.containers.len(), 1);
    assert_eq!(
        plain.containers[0].command.as_deref(),
        Some(&marked_entry(false, true)[..])
    );
    // A TUI beside a broker waits for its files, then runs the same wrapper.
    t.interactive = Some(Some((80, 24)));
    let tui = turn_pod_spec(&t).unwrap();
    let script = &tui.containers[0].command.as_ref().unwrap()[2];
    assert!(script.contains("CAW_BOX_POD_END="), "{script}");
    assert!(script.contains(".caw-box-ready"), "{script}");
}

/// The wrapper (run by the real bash here) passes on stdin, the entrypoint's exit code and a
/// stop signal, leaves the end marker in every case, and last announces the end.
#[test]
fn the_marked_entry_passes_stdin_exit_code_and_signals_and_leaves_the_marker() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ended");
    let wrapped = |inner: &str| {
        let mut c = Command::new("bash");
        c.env("CAW_BOX_POD_END", &marker)
            .env("CAW_BOX_ANNOUNCE_END", "1")
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
    // Only a 0 is announced (the record taken): another end comes from the pod's status.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got hello\n");
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    let out = wrapped("echo done").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "done\n\x1ecaw-box-ended 0\n"
    );
    std::fs::remove_file(&marker).unwrap();
    // SIGTERM to the wrapper reaches the entrypoint, whose own exit code counts; a stopped
    // turn's end is not announced, even a 0 (the driver records it from the pod's status).
    let mut child = wrapped("trap 'exit 0' TERM; echo up; while :; do sleep 0.1; done")
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
    assert_eq!(code, Some(Some(0)), "the wrapper did not pass SIGTERM on");
    assert!(marker.exists());
    let mut rest = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut rest).unwrap();
    assert_eq!(rest, "", "a stopped turn's end was announced");
}

/// The egress init container: root with NET_ADMIN and NET_RAW alone, no escalation, no
/// secret, its rules letting the proxy's uid out (unbrokered).
fn assert_egress_init_is_narrow(init: &Container) {
    let sc = init.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_user, Some(0));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(
        caps.add.as_deref(),
        Some(&["NET_ADMIN".to_string(), "NET_RAW".to_string()][..])
    );
    assert_eq!(init.env, None, "the init container gets no environment");
    let argv = init.command.as_ref().unwrap();
    assert_eq!(
        argv.last().unwrap(),
        &PROXY_UID.to_string(),
        "unbrokered: the proxy alone"
    );
    assert!(argv[2].contains("--uid-owner") && argv[2].contains("ip6tables"));
    let init_json = serde_json::to_string(init).unwrap();
    assert!(
        !init_json.contains("placeholder") && !init_json.contains("KEY"),
        "{init_json}"
    );
}

fn assert_agent_waits_for_the_proxy(agent: &Container) {
    assert_eq!(
        agent.security_context.as_ref().unwrap().run_as_user,
        Some(1000)
    );
    assert!(agent
        .command
        .as_ref()
        .unwrap()
        .iter()
        .any(|a| a == MARKED_ENTRY));
    let agent_env = agent.env.as_ref().unwrap();
    assert!(agent_env
        .iter()
        .any(|e| e.name == "CAW_BOX_PROXY_WAIT" && e.value.as_deref() == Some("3128")));
}

/// The proxy sidecar: a uid of its own, on loopback, no secret, ending on the agent's end
/// marker.
fn assert_proxy_sidecar_is_narrow(proxy: &Container) {
    let psc = proxy.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_user, Some(PROXY_UID));
    assert_ne!(PROXY_UID, 1000);
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.read_only_root_filesystem, Some(true));
    assert_eq!(
        psc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let penv: HashMap<String, String> = proxy
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(penv["CAW_BOX_ALLOW"], "10.244.7.9:8080,*.example.com");
    assert_eq!(penv["CAW_BOX_PROXY_PORT"], "3128");
    assert_eq!(penv["CAW_BOX_PROXY_HOST"], "127.0.0.1");
    let script = &proxy.command.as_ref().unwrap()[2];
    assert!(
        script.contains(&format!("{POD_END_DIR}/{POD_END_FILE}")),
        "{script}"
    );
    assert!(
        script.contains("/usr/local/lib/caw-box/proxy.js"),
        "{script}"
    );
    let proxy_json = serde_json::to_string(proxy).unwrap();
    assert!(!proxy_json.contains("placeholder"), "{proxy_json}");
}

/// `--allow-host`: an init container (root, NET_ADMIN and NET_RAW alone, no escalation, no
/// secret) holds the pod's egress to the proxy sidecar's uid (and the broker's, brokered);
/// the proxy runs under a uid of its own, on loopback, and ends on the agent's end marker.
#[test]
fn an_allow_host_pod_holds_its_egress_with_an_init_container_and_a_proxy_sidecar() {
    let mut t = turn();
    t.env.push("OPENAI_API_KEY=caw-box-placeholder".into());
    t.egress_allow = vec!["10.244.7.9:8080".into(), "*.example.com".into()];
    t.egress_policy = Some(crate::session::record::EgressPolicy::Locked);
    let spec = turn_pod_spec(&t).unwrap();
    let inits = spec.init_containers.as_ref().unwrap();
    assert_eq!(
        inits[0].name, EGRESS_INIT,
        "the rules come before anything runs"
    );
    assert_egress_init_is_narrow(&inits[0]);

    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", PROXY_SIDECAR]);
    assert_agent_waits_for_the_proxy(&spec.containers[0]);
    assert_proxy_sidecar_is_narrow(&spec.containers[1]);

    // Brokered: the broker has a uid of its own too, and the rules let it out.
    t.broker = Some("x".into());
    let spec = turn_pod_spec(&t).unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", "broker", PROXY_SIDECAR]);
    let broker_uid = spec.containers[1]
        .security_context
        .as_ref()
        .unwrap()
        .run_as_user;
    assert_eq!(broker_uid, Some(BROKER_UID));
    let uids = spec.init_containers.as_ref().unwrap()[0]
        .command
        .as_ref()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(uids, format!("{PROXY_UID} {BROKER_UID}"));

    // Under `open` (no host named): the proxy, to record, and no rules.
    let mut open = turn();
    open.egress_policy = Some(crate::session::record::EgressPolicy::Open);
    let spec = turn_pod_spec(&open).unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", PROXY_SIDECAR]);
    assert_eq!(spec.init_containers.as_ref().unwrap().len(), 1, "no rules");
    assert_agent_waits_for_the_proxy(&spec.containers[0]);
    let env = serde_json::to_string(&spec.containers[1].env).unwrap();
    assert!(env.contains("\"value\":\"open\""), "{env}");

    // Without a policy's rules (a helper's own pod): no rules, no proxy.
    let plain = turn_pod_spec(&turn()).unwrap();
    assert_eq!(plain.init_containers.as_ref().unwrap().len(), 1);
    assert_eq!(plain.containers.len(), 1);
    // An agent under the proxy's uid could pass the rules: refused.
    let mut same = turn();
    same.egress_allow = vec!["h".into()];
    same.egress_policy = Some(crate::session::record::EgressPolicy::Balanced);
    same.user = (PROXY_UID as u32, 1000);
    assert!(turn_pod_spec(&same).is_err());
}

#[test]
fn a_named_network_is_refused_in_one_line_and_a_pod_security_refusal_says_why() {
    let mut t = turn();
    t.network = NetworkPolicy::Named("gw".into());
    let e = turn_pod_spec(&t).unwrap_err().to_string();
    assert!(
        e.contains("not available with the kubernetes backend") && !e.contains('\n'),
        "{e}"
    );
    let e = pod_security_refused(
        "caw-box-x",
        "pods \"caw-box-x\" is forbidden: violates PodSecurity \"baseline:latest\": non-default capabilities (container \"egress\" must not include \"NET_ADMIN\" in securityContext.capabilities.add)",
    );
    assert_eq!(e.exit_code(), 3);
    let text = e.to_string();
    assert!(
        text.contains("NET_ADMIN") && text.contains("PodSecurity"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
}

/// The wrapper waits for the proxy's port when told (and no longer than it must).
#[test]
fn the_marked_entry_waits_for_the_proxy_port() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let started = std::time::Instant::now();
    let out = Command::new("bash")
        .env("CAW_BOX_POD_END", dir.path().join("ended"))
        .env("CAW_BOX_PROXY_WAIT", &port)
        .args(["-c", MARKED_ENTRY, "caw-box-agent", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_failed_egress_init_container_is_told_apart_from_the_seeding_one() {
    let pod = |name: &str, code: i32| -> Pod {
        serde_json::from_value(serde_json::json!({
            "status": {"initContainerStatuses": [{
                "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code}}
            }]}
        }))
        .unwrap()
    };
    assert!(egress_init_failed(&pod(EGRESS_INIT, 1)));
    assert!(!egress_init_failed(&pod(EGRESS_INIT, 0)));
    assert!(!egress_init_failed(&pod("seed-home", 1)));
}

/// A headless turn's pod says that any caw-box may finish it once its driver is gone
/// (`caw-box wait` adopts it, `caw-box stop` waits for its prompt); a TUI turn's does not.
#[test]
fn a_headless_turn_pod_is_labelled_adoptable_and_a_tui_ones_is_not() {
    let key = crate::labelling::labels::ADOPTABLE;
    let headless = super::seam::turn_pod_labels(&turn());
    assert_eq!(headless.get(key).map(String::as_str), Some("true"));
    let mut tui = turn();
    tui.interactive = Some(None);
    assert_eq!(super::seam::turn_pod_labels(&tui).get(key), None);
}

/// A broker that stands in for hosts (opencode's chatgpt.com): the pod resolves them to its
/// loopback, and its broker may listen on their port 443 (the pod's unprivileged port
/// start lowered); a pod without one gets neither.
#[test]
fn a_pod_whose_broker_stands_in_for_a_host_resolves_it_to_loopback() {
    let plain = turn_pod_spec(&turn()).unwrap();
    assert!(plain.host_aliases.is_none());
    assert!(plain.security_context.unwrap().sysctls.is_none());
    let mut t = turn();
    t.broker = Some("0".into());
    t.extra_hosts = vec!["chatgpt.com:127.0.0.1".into()];
    let spec = turn_pod_spec(&t).unwrap();
    let aliases = spec.host_aliases.unwrap();
    assert_eq!(aliases.len(), 1);
    assert_eq!(aliases[0].ip, "127.0.0.1");
    assert_eq!(
        aliases[0].hostnames.as_deref(),
        Some(&["chatgpt.com".to_string()][..])
    );
    let sysctls = spec.security_context.unwrap().sysctls.unwrap();
    assert_eq!(sysctls[0].name, "net.ipv4.ip_unprivileged_port_start");
    assert_eq!(sysctls[0].value, "0");
}

/// The broker sidecar's command (run by the host's node here, as in the pod): it takes its
/// keys on stdin, listens on loopback only, and exits 0 once the end marker appears.
#[test]
fn the_broker_sidecar_listens_on_loopback_and_exits_on_the_end_marker() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("agent-ended");
    let command =
        super::sidecars::broker_command(crate::session::BROKER_LOADER, &marker.to_string_lossy());
    let port = 20000 + (std::process::id() % 20000) as u16;
    let line = serde_json::json!({
        "script": crate::session::BROKER_SCRIPT,
        "config": {"port": port, "host": super::sidecars::LOOPBACK,
                   "upstream": "http://127.0.0.1:9", "keys": {"p": "real"}},
    });
    let mut child = std::process::Command::new(&command[0])
        .args(&command[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{line}").unwrap();
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "caw-box-broker ready");
    let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!("0100007F:{port:04X}");
    assert!(
        listening.lines().any(|l| l.contains(&local)),
        "not on 127.0.0.1:{port}"
    );
    let any = format!("00000000:{port:04X}");
    assert!(!listening.lines().any(|l| l.contains(&any)), "on 0.0.0.0");
    // Still there without the marker; gone with it.
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited without the marker"
    );
    std::fs::write(&marker, b"").unwrap();
    let code = (0..50).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        child.try_wait().unwrap().map(|s| s.code())
    });
    if code.is_none() {
        let _ = child.kill();
    }
    drop(stdin);
    assert_eq!(code, Some(Some(0)), "did not exit on the end marker");
}

/// The broker beside the agent is reached on the pod's loopback, where it alone listens
/// (known before the pod is made), and is named in messages as the pod's container.
#[test]
fn the_broker_beside_the_agent_is_on_the_pods_loopback() {
    let plan = crate::backend::BrokerPlan {
        name: "caw-box-x".into(),
        turn: "caw-box-x".into(),
        program: "p".into(),
        image: "img".into(),
        user: (1000, 1000),
        labels: HashMap::new(),
        network: NetworkPolicy::Default,
        egress: None,
        shared: false,
        beside: "caw-box-x".into(),
    };
    let route = super::broker_route(&plan);
    assert_eq!(route.host, "127.0.0.1");
    assert_eq!(route.listen.as_deref(), Some("127.0.0.1"));
    assert_eq!(route.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(route.agent_network, None);
    assert_eq!(route.shown, "caw-box-x/broker");
}

/// The cluster's settings reach every container of every pod, init containers and sidecars
/// too (a node that may not pull has to run all of them from what it has), and its host
/// aliases join those the turn asked for.
#[test]
fn a_clusters_pull_policy_and_host_aliases_reach_every_container_of_a_pod() {
    let mut t = turn();
    t.broker = Some("0".into());
    t.extra_hosts = vec!["chatgpt.com:127.0.0.1".into()];
    t.egress_allow = vec!["*.example.com".into()];
    t.egress_policy = Some(crate::session::record::EgressPolicy::Locked);
    let mut spec = turn_pod_spec(&t).unwrap();
    let cluster = crate::backend::ClusterSettings {
        image_pull_policy: Some("Never".into()),
        host_aliases: vec!["gateway.lab:10.0.0.2".into()],
        ..Default::default()
    };
    super::spec::for_cluster(&mut spec, &cluster);
    let every = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let policies: Vec<_> = every.map(|c| c.image_pull_policy.as_deref()).collect();
    assert!(policies.len() > 2, "{policies:?}");
    assert!(policies.iter().all(|p| *p == Some("Never")), "{policies:?}");
    let ips: Vec<_> = spec
        .host_aliases
        .unwrap()
        .into_iter()
        .map(|a| a.ip)
        .collect();
    assert_eq!(ips, ["127.0.0.1", "10.0.0.2"]);

    let mut plain = turn_pod_spec(&turn()).unwrap();
    super::spec::for_cluster(&mut plain, &Default::default());
    assert_eq!(
        plain.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    assert!(plain.host_aliases.is_none());
}
