//! Portable sessions (issue 19): `session export` writes one archive without a credential;
//! after every caw-box object and the data directory are gone, `session import` recreates
//! the session and its old handle resumes it, recalling turn 1. Damaged archives and
//! imports over an existing session are refused with exit 2, creating nothing.

use std::io::Read;

use crate::common::*;

fn caw(rig: &Rig, args: &[&str]) -> std::process::Output {
    let mut c = rig.caw();
    c.args(args);
    run(c)
}

/// Every entry of a gzip-compressed tar: (path, contents).
fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    tar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (path, data)
        })
        .collect()
}

#[test]
fn an_exported_session_resumes_on_an_emptied_host_by_its_old_handle() {
    let rig = Rig::new("portable");
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("notes.txt"), "from the host\n").unwrap();
    let name = format!("p-{}", rig.run_id);

    check("run, in copy mode, with a tool call (codex keeps shell snapshots of its env)");
    let ws = host.path().to_str().unwrap();
    let (code, first, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "Please REMEMBER:papaya-17 for later.",
        &[
            "--name",
            &name,
            "--workspace-mode",
            "copy",
            "--workspace",
            ws,
        ],
    ));
    assert_eq!(code, 0, "{first}\n{stderr}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let (code, second, stderr) = rig.json_turn(rig.resume_cmd(
        CODEX,
        &name,
        "RUN:echo made-by-agent > made.txt && env | grep -c OPENAI",
        &[],
    ));
    assert_eq!(code, 0, "{second}\n{stderr}");
    let handle = second["resume_handle"].as_str().unwrap().to_string();

    check("export");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.tar.gz");
    let mut export = rig.caw();
    export
        .args(["session", "export", &name, file.to_str().unwrap()])
        // As in a CI job: the key is in the environment of the exporting process too.
        .env(CODEX.key_var, TEST_KEY);
    let out = run(export);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(&format!("exported session {id}")),
        "{}",
        stderr_of(&out)
    );
    let archive = std::fs::read(&file).unwrap();
    let all = entries(&archive);
    assert_eq!(all[0].0, "caw-box-session.json");
    let state = format!("volumes/caw-box-{id}/");
    let workspace = format!("volumes/caw-box-{id}-workspace/");
    assert!(all
        .iter()
        .any(|(p, _)| p == &format!("{state}.caw-box/session.json")));
    assert!(all
        .iter()
        .any(|(p, _)| p.starts_with(&format!("{state}.codex/sessions/"))));
    assert!(all
        .iter()
        .any(|(p, d)| p == &format!("{workspace}made.txt") && d == b"made-by-agent\n"));
    for (path, data) in &all {
        assert!(
            !data
                .windows(TEST_KEY.len())
                .any(|w| w == TEST_KEY.as_bytes()),
            "the key is in the archive, in {path}"
        );
    }
    // Refused without --force: the file exists.
    let out = caw(&rig, &["session", "export", &name, file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));

    check("a damaged archive: exit 2, nothing created");
    let out = caw(&rig, &["rm", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    std::fs::remove_dir_all(rig.data_dir.path()).unwrap();
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    let truncated = dir.path().join("truncated.tar.gz");
    std::fs::write(&truncated, &archive[..archive.len() / 2]).unwrap();
    let out = caw(&rig, &["session", "import", truncated.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("not a usable caw-box session archive"),
        "{}",
        stderr_of(&out)
    );
    let foreign = dir.path().join("foreign.tar.gz");
    std::fs::write(&foreign, b"\x1f\x8b not really").unwrap();
    let out = caw(&rig, &["session", "import", foreign.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
    assert!(
        rig.caw_containers().is_empty(),
        "{:?}",
        rig.caw_containers()
    );

    check("import, then resume by the old handle: recalls");
    let out = caw(&rig, &["session", "import", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), id);
    let (code, third, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &handle, "RECALL", &[]));
    assert_eq!(code, 0, "{third}\n{stderr}");
    assert_eq!(third["turn"], 3, "{third}");
    assert!(
        third["result"]
            .as_str()
            .unwrap()
            .contains("You told me to remember papaya-17"),
        "{third}"
    );
    // The copy-mode workspace came along.
    let out_dir = tempfile::tempdir().unwrap();
    let out = caw(
        &rig,
        &["export", &name, out_dir.path().to_str().unwrap(), "--force"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("made.txt")).unwrap(),
        "made-by-agent\n"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("notes.txt")).unwrap(),
        "from the host\n"
    );

    check("import over the existing session: exit 2, unless --force");
    let out = caw(&rig, &["session", "import", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("exists on this host"),
        "{}",
        stderr_of(&out)
    );
    let out = caw(
        &rig,
        &["session", "import", file.to_str().unwrap(), "--force"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    // --force replaced it with the archive's state: two turns again.
    let out = caw(&rig, &["show", &name, "--json"]);
    let show: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(show["turns"].as_array().map(Vec::len), Some(2), "{show}");
}
