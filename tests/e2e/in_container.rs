//! caw-box where CI jobs run it (issue 19): inside a container that reaches the host's
//! Docker daemon through its socket (GitHub Actions `container:` jobs, GitLab's Docker
//! executor), so the daemon does not see caw-box's filesystem. Each step runs in a fresh
//! container, as jobs on ephemeral runners do: run, then resume and recall by name. The
//! workspace is copied into the session by itself (`--workspace-mode auto`), and no turn
//! container has a bind mount. The job's image is a minimal Debian without OpenSSL (the
//! rig's local base, debootstrap minbase plus node): caw-box links no libssl/libcrypto, so
//! it starts in such a job container (issue 29).

use bollard::models::{ContainerCreateBody, HostConfig};

use crate::common::*;

/// The host's Docker socket, as the rig's daemon listens on it.
fn socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

/// Runs `script` (bash) in a fresh job container: this build's caw-box on PATH, the host's
/// socket, and a workspace of its own at /job/ws that the daemon cannot see.
fn in_a_job(rig: &Rig, script: &str) -> (i64, String, String) {
    // The image has no OpenSSL (else this proves nothing), and caw-box starts in it.
    let setup = "set -e; if ls /lib/*/libssl.so* /usr/lib/*/libssl.so* /lib/*/libcrypto.so* \
                 /usr/lib/*/libcrypto.so* 2>/dev/null; then echo 'the job image has OpenSSL' >&2; \
                 exit 97; fi; caw-box --version >/dev/null; \
                 mkdir -p /job/ws; cd /job/ws; echo 'from the job' > notes.txt;";
    let image = std::env::var("CAW_BOX_LOCAL_BASE")
        .unwrap_or_else(|_| "caw-box-local/node:20-bookworm".to_string());
    rig.run_container(ContainerCreateBody {
        image: Some(image),
        entrypoint: Some(vec!["bash".into(), "-c".into()]),
        cmd: Some(vec![format!("{setup} {script}")]),
        user: Some("0".into()),
        env: Some(vec![
            "CAW_BOX_DATA_DIR=/job/data".into(),
            "CAW_BOX_CONFIG=/job/no-config.toml".into(),
            format!("CAW_BOX_LABELS={TEST_LABEL}={}", rig.run_id),
        ]),
        host_config: Some(HostConfig {
            binds: Some(vec![
                format!(
                    "{}:/usr/local/bin/caw-box:ro",
                    env!("CARGO_BIN_EXE_caw-box")
                ),
                format!("{}:/var/run/docker.sock", socket()),
            ]),
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The flags of a turn against this rig's stub, for `p`.
fn turn_flags(rig: &Rig, p: P) -> String {
    let model = p.model.map(|m| format!("--model {m}")).unwrap_or_default();
    format!(
        "--env {}={TEST_KEY} --network {} --endpoint {} {model} -o json",
        p.key_var,
        rig.network,
        rig.endpoint()
    )
}

#[test]
fn caw_box_in_a_container_with_the_hosts_socket_runs_and_resumes() {
    let rig = Rig::new("in-ctr");
    for p in [CODEX, CLAUDE] {
        check(&format!("{}: run in a job container", p.name));
        let name = format!("job-{}-{}", p.name.replace('_', ""), rig.run_id);
        let (code, out, err) = in_a_job(
            &rig,
            &format!(
                "caw-box run --provider {} --name {name} {} 'Please REMEMBER:papaya-17 for later.'",
                p.name,
                turn_flags(&rig, p)
            ),
        );
        assert_eq!(code, 0, "{}: {out}\n{err}", p.name);
        let first: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {out}\n{err}", p.name));
        assert_eq!(first["status"], "success", "{first}");
        assert!(
            err.contains(
                "copying the workspace into the session: the Docker daemon cannot mount /job/ws"
            ),
            "{}: {err}",
            p.name
        );
        let id = first["session_id"].as_str().unwrap().to_string();

        check(&format!("{}: resume in another job container", p.name));
        // A slow turn, to look at its container while it runs.
        let resumed = std::thread::scope(|s| {
            let job = s.spawn(|| {
                in_a_job(
                    &rig,
                    &format!(
                        "caw-box resume {name} --env {}={TEST_KEY} -o json 'SLEEP:3 RUN:cat notes.txt'",
                        p.key_var
                    ),
                )
            });
            let container =
                rig.wait_for_running_turn(Some(&id), std::time::Duration::from_secs(60));
            let mounts = rig.mounts_of(&container);
            assert!(
                mounts.iter().all(|m| m.typ.as_deref() == Some("volume")),
                "{}: a bind mount on the turn container: {mounts:?}",
                p.name
            );
            job.join().unwrap()
        });
        let (code, out, err) = resumed;
        assert_eq!(code, 0, "{}: {out}\n{err}", p.name);
        let second: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert!(
            second["result"]
                .as_str()
                .unwrap_or("")
                .contains("from the job"),
            "{}: the copied workspace is not there: {second}",
            p.name
        );

        check(&format!("{}: recall, from a third job container", p.name));
        let (code, out, err) = in_a_job(
            &rig,
            &format!(
                "caw-box resume {name} --env {}={TEST_KEY} -o json RECALL",
                p.key_var
            ),
        );
        assert_eq!(code, 0, "{}: {out}\n{err}", p.name);
        let third: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert!(
            third["result"]
                .as_str()
                .unwrap_or("")
                .contains("You told me to remember papaya-17"),
            "{}: {third}",
            p.name
        );
        assert_eq!(third["turn"], 3);
    }
}

#[test]
fn an_explicit_bind_the_daemon_cannot_see_is_refused() {
    let rig = Rig::new("in-ctr-bind");
    let (code, out, err) = in_a_job(
        &rig,
        &format!(
            "caw-box run --provider codex --workspace-mode bind {} hi",
            turn_flags(&rig, CODEX)
        ),
    );
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("--workspace-mode bind: the Docker daemon cannot mount /job/ws"),
        "{err}"
    );
    assert!(rig.caw_volumes().is_empty(), "{:?}", rig.caw_volumes());
}
