//! `caw-box mcp` (issue 41) driven by the official MCP Python SDK's client over stdio, as an
//! orchestrating agent drives it: the tool list and schemas, a codex sub-agent in copy mode
//! writing a file, `wait` with progress, `result`, `diff`, `apply`, `reply`, `cancel` of a
//! held turn, `n: 3`, `fork` of a session into three that each write their own file (their
//! diffs differ, one is applied), refusals as `isError`, and a second server finishing what a
//! killed one started. The checks are in tests/mcp/client.py; codex runs only on the test's internal
//! network against the stub model. One rig and one script run: one server (and the one that
//! replaces it after the kill) for those checks; a second test has codex itself as the
//! orchestrator, through a server of its own in a container.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// The virtualenv's Python with the MCP SDK (made by scripts/mcp-venv.sh, reused).
pub(crate) fn mcp_python() -> String {
    let out = Command::new(repo_root().join("scripts/mcp-venv.sh"))
        .output()
        .expect("run scripts/mcp-venv.sh");
    assert!(
        out.status.success(),
        "scripts/mcp-venv.sh: {}",
        stderr_of(&out)
    );
    stdout_of(&out).trim().to_string()
}

#[test]
fn an_orchestrator_delegates_through_the_mcp_server() {
    let python = mcp_python();
    let rig = Rig::new("mcp");
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("README.md"), "the orchestrator's tree\n").unwrap();
    // A user's own directory (uid 1000), with caw-box run as root here: `apply` writes as
    // its owner.
    for path in [host.path().join("README.md"), host.path().to_path_buf()] {
        std::os::unix::fs::chown(path, Some(1000), Some(1000)).unwrap();
    }
    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/client.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint(), TEST_KEY, &rig.stub])
        .arg(host.path());
    let started = Instant::now();
    let out = wait_with_deadline(
        {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().expect("spawn the MCP client")
        },
        Duration::from_secs(420),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success(),
        "the MCP client failed after {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        started.elapsed()
    );
    assert!(stdout.contains("mcp checks passed"), "{stdout}\n{stderr}");
    #[allow(clippy::print_stderr)] // the test's own captured output: what the client checked
    {
        eprintln!("{stdout}");
    }
    // The host directory got the agent's file by `apply` only, and nothing else of it; and
    // a fork's: its source's plan and its own file.
    assert_eq!(
        std::fs::read_to_string(host.path().join("hello.txt")).unwrap(),
        "hello from the box\n"
    );
    assert_eq!(
        std::fs::read_to_string(host.path().join("plan.txt")).unwrap(),
        "the plan\n"
    );
    use std::os::unix::fs::MetadataExt;
    let applied = std::fs::metadata(host.path().join("hello.txt")).unwrap();
    assert_eq!((applied.uid(), applied.gid()), (1000, 1000));
}

/// A real vendor CLI as the orchestrator: codex, with `caw-box mcp` as its MCP server
/// (Streamable HTTP, a bearer token), the stub model scripting its calls: `start` a codex
/// sub-agent, `wait` for it, read its `result`; the sub-agent's answer comes back into the
/// orchestrator's turn (the orchestrator's CLI sends it to its model: the stub records it).
///
/// The server runs in a container of the test's own on the test's internal network (the
/// stub's image, this caw-box binary mounted), with the Docker socket: the orchestrating
/// agent reaches caw-box only through MCP, as it would on a machine of its own.
#[test]
fn a_codex_orchestrator_delegates_to_a_codex_sub_agent() {
    let rig = Rig::new("mcp-orch");
    let server = format!("mcpsrv-{}", rig.run_id);
    let token = uuid::Uuid::new_v4().simple().to_string();
    let token_file = rig.data_dir.path().join("mcp-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    // Readable by its owner only, or the server refuses it (as ssh a private key).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let label = format!("{TEST_LABEL}={}", rig.run_id);
    let caw = env!("CARGO_BIN_EXE_caw-box");
    let out = Command::new("docker")
        .args(["run", "-d", "--name", &server, "--label", &label])
        .args(["--label", "io.caw-box.test=e2e", "--network", &rig.network])
        .args(["--user", "0", "--entrypoint", "/usr/local/bin/caw-box"])
        .args(["-v", "/var/run/docker.sock:/var/run/docker.sock"])
        .args(["-v", &format!("{caw}:/usr/local/bin/caw-box:ro")])
        .args(["-v", &format!("{}:/token:ro", token_file.display())])
        .args(["-e", "CAW_BOX_DATA_DIR=/tmp/caw-box"])
        .args(["-e", &format!("CAW_BOX_LABELS={label}")])
        .args(["-e", "CAW_BOX_CONFIG=/tmp/no-config.toml"])
        .arg(stub_image())
        .args(["mcp", "--http", "0.0.0.0:8765", "--token-file", "/token"])
        .args(["--network", &rig.network, "--endpoint", &rig.endpoint()])
        .args(["--model", "gpt-5.5", "--workspace-mode", "none"])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logs = Command::new("docker")
            .args(["logs", &server])
            .output()
            .unwrap();
        if stderr_of(&logs).contains("serving MCP") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the MCP server did not start: {}{}",
            stdout_of(&logs),
            stderr_of(&logs)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let sub = format!("sub-{}", &rig.run_id[rig.run_id.len() - 8..]);
    let mcp = format!("caw=http://{server}:8765/mcp");
    let header = format!("caw:Authorization=Bearer {token}");
    let flags = ["--mcp", &mcp, "--mcp-header", &header];
    let start = format!(
        r#"CALL:start {{"provider": "codex", "prompt": "REMEMBER:zebra", "name": "{sub}"}}"#
    );
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, &start, &flags));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let orchestrator = json["session_id"].as_str().unwrap().to_string();
    check(&format!("{start} -> {}", json["result"]));
    assert!(
        json["result"].as_str().unwrap().contains("running"),
        "start did not answer (a stub image older than CALL's JSON arguments? \
         scripts/stub-image.sh): {json}"
    );
    for call in [
        format!(r#"CALL:wait {{"sessions": ["{sub}"]}}"#),
        format!(r#"CALL:result {{"session": "{sub}"}}"#),
    ] {
        let mut resume = rig.resume_cmd(CODEX, &orchestrator, &call, &[]);
        resume.args(["--mcp-header", &header]);
        let (code, json, stderr) = rig.json_turn(resume);
        assert_eq!(code, 0, "{call}: {json}\n{stderr}");
        check(&format!("{call} -> {}", json["result"]));
    }
    // The sub-agent answered "Noted: zebra." (to its own model: no request of its carries
    // its answer); the orchestrator's CLI sent that answer to its model, as the output of
    // its MCP tool calls, in both turns.
    let carrying: Vec<_> = rig
        .stub_requests()
        .into_iter()
        .filter(|r| r["body"].to_string().contains("Noted: zebra."))
        .collect();
    assert!(
        carrying.len() >= 2,
        "the sub-agent's answer did not come back to the orchestrator: {carrying:#?}"
    );
    assert!(
        carrying
            .iter()
            .all(|r| r["body"].to_string().contains("CALL:")),
        "{carrying:#?}"
    );
}

/// `diff`, `apply`, `result` and `events` exact and bounded (issue 51), through the official
/// MCP Python SDK (tests/mcp/diff_client.py): a codex sub-agent in copy mode writes a file
/// that is not UTF-8, a binary file and `é b/x.txt` and changes an existing one; the text
/// `diff` returns is `caw-box diff --patch`'s bytes and applies (`git apply --binary`) to a
/// fresh copy of the directory as the agent's files, byte for byte; `apply` writes the same;
/// `files_changed` names those paths; a small `max_bytes` cuts where a file begins; `events`
/// pages with `limit: 1`. Its cost: one stub and one codex turn, and a helper container per
/// patch made (about ten).
#[test]
fn mcp_diff_is_what_apply_applies_byte_for_byte() {
    let python = mcp_python();
    let rig = Rig::new("mcp-diff");
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("keep.txt"), "original\n").unwrap();
    for path in [host.path().join("keep.txt"), host.path().to_path_buf()] {
        std::os::unix::fs::chown(path, Some(1000), Some(1000)).unwrap();
    }
    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/diff_client.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint(), TEST_KEY])
        .arg(host.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = wait_with_deadline(
        cmd.spawn().expect("spawn the MCP client"),
        Duration::from_secs(300),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("mcp diff checks passed"),
        "the MCP client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    #[allow(clippy::print_stderr)] // the test's own captured output: what the client checked
    {
        eprintln!("{stdout}");
    }
    // `apply` wrote the agent's bytes into the directory, as its owner.
    use std::os::unix::fs::MetadataExt;
    let latin = host.path().join("latin1.txt");
    assert_eq!(
        std::fs::read(&latin).unwrap(),
        b"\xff\xfe latin-1 caf\xe9\n"
    );
    assert_eq!(
        std::fs::read(host.path().join("\u{e9} b/x.txt")).unwrap(),
        b"x\n"
    );
    assert_eq!(std::fs::metadata(&latin).unwrap().uid(), 1000);
}

/// Issue 51: an orchestrating model that reads untrusted text must not be stronger than the
/// person who started its server. A hostile orchestrator (the official Python SDK's client,
/// tests/mcp/walls.py) against `caw-box mcp --allow-host @provider --allow-host OTHER`: another
/// host, a workspace outside the root (an absolute path, the root's parent, a symlink inside
/// the root that points out), `@/etc/hostname` and a symlinked secret as a prompt file, bind
/// mode, a warm container, and a repository whose `.caw-box.toml` asks for another image are
/// each `forbidden`, with nothing made; a narrower call runs, and in its box the host the
/// server allows but the call dropped is refused by the proxy (the same call keeping it
/// reaches it). A session a person started with `caw-box run` is `not_found` to every tool
/// (`fork` too, making nothing) and still there after; a server of another scope neither
/// lists, removes nor forks the first one's; a `--runtime runsc` server refuses runc and the
/// default.
#[test]
fn a_hostile_orchestrator_cannot_widen_the_servers_walls() {
    let python = mcp_python();
    let rig = Rig::new("mcp-walls");
    let other = rig.start_other_server();
    // OUTSIDE/{secret.txt, inner/, root/{repo/, evil-repo/.caw-box.toml, prompt.md, out -> OUTSIDE}}
    let outside = tempfile::tempdir().unwrap();
    let root = outside.path().join("root");
    std::fs::create_dir_all(root.join("repo")).unwrap();
    std::fs::create_dir_all(root.join("evil-repo")).unwrap();
    std::fs::create_dir_all(outside.path().join("inner")).unwrap();
    std::fs::write(outside.path().join("secret.txt"), "the-secret\n").unwrap();
    std::fs::write(root.join("prompt.md"), "You review code.\n").unwrap();
    std::fs::write(
        root.join("evil-repo/.caw-box.toml"),
        "image = \"evil/image:latest\"\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
    // A person's own session, started on the command line: no server may touch it.
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:mine", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let person = json["session_id"].as_str().unwrap().to_string();

    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/walls.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint(), TEST_KEY, &other])
        .arg(&root)
        .arg(outside.path())
        .arg(&person);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = Instant::now();
    let out = wait_with_deadline(
        cmd.spawn().expect("spawn walls.py"),
        Duration::from_secs(420),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("walls checks passed"),
        "walls.py failed after {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        started.elapsed()
    );
    check(&stdout);
    // The person's session resumes as it was: its conversation intact.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &person, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(json["result"].as_str().unwrap().contains("mine"), "{json}");
}
