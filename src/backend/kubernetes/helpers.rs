//! The pods of caw-box's helpers ([`HelperSpec`]): one run to its end
//! (`run_to_completion`), and one created as Docker creates a container, not yet started
//! (`create_helper`): its command waits for the start marker `start_container` leaves, so
//! whoever attached first reads its output from the first byte (its log, from the start) and
//! files move through it before (exec). A helper that goes out (a login,
//! [`HelperSpec::egress_allow`]) gets a turn pod's egress hold: the firewall init container
//! and the proxy sidecar on the pod's loopback. One whose written directory is read after its
//! command ended ([`HelperSpec::kept_dir`]) has that directory in the pod's memory, seeded
//! from the image by an init container, and a `keep` container that holds it for
//! [`KEPT_FOR`] once the command ended (files move through that one then). Not the turns'
//! pods (`spec.rs`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};

use super::sandbox::{claim_mounts, empty_dir, hardened, parse_user, pod_security};
use super::sandbox::{env_vars, seed_container, SEED_MOUNT};
use super::sidecars::{egress_init, proxy_container, PROXY_UID};
use super::sidecars::{POD_END_DIR, POD_END_FILE};
use super::spec::shell_quote;
use super::{failed, KubeBackend};
use crate::backend::{Attached, Backend, HelperSpec, MountSpec, NetworkPolicy, PROXY_PORT};
use crate::error::{Error, Result};

/// The helper's own container (the pod's first).
pub(super) const HELPER: &str = "helper";
/// The container that holds a helper's [`HelperSpec::kept_dir`] once its command ended.
pub(super) const KEEPER: &str = "keep";
/// How long the `keep` container holds the directory after the command ended: the caller
/// reads it and removes the pod long before; an abandoned pod (its caw-box killed) then ends.
pub(super) const KEPT_FOR: Duration = Duration::from_secs(300);
/// The start marker, in the pod's shared memory directory.
const START_FILE: &str = "start";
/// How long a created helper waits for its start (as a held one slept before).
const START_WAIT_TENTHS: u32 = 36_000;

/// A created helper's command: waits for the start marker (a helper never started ends after
/// an hour without running anything), then for the proxy sidecar's port when told
/// (`CAW_BOX_PROXY_WAIT`), runs its arguments (stdin passed on) and leaves the pod's end
/// marker with its exit code, for the sidecars.
const CREATED_ENTRY: &str = r#"n=0
until [ -e "$CAW_BOX_POD_DIR/start" ]; do
  n=$((n + 1))
  if [ "$n" -gt "$CAW_BOX_START_WAIT" ]; then : > "$CAW_BOX_POD_DIR/agent-ended"; exit 0; fi
  sleep 0.1
done
if [ -n "${CAW_BOX_PROXY_WAIT:-}" ]; then
  for _ in $(seq 100); do (: <"/dev/tcp/127.0.0.1/$CAW_BOX_PROXY_WAIT") 2>/dev/null && break; sleep 0.1; done
fi
"$@"
rc=$?
: > "$CAW_BOX_POD_DIR/agent-ended"
exit "$rc""#;

/// The pod of a helper: `created` (waits for its start, see the module docs), or its own
/// command run to its end.
pub fn helper_pod_spec(spec: &HelperSpec, created: bool) -> Result<PodSpec> {
    if spec.network != NetworkPolicy::None && spec.network != NetworkPolicy::Default {
        return Err(Error::usage(
            "helpers on a named network (an egress proxy) are not available with the kubernetes backend: a helper pod holds its egress itself",
        ));
    }
    let held = !spec.egress_allow.is_empty();
    if held && !created {
        return Err(Error::usage(
            "a helper run to its end cannot hold its egress on the kubernetes backend",
        ));
    }
    let (uid, gid) = helper_user(spec);
    if held && uid == PROXY_UID {
        return Err(Error::usage(format!(
            "a helper under the proxy sidecar's uid {uid} could pass its egress rules"
        )));
    }
    let (mut volumes, mut volume_mounts) = helper_volumes(spec, created)?;
    let mut security = hardened(uid, gid);
    if !spec.add_capabilities.is_empty() {
        if let Some(caps) = security.capabilities.as_mut() {
            caps.add = Some(spec.add_capabilities.clone());
        }
    }
    let (command, args) = match created {
        true if spec.entrypoint.is_empty() => {
            return Err(Error::usage(
                "a helper pod runs its own command: the image's entrypoint is not known here",
            ))
        }
        true => (Some(created_command(held)), Some(command_of(spec))),
        false => (
            (!spec.entrypoint.is_empty()).then(|| spec.entrypoint.clone()),
            (!spec.argv.is_empty()).then(|| spec.argv.clone()),
        ),
    };
    let mut env = spec.env.clone();
    if created {
        env.push(format!("CAW_BOX_POD_DIR={POD_END_DIR}"));
        env.push(format!("CAW_BOX_START_WAIT={START_WAIT_TENTHS}"));
    }
    if held {
        env.push(format!("CAW_BOX_PROXY_WAIT={PROXY_PORT}"));
    }
    let mut containers = vec![Container {
        name: HELPER.into(),
        image: Some(spec.image.clone()),
        command,
        args,
        env: Some(env_vars(&env)),
        stdin: Some(spec.stdin || spec.tty),
        stdin_once: Some(spec.stdin && spec.stdin_once),
        tty: Some(spec.tty),
        security_context: Some(security),
        volume_mounts: Some(volume_mounts.clone()),
        ..Default::default()
    }];
    let mut init_containers = Vec::new();
    if held {
        init_containers.push(egress_init(&spec.image, false));
        volumes.push(empty_dir("xtables", true, "1Mi"));
        containers.push(proxy_container(
            &spec.image,
            crate::event::EgressPolicy::Locked,
            &spec.egress_allow,
            gid,
        ));
    }
    if let (true, Some(dir)) = (created, &spec.kept_dir) {
        volumes.push(empty_dir("kept", true, "256Mi"));
        let kept = VolumeMount {
            name: "kept".into(),
            mount_path: dir.clone(),
            ..Default::default()
        };
        init_containers.push(seed_kept(spec, dir, uid, gid));
        containers.push(keeper(spec, &kept, uid, gid));
        volume_mounts.push(kept);
        containers[0].volume_mounts = Some(volume_mounts);
    }
    Ok(PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security(gid)),
        termination_grace_period_seconds: Some(0),
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        containers,
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// The helper's uid and gid: its `user`, else caw-box's agent's.
fn helper_user(spec: &HelperSpec) -> (i64, i64) {
    spec.user
        .as_deref()
        .and_then(parse_user)
        .unwrap_or_else(|| {
            let (u, g) = crate::dirs::agent_ids();
            (u.into(), g.into())
        })
}

/// The helper's volumes and its own mounts: its claims, /tmp, and for a created one the
/// pod's shared memory directory (its start and end markers) and its scratch directory.
fn helper_volumes(spec: &HelperSpec, created: bool) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let mounts: Vec<&MountSpec> = spec.mounts.iter().collect();
    let (mut volumes, mut volume_mounts) = claim_mounts(&mounts)?;
    let mut add = |name: &str, memory: bool, limit: &str, path: &str| {
        volumes.push(empty_dir(name, memory, limit));
        volume_mounts.push(VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        });
    };
    add("tmp", false, "256Mi", "/tmp");
    if created {
        add("pod-end", true, "1Mi", POD_END_DIR);
        if let Some(scratch) = &spec.scratch {
            // Its files may be secrets: memory, never a node's disk.
            add("scratch", true, "64Mi", &scratch.mount);
        }
    }
    Ok((volumes, volume_mounts))
}

fn created_command(held: bool) -> Vec<String> {
    // Bash where the proxy's port is waited for (`/dev/tcp`): the images that hold egress
    // have it, as their egress init container needs it.
    let shell = if held { "bash" } else { "sh" };
    vec![
        shell.into(),
        "-c".into(),
        CREATED_ENTRY.into(),
        "caw-box-helper".into(),
    ]
}

fn command_of(spec: &HelperSpec) -> Vec<String> {
    spec.entrypoint.iter().chain(&spec.argv).cloned().collect()
}

/// The init container that copies the image's own `dir` into the kept directory's volume
/// (as Docker's container sees it: a login's HOME with the vendor's config the image ships).
fn seed_kept(spec: &HelperSpec, dir: &str, uid: i64, gid: i64) -> Container {
    let script = format!(
        "cp -a {dir}/. {SEED_MOUNT}/ 2>/dev/null; true",
        dir = shell_quote(dir.trim_end_matches('/'))
    );
    seed_container("seed-kept", &spec.image, script, (uid, gid), "kept")
}

/// The container that holds the kept directory (mounted where the helper has it, so a path
/// reads the same in both) from the start until [`KEPT_FOR`] after the command ended.
fn keeper(spec: &HelperSpec, kept: &VolumeMount, uid: i64, gid: i64) -> Container {
    let script = format!(
        "until [ -e {end} ]; do sleep 0.5; done; sleep {secs}",
        end = shell_quote(&format!("{POD_END_DIR}/{POD_END_FILE}")),
        secs = KEPT_FOR.as_secs()
    );
    Container {
        name: KEEPER.into(),
        image: Some(spec.image.clone()),
        command: Some(vec!["sh".into(), "-c".into(), script]),
        security_context: Some(hardened(uid, gid)),
        volume_mounts: Some(vec![
            kept.clone(),
            VolumeMount {
                name: "pod-end".into(),
                mount_path: POD_END_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        ..Default::default()
    }
}

/// The running `keep` container of an ended helper pod that holds `path`, if any.
pub(super) fn keeper_of(pod: &k8s_openapi::api::core::v1::Pod, path: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let keeper = spec.containers.iter().find(|c| c.name == KEEPER)?;
    let holds = keeper.volume_mounts.iter().flatten().any(|m| {
        let dir = m.mount_path.trim_end_matches('/');
        m.name == "kept" && (path == dir || path.starts_with(&format!("{dir}/")))
    });
    let runs = pod
        .status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .any(|c| c.name == KEEPER && c.state.as_ref().is_some_and(|s| s.running.is_some()));
    (holds && runs).then(|| KEEPER.to_string())
}

impl KubeBackend {
    /// Creates a helper's pod, waiting for its start ([`HelperSpec`] as Docker creates a
    /// container), and puts its scratch files in once it runs.
    pub(super) async fn create_waiting_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(), crate::backend::CreateError> {
        use crate::backend::CreateError;
        let pod_spec = helper_pod_spec(spec, true).map_err(CreateError::Other)?;
        self.create_pod(&self.pod(name, &spec.labels, pod_spec))
            .await?;
        let ready = async {
            self.wait_running(name, &spec.image).await?;
            if let Some(scratch) = &spec.scratch {
                let files = scratch.tar_files();
                self.upload_files(name, &scratch.mount, &files, scratch.owner)
                    .await
                    .map_err(CreateError::Other)?;
            }
            Ok(())
        };
        if let Err(e) = ready.await {
            let _ = self.remove_container(name, true).await;
            return Err(e);
        }
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
        Ok(())
    }

    /// Runs a helper's pod to its end and deletes it: (exit code, its log, its log again
    /// when it failed: Kubernetes keeps one log per container, stdout and stderr together).
    pub(super) async fn run_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), crate::backend::CreateError> {
        use crate::backend::CreateError;
        // Scratch files go in before the command starts: a pod created waiting, then started.
        let waiting = spec.scratch.is_some();
        if waiting {
            self.create_waiting_helper(name, spec).await?;
        } else {
            let pod_spec = helper_pod_spec(spec, false).map_err(CreateError::Other)?;
            self.create_pod(&self.pod(name, &spec.labels, pod_spec))
                .await?;
        }
        let run = async {
            if waiting {
                self.start_waiting_helper(name)
                    .await
                    .map_err(CreateError::Other)?;
            } else {
                self.wait_running(name, &spec.image).await?;
            }
            let code = self
                .wait_container(name)
                .await
                .map_err(CreateError::Other)?;
            // Kubernetes keeps one log per container: stdout and stderr together.
            let logs = self
                .pods()
                .logs(name, &kube::api::LogParams::default())
                .await
                .map_err(|e| CreateError::Other(failed(format!("read pod '{name}'s logs"), &e)))?;
            Ok((
                code,
                logs.clone(),
                if code == 0 { String::new() } else { logs },
            ))
        };
        let out = run.await;
        let _ = self.remove_container(name, true).await;
        out
    }

    /// Starts a helper this process created waiting ([`Self::create_waiting_helper`]); other
    /// pods run once created: nothing to do.
    pub(super) async fn start_waiting_helper(&self, name: &str) -> Result<()> {
        let waits = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if !waits {
            return Ok(());
        }
        let marker = shell_quote(&format!("{POD_END_DIR}/{START_FILE}"));
        self.exec(name, &["sh", "-c", &format!(": > {marker}")], None)
            .await
            .map(|_| ())
    }

    /// Forgets a helper that waited for its start (it is being removed).
    pub(super) fn forget_waiting_helper(&self, name: &str) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// A helper pod's output from its start (its log, complete once it ended: an attachment
    /// can lose the last lines of a container that ends at once), and with `stdin` its input
    /// (an attachment to that alone, on its terminal with `tty`).
    pub(super) async fn attach_helper(
        &self,
        name: &str,
        stdin: bool,
        tty: bool,
    ) -> Result<Attached> {
        let input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> = if stdin {
            let params = kube::api::AttachParams::default()
                .container(HELPER)
                .stdin(true)
                .stdout(false)
                .stderr(false)
                .tty(tty);
            let mut process = self
                .pods()
                .attach(name, &params)
                .await
                .map_err(|e| failed(format!("attach to pod '{name}'s input"), &e))?;
            let writer = process
                .stdin()
                .ok_or_else(|| Error::environment(format!("pod '{name}' has no input")))?;
            // The attachment lives on by itself while its input is written.
            tokio::spawn(async move {
                let _ = process.join().await;
            });
            Box::pin(writer)
        } else {
            Box::pin(tokio::io::sink())
        };
        Ok(Attached {
            output: self.follow_logs(name),
            input,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Scratch, ScratchFile};

    fn login_helper() -> HelperSpec {
        HelperSpec {
            image: "caw-box/codex:latest".into(),
            entrypoint: vec!["codex".into(), "login".into()],
            argv: vec!["--device-auth".into()],
            env: vec!["HOME=/home/agent".into()],
            user: Some("1000:1000".into()),
            egress_allow: vec!["auth.openai.com:443".into()],
            kept_dir: Some("/home/agent".into()),
            stdin: true,
            scratch: Some(Scratch {
                mount: "/run/caw-box-login".into(),
                owner: (1000, 1000),
                files: vec![ScratchFile {
                    path: "ca.pem".into(),
                    contents: b"-----BEGIN CERTIFICATE----- scratch-content".to_vec(),
                    mode: 0o644,
                }],
                labels: Default::default(),
            }),
            ..Default::default()
        }
    }

    fn names(containers: &[Container]) -> Vec<&str> {
        containers.iter().map(|c| c.name.as_str()).collect()
    }

    /// A login's pod: its egress held as a turn pod's (rules first, the proxy beside it), its
    /// HOME seeded from the image into memory and held by `keep` after the command ended,
    /// its command waiting for its start; its scratch files are not in its spec (they go in
    /// through exec once it runs).
    #[test]
    fn a_login_helper_pod_holds_its_egress_keeps_home_and_waits_for_its_start() {
        let spec = helper_pod_spec(&login_helper(), true).unwrap();
        let inits = spec.init_containers.as_ref().unwrap();
        assert_eq!(names(inits), [super::super::EGRESS_INIT, "seed-kept"]);
        assert_eq!(
            names(&spec.containers),
            [HELPER, super::super::sidecars::PROXY_SIDECAR, KEEPER]
        );
        let helper = &spec.containers[0];
        let command = helper.command.as_ref().unwrap();
        assert_eq!(command[..3], ["bash", "-c", CREATED_ENTRY]);
        assert_eq!(
            helper.args.as_deref().unwrap(),
            ["codex", "login", "--device-auth"]
        );
        assert_eq!(helper.stdin, Some(true));
        let env: Vec<String> = helper
            .env
            .iter()
            .flatten()
            .map(|e| format!("{}={}", e.name, e.value.clone().unwrap_or_default()))
            .collect();
        assert!(
            env.contains(&"CAW_BOX_PROXY_WAIT=3128".to_string()),
            "{env:?}"
        );
        let sc = helper.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.read_only_root_filesystem),
            (Some(1000), Some(true))
        );
        let at = |c: &Container, path: &str| {
            c.volume_mounts
                .iter()
                .flatten()
                .find(|m| m.mount_path == path)
                .map(|m| (m.name.clone(), m.read_only))
        };
        assert_eq!(at(helper, "/home/agent"), Some(("kept".into(), None)));
        assert_eq!(
            at(helper, "/run/caw-box-login"),
            Some(("scratch".into(), None))
        );
        let keep = &spec.containers[2];
        assert_eq!(at(keep, "/home/agent"), Some(("kept".into(), None)));
        assert_eq!(at(keep, POD_END_DIR), Some(("pod-end".into(), Some(true))));
        assert_eq!(
            keep.security_context.as_ref().unwrap().run_as_user,
            Some(1000)
        );
        let memory = |name: &str| {
            let v = spec.volumes.iter().flatten().find(|v| v.name == name);
            v.and_then(|v| v.empty_dir.clone()?.medium)
        };
        assert_eq!(memory("kept").as_deref(), Some("Memory"));
        assert_eq!(memory("scratch").as_deref(), Some("Memory"));
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains("scratch-content"), "{json}");
    }

    /// A helper that only moves files (a probe) waits for a start that never comes: its
    /// command does not run, and nothing goes beside it. Refused: a named network, and egress
    /// held by a helper run to its end.
    #[test]
    fn a_probe_waits_alone_and_what_a_helper_pod_cannot_hold_is_refused() {
        let probe = HelperSpec {
            image: "caw-box/codex:latest".into(),
            entrypoint: vec!["true".into()],
            mounts: vec![MountSpec::volume("caw-box-x", "/home/agent").read_only()],
            network: NetworkPolicy::None,
            ..Default::default()
        };
        let spec = helper_pod_spec(&probe, true).unwrap();
        assert_eq!(spec.init_containers, None);
        assert_eq!(names(&spec.containers), [HELPER]);
        assert_eq!(
            spec.containers[0].command.as_ref().unwrap()[..3],
            ["sh", "-c", CREATED_ENTRY]
        );
        let mut named = probe.clone();
        named.network = NetworkPolicy::Named("gw".into());
        assert!(helper_pod_spec(&named, true).is_err());
        assert!(helper_pod_spec(&login_helper(), false).is_err());
        let mut own = probe;
        own.entrypoint.clear();
        assert!(helper_pod_spec(&own, true).is_err());
    }

    /// The created helper's command: nothing runs before the start marker; then the
    /// command, its stdin passed on, its exit code kept, the end marker left. Never started,
    /// it ends (0) without running it, the end marker left for `keep`.
    #[test]
    fn the_created_entry_waits_for_its_start_then_runs_and_marks_its_end() {
        use std::io::{Read, Write};
        use std::process::{Command, Stdio};
        let dir = tempfile::tempdir().unwrap();
        let entry = |wait: &str| {
            let mut c = Command::new("sh");
            c.env("CAW_BOX_POD_DIR", dir.path())
                .env("CAW_BOX_START_WAIT", wait)
                .args(["-c", CREATED_ENTRY, "caw-box-helper", "sh", "-c"])
                .arg("echo ran; read -r x; echo \"got $x\"; exit 3")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            c
        };
        let mut child = entry("600").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert!(child.try_wait().unwrap().is_none(), "it ran unstarted");
        std::fs::write(dir.path().join(START_FILE), b"").unwrap();
        child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "ran\ngot hi\n");
        assert_eq!(child.wait().unwrap().code(), Some(3));
        assert!(dir.path().join(POD_END_FILE).exists());

        std::fs::remove_file(dir.path().join(START_FILE)).unwrap();
        std::fs::remove_file(dir.path().join(POD_END_FILE)).unwrap();
        let out = entry("2").output().unwrap();
        assert_eq!(
            (out.status.code(), out.stdout.as_slice()),
            (Some(0), &b""[..])
        );
        assert!(dir.path().join(POD_END_FILE).exists());
    }

    #[test]
    fn host_aliases_split_at_the_host_names_colon() {
        let aliases = super::super::spec::host_aliases(&[
            "auth.openai.com:10.244.7.5".into(),
            "v6.example:fd00::1".into(),
        ])
        .unwrap();
        let pairs: Vec<(String, Vec<String>)> = aliases
            .into_iter()
            .map(|a| (a.ip, a.hostnames.unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "10.244.7.5".to_string(),
                    vec!["auth.openai.com".to_string()]
                ),
                ("fd00::1".to_string(), vec!["v6.example".to_string()]),
            ]
        );
    }
}
