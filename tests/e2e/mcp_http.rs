//! `caw-box mcp --http` under load and hostile clients, and its stop (issue 51): the real
//! binary, the official MCP Python SDK as the client (tests/mcp/http_server.py holds the
//! checks). A token file open to others is refused at once; then one server takes a wrong
//! and a lower-case bearer, a rebinding Host, 20 MiB bodies, 300 connections stalled
//! mid-head beside a real client's first call (within 3 s), 100 parallel calls (its peak
//! thread count read from /proc), and SIGTERM with a codex turn running (held by the stub)
//! and a `wait` on it in flight: the wait is answered, the server exits 0 within 10 s, the
//! turn goes on and a new server gives its outcome; a stdio server stops on SIGTERM too.
//!
//! Cost: one rig, one codex turn, two HTTP servers and a stdio one; about 30 s, most of it
//! the turn and the stalled connections' 10 s head deadline.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn mcp_http_holds_under_load_and_hostile_clients_and_stops_gracefully() {
    let python = crate::mcp::mcp_python();
    let rig = Rig::new("mcp-http");
    let token = uuid::Uuid::new_v4().simple().to_string();
    let token_file = rig.data_dir.path().join("mcp-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();

    check("a token file readable by others: exit 2 at once, one line naming it and `chmod 600`");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let started = Instant::now();
    let refused = {
        let mut cmd = rig.caw();
        cmd.args(["mcp", "--http", "127.0.0.1:0", "--token-file"])
            .arg(&token_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        wait_with_deadline(cmd.spawn().unwrap(), Duration::from_secs(30))
    };
    let took = started.elapsed();
    let stderr = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&token_file.display().to_string()) && stderr.contains("chmod 600"),
        "{stderr}"
    );
    assert!(!stderr.contains(&token), "the token in an error: {stderr}");

    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd: Command = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/http_server.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint(), TEST_KEY, &rig.stub])
        .arg(&token_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let out = wait_with_deadline(cmd.spawn().unwrap(), Duration::from_secs(420));
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success(),
        "the MCP client failed after {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        started.elapsed()
    );
    assert!(
        stdout.contains("mcp-http checks passed"),
        "{stdout}\n{stderr}"
    );
    #[allow(clippy::print_stderr)] // the test's own captured output: what the client checked
    {
        eprintln!("{stdout}");
    }
}
