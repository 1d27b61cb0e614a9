//! Checkpoints and forks (`caw-box fork`), per provider: turn 1 tells the agent code word A
//! and writes a.txt, turn 2 tells it B and writes b.txt (a copy-mode workspace); `show` lists
//! a checkpoint per turn, the second holding only what changed; a fork at turn 1 (its first
//! turn run by `fork` itself) recalls A and not B and its workspace has a.txt and not b.txt;
//! the source still recalls B; three forks of the latest turn that each recall B and go
//! their own way (their workspaces and diffs differ), the source unchanged. For codex (the
//! quickest CLI) also: one fork resumed by its
//! handle alone from a process without the data directory, one removed without touching
//! the source or its siblings, one exported and imported; a fork in gemini's CLI (the
//! checkpoint's workspace, a handoff in its first request); `ls --tree`; `gc --checkpoints`
//! (the kept chain still forks exactly) and a turn with `--checkpoints off`; a bind-mode
//! source; the refusals, which make nothing; a fork of the latest turn that copies the
//! source's volumes, and one during whose copy a turn of the source begins (made again
//! from the checkpoints).
//!
//! Cost: ten turns per provider; codex ten more (claude about 20 s, codex and gemini about
//! a minute each beside the other fork tests). One rig per provider.

use std::process::{Command, Output};

use serde_json::Value;

use crate::common::*;

fn fork_cmd(rig: &Rig, p: P, target: &str, extra: &[&str]) -> Command {
    let mut c = rig.caw();
    c.args(["fork", target])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(extra);
    c
}

fn json_of(out: &Output) -> Value {
    serde_json::from_str(stdout_of(out).trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}):\nstdout: {}\nstderr: {}",
            stdout_of(out),
            stderr_of(out)
        )
    })
}

/// The regular files of a session's copy-mode workspace (`caw-box export`).
fn workspace_files(rig: &Rig, target: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = rig.caw_run(&["export", target, out_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let mut files: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    files.sort();
    files
}

fn recall(rig: &Rig, p: P, target: &str) -> String {
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(p, target, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    json["result"].as_str().unwrap().to_string()
}

/// Turns 1 and 2 of a copy-mode session named `src-<run id>`; its id and name.
fn two_turns(rig: &Rig, p: P) -> (String, String) {
    let name = format!("src-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "REMEMBER:alpha-one RUN:echo a > a.txt",
        &["--name", &name, "--workspace-mode", "copy"],
    ));
    assert_eq!(code, 0, "turn 1: {first}\n{stderr}");
    let (code, second, stderr) =
        rig.json_turn(rig.resume_cmd(p, &name, "REMEMBER:bravo-two RUN:echo b > b.txt", &[]));
    assert_eq!(code, 0, "turn 2: {second}\n{stderr}");
    (first["session_id"].as_str().unwrap().to_string(), name)
}

/// The first "Prove it" bullet for `p`; returns the rig and the source's id and name.
fn fork_at_one(p: P) -> (Rig, String, String) {
    let rig = Rig::new(&format!("fork-{}", p.name));
    check("two turns");
    let (id, name) = two_turns(&rig, p);

    check("checkpoints");
    let shown = json_of(&rig.caw_run(&["show", &name, "--json"]));
    let cps = shown["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 2, "{shown}");
    assert_eq!(cps[0]["turn"], 1);
    assert!(
        cps[0]["base"].is_null(),
        "the first holds every file: {shown}"
    );
    assert_eq!(cps[1]["base"], 1, "{shown}");
    assert!(
        cps[1]["workspace_files_changed"].as_u64() >= Some(1),
        "{shown}"
    );
    assert!(
        cps[1]["files_changed"].as_u64() < cps[0]["files_changed"].as_u64(),
        "the second checkpoint holds what changed, not a copy: {shown}"
    );

    check("fork --at 1");
    let out = run(fork_cmd(
        &rig,
        p,
        &name,
        &["--at", "1", "-o", "json", "RECALL"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let forks = json_of(&out);
    let fork = &forks["sessions"][0];
    assert_eq!(forks["sessions"].as_array().unwrap().len(), 1, "{forks}");
    assert_eq!(fork["forked_from"]["session"], id.as_str(), "{forks}");
    assert_eq!(fork["forked_from"]["turn"], 1, "{forks}");
    let handle: Value = serde_json::from_str(fork["handle"].as_str().unwrap()).unwrap();
    assert_eq!(handle["forked_from"]["turn"], 1, "{handle}");
    let answer = fork["result"]["result"].as_str().unwrap_or_default();
    assert!(answer.contains("remember alpha-one"), "{forks}");
    assert!(!answer.contains("bravo"), "{forks}");
    assert_eq!(
        fork["result"]["turn"], 2,
        "the fork goes on after turn 1: {forks}"
    );
    let fork_id = fork["session_id"].as_str().unwrap().to_string();
    assert_eq!(workspace_files(&rig, &fork_id), ["a.txt"]);

    check("lineage");
    let listed = json_of(&rig.caw_run(&["ls", "--json"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_id"] == fork_id.as_str())
        .unwrap_or_else(|| panic!("the fork is not listed: {listed}"));
    assert_eq!(row["forked_from"]["turn"], 1, "{row}");
    let shown = json_of(&rig.caw_run(&["show", &fork_id, "--json"]));
    assert_eq!(shown["forked_from"]["session"], id.as_str(), "{shown}");
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "turn 1 inherited, turn 2 its own: {shown}");
    assert_eq!(turns[0]["inherited"], true, "{shown}");
    assert!(turns[1].get("inherited").is_none(), "{shown}");

    check("source untouched");
    let answer = recall(&rig, p, &name);
    assert!(answer.contains("remember bravo-two"), "{answer}");
    assert_eq!(workspace_files(&rig, &name), ["a.txt", "b.txt"]);
    (rig, id, name)
}

#[test]
fn claude_fork_at_turn_one_remembers_turn_one_only() {
    let (rig, _, name) = fork_at_one(CLAUDE);
    three_forks_go_their_own_way(&rig, CLAUDE, &name, 3);
}

#[test]
fn opencode_fork_at_turn_one_remembers_turn_one_only() {
    let (rig, _, name) = fork_at_one(OPENCODE);
    three_forks_go_their_own_way(&rig, OPENCODE, &name, 3);
}

#[test]
fn gemini_fork_at_turn_one_remembers_turn_one_only() {
    let (rig, _, name) = fork_at_one(GEMINI);
    three_forks_go_their_own_way(&rig, GEMINI, &name, 3);
}

/// `fork -n 3` of the source `name` at its latest turn (`last`), each fork's first turn a
/// recall: three sessions that each recall B; each then takes a turn of its own, so their
/// workspaces and diffs differ; the source is unchanged. Returns the forks' ids and group.
fn three_forks_go_their_own_way(rig: &Rig, p: P, name: &str, last: u64) -> (Vec<String>, String) {
    check("fork -n 3");
    let (tries, group) = (
        format!("try-{}", rig.run_id),
        format!("tries-{}", rig.run_id),
    );
    let out = run(fork_cmd(
        rig,
        p,
        name,
        &[
            "-n", "3", "--name", &tries, "--group", &group, "-o", "json", "RECALL",
        ],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let forks = json_of(&out);
    let sessions = forks["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 3, "{forks}");
    let mut ids = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(s["name"], format!("{tries}-{}", i + 1), "{forks}");
        assert_eq!(
            s["forked_from"]["turn"], last,
            "the source's latest turn: {forks}"
        );
        let answer = s["result"]["result"].as_str().unwrap_or_default();
        assert!(answer.contains("remember bravo-two"), "{forks}");
        ids.push(s["session_id"].as_str().unwrap().to_string());
    }
    for (i, fork) in ids.iter().enumerate() {
        let prompt = format!("RUN:echo {i} > own-{i}.txt");
        let (code, json, stderr) = rig.json_turn(rig.resume_cmd(p, fork, &prompt, &[]));
        assert_eq!(code, 0, "{json}\n{stderr}");
    }
    let mut diffs = Vec::new();
    for (i, fork) in ids.iter().enumerate() {
        assert_eq!(
            workspace_files(rig, fork),
            ["a.txt".to_string(), "b.txt".into(), format!("own-{i}.txt")]
        );
        let out = rig.caw_run(&["diff", fork, "--patch"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let diff = stdout_of(&out);
        assert!(diff.contains(&format!("own-{i}.txt")), "{diff}");
        assert!(
            !diffs.contains(&diff),
            "two forks' diffs are the same: {diff}"
        );
        diffs.push(diff);
    }
    assert_eq!(workspace_files(rig, name), ["a.txt", "b.txt"]);
    (ids, group)
}

/// codex: the first bullet, then three forks of the latest turn, resume by handle alone,
/// removal of one fork, a bind-mode source and the refusals.
#[test]
fn codex_forks_go_their_own_way_and_stand_alone() {
    let (rig, id, name) = fork_at_one(CODEX);

    let (ids, group) = three_forks_go_their_own_way(&rig, CODEX, &name, 3);

    check("fork of a fork");
    let out = run(fork_cmd(&rig, CODEX, &ids[2], &["--at", "2"]));
    assert_refused(&out, "is a fork of");
    let out = run(fork_cmd(&rig, CODEX, &ids[2], &["--at", "5", "-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let grandchild = json_of(&out)["sessions"][0].clone();
    assert_eq!(grandchild["forked_from"]["turn"], 5);
    let grandchild = grandchild["session_id"].as_str().unwrap().to_string();

    check("fork -d");
    let out = run(fork_cmd(
        &rig,
        CODEX,
        &name,
        &["-d", "-o", "json", "RECALL"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let detached = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = rig.caw_run(&["wait", &detached, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(json_of(&out)["result"]
        .as_str()
        .unwrap()
        .contains("bravo-two"));

    check("fork --provider gemini: the checkpoint's workspace and a handoff");
    let mut cmd = rig.caw();
    cmd.args(["fork", &name, "--at", "1", "--provider", "gemini"])
        .args(["--env", &format!("{}={TEST_KEY}", GEMINI.key_var)])
        .args(["--model", GEMINI.model.unwrap()])
        .args(["-o", "json", "the fork's own prompt: carry on"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let forks = json_of(&out);
    let handed = &forks["sessions"][0];
    assert_eq!(handed["result"]["status"], "success", "{forks}");
    assert_eq!(
        handed["result"]["turn"], 1,
        "a conversation of its own: {forks}"
    );
    let handed = handed["session_id"].as_str().unwrap().to_string();
    assert_eq!(workspace_files(&rig, &handed), ["a.txt"]);
    let shown = json_of(&rig.caw_run(&["show", &handed, "--json"]));
    assert_eq!(shown["provider"], "gemini", "{shown}");
    assert_eq!(shown["forked_from"]["turn"], 1, "{shown}");
    // Gemini's request carried turn 1's prompt and answer and the file it made, not turn 2,
    // then the fork's own prompt. (The stub acts on the first directive of a text: turn 1's
    // `RUN:echo a > a.txt` again, which leaves the workspace as it was.)
    let bodies: Vec<String> = rig
        .stub_requests()
        .iter()
        .map(|r| r["body"].to_string())
        .filter(|b| b.contains("You take over from another coding agent (codex"))
        .collect();
    assert!(!bodies.is_empty(), "no request carried the handoff");
    assert!(
        bodies.iter().all(|b| b.contains("REMEMBER:alpha-one")
            && b.contains("- a.txt")
            && b.contains("the fork's own prompt: carry on")
            && !b.contains("bravo-two")),
        "{bodies:?}"
    );

    check("resume by handle alone");
    let handle = rig.caw_run(&["handle", &ids[1]]);
    let handle = stdout_of(&handle).trim().to_string();
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &handle, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("bravo-two"),
        "{json}"
    );
    assert_eq!(json["turn"], 6, "inherited 1-3, then its own 4-6: {json}");

    check("rm one fork");
    let out = rig.caw_run(&["rm", &ids[0]]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let volumes = rig.caw_volumes();
    assert!(volumes.iter().all(|v| !v.contains(&ids[0])), "{volumes:?}");
    // The source's checkpoints, and the siblings' own (from their first turn, turn 4).
    for (kept, turn) in [(&id, 3), (&ids[1], 4), (&ids[2], 4)] {
        assert!(volumes.contains(&format!("caw-box-{kept}")), "{volumes:?}");
        assert!(
            volumes.contains(&format!("caw-box-{kept}-checkpoint-{turn}")),
            "{volumes:?}"
        );
    }

    check("a fork exported and imported");
    let archive = tempfile::tempdir().unwrap();
    let file = archive.path().join("fork.tar.gz");
    let file = file.to_str().unwrap();
    for args in [
        vec!["session", "export", &ids[2], file],
        vec!["rm", &ids[2]],
        vec!["session", "import", file],
    ] {
        let out = rig.caw_run(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr_of(&out));
    }
    let shown = json_of(&rig.caw_run(&["show", &ids[2], "--json"]));
    assert_eq!(shown["forked_from"]["session"], id.as_str(), "{shown}");
    assert!(recall(&rig, CODEX, &ids[2]).contains("bravo-two"));

    ls_tree(&rig, &id, &ids[1..], &grandchild);
    gc_checkpoints(&rig, &ids[1], &group);
    refusals(&rig, &name);
    bind_mode_source(&rig);
}

/// A warm session's turns (`--keep-warm`: the container is made before its turn, so it
/// cannot write the turn's checkpoint) are checkpointed behind them by a helper the turn
/// does not wait for: a fork started the moment the second warm turn returned waits for it
/// and recalls exactly that turn, a fork at turn 1 exactly turn 1, and no helper is left.
#[test]
fn codex_warm_turns_are_checkpointed_behind_them() {
    let rig = Rig::new("fork-warm");
    let p = CODEX;
    let name = format!("warm-{}", rig.run_id);
    check("two warm turns");
    let (code, first, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "REMEMBER:alpha-one RUN:echo a > a.txt",
        &[
            "--name",
            &name,
            "--workspace-mode",
            "copy",
            "--keep-warm",
            "60s",
        ],
    ));
    assert_eq!(code, 0, "turn 1: {first}\n{stderr}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let (code, second, stderr) =
        rig.json_turn(rig.resume_cmd(p, &name, "REMEMBER:bravo-two RUN:echo b > b.txt", &[]));
    assert_eq!(code, 0, "turn 2: {second}\n{stderr}");

    // A fork at `at`, its first turn a recall: (its answer, its id).
    let fork_at = |at: &str| {
        let out = run(fork_cmd(
            &rig,
            p,
            &name,
            &["--at", at, "-o", "json", "RECALL"],
        ));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let fork = json_of(&out)["sessions"][0].clone();
        let answer = fork["result"]["result"].as_str().unwrap_or_default();
        (
            answer.to_string(),
            fork["session_id"].as_str().unwrap().to_string(),
        )
    };

    check("fork --at 2 at once");
    let (answer, fork_id) = fork_at("2");
    assert!(answer.contains("remember bravo-two"), "{answer}");
    assert_eq!(workspace_files(&rig, &fork_id), ["a.txt", "b.txt"]);
    let behind = format!("caw-box-probe-{id}-checkpoint");
    assert!(
        !rig.caw_containers()
            .iter()
            .any(|n| n.trim_start_matches('/') == behind),
        "the checkpoint's helper stayed: {:?}",
        rig.caw_containers()
    );

    check("checkpoints and fork --at 1");
    assert_eq!(checkpoints_of(&rig, &name), [(1, None), (2, Some(1))]);
    let (answer, fork_id) = fork_at("1");
    assert!(
        answer.contains("remember alpha-one") && !answer.contains("bravo"),
        "{answer}"
    );
    assert_eq!(workspace_files(&rig, &fork_id), ["a.txt"]);
}

/// `ls --tree`: the forks under their source with the turn they were forked at, a fork of a
/// fork one level deeper.
fn ls_tree(rig: &Rig, source: &str, forks: &[String], grandchild: &str) {
    check("ls --tree");
    let out = rig.caw_run(&["ls", "--tree"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = stdout_of(&out);
    let lines: Vec<&str> = text.lines().collect();
    let line_of = |id: &str| {
        lines
            .iter()
            .position(|l| l.contains(&id[..8]))
            .unwrap_or_else(|| panic!("{id} is not listed:\n{text}"))
    };
    // How deep a line is drawn: where its id starts.
    let depth = |at: usize, id: &str| lines[at].find(&id[..8]).unwrap();
    let top = line_of(source);
    assert_eq!(depth(top, source), 0, "{text}");
    for fork in forks {
        let at = line_of(fork);
        assert!(at > top, "a fork under its source:\n{text}");
        assert!(
            lines[at].contains(&format!("─ {} @3", &fork[..8])),
            "{}\n{text}",
            lines[at]
        );
    }
    let parent = line_of(&forks[1]);
    let at = line_of(grandchild);
    assert!(at > parent, "{text}");
    assert!(depth(at, grandchild) > depth(parent, &forks[1]), "{text}");
    assert!(lines[at].contains(" @5"), "{text}");
}

/// The checkpoints `show --json` lists: (turn, base).
fn checkpoints_of(rig: &Rig, target: &str) -> Vec<(u64, Option<u64>)> {
    let shown = json_of(&rig.caw_run(&["show", target, "--json"]));
    shown["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["turn"].as_u64().unwrap(), c["base"].as_u64()))
        .collect()
}

/// `gc --checkpoints` on the group of `fork` (its own turns 4, 5, 6; the group's other
/// session, imported, has none): `--keep 2` makes turn 5's whole and removes turn 4's, and a
/// fork at turn 6 is turn 6 exactly; `--keep 1` leaves turn 6's alone, whole, and the next
/// turn's checkpoint holds the changes since it. A turn with `--checkpoints off` keeps none.
fn gc_checkpoints(rig: &Rig, fork: &str, group: &str) {
    check("gc --checkpoints");
    assert_eq!(
        checkpoints_of(rig, fork),
        [(4, None), (5, Some(4)), (6, Some(5))]
    );
    let gc = |extra: &[&str]| {
        let mut args = vec!["gc", "--checkpoints", "--group", group];
        args.extend_from_slice(extra);
        let out = rig.caw_run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        stdout_of(&out)
    };
    let said = gc(&["--keep", "2", "--dry-run"]);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains(&format!("would prune the checkpoints of {fork}"))
            && said.contains("turns 4; kept: turns 5, 6"),
        "{said}"
    );
    assert_eq!(
        checkpoints_of(rig, fork).len(),
        3,
        "a dry run prunes nothing"
    );
    let said = gc(&["--keep", "2"]);
    assert!(said.contains("turns 4; kept: turns 5, 6"), "{said}");
    assert_eq!(checkpoints_of(rig, fork), [(5, None), (6, Some(5))]);
    let out = run(fork_cmd(
        rig,
        CODEX,
        fork,
        &["--at", "6", "-o", "json", "RECALL"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let made = &json_of(&out)["sessions"][0];
    let answer = made["result"]["result"].as_str().unwrap_or_default();
    assert!(answer.contains("bravo-two"), "{made}");
    let at_six = ["a.txt", "b.txt", "own-1.txt"];
    let made = made["session_id"].as_str().unwrap();
    assert_eq!(workspace_files(rig, made), at_six);
    // Its `diff` has the base the session started from (which no checkpoint holds).
    let out = rig.caw_run(&["diff", made]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("own-1.txt"), "{}", stdout_of(&out));
    assert_refused(
        &run(fork_cmd(rig, CODEX, fork, &["--at", "4"])),
        "has no checkpoint",
    );

    let said = gc(&[]);
    assert!(said.contains("turns 5; kept: turns 6"), "{said}");
    assert_eq!(checkpoints_of(rig, fork), [(6, None)]);
    let out = run(fork_cmd(rig, CODEX, fork, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let made = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(workspace_files(rig, &made), at_six);

    check("the next turn's checkpoint on the whole one");
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, fork, "RUN:echo 7 > seven.txt", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(checkpoints_of(rig, fork), [(6, None), (7, Some(6))]);
    let out = run(fork_cmd(rig, CODEX, fork, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let made = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        workspace_files(rig, &made),
        ["a.txt", "b.txt", "own-1.txt", "seven.txt"]
    );

    check("--checkpoints off");
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(
        CODEX,
        fork,
        "RUN:echo 8 > eight.txt",
        &["--checkpoints", "off"],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert_eq!(json["turn"], 8, "{json}");
    assert_eq!(checkpoints_of(rig, fork), [(6, None), (7, Some(6))]);
    assert_refused(
        &run(fork_cmd(rig, CODEX, fork, &["--at", "8"])),
        "has no checkpoint",
    );
}

/// A turn's own container writes its checkpoint once its CLI has ended, and the agent can
/// spoil neither it nor the one before: the previous checkpoint is read-only to it, and a
/// process it leaves behind scribbling over the new checkpoint's files is killed before
/// that is written. Both checkpoints restore exactly their turn.
#[test]
fn codex_agent_cannot_touch_the_checkpoints() {
    let rig = Rig::new("fork-tamper");
    let name = format!("src-{}", rig.run_id);
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "REMEMBER:alpha-one RUN:echo a > a.txt",
        &["--name", &name, "--workspace-mode", "copy"],
    ));
    assert_eq!(code, 0, "turn 1: {json}\n{stderr}");
    check("turn 2 scribbles over the checkpoints");
    let dir = "/var/lib/caw-box";
    let scribble = format!(
        "REMEMBER:bravo-two RUN:echo b > b.txt; (echo x > {dir}/checkpoint-prev/manifest) \
         2>/dev/null && echo prev-writable || echo prev-read-only; setsid sh -c 'while :; do \
         for f in {dir}/checkpoint/*; do echo tampered > $f; done; echo tampered > \
         {dir}/checkpoint/info.json; sleep 0.01; done' </dev/null >/dev/null 2>&1 & \
         echo left-running"
    );
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &name, &scribble, &[]));
    assert_eq!(code, 0, "turn 2: {json}\n{stderr}");
    let said = json["result"].as_str().unwrap_or_default();
    assert!(said.contains("prev-read-only"), "{json}");
    assert!(said.contains("left-running"), "{json}");

    check("both checkpoints whole");
    let shown = json_of(&rig.caw_run(&["show", &name, "--json"]));
    let cps = shown["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 2, "{shown}");
    assert_eq!(cps[1]["base"], 1, "{shown}");
    for (at, word, files) in [
        ("1", "alpha-one", vec!["a.txt"]),
        ("2", "bravo-two", vec!["a.txt", "b.txt"]),
    ] {
        let out = run(fork_cmd(
            &rig,
            CODEX,
            &name,
            &["--at", at, "-o", "json", "RECALL"],
        ));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let forks = json_of(&out);
        let fork = &forks["sessions"][0];
        let answer = fork["result"]["result"].as_str().unwrap_or_default();
        assert!(answer.contains(word), "fork at {at}: {forks}");
        let id = fork["session_id"].as_str().unwrap();
        assert_eq!(workspace_files(&rig, id), files, "fork at {at}");
    }

    check("export --checkpoints all: forkable at turn 1 after an import");
    let archive = tempfile::tempdir().unwrap();
    let all = archive.path().join("all.tar.gz");
    let latest = archive.path().join("latest.tar.gz");
    let (all, latest) = (all.to_str().unwrap(), latest.to_str().unwrap());
    // The export `args` (its archive fourth), `rm` of the session, the import.
    let moved = |args: Vec<&str>| {
        let file = args[3];
        let mut said = String::new();
        for step in [
            args.clone(),
            vec!["rm", &name],
            vec!["session", "import", file],
        ] {
            let out = rig.caw_run(&step);
            assert_eq!(out.status.code(), Some(0), "{step:?}: {}", stderr_of(&out));
            said.push_str(&stderr_of(&out));
        }
        said
    };
    let said = moved(vec![
        "session",
        "export",
        &name,
        all,
        "--checkpoints",
        "all",
    ]);
    assert!(said.contains(", 2 checkpoints)"), "{said}");
    let out = run(fork_cmd(
        &rig,
        CODEX,
        &name,
        &["--at", "1", "-o", "json", "RECALL"],
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let forks = json_of(&out);
    let answer = forks["sessions"][0]["result"]["result"]
        .as_str()
        .unwrap_or_default();
    assert!(
        answer.contains("alpha-one") && !answer.contains("bravo"),
        "{forks}"
    );

    check("export without checkpoints: the import takes the latest turn's");
    let said = moved(vec!["session", "export", &name, latest]);
    assert!(!said.contains("checkpoint"), "{said}");
    let shown = json_of(&rig.caw_run(&["show", &name, "--json"]));
    let cps = shown["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 1, "{shown}");
    assert_eq!(cps[0]["turn"], 2, "{shown}");
    assert!(cps[0]["base"].is_null(), "a whole one: {shown}");
    assert_refused(
        &run(fork_cmd(&rig, CODEX, &name, &["--at", "1"])),
        "has no checkpoint",
    );
    let out = run(fork_cmd(&rig, CODEX, &name, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let fork = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(workspace_files(&rig, &fork), ["a.txt", "b.txt"]);

    check("a checkpoint holding a known key: export leaves the checkpoints out");
    let prompt = format!("RUN:echo {TEST_KEY} > ~/noted.txt");
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &name, &prompt, &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let leaky = archive.path().join("leaky.tar.gz");
    let mut cmd = rig.caw();
    cmd.args(["session", "export", &name, leaky.to_str().unwrap()])
        .args(["--checkpoints", "all"])
        .env(CODEX.key_var, TEST_KEY);
    let out = run(cmd);
    let said = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("left out ~/noted.txt: it holds a credential"),
        "{said}"
    );
    assert!(said.contains("left out the checkpoints"), "{said}");
    assert!(!said.contains("checkpoints)"), "{said}");
    let bytes = std::fs::read(&leaky).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw).unwrap();
    assert!(
        !raw.windows(TEST_KEY.len())
            .any(|w| w == TEST_KEY.as_bytes()),
        "the archive holds the key"
    );
}

/// The entrypoint leaves every file it put in HOME (the credential overlay, the paths of the
/// scrub list) out of the turn's checkpoint: it hands them to the checkpoint script as paths
/// to leave out, beside the ones caw-box names. A script of the test's own stands in for
/// caw-box's and writes down what it was given. (No turn: one container, about a second.)
#[test]
fn the_entrypoint_leaves_what_it_put_in_home_out_of_a_checkpoint() {
    use std::os::unix::fs::PermissionsExt;
    let rig = Rig::new("fork-entry");
    let run_dir = tempfile::tempdir().unwrap();
    let overlay = run_dir.path().join("home/.vendor");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(overlay.join("token.json"), "a credential").unwrap();
    std::fs::write(run_dir.path().join("scrub"), ".vendor/other.json\0").unwrap();
    // The agent's uid reads it all and empties the runtime directory, as in a turn.
    for dir in [
        run_dir.path(),
        &run_dir.path().join("home"),
        overlay.as_path(),
    ] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let script =
        r#"printf '%s' "$CKPT_EXCLUDE" >/run/caw-box/excluded; echo '{}' >"$CKPT_DIR/info.json""#;
    let repo = std::env::var("CAW_BOX_E2E_IMAGE_REPO").unwrap_or_else(|_| "caw-box".into());
    let (code, out, err) = rig.run_container(bollard::models::ContainerCreateBody {
        image: Some(format!("{repo}/codex:latest")),
        user: Some("1000:1000".into()),
        cmd: Some(vec!["true".into()]),
        env: Some(vec![
            "CAW_BOX_CHECKPOINT=/var/lib/caw-box/checkpoint".into(),
            format!("CAW_BOX_CHECKPOINT_SCRIPT={script}"),
            "CKPT_EXCLUDE=.named/by-caw-box".into(),
        ]),
        host_config: Some(bollard::models::HostConfig {
            binds: Some(vec![format!("{}:/run/caw-box", run_dir.path().display())]),
            tmpfs: Some(std::collections::HashMap::from([(
                "/var/lib/caw-box/checkpoint".to_string(),
                "mode=1777".to_string(),
            )])),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(code, 0, "{out}\n{err}");
    let excluded = std::fs::read_to_string(run_dir.path().join("excluded"))
        .unwrap_or_else(|e| panic!("the checkpoint script did not run ({e}): {out}\n{err}"));
    let excluded: Vec<&str> = excluded.lines().collect();
    for path in [
        ".named/by-caw-box",
        ".vendor/token.json",
        ".vendor/other.json",
    ] {
        assert!(
            excluded.contains(&path),
            "{path} not left out: {excluded:?}"
        );
    }
}

fn assert_refused(out: &Output, needle: &str) {
    let stderr = stderr_of(out);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one line, got: {stderr}");
    assert!(lines[0].contains(needle), "'{needle}' not in: {stderr}");
}

fn sorted_volumes(rig: &Rig) -> Vec<String> {
    let mut v = rig.caw_volumes();
    v.sort();
    v
}

fn refusals(rig: &Rig, name: &str) {
    check("refusals");
    let before = sorted_volumes(rig);
    // (`-n` outside 1..=8 and `--at 0` are refused before Docker is asked: tests/cli.rs.)
    let cases: [(&[&str], &str); 2] = [
        (&["no-such-session"], "no session matches"),
        (&["--at", "9"], "has no turn 9"),
    ];
    for (args, needle) in cases {
        let (target, rest) = if args[0].starts_with('-') {
            (name, args)
        } else {
            (args[0], &args[1..])
        };
        assert_refused(&run(fork_cmd(rig, CODEX, target, rest)), needle);
    }
    let out = run(fork_cmd(rig, CODEX, name, &["--at", "9", "-o", "json"]));
    assert_eq!(
        json_of(&out)["error"]["kind"],
        "not_found",
        "{}",
        stdout_of(&out)
    );

    assert_eq!(sorted_volumes(rig), before, "a refused fork left something");

    // A session running a turn: busy, and nothing is made.
    let held = run(rig.resume_cmd(CODEX, name, "HOLD:fork-busy RECALL", &["-d"]));
    assert_eq!(held.status.code(), Some(0), "{}", stderr_of(&held));
    rig.wait_held("fork-busy");
    let out = run(fork_cmd(rig, CODEX, name, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert_eq!(
        json_of(&out)["error"]["kind"],
        "busy",
        "{}",
        stdout_of(&out)
    );
    let sessions = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .filter(|n| n.len() == "caw-box-".len() + 36)
            .collect()
    };
    assert_eq!(sessions(sorted_volumes(rig)), sessions(before));
    rig.stub_release("fork-busy");
    let out = rig.caw_run(&["wait", name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

fn bind_mode_source(rig: &Rig) {
    check("bind-mode source");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("seed.txt"), "seed").unwrap();
    let ws = dir.path().to_str().unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "REMEMBER:charlie RUN:echo c > c.txt",
        &["--workspace-mode", "bind", "--workspace", ws],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let src = json["session_id"].as_str().unwrap().to_string();
    let out = run(fork_cmd(rig, CODEX, &src, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("bind-mode workspace"),
        "{}",
        stderr_of(&out)
    );
    let fork = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let shown = json_of(&rig.caw_run(&["show", &fork, "--json"]));
    assert_eq!(shown["settings"]["workspace_mode"], "copy", "{shown}");
    assert_eq!(workspace_files(rig, &fork), ["c.txt", "seed.txt"]);
    assert!(recall(rig, CODEX, &fork).contains("charlie"));
}

/// A fork of the latest turn copies the source's volumes, so it holds what they hold beyond
/// the checkpoint (here a file put in the source's workspace between turns); when a turn of
/// the source begins while it copies (begun by the test at that point, through
/// `fork_then`), the copies go and the forks are made again from the checkpoints: the
/// fork is the turn's end exactly, and nothing of the first copies stays.
#[test]
fn codex_a_turn_begun_during_the_copy_remakes_the_forks_from_checkpoints() {
    let rig = Rig::new("fork-race");
    let (id, name) = two_turns(&rig, CODEX);
    // What no checkpoint holds: a file in the source's workspace volume, after turn 2.
    let (code, _, err) = rig.run_container(bollard::models::ContainerCreateBody {
        image: Some(stub_image()),
        entrypoint: Some(vec!["sh".into()]),
        cmd: Some(vec!["-c".into(), "echo later > /w/later.txt".into()]),
        user: Some("1000".into()),
        host_config: Some(bollard::models::HostConfig {
            binds: Some(vec![format!("caw-box-{id}-workspace:/w")]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(code, 0, "{err}");

    check("no turn begins: the fork is a copy of the volumes");
    let out = run(fork_cmd(&rig, CODEX, &name, &["-o", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let copied = json_of(&out)["sessions"][0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        workspace_files(&rig, &copied),
        ["a.txt", "b.txt", "later.txt"]
    );

    check("a turn begins during the copy: made again from the checkpoints");
    // The library in this process, with the environment `rig.caw()` gives caw-box.
    std::env::set_var("CAW_BOX_DATA_DIR", rig.data_dir.path());
    std::env::set_var("CAW_BOX_LABELS", format!("{TEST_LABEL}={}", rig.run_id));
    std::env::set_var(
        "CAW_BOX_CONFIG",
        rig.data_dir.path().join("no-user-config.toml"),
    );
    let hold = format!("race-{}", rig.run_id);
    let begin_a_turn = async {
        let mut detach = rig.resume_cmd(CODEX, &name, &format!("HOLD:{hold} RECALL"), &["-d"]);
        let out = run(std::mem::replace(&mut detach, Command::new("true")));
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    };
    let request = caw_box::ForkRequest {
        at: None,
        count: 2,
        name: None,
        group: None,
        provider: None,
    };
    let forks = rig.rt.block_on(async {
        let client = caw_box::Client::connect().await.expect("connect");
        caw_box::session::lifecycle::fork::fork_then(
            client.backend(),
            &name,
            &request,
            begin_a_turn,
        )
        .await
        .expect("fork")
    });
    assert_eq!(forks.forked_from.turn, 2);
    let made: Vec<String> = forks
        .sessions
        .iter()
        .map(|s| s.session_id.to_string())
        .collect();
    assert_eq!(made.len(), 2);
    for fork in &made {
        assert_eq!(workspace_files(&rig, fork), ["a.txt", "b.txt"], "{fork}");
        assert!(recall(&rig, CODEX, fork).contains("bravo-two"));
    }
    // Every volume is the source's, the first fork's or these forks': the copies went.
    let kept = [&id, &copied, &made[0], &made[1]];
    let volumes = rig.caw_volumes();
    let strays: Vec<&String> = volumes
        .iter()
        .filter(|v| !kept.iter().any(|k| v.starts_with(&format!("caw-box-{k}"))))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");

    rig.stub_release(&hold);
    let out = rig.caw_run(&["wait", &name, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("bravo-two"));
}
