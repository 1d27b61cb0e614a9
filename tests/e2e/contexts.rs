//! Docker endpoints as the docker CLI resolves them (issue 16): with `DOCKER_HOST` unset,
//! the current context of `$DOCKER_CONFIG/config.json` is used for a real run and resume
//! (its endpoint is the test daemon through a second path, a socket symlink);
//! `DOCKER_CONTEXT` and `--context` override it; a context whose socket is missing is
//! exit 3, naming the context.

use crate::common::*;

/// The rig daemon's socket path.
fn socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

/// A context as `docker context create NAME --docker host=HOST` writes it.
fn write_context(dir: &std::path::Path, name: &str, host: &str) {
    caw_box::backend::docker::endpoint::write_context(dir, name, host).unwrap();
}

#[test]
fn the_current_docker_context_is_used_and_can_be_overridden() {
    let rig = Rig::new("contexts");
    let dir = tempfile::tempdir().unwrap();
    let alt = dir.path().join("alt.sock");
    std::os::unix::fs::symlink(socket(), &alt).unwrap();
    write_context(dir.path(), "alt", &format!("unix://{}", alt.display()));
    write_context(
        dir.path(),
        "broken",
        "unix:///nonexistent/caw-box-test.sock",
    );
    let set_current = |name: &str| {
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"currentContext":"{name}"}}"#),
        )
        .unwrap();
    };
    let with_config = |mut c: std::process::Command| {
        c.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env("DOCKER_CONFIG", dir.path());
        c
    };

    check("the current context");
    set_current("alt");
    let mut doctor = with_config(rig.caw());
    doctor.arg("doctor");
    let out = run(doctor);
    assert!(
        stdout_of(&out).contains(&format!(
            "✓ docker: unix://{} (context alt, the current one in",
            alt.display()
        )),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
    let name = format!("ctx-{}", rig.run_id);
    let (code, first, stderr) = rig.json_turn(with_config(rig.run_cmd(
        CODEX,
        "Please REMEMBER:papaya-17 for later.",
        &["--name", &name],
    )));
    assert_eq!(code, 0, "{first}\n{stderr}");

    check("a context whose socket is missing: exit 3, naming it");
    set_current("broken");
    let mut ls = with_config(rig.caw());
    ls.arg("ls");
    let out = run(ls);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("context broken"),
        "{}",
        stderr_of(&out)
    );

    check("--context and DOCKER_CONTEXT override the current one");
    let (code, second, stderr) = rig.json_turn(with_config(rig.resume_cmd(
        CODEX,
        &name,
        "RECALL",
        &["--context", "alt"],
    )));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert!(
        second["result"]
            .as_str()
            .unwrap_or("")
            .contains("You told me to remember papaya-17"),
        "{second}"
    );
    let mut ls = with_config(rig.caw());
    ls.args(["ls", "--json"]).env("DOCKER_CONTEXT", "alt");
    let out = run(ls);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains(&name), "{}", stdout_of(&out));
    let mut gone = with_config(rig.caw());
    gone.args(["ls", "--context", "nowhere"]);
    let out = run(gone);
    assert_eq!(out.status.code(), Some(3), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("Docker context 'nowhere' does not exist"),
        "{}",
        stderr_of(&out)
    );
}
