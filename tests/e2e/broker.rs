//! The credential broker (issue 14, API-key mode): with a collected API key, the agent's
//! container holds only a placeholder; a broker container beside it adds the real key. The
//! stub accepts only the real key (`STUB_EXPECT_KEY`), so a turn that succeeds proves the
//! swap; scans inside the running agent container, `docker inspect` of every container of the
//! turn, the state volume after it, and a prompt injection that dumps the CLI's environment
//! and credential files prove that the key never reaches the agent. A broker is shared by
//! the turns on one network with one key (each turn leases its own placeholder) and leaves
//! once no turn leased it for `CAW_BOX_BROKER_IDLE` seconds.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// A caw-box command as a user types it: brokered is the default.
fn brokered(rig: &Rig) -> Command {
    rig.caw()
}

/// `Rig::run_cmd_stored_key`: a turn with the collected key, brokered by default.
fn brokered_run(rig: &Rig, p: P, prompt: &str, extra: &[&str]) -> Command {
    rig.run_cmd_stored_key(p, prompt, extra)
}

/// Every 12-byte piece of the key: none may show anywhere the agent can look.
fn key_pieces() -> Vec<String> {
    (0..=TEST_KEY.len() - 12)
        .map(|i| TEST_KEY[i..i + 12].to_string())
        .collect()
}

/// The test's containers that are not shared brokers (which outlive the turns that used them).
fn all_but_brokers(rig: &Rig) -> Vec<String> {
    rig.caw_containers()
        .into_iter()
        .filter(|n| !n.trim_start_matches('/').starts_with("caw-box-broker-"))
        .collect()
}

fn holds_a_piece(text: &str) -> bool {
    key_pieces().iter().any(|p| text.contains(p.as_str()))
}

/// `caw-box auth collect --provider P` of the key `TEST_KEY` in `p.key_var`.
pub(crate) fn collect_key(rig: &Rig, p: P, home: &std::path::Path) {
    let mut c = brokered(rig);
    c.args(["auth", "collect", "--provider", p.name])
        .env("HOME", home)
        .env(p.key_var, TEST_KEY);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

/// The distinctive part of every placeholder key (`sk-…-cawbox-placeholder-…`, gemini's
/// `AIzaCawBoxPlaceholder…`): the scans' control.
const PLACEHOLDER_MARKS: [&str; 2] = ["cawbox-placeholder", "CawBoxPlaceholder"];

/// Runs `grep -l` for `patterns` (given on the exec's stdin, so no process's command line
/// or environment holds them) in the running `container` as `user`, over every
/// `/proc/*/environ` and `/proc/*/cmdline` and every file under `/` outside /proc and /sys.
/// Returns the files that matched. `proc_only`: only the /proc files.
pub(crate) fn scan(
    container: &str,
    user: &str,
    patterns: &[String],
    proc_only: bool,
) -> Vec<String> {
    scan_with_controls(container, user, patterns, proc_only, &[]).found
}

/// [`scan`], also reporting what shows the scan could find something: `controls` (texts
/// known to be there) and the marker file the whole-filesystem scan plants (common.rs,
/// [`secret_scan`]).
fn scan_with_controls(
    container: &str,
    user: &str,
    patterns: &[String],
    proc_only: bool,
    controls: &[&str],
) -> SecretScan {
    let scope = if proc_only {
        ScanScope::Proc
    } else {
        ScanScope::Everything
    };
    docker_secret_scan(container, user, scope, controls, patterns)
        .unwrap_or_else(|out| panic!("scan as {user} ({:?}): {}", out.status, stderr_of(&out)))
}

/// `docker inspect` of every container of this test that caw-box made, as JSON.
fn inspect_all(rig: &Rig) -> Vec<(String, String)> {
    rig.caw_containers()
        .into_iter()
        .map(|name| {
            let name = name.trim_start_matches('/').to_string();
            let c = rig
                .rt
                .block_on(rig.docker.inspect_container(&name, None))
                .unwrap();
            (name, serde_json::to_string(&c).unwrap())
        })
        .collect()
}

#[test]
fn broker_keeps_collected_api_keys_out_of_every_agent_container() {
    let rig = Rig::new("broker-keys");
    let home = tempfile::tempdir().unwrap();
    for p in ALL {
        collect_key(&rig, p, home.path());
        // The stub holds the turn's answer while the agent's container is searched.
        let hold = format!("scan-{}", p.name);
        let prompt = format!("HOLD:{hold} REMEMBER:brokered");
        let mut cmd = brokered_run(&rig, p, &prompt, &["-o", "json"]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        // Its request came through the broker: the CLI runs, with its runtime files read.
        rig.wait_held(&hold);
        let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
        let placeholder_seen = (0..60).any(|_| {
            let found = scan(
                &container,
                "1000",
                &["placeholder".into(), "Placeholder".into()],
                true,
            );
            if found.iter().any(|f| f.ends_with("/environ")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(250));
            false
        });
        assert!(
            placeholder_seen,
            "{}: no process of the agent holds a placeholder key (the scan reads nothing?)",
            p.name
        );
        for user in ["1000", "0"] {
            let s = scan_with_controls(&container, user, &key_pieces(), false, &PLACEHOLDER_MARKS);
            // Root without capabilities reads neither the agent's private files nor its
            // processes' environment (the scan as 1000 does): its own marker shows it read.
            assert!(
                s.marker_in_file && s.marker_in_environ && (user == "0" || s.control_in_environ()),
                "{}: as {user}, the scan could not have found the key: {s:?}",
                p.name
            );
            assert_eq!(s.found, Vec::<String>::new(), "{}: as {user}", p.name);
        }
        let inspected = inspect_all(&rig);
        assert!(
            inspected.iter().any(|(n, _)| n.contains("-broker-")),
            "{}: no broker container beside the turn: {:?}",
            p.name,
            inspected.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        for (name, json) in &inspected {
            assert!(!holds_a_piece(json), "{}: docker inspect {name}", p.name);
        }

        rig.stub_release(&hold);
        let out = wait_with_deadline(child, Duration::from_secs(180));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            p.name,
            stderr_of(&out)
        );
        let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        assert!(
            json["result"]
                .as_str()
                .unwrap()
                .contains("Noted: brokered."),
            "{}: {json}",
            p.name
        );
        assert!(!holds_a_piece(&stdout_of(&out)) && !holds_a_piece(&stderr_of(&out)));
        let id = json["session_id"].as_str().unwrap();
        // Nothing at rest: not in the state volume; only the shared broker stays.
        let pieces = key_pieces();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(
            volume_files_containing_any(&rig, id, &pieces),
            Vec::<String>::new(),
            "{}",
            p.name
        );
        assert_eq!(all_but_brokers(&rig), Vec::<String>::new(), "{}", p.name);
    }
    // The stub takes only the real key: every model request carried it, none was refused.
    let requests = rig.stub_requests();
    assert!(requests.len() >= 4, "{requests:#?}");
    assert!(
        requests.iter().all(|r| r["status"] != 401),
        "a request reached the stub without the real key: {requests:#?}"
    );
}

#[test]
fn broker_prompt_injection_dumps_no_secret() {
    let rig = Rig::new("broker-inject");
    let home = tempfile::tempdir().unwrap();
    let dump = "RUN:env; cat /run/caw-box/auth/env /run/caw-box/env ~/.claude/.credentials.json ~/.claude.json ~/.codex/auth.json ~/.local/share/opencode/auth.json ~/.gemini/oauth_creds.json ~/.gemini/.env 2>&1; echo dumped";
    for p in ALL {
        collect_key(&rig, p, home.path());
        let mut cmd = brokered_run(&rig, p, dump, &["-o", "stream-json"]);
        cmd.args(["--timeout", "3m"]);
        let out = run(cmd);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            p.name,
            stderr_of(&out)
        );
        let events: Vec<Value> = stdout_of(&out)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let results: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .collect();
        let text = serde_json::to_string(&results).unwrap();
        // The tool ran: its output shows the placeholder in the key's variable.
        assert!(
            text.contains("dumped") && text.contains(&format!("{}=", p.key_var)),
            "{}: the injected command did not run: {events:#?}",
            p.name
        );
        assert!(!holds_a_piece(&stdout_of(&out)), "{}: events", p.name);
        let id = events.last().unwrap()["session_id"].as_str().unwrap();
        for args in [vec!["logs", id], vec!["logs", id, "--raw"]] {
            let mut c = brokered(&rig);
            c.args(&args);
            let logged = run(c);
            assert!(!holds_a_piece(&stdout_of(&logged)), "{}: {args:?}", p.name);
        }
    }
}

#[test]
fn broker_is_the_way_out_under_allow_host() {
    let rig = Rig::new("broker-egress");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let other = rig.start_other_server();
    // The stub (the model) is not allowed: only the broker can reach it.
    let allow = format!("{other}:8080");
    let (code, json, stderr) = rig.json_turn(brokered_run(
        &rig,
        CODEX,
        "REMEMBER:locked",
        &["--allow-host", &allow],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("Noted: locked."),
        "{json}"
    );
    let id = json["session_id"].as_str().unwrap();
    // From the agent: the stub is refused by the proxy and unreachable directly; the
    // allowed host answers. (A bounded direct attempt: codex's shell tool returns what a
    // command printed after 10 s, and a name lookup on an internal network can be slow.)
    let probe = format!(
        "RUN:p=${{HTTPS_PROXY#http://}}; p=${{p%:*}}; for h in {stub} {other}; do exec 3<>/dev/tcp/$p/3128; printf 'GET http://%s:8080/_stub/health HTTP/1.0\\r\\n\\r\\n' $h >&3; echo \"$h $(head -1 <&3 | tr -d '\\r')\"; exec 3<&-; done; timeout 3 bash -c 'exec 3<>/dev/tcp/{stub}/8080' 2>/dev/null && echo direct-open || echo direct-blocked",
        stub = rig.stub
    );
    let mut c = brokered(&rig);
    c.args(["resume", id, &probe]);
    let (code, json, stderr) = rig.json_turn(c);
    assert_eq!(code, 0, "{json}\n{stderr}");
    let answer = json["result"].as_str().unwrap();
    assert!(
        answer.contains(&format!("{} HTTP/1.1 403", rig.stub)),
        "the stub was not refused: {answer}"
    );
    assert!(
        answer.contains(&format!("{other} HTTP/1.1 200")),
        "the allowed host did not answer: {answer}"
    );
    assert!(answer.contains("direct-blocked"), "{answer}");
    assert!(rig.stub_requests().iter().all(|r| r["status"] != 401));
    assert_eq!(all_but_brokers(&rig), Vec::<String>::new());
}

#[test]
fn broker_is_skipped_with_credentials_inject() {
    // Also the scan's control: the same search that finds nothing under the broker finds
    // the injected key in the CLI's environment.
    let rig = Rig::new("broker-optout");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CLAUDE, home.path());
    let mut cmd = brokered_run(
        &rig,
        CLAUDE,
        "HOLD:scan REMEMBER:injected",
        &["--credentials", "inject", "-o", "json"],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    rig.wait_held("scan");
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    let found = (0..40).find_map(|_| {
        let found = scan(&container, "1000", &key_pieces(), true);
        if found.iter().any(|f| f.ends_with("/environ")) {
            return Some(found);
        }
        std::thread::sleep(Duration::from_millis(250));
        None
    });
    assert!(found.is_some(), "the scan did not find the injected key");
    assert!(
        !rig.caw_containers().iter().any(|n| n.contains("-broker-")),
        "a broker runs with --credentials inject"
    );
    rig.stub_release("scan");
    let out = wait_with_deadline(child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("Noted: injected."));
}

#[test]
fn broker_reports_an_unreachable_upstream_as_unreachable() {
    let rig = Rig::new("broker-dead");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let mut c = brokered(&rig);
    c.args(["run", "--provider", "codex", "--network", &rig.network])
        .args(["--endpoint", &format!("http://nowhere-{}:8080", rig.run_id)])
        .args(["--model", "gpt-5.5", "--connect-timeout", "5s", "hi"]);
    let (code, json, stderr) = rig.json_turn(c);
    assert_eq!(code, 3, "{json}\n{stderr}");
    assert_eq!(json["status"], "unreachable", "{json}");
    assert_eq!(all_but_brokers(&rig), Vec::<String>::new());
}

#[test]
fn broker_lives_as_long_as_a_detached_turn() {
    let rig = Rig::new("broker-detach");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let mut c = brokered_run(&rig, CODEX, "HOLD:detached REMEMBER:later", &["--detach"]);
    c.env("CAW_BOX_BROKER_IDLE", "1");
    let out = run(c);
    let returned = std::time::Instant::now();
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let id = stdout_of(&out).trim().to_string();
    // The caw-box that started it has returned; the broker serves the turn meanwhile.
    assert!(
        rig.caw_containers().iter().any(|n| n.contains("-broker-")),
        "{:?}",
        rig.caw_containers()
    );
    // The turn's request waits at the stub, through the broker, for longer than a broker
    // without a lease stays (1 s idle, checked each second, then 2 s to close): it stays.
    rig.wait_held("detached");
    std::thread::sleep(Duration::from_secs(5).saturating_sub(returned.elapsed()));
    assert!(
        rig.caw_containers().iter().any(|n| n.contains("-broker-")),
        "the broker left while the detached turn ran: {:?}",
        rig.caw_containers()
    );
    rig.stub_release("detached");
    let mut c = brokered(&rig);
    c.args(["wait", &id, "-o", "json"]);
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert!(
        json["result"].as_str().unwrap().contains("Noted: later."),
        "{json}"
    );
    // Its lease ended with the turn: idle for a second, the broker leaves.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !rig.caw_containers().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
}

/// The broker a session's turn leased (the test's only one).
fn the_broker(rig: &Rig) -> String {
    let brokers: Vec<String> = rig
        .caw_containers()
        .into_iter()
        .map(|n| n.trim_start_matches('/').to_string())
        .filter(|n| n.starts_with("caw-box-broker-"))
        .collect();
    assert_eq!(brokers.len(), 1, "{brokers:?}");
    brokers[0].clone()
}

#[test]
fn a_shared_broker_serves_the_next_turns_and_leaves_when_idle() {
    let rig = Rig::new("broker-shared");
    let home = tempfile::tempdir().unwrap();
    collect_key(&rig, CODEX, home.path());
    let idle = |mut c: Command| {
        c.env("CAW_BOX_BROKER_IDLE", "4");
        c
    };
    // The first turn starts the broker; the second session's turn leases the same one.
    let (code, json, stderr) = rig.json_turn(idle(brokered_run(
        &rig,
        CODEX,
        "RUN:echo $OPENAI_API_KEY",
        &[],
    )));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let placeholder = json["result"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .find(|w| w.contains("placeholder"))
        .unwrap_or_else(|| panic!("the CLI's key is no placeholder: {json}"))
        .to_string();
    let broker = the_broker(&rig);
    let id_of = |name: &str| rig.exec_inspect_id(name);
    let first = id_of(&broker);
    let (code, json, stderr) =
        rig.json_turn(idle(brokered_run(&rig, CODEX, "REMEMBER:shared", &[])));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(the_broker(&rig), broker);
    assert_eq!(
        id_of(&broker),
        first,
        "the second turn started a broker of its own"
    );

    // A placeholder is worth nothing once its turn ended: from a container on the
    // network, the broker passes it on as it is, and the stub (real key only) refuses it.
    let probe = format!(
        "fetch('http://{broker}:8080/v1/responses',{{method:'POST',headers:{{authorization:'Bearer {placeholder}','content-type':'application/json'}},body:'{{}}'}}).then(r=>console.log('status',r.status)).catch(e=>console.log('error',e.message))"
    );
    let answer = rig.exec(&rig.stub, &["node", "-e", &probe]);
    assert!(answer.contains("status 401"), "{answer}");

    // With no lease, it leaves after its idle time (and is removed); a new turn starts a
    // new one.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !rig.caw_containers().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(rig.caw_containers(), Vec::<String>::new());
    let (code, json, stderr) =
        rig.json_turn(idle(brokered_run(&rig, CODEX, "REMEMBER:again", &[])));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_ne!(id_of(&the_broker(&rig)), first);
    assert!(
        rig.stub_requests()
            .iter()
            .filter(|r| r["status"] == 401)
            .count()
            == 1
    );
}
