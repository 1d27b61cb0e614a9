//! Pools (`caw-box pool`) on Docker: a new session's first turn in a box made before the
//! command ran, which holds no credential, and a pool that makes another after a claim.

use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The placeholder keys' distinctive part (broker.rs).
const PLACEHOLDER: &str = "cawbox-placeholder";

/// `caw-box pool start` for `p` with the flags `Rig::run_cmd` gives a run (a box is made for
/// exactly a run's settings), and `extra`.
fn pool_start_cmd(rig: &Rig, p: P, extra: &[&str]) -> std::process::Command {
    let mut c = rig.caw();
    c.args([
        "pool",
        "start",
        "--provider",
        p.name,
        "--network",
        &rig.network,
    ])
    .args(["--endpoint", &rig.endpoint()]);
    if let Some(m) = p.model {
        c.args(["--model", m]);
    }
    c.args(extra);
    c
}

fn pool_ls(rig: &Rig) -> Value {
    let mut c = rig.caw();
    c.args(["pool", "ls", "--json"]);
    serde_json::from_str(&stdout_of(&run(c))).unwrap()
}

/// The ids of the pool's ready boxes.
fn ready_boxes(rig: &Rig) -> Vec<String> {
    let ls = pool_ls(rig);
    ls[0]["boxes"]
        .as_array()
        .unwrap_or_else(|| panic!("no pool: {ls}"))
        .iter()
        .filter(|b| b["state"] == "ready")
        .map(|b| b["session_id"].as_str().unwrap().to_string())
        .collect()
}

/// A codex pool of 2: its boxes run before any session, hold no key or placeholder; a
/// `run` with the same settings takes one (its session id is the box's, its name is its
/// own), succeeds, and resumes by name from another process, recalling; the pool makes a
/// box in its place; a run with other settings takes none; `pool stop --all` leaves no box,
/// and the claimed session stays.
#[test]
fn a_new_sessions_first_turn_takes_a_ready_box_and_the_pool_makes_another() {
    let rig = Rig::new("pool");
    let p = CODEX;
    let turn = |cmd| {
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{json}\n{stderr}");
        assert_eq!(json["status"], "success", "{json}");
        json
    };

    check("bad input makes nothing");
    let out = run(pool_start_cmd(&rig, p, &["--size", "0"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let out = run(pool_start_cmd(&rig, p, &["a prompt"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("no prompt"), "{}", stderr_of(&out));
    assert!(rig.caw_containers().is_empty(), "bad input made a box");

    check("pool start");
    let out = run(pool_start_cmd(&rig, p, &["--size", "2"]));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let key = stdout_of(&out).trim().to_string();
    assert_eq!(key.len(), 12, "{key}");
    let boxes = ready_boxes(&rig);
    assert_eq!(boxes.len(), 2, "{}", pool_ls(&rig));
    // (Docker's names, with their leading `/`.)
    let containers: Vec<String> = rig
        .caw_containers()
        .iter()
        .map(|c| c.trim_start_matches('/').to_string())
        .collect();
    for id in &boxes {
        assert!(
            containers.contains(&format!("caw-box-pool-{id}")),
            "{containers:?}"
        );
    }

    check("no credential in a ready box");
    let first_box = format!("caw-box-pool-{}", boxes[0]);
    let secrets = [TEST_KEY.to_string(), PLACEHOLDER.to_string()];
    assert_holds_no_secret(&first_box, "1000", &secrets, "a ready box");

    check("a ready codex box is primed: codex's databases made, no thread started");
    let mut ls = std::process::Command::new("docker");
    ls.args(["exec", &first_box, "ls", "-A", "/home/agent/.codex"]);
    let home = stdout_of(&run(ls));
    for made in ["state_5.sqlite", "installation_id"] {
        assert!(home.lines().any(|l| l == made), "{made} not in {home}");
    }
    assert!(
        !home.lines().any(|l| l == "sessions"),
        "a primed box started a thread: {home}"
    );

    check("a first turn takes a ready box");
    let made_before: Vec<String> = boxes
        .iter()
        .map(|id| rig.exec_inspect_id(&format!("caw-box-pool-{id}")))
        .collect();
    let watches: Vec<EventWatch> = made_before.iter().map(|c| rig.watch_events(c)).collect();
    check("a ready codex box's CLI waits for its first turn, started ahead");
    let mut ps = std::process::Command::new("docker");
    ps.args(["exec", &first_box, "ps", "-eo", "args"]);
    let processes = stdout_of(&run(ps));
    assert!(
        processes.contains("codex app-server --listen unix://"),
        "no codex server started ahead: {processes}"
    );
    // (Its first turn: a tool that prints a variable of the turn's own `--env`, which the
    // turn hands the server along with the prompt.)
    let first = turn(rig.run_cmd(
        p,
        "Please REMEMBER:pool-fig-5 for later.\nRUN:echo var=$POOL_VAR",
        &["--name", "pooled", "--env", "POOL_VAR=fig-tree"],
    ));
    assert!(
        first["result"]
            .as_str()
            .unwrap_or_default()
            .contains("var=fig-tree"),
        "the agent's command lacked the turn's --env: {first}"
    );
    let id = first["session_id"].as_str().unwrap().to_string();
    let at = boxes
        .iter()
        .position(|b| *b == id)
        .unwrap_or_else(|| panic!("session {id} took no box of {boxes:?}"));
    // The box's container ran the turn: claimed (renamed to the session's idle name), taken
    // (to the turn's name), the turn run in it by exec; then it went (renamed aside and
    // removed), as a cold turn's container does.
    assert!(!made_before[at].is_empty());
    assert_eq!(watches[at].count("rename"), 3);
    assert!(
        watches[at].count("exec_start") >= 1,
        "the turn did not run in the box made before it"
    );
    let names = rig.caw_containers();
    assert!(
        !names.iter().any(|n| n.contains(id.as_str())),
        "the claimed box stayed after the turn: {names:?}"
    );
    // The thread was the box's server's (codex notes an app-server's thread as `vscode`,
    // `codex exec`'s as `exec`), and its file holds no key.
    let mut meta = std::process::Command::new("docker");
    meta.args(["run", "--rm", "--network", "none", "--user", "0"])
        .args(["--label", &format!("{TEST_LABEL}={}", rig.run_id)])
        .args(["-v", &format!("caw-box-{id}:/h:ro"), "--entrypoint", "bash"])
        .args(["caw-box/codex:latest", "-c"])
        .arg(format!(
            "head -qn1 /h/.codex/sessions/*/*/*/rollout-*.jsonl; grep -rlF '{TEST_KEY}' /h || true"
        ));
    let meta = stdout_of(&run(meta));
    assert!(
        meta.contains("\"source\":\"vscode\"") && !meta.contains("\"source\":\"exec\""),
        "the first turn did not run in the server started ahead: {meta}"
    );
    assert!(!meta.contains("/h/"), "a file holds the key: {meta}");
    let mut ls = rig.caw();
    ls.args(["ls", "--json"]);
    let rows: Value = serde_json::from_str(&stdout_of(&run(ls))).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no row of {id}: {rows}"));
    assert_eq!(row["name"], "pooled", "{row}");
    assert!(
        !rows.as_array().unwrap().iter().any(|r| boxes
            .iter()
            .any(|b| *b != id && r["session_id"] == b.as_str())),
        "an unclaimed box is listed as a session: {rows}"
    );

    check("resume by name from another process recalls");
    let second = turn(rig.resume_cmd(p, "pooled", "RECALL", &[]));
    assert_eq!(second["session_id"], id.as_str());
    assert!(
        second["result"].as_str().unwrap().contains("pool-fig-5"),
        "no recall after a pooled first turn: {second}"
    );

    check("a claimed session forks at its first turn and exports");
    let mut fork = rig.caw();
    fork.args(["fork", &id, "--at", "1", "-o", "json"])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .arg("RECALL");
    let out = run(fork);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let forked: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let fork = &forked["sessions"][0];
    assert_eq!(fork["forked_from"]["session"], id.as_str(), "{forked}");
    let answer = fork["result"]["result"].as_str().unwrap_or_default();
    assert!(
        answer.contains("pool-fig-5"),
        "the fork does not recall: {forked}"
    );
    let archive = rig.workspace.path().join("pooled.tar.gz");
    let mut export = rig.caw();
    export.args(["session", "export", &id]).arg(&archive);
    let out = run(export);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(std::fs::metadata(&archive).unwrap().len() > 0);
    std::fs::remove_file(&archive).unwrap();

    check("the pool makes a box in its place");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = ready_boxes(&rig);
        if now.len() == 2 && !now.contains(&id) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no box in the claimed one's place: {}",
            pool_ls(&rig)
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    check("other settings take no box");
    let ready = ready_boxes(&rig);
    let other = turn(rig.run_cmd(p, "Say hello.", &["--memory", "700m"]));
    let other_id = other["session_id"].as_str().unwrap();
    assert!(!ready.iter().any(|b| b == other_id), "{other}");
    assert_eq!(ready_boxes(&rig), ready);

    check("pool stop --all");
    let mut stop = rig.caw();
    stop.args(["pool", "stop", "--all"]);
    let out = run(stop);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let left: Vec<String> = rig
        .caw_containers()
        .into_iter()
        .filter(|c| c.contains("pool"))
        .collect();
    assert!(left.is_empty(), "boxes stayed: {left:?}");
    let volumes = rig.caw_volumes();
    for b in &ready {
        assert!(
            !volumes.iter().any(|v| v.contains(b.as_str())),
            "a box's volume stayed: {volumes:?}"
        );
    }
    let listed = pool_ls(&rig);
    assert_eq!(listed, serde_json::json!([]), "{listed}");
    // The claimed session is its own: it stays, and resumes.
    let third = turn(rig.resume_cmd(p, &id, "RECALL", &[]));
    assert!(third["result"].as_str().unwrap().contains("pool-fig-5"));

    check("rm of the claimed session leaves none of it");
    let mut rm = rig.caw();
    rm.args(["rm", "pooled"]);
    let out = run(rm);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let volumes = rig.caw_volumes();
    assert!(
        !volumes.iter().any(|v| v.contains(id.as_str())),
        "the claimed session's volumes stayed: {volumes:?}"
    );
}

/// For `p`: with a pool of 2, a first turn takes a ready box (made before the command ran:
/// its container's renames say it ran the turn), succeeds, and resumes by its handle alone
/// from another process, recalling; the pool makes a box in its place.
fn first_turn_from_a_pool_recalls(p: P) {
    let rig = Rig::new(&format!("pool-{}", p.name));
    let out = run(pool_start_cmd(&rig, p, &["--size", "2"]));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let boxes = ready_boxes(&rig);
    assert_eq!(boxes.len(), 2, "{}", pool_ls(&rig));
    let made: Vec<String> = boxes
        .iter()
        .map(|id| rig.exec_inspect_id(&format!("caw-box-pool-{id}")))
        .collect();
    let watches: Vec<EventWatch> = made.iter().map(|c| rig.watch_events(c)).collect();
    let (code, first, stderr) =
        rig.json_turn(rig.run_cmd(p, "Please REMEMBER:pool-plum-8 for later.", &[]));
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(first["status"], "success", "{first}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let at = boxes
        .iter()
        .position(|b| *b == id)
        .unwrap_or_else(|| panic!("{}: session {id} took no box of {boxes:?}", p.name));
    assert!(
        watches[at].count("exec_start") >= 1,
        "{}: the turn did not run in the box",
        p.name
    );
    let mut handle = rig.caw();
    handle.args(["handle", &id]);
    let handle = stdout_of(&run(handle)).trim().to_string();
    let (code, second, stderr) = rig.json_turn(rig.resume_cmd(p, &handle, "RECALL", &[]));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"].as_str().unwrap().contains("pool-plum-8"),
        "{}: no recall: {second}",
        p.name
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready_boxes(&rig).len() < 2 {
        assert!(Instant::now() < deadline, "{}", pool_ls(&rig));
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut stop = rig.caw();
    stop.args(["pool", "stop", "--all"]);
    assert!(run(stop).status.success());
}

#[test]
fn claudes_first_turn_from_a_pool_recalls() {
    first_turn_from_a_pool_recalls(CLAUDE);
}

#[test]
fn opencodes_first_turn_from_a_pool_recalls() {
    first_turn_from_a_pool_recalls(OPENCODE);
}

#[test]
fn geminis_first_turn_from_a_pool_recalls() {
    first_turn_from_a_pool_recalls(GEMINI);
}

/// A pool's boxes of an image that changed since are replaced before the next claim: the
/// run takes none of them (a cold start), and the refill puts boxes of the new image in
/// their place. The image is this test's own tag, so no other test sees it change.
#[test]
fn a_new_image_replaces_the_pools_boxes_before_the_next_claim() {
    let rig = Rig::new("pool-image");
    let p = CODEX;
    let tag = format!("caw-box-test/pool-codex:{}", rig.run_id);
    let build = |label: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Dockerfile"),
            format!("FROM caw-box/codex:latest\nLABEL io.caw-box-test.pool={label}\n"),
        )
        .unwrap();
        let mut c = std::process::Command::new("docker");
        c.args(["build", "-q", "-t", &tag]).arg(dir.path());
        let out = run(c);
        assert!(out.status.success(), "{}", stderr_of(&out));
    };
    build("1");
    let image = ["--image", tag.as_str()];
    let out = run(pool_start_cmd(
        &rig,
        p,
        &["--size", "1", image[0], image[1]],
    ));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let old = ready_boxes(&rig);
    assert_eq!(old.len(), 1, "{}", pool_ls(&rig));

    check("a new image: the box is stale, and no run takes it");
    build("2");
    let ls = pool_ls(&rig);
    assert_eq!(ls[0]["boxes"][0]["state"], "stale image", "{ls}");
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(p, "Say hello.", &image));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_ne!(
        json["session_id"],
        old[0].as_str(),
        "a stale box was claimed"
    );

    check("the pool replaces it");
    let mut fill = rig.caw();
    fill.args(["pool", "fill", ls[0]["key"].as_str().unwrap()]);
    let out = run(fill);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let now = ready_boxes(&rig);
    assert_eq!(now.len(), 1, "{}", pool_ls(&rig));
    assert_ne!(now, old);
    let names = rig.caw_containers();
    assert!(
        !names.iter().any(|n| n.contains(old[0].as_str())),
        "the stale box stayed: {names:?}"
    );
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(p, "Say hello.", &image));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(
        json["session_id"],
        now[0].as_str(),
        "the new box was not claimed"
    );
    let mut stop = rig.caw();
    stop.args(["pool", "stop", "--all"]);
    assert!(run(stop).status.success());
    let mut rmi = std::process::Command::new("docker");
    rmi.args(["rmi", "-f", &tag]);
    let _ = rmi.output();
}

/// A claimed turn's walls are its settings', as a cold turn's of the same settings: the
/// same user, a protected path read-only, a host off the egress list refused; a run with
/// another `--allow-host` takes no box, and has its own walls.
#[test]
fn a_claimed_turns_walls_are_those_of_its_settings() {
    let rig = Rig::new("pool-walls");
    let p = CODEX;
    rig.start_stand_in("decoy");
    let mut git = std::process::Command::new("git");
    git.args(["init", "-q"]).current_dir(rig.workspace.path());
    assert!(run(git).status.success());
    let turn = |cmd| {
        let (code, json, stderr) = rig.json_turn(cmd);
        assert_eq!(code, 0, "{json}\n{stderr}");
        assert_eq!(json["status"], "success", "{json}");
        json
    };
    let probe = "RUN:echo uid=$(id -u); (printf x >> .git/config) 2>/dev/null && echo WROTE:config || echo DENIED:config; echo decoy=$(curl -s -o /dev/null -w '%{http_code}' http://decoy/_stub/health)";
    let out = run(pool_start_cmd(&rig, p, &["--size", "1"]));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let boxes = ready_boxes(&rig);

    check("the claimed turn's walls");
    let claimed = turn(rig.run_cmd(p, probe, &[]));
    assert_eq!(claimed["session_id"], boxes[0].as_str(), "{claimed}");
    let said = claimed["result"].as_str().unwrap().to_string();
    assert!(said.contains("DENIED:config"), "{said}");
    assert!(said.contains("decoy=403"), "{said}");
    assert!(said.contains("uid="), "{said}");

    check("another --allow-host takes no box");
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready_boxes(&rig).is_empty() {
        assert!(Instant::now() < deadline, "{}", pool_ls(&rig));
        std::thread::sleep(Duration::from_millis(500));
    }
    let ready = ready_boxes(&rig);
    let allowed = turn(rig.run_cmd(p, probe, &["--allow-host", "decoy:80"]));
    assert!(!ready.iter().any(|b| allowed["session_id"] == b.as_str()));
    let said_allowed = allowed["result"].as_str().unwrap();
    assert!(said_allowed.contains("decoy=200"), "{said_allowed}");

    check("a cold turn of the same settings has the same walls");
    let mut stop = rig.caw();
    stop.args(["pool", "stop", "--all"]);
    assert!(run(stop).status.success());
    let cold = turn(rig.run_cmd(p, probe, &[]));
    // (What the shell printed: codex's own lines before it name its chunk.)
    let output = |s: &str| s.split_once("Output:").map(|(_, o)| o.trim().to_string());
    assert_eq!(
        output(cold["result"].as_str().unwrap()),
        output(&said),
        "{cold}"
    );
    assert!(output(&said).is_some(), "{said}");
}

/// `caw-box mcp --pool 2`, driven by the official MCP Python SDK (tests/mcp/pool.py): the
/// first `start` makes the server's pool, a `start` with `n: 2` claims both its boxes (and
/// their sessions recall), and the pool goes when the server stops.
#[test]
fn an_mcp_servers_starts_claim_its_pools_boxes() {
    let python = crate::mcp::mcp_python();
    let rig = Rig::new("pool-mcp");
    let home = tempfile::tempdir().unwrap();
    crate::broker::collect_key(&rig, CODEX, home.path());
    let mut cmd = rig.caw_env(&python);
    cmd.arg(repo_root().join("tests/mcp/pool.py"))
        .arg(env!("CARGO_BIN_EXE_caw-box"))
        .args([&rig.network, &rig.endpoint()])
        .arg(rig.workspace.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = wait_with_deadline(
        cmd.spawn().expect("spawn the MCP client"),
        Duration::from_secs(240),
    );
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert!(
        out.status.success() && stdout.contains("mcp pool checks passed"),
        "the MCP client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// Waits (up to `limit`) until the pool holds exactly one ready box other than `not`: its id.
fn one_ready_box_but(rig: &Rig, not: Option<&str>, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let ready = ready_boxes_if_any(rig);
        if let [only] = ready.as_slice() {
            if Some(only.as_str()) != not {
                return only.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no new ready box within {limit:?}: {}",
            pool_ls(rig)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// [`ready_boxes`], or none while there is no pool yet.
fn ready_boxes_if_any(rig: &Rig) -> Vec<String> {
    match pool_ls(rig)[0]["boxes"].as_array() {
        Some(_) => ready_boxes(rig),
        None => Vec::new(),
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let sent = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// `pool start --serve` keeps its pool full as a service: a box removed from outside is
/// replaced (its volumes go), SIGTERM ends the service and leaves the pool, and a
/// `pool stop` from another process ends a service and leaves nothing.
#[test]
fn a_served_pool_replaces_what_goes_and_its_service_ends_cleanly() {
    let rig = Rig::new("pool-serve");
    let serve = || {
        let mut c = pool_start_cmd(&rig, CODEX, &["--size", "1", "--serve"]);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    let child = serve();
    let first = one_ready_box_but(&rig, None, Duration::from_secs(120));

    check("a box removed from outside is replaced by the service");
    let mut rm = std::process::Command::new("docker");
    rm.args(["rm", "-f", &format!("caw-box-pool-{first}")]);
    assert!(run(rm).status.success());
    let second = one_ready_box_but(&rig, Some(&first), Duration::from_secs(60));
    let volumes = rig.caw_volumes();
    assert!(
        !volumes.iter().any(|v| v.contains(first.as_str())),
        "the removed box's volumes stayed: {volumes:?}"
    );

    check("SIGTERM ends the service; the pool stays");
    signal(&child, "-TERM");
    let out = wait_with_deadline(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("the pool stays"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(ready_boxes(&rig), vec![second.clone()]);

    check("pool stop from another process ends a service and leaves nothing");
    let child = serve();
    // (The same settings: the service takes the pool as it is.)
    assert_eq!(
        one_ready_box_but(&rig, None, Duration::from_secs(60)),
        second
    );
    let mut stop = rig.caw();
    stop.args(["pool", "stop", "--all"]);
    assert!(run(stop).status.success());
    let out = wait_with_deadline(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("was stopped"),
        "{}",
        stderr_of(&out)
    );
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );
    let volumes = rig.caw_volumes();
    assert!(volumes.is_empty(), "{volumes:?}");
}
