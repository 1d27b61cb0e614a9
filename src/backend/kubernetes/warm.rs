//! Warm pods on Kubernetes (`--keep-warm`, see `backend::warm`): the session's turn pod
//! stays Running after a turn, its agent container running the idle loop instead of the CLI,
//! and the session's next turns run in it by `exec`. A pod cannot be renamed, so the pod
//! keeps the turn's name (the session's lock: a cold turn's create still finds it taken) and
//! says whether a turn runs in it by an annotation, [`WARM_TURN`]:
//!
//! - a turn claims an idle pod by a patch that sets [`WARM_TURN`] with the pod's
//!   `resourceVersion` as read idle: of racing claims the API server takes one and refuses
//!   the others (409), which then find the name taken by a running turn (busy, exit 2);
//! - it releases the pod, once its turn is recorded, by making it idle again (the shared
//!   release script) and removing the annotation; a pod that cannot be made so is deleted;
//! - an idle pod is removed by a delete whose preconditions are its uid and the
//!   `resourceVersion` it was read idle at: never a pod a racing turn claimed meanwhile.
//!
//! To the session layer an idle pod is what Docker's idle container is: a container named
//! `<turn name>-warm` ([`idle_name`]), not the turn's; listing and inspecting say so. A
//! cold turn's create that finds an idle (or ended) warm pod under its name removes it and
//! creates its own (an idle pod holds no lock). The pod ends itself (its idle loop exits;
//! restartPolicy Never): its object stays, ended, holding nothing, until the session's next
//! turn (or `stop`, `rm`, `gc`) deletes it.
//!
//! A turn run by exec is this process's to drive: after `exec_in_warm`, the driver's
//! attach/wait/stop/remove of the turn's name act on the exec (the remove releases). Not
//! kept warm (`session::warm::keep_for`): a turn whose pod has a broker sidecar (it would
//! hold its keys while idle). An egress proxy sidecar stays with a warm pod.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{AttachParams, DeleteParams, Patch, PatchParams, Preconditions};

use super::ends::{KeepOpen, Shared};
use super::exec::chunks;
use super::pipes::{Ended, UntilEnded};
use super::status::container_info;
use super::{failed, is_status, meta, KubeBackend};
use crate::backend::warm::{
    release_argv, stop_argv, turn_end, turn_of, WarmExec, WARM_FOR_LABEL, WARM_LABEL,
};
use crate::backend::{Attached, ContainerInfo, CreateError, OutputChunk, TurnSpec};
use crate::error::{Error, Result};
use crate::labelling::labels;

/// The annotation of a warm pod a turn runs in: `<turn> <driver pid>` (turn 0: claimed, its
/// exec not yet started). Absent: the pod is idle.
pub(super) const WARM_TURN: &str = "io.caw-box.warm-turn";

/// How long a warm turn's entrypoint waits for its record after the CLI: its driver is
/// attached (a warm turn is not adoptable), and the hand-off passes a few API calls.
const HANDOFF_WAIT: &str = "CAW_BOX_HANDOFF_WAIT=60";

/// Runs a warm turn's command in its working directory with its environment
/// (`bash -c CD cd DIR KEY=VALUE... COMMAND...`: an exec has neither), once the idle loop
/// has made its directory (a pod just started).
const CD: &str = r#"for _ in $(seq 50); do [ -e /tmp/.caw-box-warm/loop.pid ] && break; sleep 0.1; done
cd -- "$1" || exit 1; shift; exec env "$@""#;

/// Waits (up to 10 s) for a claimed pod's turn to be noted by its wrapper: a stop from
/// another process right after `resume --detach` returned may come before it.
const TURN_NOTED: &str =
    r#"for _ in $(seq 100); do [ -s /tmp/.caw-box-warm/turn.pid ] && exit 0; sleep 0.1; done"#;

/// The label of a pool's box (`super::pool`): the name it is shown under until a claim
/// takes it.
pub(super) const POOL_BOX: &str = "io.caw-box.pool-box";

/// The box name a pod is shown under, if it is a pool's box.
pub(super) fn box_name(labels: &HashMap<String, String>) -> Option<&str> {
    labels.get(POOL_BOX).map(String::as_str)
}

/// Whether `pod` is a pool's box (not claimed yet).
fn is_box(pod: &Pod) -> bool {
    meta::merged(&pod.metadata).contains_key(POOL_BOX)
}

/// The name an idle warm pod `name` is shown under (Docker's idle container's name).
pub(super) fn idle_name(name: &str) -> String {
    format!("{name}-warm")
}

/// A turn run by exec in a warm pod, by this process.
pub(super) struct WarmTurn {
    exec: WarmExec,
    /// The exec's exit code once it ended (set at the attach).
    ended: Option<tokio::sync::watch::Receiver<Option<i64>>>,
    /// Whether the turn's command made the pod idle itself.
    released: bool,
}

pub(super) type WarmTurns = Arc<std::sync::Mutex<HashMap<String, WarmTurn>>>;

fn is_warm(pod: &Pod) -> bool {
    meta::merged(&pod.metadata).contains_key(WARM_LABEL)
}

/// The turn noted on a warm pod ([`WARM_TURN`]); `None`: it is idle.
fn warm_turn(pod: &Pod) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(WARM_TURN).cloned()
}

/// A warm pod no turn runs in (running or ended), not being deleted, and no pool's box
/// (`super::pool`: no session's until a claim takes it).
fn idle(pod: &Pod) -> bool {
    is_warm(pod)
        && warm_turn(pod).is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && !is_box(pod)
}

/// What the session layer sees of a pod: a pool's box under its box's name, an idle warm
/// pod as [`idle_name`].
pub(super) fn shown(mut c: ContainerInfo) -> ContainerInfo {
    if let Some(name) = box_name(&c.labels) {
        c.name = name.to_string();
        return c;
    }
    if c.labels.contains_key(WARM_LABEL) && !c.labels.contains_key(WARM_TURN) {
        c.name = idle_name(&c.name);
    }
    c
}

/// The pod an idle warm pod `found` (as [`shown`]) is; `None` for any other.
pub(super) fn idle_pod_of(found: &ContainerInfo) -> Option<&str> {
    found
        .name
        .strip_suffix("-warm")
        .filter(|_| found.labels.contains_key(WARM_LABEL) && !found.labels.contains_key(WARM_TURN))
}

/// The warm pod's spec for `spec` (a warm turn's, [`WARM_LABEL`]): its agent container runs
/// the image's entrypoint with the idle loop (no stdin: the turns come by exec), and leaves
/// the pod's end marker when the loop ended where a sidecar (the egress proxy) waits for it;
/// its labels say its creator's turn runs in it, and that it is no adoptable turn.
pub(super) fn warm_pod(spec: &TurnSpec, pod: &mut PodSpec, labels: &mut HashMap<String, String>) {
    let sidecars = pod.containers.len() > 1;
    if let Some(agent) = pod.containers.first_mut() {
        agent.command = Some(match sidecars {
            true => super::spec::marked_entry(true, false),
            false => vec![
                "/usr/bin/tini".into(),
                "--".into(),
                "/usr/local/bin/caw-box-entry".into(),
            ],
        });
        agent.stdin = Some(false);
        // Kubernetes expands `$(NAME)` in a container's arguments and reads `$$` as `$`:
        // the loop's script is escaped to reach bash as written.
        if let Some(args) = agent.args.as_mut() {
            for a in args.iter_mut() {
                *a = a.replace('$', "$$");
            }
        }
    }
    labels.remove(labels::ADOPTABLE);
    let of = |k| spec.labels.get(k).map(String::as_str).unwrap_or("0");
    labels.insert(
        WARM_TURN.into(),
        format!("{} {}", of(labels::TURN), of(labels::DRIVER_PID)),
    );
}

/// A merge patch of caw-box's `pairs` (as labels where they can be, and annotations) and of
/// `raw` annotations (`null` removes one).
fn patch_of(pairs: &[(&str, String)], raw: serde_json::Value) -> serde_json::Value {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let (labels, annotations) = meta::split(&map);
    let mut annotations = serde_json::to_value(annotations).unwrap_or_default();
    if let (Some(a), Some(raw)) = (annotations.as_object_mut(), raw.as_object()) {
        a.extend(raw.clone());
    }
    serde_json::json!({"metadata": {"labels": labels, "annotations": annotations}})
}

/// The exit code in an exec's final status.
fn exit_code(status: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> i64 {
    let Some(s) = status else { return -1 };
    if s.status.as_deref() == Some("Success") {
        return 0;
    }
    s.details
        .and_then(|d| d.causes)
        .unwrap_or_default()
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse().ok())
        .unwrap_or(-1)
}

impl KubeBackend {
    fn warm_turns(&self) -> std::sync::MutexGuard<'_, HashMap<String, WarmTurn>> {
        self.warm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `name` is a turn this process runs in a warm pod.
    pub(super) fn is_warm_turn(&self, name: &str) -> bool {
        self.warm_turns().contains_key(name)
    }

    pub(super) fn exec_in_warm(&self, name: &str, exec: WarmExec) {
        self.warm_turns().insert(
            name.to_string(),
            WarmTurn {
                exec,
                ended: None,
                released: false,
            },
        );
    }

    /// Claims the idle warm pod `name` for this process's turn (see the module docs).
    /// `None`: there is none, a turn runs in it, or a racing turn claimed it first.
    pub(super) async fn claim_warm(&self, name: &str) -> Result<Option<ContainerInfo>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        let Some(pod) = pod.filter(idle) else {
            return Ok(None);
        };
        let mut patch = patch_of(
            &[
                (labels::DRIVER_PID, std::process::id().to_string()),
                (labels::DRIVER_HOST, crate::dirs::host_name()),
            ],
            serde_json::json!({ WARM_TURN: format!("0 {}", std::process::id()) }),
        );
        patch["metadata"]["resourceVersion"] = pod.metadata.resource_version.clone().into();
        let params = PatchParams::default();
        match self
            .pods()
            .patch(name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(claimed) => Ok(Some(container_info(&claimed))),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => Ok(None),
            Err(e) => Err(failed(format!("take the warm pod '{name}'"), &e)),
        }
    }

    /// The turn (and its driver's pid) noted on the warm pod `name`; `None`: none runs in it
    /// (or its exec has not started), or it is no warm pod.
    pub(super) async fn turn_in_warm(&self, name: &str) -> Result<Option<(u32, u32)>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        let noted = pod.filter(is_warm).and_then(|p| warm_turn(&p));
        Ok(noted.and_then(|t| {
            let (turn, pid) = t.split_once(' ')?;
            let turn: u32 = turn.parse().ok().filter(|t| *t > 0)?;
            Some((turn, pid.parse().ok()?))
        }))
    }

    /// Removes the warm pod `name` if no turn runs in it (idle, ended, or being deleted
    /// already), and only the one of `uid` when given; returns once it is gone: whether
    /// there was one.
    pub(super) async fn remove_idle(&self, name: &str, uid: Option<&str>) -> Result<bool> {
        for _ in 0..3 {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
            let Some(pod) = pod else { return Ok(false) };
            let this = pod.metadata.uid.clone();
            if !is_warm(&pod) || uid.is_some_and(|u| this.as_deref() != Some(u)) {
                return Ok(false);
            }
            if pod.metadata.deletion_timestamp.is_none() {
                if warm_turn(&pod).is_some() {
                    return Ok(false);
                }
                // Not forced: the pod's object goes once its containers did (its loop ends
                // on SIGTERM at once); a forced one's container could still be the kubelet's
                // when the turn's next pod of that name comes, and take that one's exec.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: this.clone(),
                        resource_version: pod.metadata.resource_version.clone(),
                    }),
                    ..Default::default()
                };
                match self.pods().delete(name, &params).await {
                    Ok(_) => {}
                    Err(e) if is_status(&e, 404) => return Ok(false),
                    // Changed since it was read (a turn claimed it?): read again.
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) => return Err(failed(format!("delete pod '{name}'"), &e)),
                }
            }
            self.delete_pod(name, this, false).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Creates the turn pod `pod`: an idle (or ended) warm pod under its name holds no
    /// lock, and goes for it; a taken name is `NameTaken`.
    pub(super) async fn create_over_idle(&self, pod: &Pod) -> std::result::Result<(), CreateError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let mut created = self.create_pod(pod).await;
        for _ in 0..3 {
            if !matches!(created, Err(CreateError::NameTaken)) {
                break;
            }
            let removed = self
                .remove_idle(name, None)
                .await
                .map_err(CreateError::Other)?;
            // (Or gone meanwhile: a racing `remove_warm` of this turn's removed it.)
            if !removed && self.pods().get_opt(name).await.ok().flatten().is_some() {
                break;
            }
            created = self.create_pod(pod).await;
        }
        created
    }

    /// Starts the warm turn `name`'s exec in its pod, attached.
    pub(super) async fn warm_attach(&self, name: &str) -> Result<Attached> {
        let exec = self
            .warm_turns()
            .get(name)
            .map(|t| t.exec.clone())
            .ok_or_else(|| Error::environment(format!("no warm turn in pod '{name}'")))?;
        let mut argv: Vec<String> = vec!["bash".into(), "-c".into(), CD.into(), "cd".into()];
        argv.push(exec.working_dir.clone());
        argv.extend(exec.env.iter().cloned());
        argv.push(HANDOFF_WAIT.into());
        argv.extend(exec.argv.iter().cloned());
        let mut params = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .max_stdout_buf_size(64 * 1024)
            .max_stderr_buf_size(64 * 1024)
            .max_stdin_buf_size(64 * 1024);
        if let Some(main) = self.main_container(name).await? {
            params = params.container(main);
        }
        let t0 = std::time::Instant::now();
        let mut process = self
            .pods()
            .exec(name, argv, &params)
            .await
            .map_err(|e| failed(format!("run the turn in pod '{name}'"), &e))?;
        super::timeline("exec (warm turn)", t0);
        let ended = Ended::new();
        let stdout = UntilEnded::new(process.stdout().expect("stdout was asked for"), &ended);
        let stderr = UntilEnded::new(process.stderr().expect("stderr was asked for"), &ended);
        // Open to the end: a closed stdin would end the exec's connection (kube has no
        // half-close), and with it the wait for its status.
        let input: Shared = match process.stdin() {
            Some(w) => Arc::new(std::sync::Mutex::new(Box::pin(w))),
            None => Arc::new(std::sync::Mutex::new(Box::pin(tokio::io::sink()))),
        };
        let (tx, rx) = tokio::sync::watch::channel(None);
        let status = process.take_status();
        tokio::spawn(async move {
            let status = match status {
                Some(s) => s.await,
                None => None,
            };
            let _ = process.join().await;
            ended.finish();
            let _ = tx.send(Some(exit_code(status)));
        });
        if let Some(t) = self.warm_turns().get_mut(name) {
            t.ended = Some(rx);
        }
        // Who runs in it now, for `resume --detach` and `stop` of other processes.
        let (turn, driver) = exec
            .argv
            .get(1..)
            .and_then(turn_of)
            .unwrap_or((0, std::process::id()));
        let patch = patch_of(
            &[(labels::TURN, turn.to_string())],
            serde_json::json!({ WARM_TURN: format!("{turn} {driver}") }),
        );
        if let Err(e) = self
            .pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!("could not note the turn on pod '{name}': {e}");
        }
        let output = futures_util::stream::select(
            chunks(stdout, OutputChunk::Stdout),
            chunks(stderr, OutputChunk::Stderr),
        );
        Ok(Attached {
            output: Box::pin(output),
            input: Box::pin(KeepOpen(input)),
        })
    }

    /// Waits for the warm turn `name`'s exec to end: its exit code.
    pub(super) async fn warm_wait(&self, name: &str) -> Result<i64> {
        let ended = self.warm_turns().get(name).and_then(|t| t.ended.clone());
        let Some(mut ended) = ended else {
            return Ok(-1);
        };
        let (released, code) = turn_end(match ended.wait_for(Option::is_some).await {
            Ok(code) => code.unwrap_or(-1),
            Err(_) => -1,
        });
        if let Some(t) = self.warm_turns().get_mut(name) {
            t.released = released;
        }
        Ok(code)
    }

    /// How long the idle warm pod `name` (running) stays idle after a turn, if it is one.
    pub(super) async fn warm_idle_for(&self, name: &str) -> Result<Option<u64>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        Ok(pod
            .filter(|p| idle(p) && container_info(p).running())
            .and_then(|p| meta::merged(&p.metadata).get(WARM_FOR_LABEL)?.parse().ok()))
    }

    /// Makes the warm pod `name`, made for no turn (`caw-box warm`), idle: its creator's
    /// turn note goes.
    pub(super) async fn idle_warm(&self, name: &str) -> Result<()> {
        let patch = serde_json::json!({"metadata": {"annotations": { WARM_TURN: null }}});
        self.pods()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| failed(format!("make pod '{name}' idle"), &e))
    }

    /// Stops the turn running in the warm pod `name` (the pod stays): `false` when `name`
    /// is no warm pod a turn runs in.
    pub(super) async fn stop_warm_turn(&self, name: &str, grace: Duration) -> Result<bool> {
        if !self.is_warm_turn(name) {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
            let runs = pod.is_some_and(|p| {
                is_warm(&p) && warm_turn(&p).is_some() && container_info(&p).running()
            });
            if !runs {
                return Ok(false);
            }
            let _ = self.exec(name, &["bash", "-c", TURN_NOTED], None).await;
        }
        let argv = stop_argv(grace);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.exec(name, &argv, None).await?;
        Ok(true)
    }

    /// After the warm turn `name` was recorded: makes its pod idle again and removes its
    /// turn's notes (and a stop noted on it); a pod that cannot be made so is deleted.
    pub(super) async fn release_warm(&self, name: &str) -> Result<()> {
        let Some(turn) = self.warm_turns().remove(name) else {
            return Ok(());
        };
        if turn.exec.goes_after {
            // A pool's box that ran a first turn of a session that keeps no pod warm: it
            // goes, as a cold turn's pod does.
            return self.delete_pod(name, None, false).await;
        }
        let t0 = std::time::Instant::now();
        let argv = release_argv(&turn.exec.run_dir);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        // (The turn's own command made it idle where it could.)
        let idle = match turn.released {
            true => Ok(Vec::new()),
            false => self.exec(name, &argv, None).await,
        };
        let released = match idle {
            Ok(_) => {
                let patch = serde_json::json!({"metadata": {"annotations": {
                    WARM_TURN: null, labels::STOP_REQUESTED: null
                }}});
                self.pods()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
                    .map_err(|e| failed(format!("release pod '{name}'"), &e))
            }
            Err(e) => Err(e),
        };
        super::timeline("release (warm pod)", t0);
        if let Err(e) = released {
            tracing::debug!("{e}; deleting it");
            self.delete_pod(name, None, false).await?;
        }
        Ok(())
    }

    /// Waits, from a process that does not drive it, for the turn in the warm pod `pod` to
    /// be released (the pod idle) or the pod to end or go: 0.
    pub(super) async fn wait_warm_elsewhere(&self, pod: &Pod) -> Result<i64> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let t0 = std::time::Instant::now();
        loop {
            let now = self
                .pods()
                .get_opt(&name)
                .await
                .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
            match now {
                Some(p)
                    if p.metadata.uid == pod.metadata.uid
                        && warm_turn(&p).is_some()
                        && container_info(&p).running() =>
                {
                    tokio::time::sleep(super::poll_after(t0)).await
                }
                _ => return Ok(0),
            }
        }
    }

    /// Whether the pod `pod` is a warm one.
    pub(super) fn is_warm_pod(pod: &Pod) -> bool {
        is_warm(pod)
    }

    /// The container `name` as the session layer sees it ([`shown`]): an idle warm pod
    /// under its idle name, not under its own.
    pub(super) async fn inspect_shown(&self, name: &str) -> Result<Option<ContainerInfo>> {
        let get = |n: String| async move {
            self.pods()
                .get_opt(&n)
                .await
                .map_err(|e| failed(format!("read pod '{n}'"), &e))
        };
        if let Some(pod) = name.strip_suffix("-warm") {
            if let Some(p) = get(pod.to_string()).await?.filter(is_warm) {
                return Ok(Some(shown(container_info(&p))).filter(|c| c.name == name));
            }
        }
        let pod = get(name.to_string()).await?;
        Ok(pod
            .map(|p| shown(container_info(&p)))
            .filter(|c| c.name == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exec's status says its exit code: success, a non-zero code, or none known.
    #[test]
    fn an_execs_status_gives_its_exit_code() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(ok)), 0);
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("75".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(failed)), 75);
        assert_eq!(exit_code(None), -1);
    }

    /// A warm pod with an egress proxy beside its agent leaves the pod's end marker when its
    /// idle loop ends (the proxy then ends, and the pod with it); one without runs the
    /// entrypoint alone.
    #[test]
    fn a_warm_pods_loop_ends_its_sidecars_with_it() {
        let mut turn = crate::backend::kubernetes::tests::turn();
        turn.egress_policy = Some(crate::event::EgressPolicy::Balanced);
        let spec = crate::backend::kubernetes::spec::turn_pod_spec(&turn).unwrap();
        let mut pod = spec.clone();
        let mut labels = HashMap::new();
        warm_pod(&turn, &mut pod, &mut labels);
        let command = pod.containers[0].command.clone().unwrap();
        assert!(
            command.iter().any(|a| a.starts_with("CAW_BOX_POD_END=")),
            "{command:?}"
        );
        assert!(
            command.last().unwrap().ends_with("caw-box-entry"),
            "{command:?}"
        );
        assert!(!command.iter().any(|a| a == "CAW_BOX_ANNOUNCE_END=1"));

        turn.egress_policy = None;
        let mut pod = crate::backend::kubernetes::spec::turn_pod_spec(&turn).unwrap();
        warm_pod(&turn, &mut pod, &mut labels);
        let command = pod.containers[0].command.clone().unwrap();
        assert_eq!(
            command,
            ["/usr/bin/tini", "--", "/usr/local/bin/caw-box-entry"]
        );
    }

    /// An idle warm pod is shown under its idle name; one a turn runs in, and any other pod,
    /// under its own.
    #[test]
    fn an_idle_warm_pod_is_shown_as_the_idle_container() {
        let pod = |labels: &[(&str, &str)]| ContainerInfo {
            name: "caw-box-x".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        assert_eq!(shown(pod(&[(WARM_LABEL, "ab")])).name, "caw-box-x-warm");
        assert_eq!(
            shown(pod(&[(WARM_LABEL, "ab"), (WARM_TURN, "2 7")])).name,
            "caw-box-x"
        );
        assert_eq!(shown(pod(&[])).name, "caw-box-x");
    }
}
