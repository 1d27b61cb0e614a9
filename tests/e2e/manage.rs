//! Session management (issue 4): racing turns, detach/wait/stop, ls/show/handle/logs by id,
//! prefix and name with the host data directory gone, rm, gc, groups.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use bollard::models::VolumeCreateRequest;
use serde_json::Value;

use crate::common::*;

fn start(rig: &Rig, p: P, prompt: &str, extra: &[&str]) -> String {
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(p, prompt, extra));
    assert_eq!(code, 0, "{json}\n{stderr}");
    json["session_id"].as_str().unwrap().to_string()
}

fn caw_out(rig: &Rig, args: &[&str]) -> std::process::Output {
    let mut c = rig.caw();
    c.args(args);
    run(c)
}

#[test]
fn two_racing_resumes_exactly_one_runs() {
    let rig = Rig::new("race");
    let id = start(&rig, CODEX, "REMEMBER:race", &[]);
    let spawn = || {
        let mut c = rig.resume_cmd(CODEX, &id, "HOLD:race REMEMBER:again", &["-o", "json"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let outs = race_held(&rig, "race", spawn(), spawn());
    let mut codes: Vec<i32> = outs.iter().map(|o| o.status.code().unwrap_or(-1)).collect();
    codes.sort();
    assert_eq!(
        codes,
        vec![0, 2],
        "{:?}",
        outs.iter().map(stderr_of).collect::<Vec<_>>()
    );
    let loser = outs.iter().find(|o| o.status.code() == Some(2)).unwrap();
    assert!(stderr_of(loser).contains("is busy"), "{}", stderr_of(loser));
    assert!(
        stderr_of(loser).contains("is running right now"),
        "{}",
        stderr_of(loser)
    );
    // `-o json`: the refusal's kind is `busy` (exit 2, as a usage error's).
    let report: Value = serde_json::from_str(stdout_of(loser).trim()).unwrap();
    assert_eq!(
        (
            report["error"]["kind"].as_str(),
            report["exit_code"].as_i64()
        ),
        (Some("busy"), Some(2)),
        "{report}"
    );
}

#[test]
fn detach_wait_and_stop() {
    let rig = Rig::new("detach");
    let id = start(&rig, CODEX, "REMEMBER:lime", &[]);

    // Detach returns with the id while the turn waits at the stub (it could not wait for
    // the turn); wait prints the result like a foreground turn.
    let mut detach = rig.resume_cmd(CODEX, &id, "HOLD:detached RECALL", &["--detach"]);
    detach.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = wait_with_deadline(detach.spawn().unwrap(), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), id);
    let ls = caw_out(&rig, &["ls", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&stdout_of(&ls)).unwrap();
    let row = rows
        .iter()
        .find(|r| r["session_id"] == id.as_str())
        .unwrap();
    assert_eq!(row["status"], "running", "{row}");
    // logs -f follows the running turn's unified events until it ends: the turn is released
    // once its request is at the stub with logs -f started (one that attached later would
    // print the recorded events).
    let mut follow = rig.caw();
    follow
        .args(["logs", "-f", &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let follow = follow.spawn().unwrap();
    rig.wait_held("detached");
    rig.stub_release("detached");
    let out = wait_with_deadline(follow, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let followed: Vec<Value> = stdout_of(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        followed
            .iter()
            .any(|e| e["type"] == "text" && e["text"] == "You told me to remember lime."),
        "{followed:?}"
    );
    // ... and ends with the turn's result, as `logs` of the recorded turn does.
    let last = followed.last().unwrap();
    assert_eq!(last["type"], "result", "{followed:?}");
    assert_eq!(last["status"], "success", "{last}");
    let out = caw_out(&rig, &["wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("You told me to remember lime."),
        "{}",
        stdout_of(&out)
    );
    // Its driver recorded it: it kept no last words.
    assert_eq!(driver_logs(&rig, &id), Vec::<String>::new());

    // -o json of a detached turn says running; stop keeps the session resumable.
    let mut cmd = rig.resume_cmd(CODEX, &id, "SLEEP:120", &["--detach"]);
    cmd.args(["-o", "json"]);
    let out = run(cmd);
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "running");
    assert_eq!(json["turn"], 3);
    let out = caw_out(&rig, &["stop", &id[..8]]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let out = caw_out(&rig, &["wait", &id, "-o", "json"]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["status"], "interrupted");
    assert!(rig.caw_containers().is_empty());
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("remember lime"),
        "{json}"
    );
    assert_eq!(json["turn"], 4);
}

#[test]
fn detach_on_a_busy_session_is_refused_and_the_running_turn_goes_on() {
    let rig = Rig::new("busy-detach");
    let id = start(&rig, CODEX, "REMEMBER:plum", &[]);
    let out = run(rig.resume_cmd(CODEX, &id, "HOLD:busy RECALL", &["--detach"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    // Turn 2 runs (held at the stub): a detached turn 2 of our own must not pass for it.
    let out = run(rig.resume_cmd(CODEX, &id, "REMEMBER:fig", &["--detach"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stdout_of(&out).trim().is_empty(), "{}", stdout_of(&out));
    assert!(stderr_of(&out).contains("is busy"), "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", stderr_of(&out));
    // The refused driver's words were said, not kept; the running one's log is there.
    assert_eq!(
        driver_logs(&rig, &id).len(),
        1,
        "{:?}",
        driver_logs(&rig, &id)
    );
    rig.stub_release("busy");

    let out = caw_out(&rig, &["wait", &id, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["turn"], 2, "{json}");
    assert!(
        json["result"].as_str().unwrap().contains("remember plum"),
        "{json}"
    );
    assert_eq!(driver_logs(&rig, &id), Vec::<String>::new());
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );
}

#[test]
fn a_group_with_a_busy_member_counts_it_as_failed_even_quietly() {
    let rig = Rig::new("busy-group");
    let group = format!("b-{}", rig.run_id);
    let busy = start(&rig, CODEX, "REMEMBER:a", &["--group", &group]);
    start(&rig, CODEX, "REMEMBER:b", &["--group", &group]);
    let out = run(rig.resume_cmd(CODEX, &busy, "HOLD:busy RECALL", &["--detach"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    let mut cmd = rig.caw();
    cmd.args(["-q", "resume", "--group", &group])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .arg("RECALL");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let stderr = stderr_of(&out);
    assert!(stderr.contains("is busy"), "{stderr}");
    assert!(
        stderr.contains(&format!("1 of 2 sessions of group {group} did not succeed")),
        "{stderr}"
    );
    // The other member's turn ran.
    assert!(
        stdout_of(&out).contains("remember b"),
        "{}",
        stdout_of(&out)
    );

    rig.stub_release("busy");
    let out = caw_out(&rig, &["wait", &busy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

#[test]
fn management_by_id_prefix_and_name_without_the_host_data_dir() {
    let rig = Rig::new("manage");
    let name = format!("m-{}", rig.run_id);
    let id = start(&rig, CLAUDE, "REMEMBER:quince", &["--name", &name]);
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();

    let out = caw_out(&rig, &["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let rows: Vec<Value> = serde_json::from_str(&stdout_of(&out)).unwrap();
    let row = rows
        .iter()
        .find(|r| r["session_id"] == id.as_str())
        .unwrap();
    assert_eq!(row["name"], name.as_str());
    assert_eq!(row["turns"], 1);
    assert_eq!(row["status"], "success");
    assert_eq!(row["provider"], "claude_code");
    let out = caw_out(&rig, &["ls"]);
    let table = stdout_of(&out);
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&id[..8]) && l.contains(&name)),
        "{table}"
    );

    for target in [id.as_str(), &id[..6], name.as_str()] {
        let out = caw_out(&rig, &["show", target]);
        assert_eq!(out.status.code(), Some(0), "{target}: {}", stderr_of(&out));
        assert!(
            stdout_of(&out).contains("> REMEMBER:quince"),
            "{}",
            stdout_of(&out)
        );
        assert!(
            stdout_of(&out).contains("< Noted: quince."),
            "{}",
            stdout_of(&out)
        );

        let out = caw_out(&rig, &["handle", target]);
        let handle: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
        assert_eq!(handle["session_id"], id.as_str());

        let out = caw_out(&rig, &["logs", target]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        let events: Vec<Value> = stdout_of(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(events
            .iter()
            .any(|e| e["type"] == "text" && e["text"] == "Noted: quince."));
        assert_eq!(events.last().unwrap()["type"], "result");
    }
    let out = caw_out(&rig, &["show", &id, "--json"]);
    let shown: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(shown["turns"][0]["prompt"], "REMEMBER:quince");
    // A turn resumed with no host data keeps the earlier turns' history in the volume.
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(CLAUDE, &name, "RECALL", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();
    let out = caw_out(&rig, &["show", &id, "--json"]);
    let shown: Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(shown["turns"][0]["prompt"], "REMEMBER:quince", "{shown}");
    assert_eq!(shown["turns"][0]["result"], "Noted: quince.", "{shown}");
    assert_eq!(shown["turns"][1]["prompt"], "RECALL", "{shown}");
    let out = caw_out(&rig, &["logs", &name, "--raw", "--turn", "1"]);
    assert!(
        stdout_of(&out).contains("\"type\":\"system\""),
        "{}",
        stdout_of(&out)
    );
    let out = caw_out(&rig, &["logs", &name, "--turn", "7"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    // Unknown and ambiguous TARGETs.
    let out = caw_out(&rig, &["show", "no-such-session"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("no session matches"),
        "{}",
        stderr_of(&out)
    );
    let prefix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    for n in 1..=2 {
        let fake = format!("{prefix}-0000-4000-8000-00000000000{n}");
        rig.rt
            .block_on(rig.docker.create_volume(VolumeCreateRequest {
                name: Some(format!("caw-box-{fake}")),
                labels: Some(HashMap::from([
                    ("io.caw-box.managed".to_string(), "true".to_string()),
                    ("io.caw-box.session".to_string(), fake.clone()),
                    ("io.caw-box.provider".to_string(), "codex".to_string()),
                    ("io.caw-box.role".to_string(), "state".to_string()),
                    (TEST_LABEL.to_string(), rig.run_id.clone()),
                ])),
                ..Default::default()
            }))
            .unwrap();
    }
    let out = caw_out(&rig, &["show", prefix]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("is ambiguous"),
        "{}",
        stderr_of(&out)
    );
    assert!(stderr_of(&out).contains(&format!("{prefix}-0000-4000-8000-000000000001")));
}

#[test]
fn rm_and_gc() {
    let rig = Rig::new("rm-gc");
    let group = format!("g-{}", rig.run_id);
    let a = start(&rig, CODEX, "REMEMBER:a", &["--group", &group]);
    let b = start(&rig, CODEX, "REMEMBER:b", &["--group", &group]);

    // rm refuses a running turn unless --force, and then leaves no volume.
    let out = run(rig.resume_cmd(CODEX, &a, "SLEEP:120", &["--detach"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let out = caw_out(&rig, &["rm", &a]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("nothing was removed"),
        "{}",
        stderr_of(&out)
    );
    let out = caw_out(&rig, &["rm", "--force", &a]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), a);
    let left = rig.caw_volumes();
    assert!(left.iter().all(|v| !v.contains(&a)), "{left:?}");

    // gc --dry-run lists without deleting; gc deletes.
    std::thread::sleep(Duration::from_secs(2));
    let out = caw_out(
        &rig,
        &["gc", "--older-than", "1s", "--dry-run", "--group", &group],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains(&format!("would remove {b}")),
        "{}",
        stdout_of(&out)
    );
    assert!(rig.caw_volumes().contains(&format!("caw-box-{b}")));
    let out = caw_out(&rig, &["gc", "--older-than", "1s", "--group", &group]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains(&format!("removed {b}")),
        "{}",
        stdout_of(&out)
    );
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    assert!(rig.caw_containers().is_empty());
}

#[test]
fn a_group_of_two_vendors_resumes_with_one_command() {
    let rig = Rig::new("group");
    let group = format!("t-{}", rig.run_id);
    let c = start(&rig, CLAUDE, "REMEMBER:cedar", &["--group", &group]);
    let x = start(&rig, CODEX, "REMEMBER:xylem", &["--group", &group]);
    let mut cmd = rig.caw();
    cmd.args(["resume", "--group", &group, "-o", "json"])
        .args(["--env", &format!("ANTHROPIC_API_KEY={TEST_KEY}")])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .arg("RECALL");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let results: Vec<Value> = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(results.len(), 2, "{results:?}");
    for (id, fact) in [(&c, "cedar"), (&x, "xylem")] {
        let r = results
            .iter()
            .find(|r| r["session_id"] == id.as_str())
            .unwrap();
        assert_eq!(r["status"], "success", "{r}");
        assert!(
            r["result"]
                .as_str()
                .unwrap()
                .contains(&format!("remember {fact}")),
            "{r}"
        );
        assert_eq!(r["turn"], 2);
    }
    let out = caw_out(&rig, &["ls", "--group", &group, "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(rows.len(), 2);
    let out = caw_out(&rig, &["rm", "--group", &group]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
}

/// The logs that detached turns' drivers of session `id` left in the rig's data directory.
fn driver_logs(rig: &Rig, id: &str) -> Vec<String> {
    let dir = rig.data_dir.path().join("drivers").join(id);
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
