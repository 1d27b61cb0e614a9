//! `caw-box --backend kubernetes mcp` (issue 51): the delegation server on the lab, driven
//! by the official MCP Python SDK (tests/mcp/cluster.py): a codex sub-agent as a pod, `start`,
//! `wait` with progress, `result`, `diff`, `apply` into this host's directory, `cancel` of a
//! held turn, and a second server's `wait` on the turn the first one left running.

use std::time::{Duration, Instant};

use super::{caw_lab_env, codex_on_the_lab};
use crate::common::*;

#[test]
fn kubernetes_mcp_serves_every_tool() {
    let python = crate::mcp::mcp_python();
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    // The Python client starts the servers itself (`--backend kubernetes`), in caw-box's
    // environment for the lab: its kubeconfig, a data directory, no user config.
    let caw = caw_lab_env(data.path(), workspace.path(), &lab);
    let mut py = std::process::Command::new(&python);
    for (k, v) in caw.get_envs() {
        match v {
            Some(v) => py.env(k, v),
            None => py.env_remove(k),
        };
    }
    py.current_dir(workspace.path())
        .arg(repo_root().join("tests/mcp/cluster.py"))
        .arg(caw.get_program())
        .args([&endpoint, TEST_KEY])
        .arg(workspace.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = Instant::now();
    let out = wait_with_deadline(
        py.spawn().expect("spawn cluster.py"),
        Duration::from_secs(600),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("cluster checks passed"),
        "cluster.py failed after {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        started.elapsed()
    );
    check(&stdout);
    assert!(lab.caw_objects().is_empty(), "{:?}", lab.caw_objects());
}
