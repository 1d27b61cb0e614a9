//! A stronger box on demand (`--runtime`, issue 27): turns whose container runs on gVisor
//! (`runsc`, which `scripts/rig.sh up` registers with the daemon). Per provider, a first
//! turn, a headless resume and a TUI turn there, brokered (a collected key): the
//! conversation goes on across them, and the agent's container has gVisor's kernel (its
//! kernel log, read in the container and by the agent through the stub model), while the
//! broker stays on the daemon's default runtime. codex also holds `--allow-host` there. A
//! runtime the daemon does not have is exit 3, one line, before anything is created.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::broker::collect_key;
use crate::common::*;
use crate::interactive::{assert_terminal_intact, Tmux};

/// A runtime no daemon has.
const NO_SUCH: &str = "caw-box-no-such-runtime";

/// A model codex's TUI asks no upgrade question about (see interactive.rs); it offers no
/// shell tool, so headless turns keep `CODEX`'s.
const CODEX_TUI_MODEL: &str = "gpt-6-sol";

/// The OCI runtime Docker reports for a container (`runc` is the daemon's default).
fn runtime_of(rig: &Rig, container: &str) -> Option<String> {
    rig.rt
        .block_on(rig.docker.inspect_container(container, None))
        .unwrap()
        .host_config
        .and_then(|h| h.runtime)
}

/// The running `container` is on gVisor: Docker ran it with runsc, and the kernel log seen
/// inside it is gVisor's own ("Starting gVisor..."; the host's kernel log is not).
fn assert_on_gvisor(rig: &Rig, container: &str) {
    assert_eq!(
        runtime_of(rig, container).as_deref(),
        Some("runsc"),
        "{container}"
    );
    let kernel = rig.exec(container, &["dmesg"]);
    assert!(
        kernel.contains("Starting gVisor"),
        "{container}: not gVisor's kernel log:\n{kernel}"
    );
}

/// Runs the turn `cmd` (its prompt holds on `HOLD:<hold>`); while the stub holds it, its
/// container is checked to be on gVisor. The turn's JSON result.
fn held_on_gvisor(rig: &Rig, mut cmd: Command, hold: &str) -> Value {
    cmd.args(["-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    rig.wait_held(hold);
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    assert_on_gvisor(rig, &container);
    rig.stub_release(hold);
    let out = wait_with_deadline(child, Duration::from_secs(180));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    serde_json::from_str(stdout_of(&out).trim()).unwrap()
}

/// `cmd` with `--runtime` naming one the daemon lacks: exit 3, one line naming it, and no
/// container or volume of the test made (those listed before stay as they were).
fn assert_refused_unknown(rig: &Rig, cmd: Command) {
    let sorted = |mut names: Vec<String>| {
        names.sort();
        names
    };
    let (containers, volumes) = (sorted(rig.caw_containers()), sorted(rig.caw_volumes()));
    let out = run(cmd);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(
        stderr.starts_with("caw-box: error: --runtime caw-box-no-such-runtime: ")
            && stderr.contains("no runtime 'caw-box-no-such-runtime'")
            && stderr.contains("runsc"),
        "{stderr}"
    );
    assert_eq!(
        sorted(rig.caw_containers()),
        containers,
        "a container was made"
    );
    assert_eq!(sorted(rig.caw_volumes()), volumes, "a volume was made");
}

/// caw-box's own containers beside the running turn `turn` (its credential broker, and
/// under `--allow-host` its egress proxy) are on the daemon's default runtime, not the
/// agent's: they run caw-box's code, never the agent's (docs/walls.md, "A stronger box").
fn assert_helpers_on_default_runtime(rig: &Rig, turn: &str) {
    let helpers: Vec<String> = rig
        .caw_containers()
        .into_iter()
        .map(|n| n.trim_start_matches('/').to_string())
        .filter(|n| n != turn)
        .collect();
    assert!(
        helpers.iter().any(|n| n.contains("broker-")),
        "no broker beside {turn}: {helpers:?}"
    );
    for h in helpers {
        // Docker's default runtime: not gVisor.
        assert_eq!(runtime_of(rig, &h).as_deref(), Some("runc"), "{h}");
    }
}

/// codex on gVisor: an unknown runtime refused; a brokered first turn within
/// `--allow-host`, a headless resume (the runtime remembered) whose agent reads gVisor's
/// kernel log and finds only the allowed host reachable, a resume naming an unknown
/// runtime refused, and a TUI turn that recalls the first turn.
#[test]
fn codex_on_gvisor_runs_resumes_and_opens_its_tui_brokered_within_allow_host() {
    let rig = Rig::new("runsc-codex");
    check("run with an unknown runtime: exit 3, one line, nothing created");
    assert_refused_unknown(&rig, rig.run_cmd(CODEX, "hello", &["--runtime", NO_SUCH]));
    assert!(rig.caw_volumes().is_empty() && rig.caw_containers().is_empty());

    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let other = rig.start_other_server();
    let allow = format!("{other}:8080");
    let name = format!("n-{}", rig.run_id);

    check("run on runsc, brokered, within --allow-host: the container is on gVisor");
    let cmd = rig.run_cmd_stored_key(
        CODEX,
        "HOLD:first REMEMBER:owl",
        &[
            "--runtime",
            "runsc",
            "--allow-host",
            &allow,
            "--name",
            &name,
        ],
    );
    let first = held_on_gvisor(&rig, cmd, "first");
    assert_eq!(first["result"], "Noted: owl.", "{first}");

    check("a headless resume: the agent reads gVisor's kernel log; only the allowed host");
    // (Node's HTTP client through the proxy, not bash's /dev/tcp with `head`: on gVisor that
    // read once failed with EAGAIN before the proxy's answer came.)
    let probe = format!(
        "RUN:dmesg | grep -q 'Starting gVisor' && echo kernel-gvisor; for h in {stub} {other}; do node -e 'const h = process.argv[1]; require(\"http\").get({{host: new URL(process.env.HTTPS_PROXY).hostname, port: 3128, path: \"http://\" + h + \":8080/_stub/health\"}}, r => {{ console.log(h + \" HTTP/1.1 \" + r.statusCode); r.resume(); }}).on(\"error\", e => console.log(h + \" \" + e.code))' $h; done; timeout 3 bash -c 'exec 3<>/dev/tcp/{stub}/8080' 2>/dev/null && echo direct-open || echo direct-blocked",
        stub = rig.stub
    );
    let mut c = rig.caw();
    c.args(["resume", &name, &probe]);
    let (code, json, stderr) = rig.json_turn(c);
    assert_eq!(code, 0, "{json}\n{stderr}");
    let answer = json["result"].as_str().unwrap();
    assert!(answer.contains("kernel-gvisor"), "not gVisor: {answer}");
    assert!(
        answer.contains(&format!("{} HTTP/1.1 403", rig.stub)),
        "the stub was not refused: {answer}"
    );
    assert!(
        answer.contains(&format!("{other} HTTP/1.1 200")),
        "the allowed host did not answer: {answer}"
    );
    assert!(answer.contains("direct-blocked"), "{answer}");

    check("a resume with an unknown runtime: exit 3, one line, nothing created");
    let mut c = rig.caw();
    c.args(["resume", &name, "--runtime", NO_SUCH, "hello"]);
    assert_refused_unknown(&rig, c);

    check("a TUI turn on runsc recalls the first turn; the broker on the default runtime");
    let mut tmux = Tmux::new(&rig);
    tmux.start(&rig, &["resume", &name, "--model", CODEX_TUI_MODEL]);
    tmux.wait_for("Noted: owl.", "codex's TUI did not show the history");
    let container = rig.wait_for_running_turn(None, Duration::from_secs(30));
    assert_on_gvisor(&rig, &container);
    assert_helpers_on_default_runtime(&rig, &container);
    tmux.type_line("RECALL");
    tmux.wait_for("You told me to remember owl.", "the TUI did not recall");
    crate::interactive::quit_codex_tui(&tmux);
    assert_terminal_intact(&tmux);
    // Every model request came through the broker with the real key.
    assert!(rig.stub_requests().iter().all(|r| r["status"] != 401));
    rig.cleanup();
}

/// claude on gVisor: a brokered first turn, a TUI resume that shows it and is told
/// something new, and a headless resume that recalls what the TUI was told; each turn's
/// container on gVisor.
#[test]
fn claude_on_gvisor_runs_then_resumes_in_its_tui_and_headless() {
    let rig = Rig::new("runsc-claude");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CLAUDE, home.path());
    let name = format!("n-{}", rig.run_id);

    check("run on runsc, brokered: the container is on gVisor");
    let cmd = rig.run_cmd_stored_key(
        CLAUDE,
        "HOLD:first REMEMBER:kiwi",
        &["--runtime", "runsc", "--name", &name],
    );
    let first = held_on_gvisor(&rig, cmd, "first");
    assert_eq!(first["result"], "Noted: kiwi.", "{first}");

    check("a TUI resume on runsc shows the history and answers");
    let mut tmux = Tmux::new(&rig);
    tmux.start(&rig, &["resume", &name]);
    tmux.wait_for("Noted: kiwi.", "claude's TUI did not show the history");
    let container = rig.wait_for_running_turn(None, Duration::from_secs(30));
    assert_on_gvisor(&rig, &container);
    assert_helpers_on_default_runtime(&rig, &container);
    tmux.type_line("REMEMBER:fig");
    tmux.wait_for("Noted: fig.", "claude's TUI did not answer");
    tmux.keys(&["C-c"]);
    tmux.wait_for(
        "Press Ctrl-C again to exit",
        "claude did not get the Ctrl-C",
    );
    tmux.keys(&["C-c"]);
    assert_terminal_intact(&tmux);

    check("a headless resume on runsc recalls what the TUI was told");
    let mut c = rig.caw();
    c.args(["resume", &name, "HOLD:last RECALL"]);
    let last = held_on_gvisor(&rig, c, "last");
    assert_eq!(last["result"], "You told me to remember fig.", "{last}");
    assert_eq!(last["turn"], 3, "{last}");
    assert!(rig.stub_requests().iter().all(|r| r["status"] != 401));
    rig.cleanup();
}
