//! Walls without doors (issue 27): nothing the workspace or the agent controls runs on the
//! host because of caw-box. caw-box's own git steps never run a program the repository names
//! (a clean filter, `core.fsmonitor`), and `export` / `diff --patch` of a copied workspace
//! leave out the agent's changes to protected paths (git hooks and config, `.envrc`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;

/// Plants in the git repository `ws` a clean filter for every file and an fsmonitor
/// program, as a cloned repository or an earlier agent can leave them. On the host each
/// writes a marker into `marks` (outside the workspace); the filter also upper-cases what
/// it cleans, which shows in a tree or a patch wherever it ran (in a helper container too,
/// where the marker's directory does not exist).
fn plant(ws: &Path, marks: &Path) {
    let m = marks.display();
    let fsmonitor = marks.join("fsmonitor.sh");
    std::fs::write(
        &fsmonitor,
        format!("#!/bin/sh\necho fired >> {m}/fsmonitor.fired\nexit 1\n"),
    )
    .unwrap();
    std::fs::set_permissions(&fsmonitor, std::fs::Permissions::from_mode(0o755)).unwrap();
    git(
        ws,
        &["config", "core.fsmonitor", fsmonitor.to_str().unwrap()],
    );
    git(
        ws,
        &[
            "config",
            "filter.x.clean",
            &format!("echo fired >> {m}/filter.fired; tr a-z A-Z"),
        ],
    );
    std::fs::write(ws.join(".gitattributes"), "* filter=x\n").unwrap();
}

fn fired(marks: &Path) -> Vec<String> {
    ["filter.fired", "fsmonitor.fired"]
        .into_iter()
        .filter(|f| marks.join(f).exists())
        .map(String::from)
        .collect()
}

#[test]
fn programs_a_repository_names_never_run_on_the_host() {
    let rig = Rig::new("doors-plant");
    let ws = rig.workspace.path();
    let marks = tempfile::tempdir().unwrap();
    std::fs::write(ws.join("keep.txt"), "original\n").unwrap();
    git(ws, &["init", "-q"]);
    git(ws, &["add", "."]);
    git(ws, &["commit", "-qm", "base"]);
    plant(ws, marks.path());
    // Dirty: an untracked file for the filter to clean.
    std::fs::write(ws.join("draft.txt"), "draft\n").unwrap();
    for f in ["keep.txt", "draft.txt", ".gitattributes"] {
        std::os::unix::fs::chown(ws.join(f), Some(1000), Some(1000)).unwrap();
    }
    let nothing_fired = |after: &str| {
        assert_eq!(fired(marks.path()), Vec::<String>::new(), "after {after}");
    };

    // Bind mode: `run` records the baseline, `resume`, `diff --patch`.
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "RUN:echo changed > keep.txt && echo done", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    nothing_fired("run");
    let id = json["session_id"].as_str().unwrap().to_string();
    let (code, json, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, &id, "RUN:echo more > more.txt", &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    nothing_fired("resume");
    let out = rig.caw_run(&["diff", &id, "--patch"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let patch = stdout_of(&out);
    // Neither end of the patch went through the filter (here or in the helper container).
    assert!(patch.contains("-original\n+changed"), "{patch}");
    assert!(patch.contains("+more"), "{patch}");
    assert!(
        !patch.contains("CHANGED") && !patch.contains("DRAFT"),
        "{patch}"
    );
    nothing_fired("diff --patch");

    // Copy mode of the same repository: `export`, the listing and the patch.
    let ws_arg = ws.to_str().unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "RUN:echo copied > keep.txt && echo done",
        &["--workspace-mode", "copy", "--workspace", ws_arg],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let copy_id = json["session_id"].as_str().unwrap().to_string();
    let dest = rig.data_dir.path().join("exported");
    let out = rig.caw_run(&["export", &copy_id, dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(dest.join("keep.txt")).unwrap(),
        "copied\n"
    );
    let out = rig.caw_run(&["diff", &copy_id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let listing = stdout_of(&out);
    assert!(listing.contains("+copied"), "{listing}");
    assert!(!listing.contains("COPIED"), "{listing}");
    let out = rig.caw_run(&["diff", &copy_id, "--patch"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("+copied"), "{}", stdout_of(&out));
    nothing_fired("export and diff of a copy");

    // The positive control: the host's own `git add -A` in the same checkout runs both.
    let index = tempfile::NamedTempFile::new().unwrap();
    std::fs::copy(ws.join(".git/index"), index.path()).unwrap();
    // (The rig's workspace is the agent's, 1000's: root's git asks for safe.directory.)
    let control = std::process::Command::new("git")
        .args(["-c", "safe.directory=*", "add", "-A", "."])
        .env("GIT_INDEX_FILE", index.path())
        .current_dir(ws)
        .output()
        .unwrap();
    assert!(control.status.success(), "{control:?}");
    assert_eq!(
        fired(marks.path()),
        vec!["filter.fired".to_string(), "fsmonitor.fired".to_string()],
        "the plant did not fire under the host's git: the test proves nothing"
    );
}

/// What the agent does in a copied repository: a hook, a config change that names a program,
/// a direnv file, and a normal file.
const PLANT_IN_COPY: &str = "RUN:printf '#!/bin/sh\\necho hook\\n' > .git/hooks/pre-commit \
    && chmod +x .git/hooks/pre-commit && git config core.fsmonitor /tmp/evil \
    && echo 'export EVIL=1' > .envrc && echo normal > normal.txt && echo done";

fn protected_of(json: &serde_json::Value) -> Vec<(String, String, bool)> {
    let mut v: Vec<(String, String, bool)> = json["protected"]
        .as_array()
        .unwrap_or_else(|| panic!("no protected list: {json}"))
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
                c["included"].as_bool().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn export_and_patch_of_a_copy_leave_the_agents_protected_changes_out() {
    let rig = Rig::new("doors-protected");
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("keep.txt"), "original\n").unwrap();
    git(host.path(), &["init", "-q"]);
    git(host.path(), &["add", "."]);
    git(host.path(), &["commit", "-qm", "base"]);
    let config_before = std::fs::read_to_string(host.path().join(".git/config")).unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        PLANT_IN_COPY,
        &[
            "--workspace-mode",
            "copy",
            "--workspace",
            host.path().to_str().unwrap(),
        ],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap().to_string();
    let out_dir = |name: &str| rig.data_dir.path().join(name);

    // export: the normal file and the untouched repository; not the hook, config or .envrc.
    let dest = out_dir("plain");
    let out = rig.caw_run(&["export", &id, dest.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let left_out = vec![
        (".envrc".to_string(), "added".to_string(), false),
        (".git/config".to_string(), "modified".to_string(), false),
        (
            ".git/hooks/pre-commit".to_string(),
            "added".to_string(),
            false,
        ),
    ];
    assert_eq!(protected_of(&json), left_out, "{json}");
    let err = stderr_of(&out);
    for named in [
        ".git/config (modified)",
        ".git/hooks/pre-commit (added)",
        ".envrc",
    ] {
        assert!(err.contains(named), "{named} not in: {err}");
    }
    assert!(err.contains("--include-protected"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dest.join("normal.txt")).unwrap(),
        "normal\n"
    );
    assert!(dest.join(".git/HEAD").is_file());
    assert!(dest.join(".git/hooks/pre-push.sample").is_file());
    for gone in [".git/hooks/pre-commit", ".git/config", ".envrc"] {
        assert!(!dest.join(gone).exists(), "{gone} was written");
    }

    // --include-protected: all of it, as the agent left it.
    let all = out_dir("all");
    let out = rig.caw_run(&["export", &id, all.to_str().unwrap(), "--include-protected"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains(".git/hooks/pre-commit"));
    let hook = all.join(".git/hooks/pre-commit");
    assert_ne!(
        std::fs::metadata(&hook).unwrap().permissions().mode() & 0o111,
        0
    );
    let config = std::fs::read_to_string(all.join(".git/config")).unwrap();
    assert!(config.contains("fsmonitor = /tmp/evil"), "{config}");
    assert_ne!(config, config_before);
    assert!(all.join(".envrc").is_file());

    // diff --patch: the normal file, not .envrc; the .git changes named (never in a patch).
    let file = out_dir("plain.patch");
    let out = rig.caw_run(&["diff", &id, "--patch", file.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(protected_of(&json), left_out, "{json}");
    let err = stderr_of(&out);
    for named in [".git/config", ".git/hooks/pre-commit", ".envrc"] {
        assert!(err.contains(named), "{named} not in: {err}");
    }
    let patch = std::fs::read_to_string(&file).unwrap();
    assert!(patch.contains("+normal"), "{patch}");
    assert!(
        !patch.contains(".envrc") && !patch.contains("EVIL"),
        "{patch}"
    );

    let file = out_dir("all.patch");
    let out = rig.caw_run(&[
        "diff",
        &id,
        "--patch",
        file.to_str().unwrap(),
        "--json",
        "--include-protected",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        protected_of(&json),
        vec![
            (".envrc".to_string(), "added".to_string(), true),
            (".git/config".to_string(), "modified".to_string(), false),
            (
                ".git/hooks/pre-commit".to_string(),
                "added".to_string(),
                false
            ),
        ],
        "{json}"
    );
    let patch = std::fs::read_to_string(&file).unwrap();
    assert!(
        patch.contains("+export EVIL=1") && patch.contains("+normal"),
        "{patch}"
    );

    // --json with the patch on stdout: refused before anything runs.
    let out = rig.caw_run(&["diff", &id, "--patch", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}
