//! Credentials (issue 5): collected API keys and credential files reach each CLI (the stub
//! refuses any request without the key), no secret shows in `docker inspect`, the state
//! volume, caw-box's output or logs, and a token the CLI replaced during a turn is written
//! back to the store and given to the next turn.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// `caw-box auth collect --provider P` with `HOME` at `home` and the extra `env`.
fn collect(rig: &Rig, p: P, home: &std::path::Path, env: &[(&str, &str)]) -> String {
    let mut c = rig.caw();
    c.args(["auth", "collect", "--provider", p.name])
        .env("HOME", home)
        .envs(env.iter().copied());
    let out = run(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(!stdout_of(&out).contains(TEST_KEY) && !stderr_of(&out).contains(TEST_KEY));
    stdout_of(&out)
}

#[test]
fn collected_api_keys_reach_every_cli() {
    let rig = Rig::new("auth-env");
    let home = tempfile::tempdir().unwrap();
    for p in ALL {
        let said = collect(&rig, p, home.path(), &[(p.key_var, TEST_KEY)]);
        assert!(said.contains(&format!("env:{}", p.key_var)), "{said}");
        let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(p, "REMEMBER:keyed", &[]));
        assert_eq!(code, 0, "{}: {json}\n{stderr}", p.name);
        assert!(
            json["result"].as_str().unwrap().contains("Noted: keyed."),
            "{json}"
        );
        assert!(!json.to_string().contains(TEST_KEY) && !stderr.contains(TEST_KEY));
        let id = json["session_id"].as_str().unwrap();
        assert_eq!(
            volume_files_containing(&rig, id, TEST_KEY),
            Vec::<String>::new(),
            "{}",
            p.name
        );
    }
    assert!(rig.stub_requests().iter().all(|r| r["status"] != 401));

    let mut c = rig.caw();
    c.args(["auth", "status", "--json"]);
    let out = run(c);
    assert!(!stdout_of(&out).contains(TEST_KEY));
    let status: Vec<Value> = serde_json::from_str(&stdout_of(&out)).unwrap();
    for s in &status {
        assert_eq!(s["present"], true, "{s}");
        let item = &s["items"][0];
        assert!(
            item["source"].as_str().unwrap().starts_with("env:"),
            "{item}"
        );
        assert_eq!(item["sha256"].as_str().unwrap().len(), 64);
    }
    let mut c = rig.caw();
    c.args(["auth", "flags", "--provider", "codex"]);
    let out = run(c);
    let flags = stdout_of(&out);
    assert!(
        flags.trim().starts_with("-v ") && flags.contains("/auth/codex:/run/caw-box/auth:ro"),
        "{flags}"
    );
    assert!(!flags.contains(TEST_KEY));
    let mut c = rig.caw();
    c.args(["auth", "rm", "--provider", "codex"]);
    assert_eq!(run(c).status.code(), Some(0));
    let out = run(rig.run_cmd_stored_key(CODEX, "hi", &[]));
    assert_eq!(out.status.code(), Some(4), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("caw-box auth collect --provider codex"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn credential_files_from_the_host_reach_every_cli_and_never_leak() {
    let rig = Rig::new("auth-files");
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let write = |rel: &str, text: String| {
        let path = h.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        ".claude/.credentials.json",
        format!(
            r#"{{"claudeAiOauth":{{"accessToken":"{TEST_KEY}","refreshToken":"refresh-me","expiresAt":4102444800000,"scopes":["user:inference"]}}}}"#
        ),
    );
    write(
        ".codex/auth.json",
        format!(r#"{{"OPENAI_API_KEY":"{TEST_KEY}"}}"#),
    );
    write(
        ".local/share/opencode/auth.json",
        format!(r#"{{"openai":{{"type":"api","key":"{TEST_KEY}"}}}}"#),
    );
    write(".gemini/.env", format!("GEMINI_API_KEY={TEST_KEY}\n"));
    for p in ALL {
        collect(&rig, p, h, &[]);
    }

    // A slow turn: nothing secret in docker inspect of its container.
    let mut cmd = rig.run_cmd_stored_key(CLAUDE, "SLEEP:4 REMEMBER:hidden", &["-o", "json"]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    let inspect = rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .unwrap();
    let inspect_json = serde_json::to_string(&inspect).unwrap();
    assert!(
        !inspect_json.contains(TEST_KEY),
        "a secret shows in docker inspect"
    );
    let out = wait_with_deadline(child, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert!(
        json["result"].as_str().unwrap().contains("Noted: hidden."),
        "{json}"
    );
    let claude_id = json["session_id"].as_str().unwrap().to_string();
    // Claude sent the OAuth token as a bearer token: the file reached it.
    assert!(rig.stub_requests().iter().any(|r| r["path"]
        .as_str()
        .unwrap_or("")
        .starts_with("/v1/messages")
        && r["key_header"] == "authorization"
        && r["status"] == 200));

    for p in [CODEX, OPENCODE, GEMINI] {
        let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(p, "REMEMBER:filed", &[]));
        assert_eq!(code, 0, "{}: {json}\n{stderr}", p.name);
        assert!(
            json["result"].as_str().unwrap().contains("Noted: filed."),
            "{json}"
        );
        let id = json["session_id"].as_str().unwrap();
        assert_eq!(
            volume_files_containing(&rig, id, TEST_KEY),
            Vec::<String>::new(),
            "{}",
            p.name
        );
        let mut c = rig.caw();
        c.args(["logs", id, "--raw"]);
        assert!(
            !stdout_of(&run(c)).contains(TEST_KEY),
            "{}: raw log",
            p.name
        );
    }
    assert_eq!(
        volume_files_containing(&rig, &claude_id, TEST_KEY),
        Vec::<String>::new()
    );
    let mut c = rig.caw();
    c.args(["logs", &claude_id]);
    assert!(!stdout_of(&run(c)).contains(TEST_KEY));
}

/// A JWT with the given `exp` (unsigned: caw-box only compares expiries).
fn jwt(exp: u64) -> String {
    use base64::Engine;
    let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.sig",
        enc(r#"{"alg":"none"}"#),
        enc(&format!(r#"{{"exp":{exp}}}"#))
    )
}

#[test]
fn a_token_replaced_by_rename_is_written_back_and_used_next_turn() {
    let rig = Rig::new("auth-refresh");
    let home = tempfile::tempdir().unwrap();
    let old = jwt(2_000_000_000);
    let new = jwt(2_100_000_000);
    let path = home.path().join(".codex/auth.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        format!(r#"{{"OPENAI_API_KEY":"{TEST_KEY}","tokens":{{"access_token":"{old}"}}}}"#),
    )
    .unwrap();
    collect(&rig, CODEX, home.path(), &[]);

    // The CLI (here: a shell command it runs) replaces the file by rename, as CLIs do.
    let refresh = format!(
        r#"RUN:printf '%s' '{{"OPENAI_API_KEY":"{TEST_KEY}","tokens":{{"access_token":"{new}"}}}}' > ~/.codex/auth.tmp && mv ~/.codex/auth.tmp ~/.codex/auth.json && echo refreshed"#
    );
    let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(CODEX, &refresh, &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    assert!(
        json["result"].as_str().unwrap().contains("refreshed"),
        "{json}"
    );
    let id = json["session_id"].as_str().unwrap().to_string();

    let stored =
        std::fs::read_to_string(rig.data_dir.path().join("auth/codex/home/.codex/auth.json"))
            .unwrap();
    assert!(
        stored.contains(&new),
        "the store kept the old token: {stored}"
    );
    let mut c = rig.caw();
    c.args(["auth", "status", "--json"]);
    let status: Vec<Value> = serde_json::from_str(&stdout_of(&run(c))).unwrap();
    let codex = status.iter().find(|s| s["provider"] == "codex").unwrap();
    let file = codex["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["target"] == ".codex/auth.json")
        .unwrap();
    assert_eq!(file["expires_at"], 2_100_000_000u64, "{file}");
    assert!(file["refreshed_at"].is_u64(), "{file}");

    // Collecting the host's older copy again does not undo the refresh.
    let said = collect(&rig, CODEX, home.path(), &[]);
    assert!(said.contains("kept"), "{said}");

    // The next turn gets the new value, and nothing of it stays in the volume after.
    let mut cmd = rig.resume_cmd(CODEX, &id, "RUN:cat ~/.codex/auth.json", &[]);
    cmd.args(["-o", "json"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let answer = json["result"].as_str().unwrap();
    assert!(answer.contains(&new[..40]), "{answer}");
    // (The conversation now quotes the token: the agent printed it. The file is gone.) The
    // same find must see the session's record: it looked in the session's volume.
    assert_eq!(
        in_volume(
            &rig,
            &id,
            &[
                "find",
                "/h/.codex",
                "/h/.caw-box",
                "-name",
                "auth.json",
                "-o",
                "-name",
                "session.json"
            ]
        ),
        vec![SESSION_RECORD.to_string()]
    );
}

#[test]
fn status_flags_an_expired_login_and_collect_reports_nothing_found() {
    let rig = Rig::new("auth-status");
    let home = tempfile::tempdir().unwrap();
    let said = collect(&rig, GEMINI, home.path(), &[]);
    assert!(said.contains("gemini: nothing to collect"), "{said}");

    let creds = home.path().join(".claude/.credentials.json");
    std::fs::create_dir_all(creds.parent().unwrap()).unwrap();
    std::fs::write(
        &creds,
        r#"{"claudeAiOauth":{"accessToken":"expired-token","refreshToken":"r","expiresAt":1000000000000}}"#,
    )
    .unwrap();
    collect(&rig, CLAUDE, home.path(), &[]);
    let mut c = rig.caw();
    c.args(["auth", "status"]);
    let out = stdout_of(&run(c));
    let row = out
        .lines()
        .find(|l| l.starts_with("claude_code") && l.contains(".claude/.credentials.json"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("(EXPIRED)") && row.contains("expired"),
        "{row}"
    );
    assert!(!out.contains("expired-token"));
    let mut c = rig.caw();
    c.args(["auth", "status", "--json"]);
    let status: Vec<Value> = serde_json::from_str(&stdout_of(&run(c))).unwrap();
    let claude = status
        .iter()
        .find(|s| s["provider"] == "claude_code")
        .unwrap();
    assert_eq!(claude["items"][0]["state"], "expired");
    assert_eq!(claude["items"][0]["expires_at"], 1_000_000_000u64);
    let mut c = rig.caw();
    c.arg("doctor");
    let out = run(c);
    assert_eq!(out.status.code(), Some(3), "{}", stdout_of(&out));
    assert!(
        stdout_of(&out).contains("✗ claude_code: stored login expired"),
        "{}",
        stdout_of(&out)
    );
}

/// A driver killed too hard to clean up (SIGKILL) leaves its turn's container and runtime
/// volume, with no credential in them; whoever records the turn removes them.
#[test]
fn a_killed_drivers_turn_leaves_no_credential_and_goes_with_the_next_turn() {
    let rig = Rig::new("sweep");
    let home = tempfile::tempdir().unwrap();
    collect(&rig, CODEX, home.path(), &[("OPENAI_API_KEY", TEST_KEY)]);

    let mut slow = rig.run_cmd_stored_key(CODEX, "SLEEP:3 REMEMBER:killed", &[]);
    slow.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = slow.spawn().unwrap();
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    // The runtime directory is a volume of the turn container's own, never a host path:
    // the one bind mount is the workspace.
    let mounts = rig.mounts_of(&container);
    assert!(
        mounts
            .iter()
            .all(|m| m.typ.as_deref() != Some("bind")
                || m.destination.as_deref() == Some("/workspace")),
        "a bind mount: {mounts:?}"
    );
    let runtime = mounts
        .iter()
        .find(|m| m.destination.as_deref() == Some("/run/caw-box"))
        .and_then(|m| m.name.clone())
        .expect("the runtime volume");
    // The entrypoint deleted the key from it once read, before it started the CLI: once the
    // CLI's request reached the stub, nothing is to be found at rest. (Scanned as soon as
    // the container runs, the directory can still be empty: the entrypoint unpacks it from
    // its stdin first.) The same grep finds the scrub list the entrypoint keeps there,
    // naming codex's login file.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !rig
        .stub_requests()
        .iter()
        .any(|r| r["body"].to_string().contains("REMEMBER:killed"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI sent no request"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let holding = scan_named_volume(
        &rig,
        &runtime,
        &[TEST_KEY],
        ("/h/scrub", ".codex/auth.json"),
    );
    assert_eq!(
        holding,
        Vec::<String>::new(),
        "the key stays in the runtime directory"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The CLI ends on its own; the container stays, with nobody to remove it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
    {
        assert!(std::time::Instant::now() < deadline, "the turn never ended");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Another session's turn leaves it (it is the killed turn's session's to record); the
    // next caw-box that lists the sessions records it, as its driver would have: the
    // container goes, and its runtime volume with it. (Another test's `ls` may be first.)
    let (code, json, stderr) = rig.json_turn(rig.run_cmd_stored_key(CODEX, "REMEMBER:next", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let mut ls = rig.caw();
    ls.args(["ls", "--json"]);
    let out = run(ls);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let gone = rig.rt.block_on(rig.docker.inspect_volume(&runtime));
    assert!(
        gone.is_err(),
        "the killed turn's runtime volume is still there"
    );
    let killed = container
        .trim_start_matches('/')
        .trim_start_matches("caw-box-");
    let mut show = rig.caw();
    show.args(["show", killed, "--json"]);
    let out = run(show);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout_of(&out)).unwrap();
    assert_eq!(shown["turns"][0]["result"], "Noted: killed.", "{shown}");
    // Nothing of a turn's runtime is on the host: the key is in the store alone. (Of the
    // session records this test's `ls` may have written, only its own two sessions' count:
    // another test's killed driver leaves a turn that this `ls` records here too, and a
    // test may have put the key in a prompt on purpose.)
    let next = json["session_id"]
        .as_str()
        .expect("the next turn's session");
    let sessions = rig.data_dir.path().join("sessions");
    let ours = |f: &std::path::Path| {
        !f.starts_with(&sessions)
            || [killed, next].iter().any(|id| {
                f.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(id))
            })
    };
    let outside_store: Vec<_> = walkdir(rig.data_dir.path())
        .into_iter()
        .filter(|f| !f.starts_with(rig.data_dir.path().join("auth")) && ours(f))
        .filter(|f| {
            std::fs::read(f)
                .is_ok_and(|b| b.windows(TEST_KEY.len()).any(|w| w == TEST_KEY.as_bytes()))
        })
        .collect();
    assert_eq!(
        outside_store,
        Vec::<std::path::PathBuf>::new(),
        "where the key was found: {}",
        key_context(&outside_store)
    );
    rig.cleanup();
}

/// Each of `files` where it holds the test key: 200 characters either side of it, the key
/// itself written as `<TEST_KEY>`.
fn key_context(files: &[std::path::PathBuf]) -> String {
    let mut said = String::new();
    for file in files {
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap_or_default()).into_owned();
        for (at, _) in text.match_indices(TEST_KEY) {
            // (`str::floor_char_boundary` is newer than the crate's MSRV.)
            let mut from = at.saturating_sub(200);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            let mut to = (at + TEST_KEY.len() + 200).min(text.len());
            while !text.is_char_boundary(to) {
                to += 1;
            }
            said += &format!(
                "\n{}: …{}…",
                file.display(),
                text[from..to].replace(TEST_KEY, "<TEST_KEY>")
            );
        }
    }
    said
}

/// Every file below `dir`.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
}
