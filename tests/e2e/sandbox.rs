//! Sandbox and workspace (issue 6): copy-mode workspaces. The host tree is never touched;
//! export and diff show what the agent changed; .gitignored files are not copied.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn tree(dir: &Path) {
    std::fs::write(dir.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(dir.join("keep.txt"), "original\n").unwrap();
    std::fs::write(dir.join("old.txt"), "to be removed\n").unwrap();
    std::fs::write(dir.join("debug.log"), "ignored\n").unwrap();
}

const CHANGE: &str =
    "RUN:echo changed > keep.txt && echo new > new.txt && rm old.txt && ls -a | tr '\\n' ' '";

fn copy_session(rig: &Rig, host: &Path) -> String {
    let ws = host.to_str().unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        CHANGE,
        &["--workspace-mode", "copy", "--workspace", ws],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let listing = json["result"].as_str().unwrap();
    assert!(
        listing.contains("keep.txt") && listing.contains(".gitignore"),
        "{listing}"
    );
    assert!(
        !listing.contains("debug.log"),
        "a .gitignored file was copied: {listing}"
    );
    json["session_id"].as_str().unwrap().to_string()
}

#[test]
fn copy_mode_leaves_the_host_tree_alone_and_exports_and_diffs() {
    let rig = Rig::new("copy");
    let host = tempfile::tempdir().unwrap();
    tree(host.path());
    let id = copy_session(&rig, host.path());

    // The host tree is exactly as it was.
    assert_eq!(
        std::fs::read_to_string(host.path().join("keep.txt")).unwrap(),
        "original\n"
    );
    assert!(host.path().join("old.txt").exists());
    assert!(!host.path().join("new.txt").exists());

    // The change persists in the session's workspace across turns.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RUN:cat new.txt", &[]));
    assert_eq!(code, 0, "{stderr}");
    assert!(json["result"].as_str().unwrap().contains("new"), "{json}");

    let out = rig.caw_run(&["diff", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let diff = stdout_of(&out);
    let mut lines: Vec<&str> = diff.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec!["A new.txt", "D old.txt", "M keep.txt"],
        "{diff}"
    );

    let dest = tempfile::tempdir().unwrap();
    let dest = dest.path().join("out");
    let out = rig.caw_run(&["export", &id, dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(dest.join("keep.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("new.txt")).unwrap(),
        "new\n"
    );
    assert!(!dest.join("old.txt").exists() && !dest.join("debug.log").exists());

    // A non-empty DIR is refused unless --force.
    let out = rig.caw_run(&["export", &id, dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("is not empty"),
        "{}",
        stderr_of(&out)
    );
    let out = rig.caw_run(&["export", &id, dest.to_str().unwrap(), "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    // export/diff of a bind-mode session say why not.
    let (_, json, _) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:bind", &[]));
    let bind_id = json["session_id"].as_str().unwrap();
    let out = rig.caw_run(&["diff", bind_id]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("no copy-mode workspace"),
        "{}",
        stderr_of(&out)
    );

    // The workspace mode is fixed when a session starts.
    let out = run(rig.resume_cmd(CODEX, bind_id, "hi", &["--workspace-mode", "copy"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("fixed when a session starts"),
        "{}",
        stderr_of(&out)
    );

    // rm takes the workspace volume too.
    let out = rig.caw_run(&["rm", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        rig.caw_volumes().iter().all(|v| !v.contains(&id)),
        "{:?}",
        rig.caw_volumes()
    );
}

#[test]
fn copy_mode_diff_of_a_repository_is_a_git_diff() {
    let rig = Rig::new("copy-git");
    let host = tempfile::tempdir().unwrap();
    tree(host.path());
    let git = |args: &[&str]| git(host.path(), args);
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "base"]);
    let id = copy_session(&rig, host.path());
    let out = rig.caw_run(&["diff", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let diff = stdout_of(&out);
    assert!(
        diff.contains(" M keep.txt") && diff.contains(" D old.txt") && diff.contains("?? new.txt"),
        "{diff}"
    );
    assert!(
        diff.contains("-original") && diff.contains("+changed"),
        "{diff}"
    );
    // .git came along, so an export is a repository with the change uncommitted.
    let dest = tempfile::tempdir().unwrap();
    let out = rig.caw_run(&["export", &id, dest.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(dest.path().join(".git/HEAD").exists());
}

/// `cmd`, run as `uid:uid` (with the Docker socket's group, to reach the daemon).
fn as_user(cmd: &Command, uid: u32) -> Command {
    use std::os::unix::fs::MetadataExt;
    // The engine's socket: DOCKER_HOST's (the Podman rig's), else Docker's default.
    let socket = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string());
    let socket_gid = std::fs::metadata(socket).unwrap().gid();
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        &uid.to_string(),
        "--regid",
        &uid.to_string(),
        "--groups",
        &socket_gid.to_string(),
        "--",
    ])
    .arg(cmd.get_program())
    .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        c.current_dir(dir);
    }
    c.stdin(std::process::Stdio::null());
    c
}

#[test]
fn files_the_agent_creates_belong_to_a_non_1000_host_user() {
    use std::os::unix::fs::MetadataExt;
    let rig = Rig::new("uid");
    let uid = 4242;
    let home = tempfile::tempdir().unwrap();
    for dir in [rig.data_dir.path(), rig.workspace.path(), home.path()] {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    }
    let with_home = |mut c: Command| {
        c.env("HOME", home.path());
        c
    };
    let (code, json, stderr) = rig.json_turn(as_user(
        &with_home(rig.run_cmd(CODEX, "REMEMBER:owned", &[])),
        uid,
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();

    let (code, json, stderr) = rig.json_turn(as_user(
        &with_home(rig.resume_cmd(CODEX, &id, "RUN:touch made-by-agent && id -u", &[])),
        uid,
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(json["result"].as_str().unwrap().contains("4242"), "{json}");
    let made = std::fs::metadata(rig.workspace.path().join("made-by-agent")).unwrap();
    assert_eq!((made.uid(), made.gid()), (uid, uid));

    // HOME in the state volume stays writable for the CLI: the conversation goes on.
    let (code, json, stderr) = rig.json_turn(as_user(
        &with_home(rig.resume_cmd(CODEX, &id, "RECALL", &[])),
        uid,
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("remember owned"),
        "{json}"
    );
    assert_eq!(json["turn"], 3);
}

#[test]
fn allow_host_admits_only_listed_hosts_through_the_proxy() {
    let rig = Rig::new("allow");
    let other = rig.start_other_server();
    let allow = format!("{}:8080", rig.stub);

    // The CLI's own model traffic goes through the proxy to the allowed stub.
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:proxied", &["--allow-host", &allow]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    // On the record (a shared proxy's on Docker, the turn's own on Podman): the model's host.
    assert_eq!(json["egress"]["policy"], "balanced", "{json}");
    assert!(
        json["egress"]["allowed"].as_array().is_some_and(|l| l
            .iter()
            .any(|h| h["host"] == rig.stub && h["connections"].as_u64() > Some(0))),
        "{json}"
    );

    rig.assert_only_the_stub_is_reachable(&id, &other);

    // The proxy stays for the next turns (of any session with the same egress); nothing
    // of the session's own is left.
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );
    let networks = rig.rt.block_on(rig.docker.list_networks(Some(
        bollard::query_parameters::ListNetworksOptions {
            filters: Some(std::collections::HashMap::from([(
                "label".to_string(),
                vec![format!("io.caw-box.session={id}")],
            )])),
        },
    )));
    assert!(networks.unwrap().is_empty());

    // --allow-host with --network none (or host) is refused up front: no proxy could reach
    // the allowed hosts (none is refused on its own too: tests/e2e/hardening.rs).
    for network in ["none", "host"] {
        let mut c = rig.caw();
        c.args(["run", "--provider", "codex", "--network", network])
            .args(["--endpoint", &rig.endpoint()])
            .args(["--allow-host", &allow])
            .arg("hi");
        let out = run(c);
        assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains(&format!("--network {network}")),
            "{}",
            stderr_of(&out)
        );
    }
    assert!(rig.caw_containers().is_empty());
}

/// A second turn on a busy `--allow-host` session is refused as busy and leaves the running
/// turn's proxy alone; a killed turn's own egress network (as caw-boxes before shared
/// proxies left) is removed by the next turn, and `rm` removes the session's networks.
#[test]
fn a_busy_allow_host_session_keeps_its_proxy() {
    let rig = Rig::new("allowbusy");
    let allow = format!("{}:8080", rig.stub);
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:first", &["--allow-host", &allow]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let session_networks = || {
        let mut names: Vec<String> = rig
            .rt
            .block_on(rig.docker.list_networks(Some(
                bollard::query_parameters::ListNetworksOptions {
                    filters: Some(std::collections::HashMap::from([(
                        "label".to_string(),
                        vec![format!("io.caw-box.session={id}")],
                    )])),
                },
            )))
            .unwrap()
            .into_iter()
            .filter_map(|n| n.name)
            .collect();
        names.sort();
        names
    };

    let mut slow = rig.resume_cmd(CODEX, &id, "SLEEP:6 REMEMBER:slow", &["-o", "json"]);
    slow.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = slow.spawn().unwrap();
    rig.wait_for_running_turn(Some(&id[..8]), Duration::from_secs(60));
    let out = run(rig.resume_cmd(CODEX, &id, "REMEMBER:second", &[]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("busy"), "{}", stderr_of(&out));
    // The egress network is shared (no session's own), and the proxy too.
    assert!(session_networks().is_empty(), "{:?}", session_networks());
    let out = wait_with_deadline(child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("Noted: slow."),
        "{}",
        stdout_of(&out)
    );
    assert!(session_networks().is_empty());

    // What a killed turn leaves: its egress network. The next turn removes it.
    let leftover = format!("caw-box-{id}-egress-1");
    rig.rt
        .block_on(create_network(
            &rig.docker,
            bollard::models::NetworkCreateRequest {
                name: leftover.clone(),
                internal: Some(true),
                labels: Some(std::collections::HashMap::from([
                    ("io.caw-box.managed".to_string(), "true".to_string()),
                    ("io.caw-box.session".to_string(), id.clone()),
                    ("io.caw-box.role".to_string(), "proxy".to_string()),
                    (TEST_LABEL.to_string(), rig.run_id.clone()),
                ])),
                ..Default::default()
            },
        ))
        .unwrap();
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(session_networks().is_empty(), "{:?}", session_networks());

    // `rm` takes a leftover network with the session.
    rig.rt
        .block_on(create_network(
            &rig.docker,
            bollard::models::NetworkCreateRequest {
                name: leftover,
                internal: Some(true),
                labels: Some(std::collections::HashMap::from([
                    ("io.caw-box.session".to_string(), id.clone()),
                    (TEST_LABEL.to_string(), rig.run_id.clone()),
                ])),
                ..Default::default()
            },
        ))
        .unwrap();
    let mut rm = rig.caw();
    rm.args(["rm", &id]);
    let out = run(rm);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(session_networks().is_empty(), "{:?}", session_networks());
    rig.cleanup();
}

#[test]
fn workspace_mode_none_mounts_nothing() {
    let rig = Rig::new("ws-none");
    std::fs::write(rig.workspace.path().join("host-file"), "x").unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "RUN:ls -A /workspace | wc -l",
        &["--workspace-mode", "none"],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let answer = json["result"].as_str().unwrap();
    assert!(
        answer.trim_end().ends_with('0'),
        "/workspace was not empty: {answer}"
    );
    assert!(!answer.contains("host-file"));
}

/// caw-box run as root (a CI job's container) in a root-owned git checkout, mode 0755 (the
/// images' uid 1000 could not write it): the agent runs as the checkout's owner, root, with
/// the turn's hardening kept; it creates, edits and commits (git in its container), a resume
/// goes on with the conversation, and on the host all it made is root's. claude: the CLI
/// that refuses to skip its permission prompts as root unless told it is in a sandbox. Then
/// a checkout its agent cannot write (the owner's write bit off) is said up front, in one
/// line with what to do, and the turn still reads it (codex).
#[test]
fn as_root_the_agent_writes_and_commits_in_a_root_owned_checkout() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let rig = Rig::new("root-checkout");
    let checkout = tempfile::tempdir().unwrap();
    let dir = checkout.path();
    assert_eq!(
        std::fs::metadata(dir).unwrap().uid(),
        0,
        "e2e tests run as root"
    );
    git(dir, &["init", "-q"]);
    std::fs::write(dir.join("README"), "hello\n").unwrap();
    git(dir, &["add", "README"]);
    git(dir, &["commit", "-qm", "start"]);
    git(dir, &["config", "user.name", "agent"]);
    git(dir, &["config", "user.email", "agent@example.com"]);
    std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755)).unwrap();
    let ws = dir.to_str().unwrap();

    // PID 1 (tini) holds no capability either: the first turn's container handed the new
    // state volume to root itself, with capabilities it dropped before tini started.
    let make = "REMEMBER:rooted RUN:id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; \
                grep -E '^CapBnd' /proc/1/status | sed 's/^/pid1 /'; \
                touch /usr/x 2>/dev/null || echo ro-root; echo one > made.txt && \
                echo more >> README && git add -A && git commit -qm agent-made && echo committed";
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CLAUDE, make, &["--workspace", ws]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    let said = json["result"].as_str().unwrap();
    for line in [
        "Tool said: 0\n",
        "CapEff:\t0000000000000000",
        "pid1 CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "ro-root",
        "committed",
    ] {
        assert!(said.contains(line), "{line:?} in {said:?}");
    }
    let id = json["session_id"].as_str().unwrap().to_string();

    let edit = "RUN:echo two >> made.txt && git commit -qam agent-edit && git log --format=%s | tr '\\n' ' '";
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CLAUDE, &id, edit, &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"]
            .as_str()
            .unwrap()
            .contains("agent-edit agent-made start"),
        "{json}"
    );
    // The resumed CLI sent the first turn's conversation along.
    let resumed: Vec<serde_json::Value> = rig
        .stub_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["body"].to_string().contains("agent-edit"))
        .collect();
    assert!(!resumed.is_empty());
    assert!(resumed
        .iter()
        .all(|r| r["body"].to_string().contains("REMEMBER:rooted")));

    assert_eq!(
        std::fs::read_to_string(dir.join("made.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(git(dir, &["status", "--porcelain"]), "");
    let not_roots: Vec<String> = walk(dir)
        .into_iter()
        .filter(|p| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (m.uid(), m.gid()) != (0, 0)
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(not_roots.is_empty(), "not root's: {not_roots:?}");

    // The owner may not write: said before the turn, which still reads.
    std::fs::set_permissions(dir, PermissionsExt::from_mode(0o555)).unwrap();
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "RUN:cat made.txt", &["--workspace", ws]));
    std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755)).unwrap();
    assert_eq!(code, 0, "{json}\n{stderr}");
    let warning = format!(
        "warning: the agent runs as uid 0:0 and cannot write the workspace {ws} (owner 0:0, \
         mode 555): this turn may only read it; make it writable for its owner (`chmod u+rwx {ws}`)\n"
    );
    assert!(stderr.starts_with(&warning), "{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("one\ntwo"),
        "{json}"
    );
}

/// Every path under `dir`, `dir` included.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.is_symlink() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
