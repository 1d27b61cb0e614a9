//! `caw-box mcp` (issue 41) driven by the official MCP Python SDK's client over stdio, as an
//! orchestrating agent drives it: the tool list and schemas, a codex sub-agent in copy mode
//! writing a file, `wait` with progress, `result`, `diff`, `apply`, `reply`, `cancel` of a
//! held turn, `n: 3`, refusals as `isError`, and a second server finishing what a killed one
//! started. The checks are in tests/mcp/client.py; codex runs only on the test's internal
//! network against the stub model. One rig and one script run: one server (and the one that
//! replaces it after the kill) for the whole module.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// The virtualenv's Python with the MCP SDK (made by scripts/mcp-venv.sh, reused).
fn mcp_python() -> String {
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
    // The host directory got the agent's file by `apply` only, and nothing else of it.
    assert_eq!(
        std::fs::read_to_string(host.path().join("hello.txt")).unwrap(),
        "hello from the box\n"
    );
}
