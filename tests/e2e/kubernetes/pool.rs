//! Pools on the lab (issue 56): a pool of 1 keeps a warm pod with its claims bound under the
//! name of the session it will be; a new session's first turn runs in that pod, which goes
//! after it; the box was primed; the session resumes by its handle from another process and recalls; the pool
//! makes another; `pool stop --all` and `rm` leave nothing.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{caw_k8s, codex_on_the_lab, json_of, release, turn_cmd, wait_held, Lab};
use crate::common::*;

/// The ready boxes of the only pool: their session ids.
fn ready_boxes(lab: &Lab, data: &std::path::Path, workspace: &std::path::Path) -> Vec<String> {
    let mut ls = caw_k8s(data, workspace, lab);
    ls.args(["pool", "ls", "--json"]);
    let out = run(ls);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let pools: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    pools[0]["boxes"]
        .as_array()
        .unwrap_or_else(|| panic!("no pool: {pools}"))
        .iter()
        .filter(|b| b["state"] == "ready")
        .map(|b| b["session_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn kubernetes_a_first_turn_from_a_pool_runs_in_its_ready_pod_and_recalls() {
    let (lab, endpoint, workspace, data) = codex_on_the_lab();
    let (data, workspace) = (data.path(), workspace.path());
    let p = CODEX;
    let model = p.model.unwrap();
    let settings = [
        "--provider",
        "codex",
        "--endpoint",
        endpoint.as_str(),
        "--model",
        model,
    ];
    // A pod's uid and phase, and its pool label ("" each when it is gone).
    let pod_state = |pod: &str| {
        let out = lab.kubectl(&[
            "get",
            "pod",
            pod,
            "-o",
            r"jsonpath={.metadata.uid} {.status.phase} {.metadata.labels.io\.caw-box\.pool-box}",
        ]);
        let text = stdout_of(&out);
        let mut parts = text.split(' ').map(str::to_string);
        let mut next = || parts.next().unwrap_or_default();
        (next(), next(), next())
    };

    check("pool start");
    let mut start = caw_k8s(data, workspace, &lab);
    start.args(["pool", "start", "--size", "1"]).args(settings);
    let out = run(start);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let boxes = ready_boxes(&lab, data, workspace);
    assert_eq!(boxes.len(), 1, "{boxes:?}");
    let id = boxes[0].clone();
    // The box: a running pod under its session's name, shown as the box, its claim bound,
    // made before any run.
    let pod = format!("caw-box-{id}");
    let (uid, phase, shown) = pod_state(&pod);
    assert_eq!(phase, "Running", "no ready pod for box {id}");
    assert_eq!(shown, format!("caw-box-pool-{id}"));
    let claim = lab.kubectl_ok(&["get", "pvc", &pod, "-o", "jsonpath={.status.phase}"]);
    assert_eq!(claim.trim(), "Bound", "the box's claim");
    // Primed, as on Docker: codex's databases made, no thread started.
    let home = lab.kubectl_ok(&[
        "exec",
        &pod,
        "-c",
        "agent",
        "--",
        "ls",
        "-A",
        "/home/agent/.codex",
    ]);
    assert!(
        home.lines().any(|l| l == "state_5.sqlite"),
        "not primed: {home}"
    );
    assert!(
        !home.lines().any(|l| l == "sessions"),
        "a thread in the box: {home}"
    );

    check("a first turn runs in the ready pod");
    let mut first = turn_cmd(p, data, workspace, &lab, &["run"]);
    first
        .args(settings)
        .arg("HOLD:pool-k8s Please REMEMBER:pool-kiwi-7 for later.")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = first.spawn().unwrap();
    wait_held(&endpoint, "pool-k8s");
    // Mid-turn: the box's own pod runs it, claimed (no longer shown as the box).
    let (during, phase, shown) = pod_state(&pod);
    assert_eq!(
        (during.as_str(), phase.as_str(), shown.as_str()),
        (uid.as_str(), "Running", ""),
        "the turn did not run in the box's pod"
    );
    release(&endpoint, "pool-k8s");
    let out = wait_with_deadline(child, Duration::from_secs(180));
    let json = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{json}\n{}", stderr_of(&out));
    assert_eq!(json["status"], "success", "{json}");
    assert_eq!(
        json["session_id"],
        id.as_str(),
        "the run took no box: {json}"
    );
    // The session keeps no pod warm: the box went after its turn, as a cold turn's pod.
    assert_eq!(pod_state(&pod).0, "", "the box's pod stayed after the turn");
    let handle = json["resume_handle"].as_str().unwrap().to_string();

    check("resume by its handle from another process");
    let mut resume = turn_cmd(p, data, workspace, &lab, &["resume", &handle]);
    resume.args(["--model", model]).arg("RECALL");
    let out = run(resume);
    let json = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{json}\n{}", stderr_of(&out));
    assert!(
        json["result"]
            .as_str()
            .unwrap_or("")
            .contains("pool-kiwi-7"),
        "no recall: {json}"
    );

    check("the pool made another");
    let deadline = Instant::now() + Duration::from_secs(90);
    let next = loop {
        let ready = ready_boxes(&lab, data, workspace);
        if let Some(b) = ready.first() {
            break b.clone();
        }
        assert!(Instant::now() < deadline, "no box made after the claim");
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_ne!(next, id);

    check("pool stop --all, rm");
    let mut stop = caw_k8s(data, workspace, &lab);
    stop.args(["pool", "stop", "--all"]);
    let out = run(stop);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(pod_state(&format!("caw-box-{next}")).0, "", "a box stayed");
    lab.rm(data, workspace, &[&id], Duration::from_secs(60));
}
