//! Protected paths in bind mode (issue 27): during a turn the agent cannot write the
//! workspace's protected paths that exist (git's config and hooks, editors' and tools' own
//! files), while it writes and commits the rest; what protected path it creates is moved to
//! a quarantine directory after the turn, named on stderr and in the JSON result, also when
//! the turn is detached and another process waits for it. (The TUI turn's sweep is proven in
//! `interactive::codex_tui_session_resumes_headless_and_back`.)

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// Protected files the test plants (every default but `.git/commondir`, which would point
/// git elsewhere, and `.envrc` and `.mcp.json`, which the agent creates).
const PLANTED_FILES: &[&str] = &[
    ".git/config",
    ".git/config.worktree",
    ".gitmodules",
    ".caw-box.toml",
    "mise.toml",
    ".mise.toml",
    ".devcontainer.json",
    ".pre-commit-config.yaml",
    "lefthook.yml",
    ".lefthook.yml",
    "lefthook.yaml",
    ".lefthook.yaml",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".codex/config.toml",
    ".gemini/settings.json",
    "opencode.json",
    "opencode.jsonc",
];

/// Protected directories the test plants (each with a file in it).
const PLANTED_DIRS: &[&str] = &[
    ".git/hooks",
    ".git/info",
    ".git/modules",
    ".git/worktrees",
    ".vscode",
    ".idea",
    ".devcontainer",
    ".husky",
];

/// Hands the whole tree to the agent's uid, as a user's own checkout is the user's.
fn chown_tree(dir: &Path) {
    std::os::unix::fs::lchown(dir, Some(1000), Some(1000)).unwrap();
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            chown_tree(&entry.unwrap().path());
        }
    }
}

/// What under `dir` (itself included) `uid` does not own.
fn not_owned_by(dir: &Path, uid: u32) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut out = Vec::new();
    if meta.uid() != uid {
        out.push(format!("{} ({})", dir.display(), meta.uid()));
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            out.extend(not_owned_by(&entry.unwrap().path(), uid));
        }
    }
    out
}

/// A git workspace with every planted protected path; returns each planted file's bytes.
fn plant(ws: &Path) -> Vec<(String, Vec<u8>)> {
    git(ws, &["init", "-q"]);
    // The session's git baseline (written as root before the turn) leaves object
    // directories the agent's commit must write into.
    git(ws, &["config", "core.sharedRepository", "0666"]);
    std::fs::write(ws.join("README.md"), "start\n").unwrap();
    for d in PLANTED_DIRS {
        std::fs::create_dir_all(ws.join(d)).unwrap();
        std::fs::write(ws.join(d).join("planted"), "planted\n").unwrap();
    }
    for f in PLANTED_FILES.iter().filter(|f| **f != ".git/config") {
        let at = ws.join(f);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        let text = if f.ends_with(".json") || f.ends_with(".jsonc") {
            "{}\n"
        } else {
            "# planted\n"
        };
        std::fs::write(at, text).unwrap();
    }
    git(ws, &["add", "README.md"]);
    git(ws, &["commit", "-qm", "start"]);
    chown_tree(ws);
    PLANTED_FILES
        .iter()
        .map(|f| (f.to_string(), std::fs::read(ws.join(f)).unwrap()))
        .collect()
}

/// The agent tries to write each planted path and to rename `.git/hooks` away; it writes
/// and commits a file; it creates `.envrc` and `.mcp.json`. It prints little (the stub
/// quotes 300 characters of a tool's output): the paths it could write, and counts.
fn agent_script() -> String {
    let files = PLANTED_FILES.join(" ");
    let dirs = PLANTED_DIRS.join(" ");
    format!(
        "RUN:n=0; for p in {files}; do (printf x >> \"$p\") 2>/dev/null && echo \"WROTE:$p\" || n=$((n+1)); done; \
         for d in {dirs}; do touch \"$d/agent\" 2>/dev/null && echo \"WROTE:$d\" || n=$((n+1)); done; echo \"denied=$n\"; \
         mv .git/hooks .git/hooks-gone 2>/dev/null && echo WROTE:mv || echo mv-denied; \
         echo work > work.txt && git add work.txt && git -c user.name=agent -c user.email=a@b commit -qm by-agent && echo COMMITTED; \
         echo 'echo planted' > .envrc; echo '{{}}' > .mcp.json; echo done"
    )
}

/// The quarantine named in a result holds `paths`, moved out of workspace `ws`, and the
/// warning on stderr says so.
fn assert_quarantined(json: &Value, stderr: &str, rig: &Rig, ws: &Path, paths: &[&str]) {
    let q = &json["quarantined"];
    let listed: Vec<&str> = q["paths"]
        .as_array()
        .unwrap_or_else(|| panic!("no quarantine in the result: {json}"))
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(listed, paths, "{json}");
    let dir = Path::new(q["dir"].as_str().unwrap());
    assert!(dir.starts_with(rig.data_dir.path()), "{}", dir.display());
    for p in paths {
        assert!(
            std::fs::symlink_metadata(ws.join(p)).is_err(),
            "{p} is still in the workspace"
        );
        assert!(dir.join(p).exists(), "{p} is not in {}", dir.display());
    }
    assert!(
        stderr.contains(&format!(
            "warning: the agent created protected paths in the workspace ({})",
            paths.join(", ")
        )) && stderr.contains(&dir.display().to_string()),
        "{stderr}"
    );
}

#[test]
fn protected_paths_are_read_only_to_the_agent_and_what_it_plants_is_quarantined() {
    let rig = Rig::new("protect");
    let ws = rig.workspace.path();
    let planted = plant(ws);

    // A path that leaves the workspace: one line, exit 2, nothing made.
    let out = run(rig.run_cmd(CODEX, "hi", &["--protect", "../elsewhere"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("'../elsewhere' is not a path inside the workspace"));
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());

    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, &agent_script(), &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    // The session's git baseline (caw-box runs as root here) wrote the repository's objects
    // as its owner: an object directory root made would refuse the agent's commit whenever
    // its object fell there.
    assert_eq!(
        not_owned_by(&ws.join(".git/objects"), 1000),
        Vec::<String>::new()
    );
    let said = json["result"].as_str().unwrap();
    assert!(
        !said.contains("WROTE:"),
        "the agent wrote a protected path: {said}"
    );
    let all = PLANTED_FILES.len() + PLANTED_DIRS.len();
    assert!(said.contains(&format!("denied={all}")), "{said}");
    assert!(said.contains("mv-denied"), "{said}");
    assert!(said.contains("COMMITTED"), "{said}");
    for (f, bytes) in &planted {
        assert_eq!(&std::fs::read(ws.join(f)).unwrap(), bytes, "{f} changed");
    }
    for d in PLANTED_DIRS {
        assert!(!ws.join(d).join("agent").exists(), "{d}");
    }
    let log = git(ws, &["-c", "safe.directory=*", "log", "-1", "--format=%s"]);
    assert_eq!(log.trim(), "by-agent");
    assert_eq!(
        std::fs::read_to_string(ws.join("work.txt")).unwrap(),
        "work\n"
    );
    assert_quarantined(&json, &stderr, &rig, ws, &[".envrc", ".mcp.json"]);
    let id = json["session_id"].as_str().unwrap().to_string();

    // `show` lists the session's set.
    let out = rig.caw_run(&["show", &id, "--json"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let set: Vec<&str> = shown["protected_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for p in PLANTED_FILES.iter().chain(PLANTED_DIRS) {
        assert!(set.contains(p), "{p}: {shown}");
    }
    let out = rig.caw_run(&["show", &id]);
    assert!(
        stdout_of(&out).contains("protected  .git/config .git/config.worktree .git/hooks"),
        "{}",
        stdout_of(&out)
    );

    // --unprotect .git/hooks: that one the agent writes (and it stays); the rest holds.
    let (code, json, stderr) = rig.json_turn(rig.resume_cmd(
        CODEX,
        &id,
        "RUN:echo '#!/bin/sh' > .git/hooks/pre-commit && echo HOOK-WRITTEN; (printf x >> .git/config) 2>/dev/null && echo WROTE:config || echo DENIED:config",
        &["--unprotect", ".git/hooks"],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let said = json["result"].as_str().unwrap();
    assert!(said.contains("HOOK-WRITTEN"), "{said}");
    assert!(said.contains("DENIED:config"), "{said}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".git/hooks/pre-commit")).unwrap(),
        "#!/bin/sh\n"
    );
    assert!(json.get("quarantined").is_none(), "{json}");
    assert!(!stderr.contains("protected paths"), "{stderr}");
    rig.cleanup();
}

/// A detached turn: the driver in the background sweeps before it releases the session,
/// so `wait` in another process reports the quarantine (stderr and JSON).
#[test]
fn a_detached_turns_quarantine_is_reported_by_wait() {
    let rig = Rig::new("protect-detach");
    let ws = rig.workspace.path();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    chown_tree(ws);
    let prompt = "HOLD:swept RUN:touch .git/hooks/x 2>/dev/null && echo WROTE:hooks || echo DENIED:hooks; echo 'echo planted' > .envrc; echo made";
    let out = run(rig.run_cmd(CODEX, prompt, &["--detach"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let id = stdout_of(&out).trim().to_string();

    let mut wait = rig.caw();
    wait.args(["wait", &id, "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let waiting = wait.spawn().unwrap();
    rig.wait_held("swept");
    rig.stub_release("swept");
    let out = wait_with_deadline(waiting, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let said = json["result"].as_str().unwrap();
    assert!(
        said.contains("DENIED:hooks") && said.contains("made"),
        "{said}"
    );
    assert!(!ws.join(".git/hooks/x").exists());
    assert_quarantined(&json, &stderr_of(&out), &rig, ws, &[".envrc"]);
    rig.cleanup();
}
