//! `diff --patch` (issue 19): the agent's changes as a patch that `git apply` takes on the
//! workspace as it was at session start — new, deleted, renamed, binary and mode changes —
//! for a copy-mode workspace and for a bind-mode git workspace (dirty at start).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;

/// The workspace at session start (also rebuilt as the pristine copy a patch applies to).
fn start_tree(dir: &Path) {
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write(".gitignore", b"*.log\n");
    write("keep.txt", b"original\n");
    write("old.txt", b"to be removed\n");
    write(
        "move-me.txt",
        "a file that moves, line by line\n".repeat(8).as_bytes(),
    );
    write("script.sh", b"echo hi\n");
    write("blob.bin", b"\x00\x01binary\x00\xff");
    write("debug.log", b"ignored\n");
}

/// What the agent does: a change, a new file, a deletion, a rename, a mode change, a new and
/// a changed binary file, and a file .gitignore keeps out of the patch.
const CHANGE: &str = "RUN:echo changed > keep.txt && echo new > new.txt && rm old.txt \
    && mv move-me.txt moved.txt && chmod +x script.sh && printf 'new\\000bin\\001' > new.bin \
    && printf 'more\\000\\002' >> blob.bin && echo noise > more.log && echo done";

/// The agent (uid 1000, the tree's owner: caw-box as root runs it as the workspace's) may
/// change, chmod and delete the files, as in a user's own tree.
fn hand_to_agent(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != ".git" {
            std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
        }
    }
    std::os::unix::fs::chown(dir, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// `diff --patch` to stdout and to a file: the same bytes; returns them.
fn patch_of(rig: &Rig, id: &str) -> Vec<u8> {
    let out = rig.caw_run(&["diff", id, "--patch"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let file = rig.data_dir.path().join(format!("{id}.patch"));
    let to_file = rig.caw_run(&["diff", id, "--patch", file.to_str().unwrap()]);
    assert_eq!(to_file.status.code(), Some(0), "{}", stderr_of(&to_file));
    assert_eq!(std::fs::read(&file).unwrap(), out.stdout);
    out.stdout
}

/// The patch names every kind of change, and leaves out what .gitignore ignores.
fn assert_kinds(patch: &str) {
    for needle in [
        "diff --git a/keep.txt b/keep.txt",
        "new file mode 100644",
        "deleted file mode 100644",
        "rename from move-me.txt",
        "rename to moved.txt",
        "old mode 100644\nnew mode 100755",
        "GIT binary patch",
    ] {
        assert!(patch.contains(needle), "'{needle}' not in:\n{patch}");
    }
    assert!(!patch.contains("more.log"), "an ignored file:\n{patch}");
}

/// Applies the patch to a pristine copy of the start (`git apply --check`, then for real)
/// and compares with the agent's tree.
fn assert_applies(patch: &[u8], make_start: impl Fn(&Path), agents: &Path) {
    let pristine = tempfile::tempdir().unwrap();
    make_start(pristine.path());
    let patch_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(patch_file.path(), patch).unwrap();
    let file = patch_file.path().to_str().unwrap();
    git(pristine.path(), &["apply", "--check", file]);
    git(pristine.path(), &["apply", file]);
    for name in [
        "keep.txt",
        "new.txt",
        "moved.txt",
        "new.bin",
        "blob.bin",
        "script.sh",
    ] {
        assert_eq!(
            std::fs::read(pristine.path().join(name)).unwrap(),
            std::fs::read(agents.join(name)).unwrap(),
            "{name}"
        );
    }
    assert!(!pristine.path().join("old.txt").exists());
    assert!(!pristine.path().join("move-me.txt").exists());
    let mode = std::fs::metadata(pristine.path().join("script.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_ne!(mode & 0o100, 0, "script.sh is not executable: {mode:o}");
}

#[test]
fn a_copy_mode_patch_applies_to_the_tree_as_copied() {
    let rig = Rig::new("patch-copy");
    let host = tempfile::tempdir().unwrap();
    start_tree(host.path());
    let ws = host.path().to_str().unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        CHANGE,
        &["--workspace-mode", "copy", "--workspace", ws],
    ));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap();

    let patch = patch_of(&rig, id);
    assert_kinds(&String::from_utf8_lossy(&patch));
    let agents = tempfile::tempdir().unwrap();
    let dest = agents.path().join("out");
    let out = rig.caw_run(&["export", id, dest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // The baseline lives in the state volume: not in the exported workspace.
    let exported: Vec<String> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        exported.iter().all(|n| !n.contains("caw-box")),
        "{exported:?}"
    );
    assert_applies(&patch, start_tree, &dest);
}

#[test]
fn a_bind_mode_patch_applies_to_the_working_tree_as_it_was_at_start() {
    let rig = Rig::new("patch-bind");
    let ws = rig.workspace.path();
    start_tree(ws);
    git(ws, &["init", "-q"]);
    git(ws, &["add", "."]);
    git(ws, &["commit", "-qm", "base"]);
    // Dirty at session start: a change and an untracked file belong to the baseline.
    let dirty = |dir: &Path| {
        start_tree(dir);
        std::fs::write(dir.join("keep.txt"), "dirty\n").unwrap();
        std::fs::write(dir.join("draft.txt"), "untracked at start\n").unwrap();
    };
    dirty(ws);
    hand_to_agent(ws);
    let refs_before = git(ws, &["for-each-ref"]);
    let index_before = std::fs::read(ws.join(".git/index")).unwrap();
    let (code, json, stderr) = rig.json_turn(rig.run_cmd(CODEX, CHANGE, &[]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let id = json["session_id"].as_str().unwrap();

    let patch = patch_of(&rig, id);
    let text = String::from_utf8_lossy(&patch);
    assert_kinds(&text);
    assert!(text.contains("-dirty\n+changed"), "{text}");
    assert!(!text.contains("draft.txt"), "{text}");
    // The user's repository: the same index, refs and stash.
    assert_eq!(std::fs::read(ws.join(".git/index")).unwrap(), index_before);
    assert_eq!(git(ws, &["for-each-ref"]), refs_before);
    assert_eq!(git(ws, &["stash", "list"]), "");
    assert_applies(&patch, dirty, ws);

    // A bind-mode workspace that was no git repository has no baseline: refused, exit 2.
    let plain = tempfile::tempdir().unwrap();
    std::fs::set_permissions(plain.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let plain_ws = plain.path().to_str().unwrap();
    let (code, json, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "RUN:echo x > x.txt", &["--workspace", plain_ws]));
    assert_eq!(code, 0, "{json}\n{stderr}");
    let out = rig.caw_run(&["diff", json["session_id"].as_str().unwrap(), "--patch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("no baseline"),
        "{}",
        stderr_of(&out)
    );
    assert!(out.stdout.is_empty());
}
