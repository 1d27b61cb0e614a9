//! The Kubernetes backend (kube-rs): the only code that talks to an API server. Not the
//! session layer's business how a "container" or a "volume" is kept here; this file maps
//! caw-box's terms onto Kubernetes objects in one namespace:
//!
//! - a state or workspace volume is a PersistentVolumeClaim (ReadWriteOnce, the cluster's
//!   default storage class unless `CAW_BOX_STORAGE_CLASS` names one);
//! - a turn-record volume (an empty volume whose labels summarise a turn, the Docker
//!   backend's trick for labels that cannot change) is a ConfigMap: no storage is
//!   provisioned for it;
//! - a turn is a Pod (restartPolicy Never) named like the Docker container, so the pod name
//!   is the session's lock (the API server refuses a second pod of one name atomically);
//! - a helper that Docker creates and never starts (to move files through the archive API)
//!   is a pod that sleeps: files move through `exec tar` while it runs, and it is deleted
//!   after;
//! - caw-box's labels are kept whole as annotations (Kubernetes label values are limited to
//!   63 characters of a small alphabet; caw-box's settings label is JSON) and, where a
//!   value is a valid label value, also as labels, which is what listing selects on.
//!
//! Files move through a running pod (`exec`): the pod itself while it runs; once it ended,
//! a short-lived pod that mounts the same claims on the same node (as Docker reads a
//! stopped container). What lived in the ended pod's own memory or empty dirs (its runtime
//! directory, refreshed credentials) is gone with it.
//!
//! A turn outlives its driver ([`Backend::turns_outlive_driver`]): the pod's stdin stays
//! open across attachments and its entrypoint waits hours for the record, so any caw-box
//! can finish a turn whose driver is gone (`session::headless::adopt`). `caw-box stop`
//! annotates the pod (`note_stop`), read after the pod ended.
//!
//! A TUI turn's pod has a terminal and waits for its runtime files, which are put in once
//! it runs (a terminal's stdin is no way for an archive); `resize_tty` reaches the
//! attachment this process holds. A turn failed by its environment is told by
//! `ended_by_environment` (OOM kills counted by the pod's memory cgroup, an eviction).
//!
//! A brokered turn's pod has the credential broker as a second container
//! ([`TurnSpec::broker`], `session::broker`): the agent's container runs its entrypoint
//! under [`MARKED_ENTRY`], which leaves an end marker the broker exits on, so the pod
//! completes on clusters without native sidecars; exec, attach and logs name the agent's
//! container ([`KubeBackend::main_container`]).
//!
//! `--allow-host` is held in the turn's pod ([`TurnSpec::egress_allow`]): an init container
//! sets iptables rules in the pod's own network namespace that let out only loopback and
//! the proxy and broker sidecars' uids ([`egress_init`]), and the proxy is a sidecar on the
//! pod's loopback ([`proxy_container`]). No NetworkPolicy, so it holds whatever the CNI;
//! it needs NET_ADMIN for the init container, which a `baseline` or `restricted`
//! PodSecurity level refuses ([`pod_security_refused`]).
//!
//! Not here: Docker networks (`--network NAME|host`, refused before a turn), a
//! process limit (a pod has none; a kubelet's `podPidsLimit` is the node's), image builds
//! (images come from a registry, or `k8s-lab load-image` in tests).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, EmptyDirVolumeSource, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, AttachParams, DeleteParams, ListParams, LogParams, PostParams};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{
    Attached, Backend, ContainerInfo, ContainerState, CreateError, HelperSpec, ImageInfo,
    MountSource, MountSpec, NetworkPolicy, OutputChunk, OutputStream, TarFile, TurnSpec,
    VolumeInfo, PROXY_SIDECAR,
};
use crate::error::{Error, Result};
use crate::session::runner::PROXY_PORT;
use crate::session::{POD_END_DIR, POD_END_FILE, SIDECAR};

pub mod doctor;
mod meta;
pub use meta::{label_selector, valid_label_value};

/// Every object caw-box creates here carries this label too (the Kubernetes convention).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "caw-box");

/// How long a pod may take to start running (scheduling, a claim to bind, an image).
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a deleted pod may take to go.
const GONE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a turn's claims may take to bind before the turn is refused (the lab's bind
/// within a second; a provisioner in the cloud takes some seconds).
const CLAIM_BIND_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(250);
/// How long a turn pod whose CLI ended waits for its record (the entrypoint's
/// `CAW_BOX_HANDOFF_WAIT`): long, so that a detached turn whose driver is gone is still
/// recorded by the next `caw-box wait` (Docker's 5 s suit a driver that is always there).
const HANDOFF_WAIT: Duration = Duration::from_secs(6 * 3600);

/// A connected API server and the namespace caw-box works in.
#[derive(Clone)]
pub struct KubeBackend {
    client: kube::Client,
    namespace: String,
    /// Where the client's configuration came from, for messages.
    origin: String,
    /// The terminal size senders of this process's TTY attachments, by pod name.
    terminals: std::sync::Arc<std::sync::Mutex<HashMap<String, Resizer>>>,
}

/// Sends a TTY attachment's new size (columns, rows); `false` once the attachment ended.
type Resizer = Box<dyn FnMut(u16, u16) -> bool + Send>;

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("namespace", &self.namespace)
            .field("origin", &self.origin)
            .finish()
    }
}

fn unreachable(origin: &str, e: impl std::fmt::Display) -> Error {
    Error::environment(format!(
        "cannot reach the Kubernetes API server ({origin}): {e}"
    ))
    .with_hint("check KUBECONFIG / ~/.kube/config and --context, and that the cluster is up")
}

/// The API server's own message, or the transport's.
fn failed(what: impl std::fmt::Display, e: &kube::Error) -> Error {
    match e {
        kube::Error::Api(r) => Error::environment(format!("failed to {what}: {}", r.message)),
        other => Error::environment(format!("failed to {what}: {other}"))
            .with_hint("is the Kubernetes API server reachable? check KUBECONFIG and --context"),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == code)
}

impl KubeBackend {
    /// Deletes pod `name` (only the one of `uid`, when given: not a newer pod that took the
    /// name) and returns once it is gone for good: a claim is free (and deletable) only then.
    async fn delete_pod(&self, name: &str, uid: Option<String>, force: bool) -> Result<()> {
        let params = DeleteParams {
            grace_period_seconds: force.then_some(0),
            preconditions: uid.clone().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.pods().delete(name, &params).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(()),
            // Another pod of that name by now: the one meant is gone.
            Err(e) if uid.is_some() && is_status(&e, 409) => return Ok(()),
            Err(e) => return Err(failed(format!("delete pod '{name}'"), &e)),
        }
        let deadline = tokio::time::Instant::now() + GONE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match self.pods().get_opt(name).await {
                Ok(None) => return Ok(()),
                Ok(Some(p)) if uid.is_some() && p.metadata.uid != uid => return Ok(()),
                Ok(Some(_)) => tokio::time::sleep(POLL).await,
                Err(e) => return Err(failed(format!("read pod '{name}'"), &e)),
            }
        }
        Err(Error::environment(format!(
            "pod '{name}' was deleted but is still there after {} s",
            GONE_TIMEOUT.as_secs()
        )))
    }

    /// Connects with the kubeconfig (`KUBECONFIG`, `~/.kube/config`, `context` when given)
    /// or the in-cluster service account, and checks that the API server answers. Nothing
    /// reads the server's version: a server whose `/version` has no major/minor works.
    pub async fn connect(context: Option<&str>, namespace: Option<&str>) -> Result<Self> {
        let (config, origin) = match context {
            Some(context) => {
                let options = kube::config::KubeConfigOptions {
                    context: Some(context.to_string()),
                    ..Default::default()
                };
                let config = kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                    Error::environment(format!(
                        "cannot use the kubeconfig context '{context}': {e}"
                    ))
                    .with_hint("`kubectl config get-contexts` lists the contexts")
                })?;
                (config, format!("context '{context}'"))
            }
            None => {
                let config = kube::Config::infer().await.map_err(|e| {
                    Error::environment(format!("no Kubernetes configuration found: {e}"))
                        .with_hint("set KUBECONFIG, or run inside a cluster")
                })?;
                (config, "the kubeconfig's current context".to_string())
            }
        };
        let origin = format!("{} at {}", origin, config.cluster_url);
        let namespace = namespace
            .map(str::to_string)
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).map_err(|e| unreachable(&origin, e))?;
        let backend = KubeBackend {
            client,
            namespace,
            origin,
            terminals: Default::default(),
        };
        let pods = backend.pods();
        let first = ListParams::default().limit(1);
        let probe = pods.list_metadata(&first);
        match tokio::time::timeout(Duration::from_secs(10), probe).await {
            Ok(Ok(_)) => Ok(backend),
            Ok(Err(e @ kube::Error::Api(_))) => Err(failed(
                format!("list pods in namespace '{}'", backend.namespace),
                &e,
            )),
            Ok(Err(e)) => Err(unreachable(&backend.origin, e)),
            Err(_) => Err(unreachable(&backend.origin, "no answer within 10 s")),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates a pod; a taken name is `NameTaken`.
    async fn create_pod(&self, pod: &Pod) -> std::result::Result<(), CreateError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        match self.pods().create(&PostParams::default(), pod).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => Err(CreateError::NameTaken),
            Err(kube::Error::Api(r)) if r.message.contains("PodSecurity") => {
                Err(CreateError::Other(pod_security_refused(&name, &r.message)))
            }
            Err(e) => Err(CreateError::Other(failed(
                format!("create pod '{name}'"),
                &e,
            ))),
        }
    }

    /// Waits for a created pod's container to run (or to have run already); a pod whose
    /// image cannot be had is deleted and reported as `ImageMissing`.
    async fn wait_running(&self, name: &str, image: &str) -> std::result::Result<(), CreateError> {
        let started = tokio::time::Instant::now();
        let deadline = started + START_TIMEOUT;
        let mut last;
        loop {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| CreateError::Other(failed(format!("read pod '{name}'"), &e)))?;
            let Some(pod) = pod else {
                return Err(CreateError::Other(Error::environment(format!(
                    "pod '{name}' was deleted before it ran"
                ))));
            };
            if egress_init_failed(&pod) {
                // Its own words (iptables missing from a custom image, a kernel without
                // nf_tables or ip_tables), then the pod goes: no turn without the rules.
                let params = LogParams {
                    container: Some(EGRESS_INIT.to_string()),
                    ..Default::default()
                };
                let said = self.pods().logs(name, &params).await.unwrap_or_default();
                let said = said.lines().rev().find(|l| !l.trim().is_empty());
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(
                    Error::environment(format!(
                        "the turn's egress rules (--allow-host) could not be set in pod '{name}': {}",
                        said.unwrap_or("its init container failed").trim()
                    ))
                    .with_hint(format!(
                        "the image '{image}' needs iptables (caw-box's images have it) and the node's kernel nf_tables or ip_tables"
                    )),
                ));
            }
            match pod_progress(&pod) {
                Progress::Running | Progress::Ended(_) => return Ok(()),
                Progress::ImageMissing(why) => {
                    let _ = self.remove_container(name, true).await;
                    return Err(CreateError::ImageMissing(Error::environment(format!(
                        "image '{image}' is not available to the cluster ({why})"
                    ))));
                }
                Progress::Waiting(why) => last = why,
            }
            // A claim that does not bind (no default storage class, a provisioner that
            // fails) keeps the pod unscheduled for ever: told, not waited out.
            if started.elapsed() > CLAIM_BIND_TIMEOUT && !pod_scheduled(&pod) {
                let unbound = self.unbound_claims(&pod).await;
                if !unbound.is_empty() {
                    let _ = self.remove_container(name, true).await;
                    return Err(CreateError::Other(
                        Error::environment(format!(
                            "pod '{name}' cannot start: claim {} not bound after {} s",
                            unbound.join(", claim "),
                            CLAIM_BIND_TIMEOUT.as_secs()
                        ))
                        .with_hint(format!(
                            "`kubectl -n {} describe pvc` says why (a storage class that does not exist or cannot provision?)",
                            self.namespace
                        )),
                    ));
                }
            }
            if tokio::time::Instant::now() > deadline {
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(Error::environment(format!(
                    "pod '{name}' did not start within {} s: {last}",
                    START_TIMEOUT.as_secs()
                ))
                .with_hint(format!(
                    "`kubectl -n {} describe pod {name}` says why (a claim not bound, no node with room?)",
                    self.namespace
                ))));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Runs `argv` in the running pod `name`, feeding it `input`; its stdout. A pod that
    /// has ended cannot run anything: that is an error saying so.
    async fn exec(&self, name: &str, argv: &[&str], input: Option<Vec<u8>>) -> Result<Vec<u8>> {
        let what = || format!("run `{}` in pod '{name}'", argv.first().unwrap_or(&""));
        let mut params = AttachParams::default()
            .stdin(input.is_some())
            .stdout(true)
            .stderr(true);
        if let Some(main) = self.main_container(name).await? {
            params = params.container(main);
        }
        let mut process = self
            .pods()
            .exec(name, argv.iter().copied(), &params)
            .await
            .map_err(|e| failed(what(), &e))?;
        let stdin = process.stdin();
        let feed = async move {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                stdin.write_all(&input).await?;
                stdin.shutdown().await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let mut stdout = process.stdout().expect("stdout was asked for");
        let mut stderr = process.stderr().expect("stderr was asked for");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (fed, read_out, read_err) = tokio::join!(
            feed,
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err)
        );
        let status = match process.take_status() {
            Some(status) => status.await,
            None => None,
        };
        fed.and(read_out)
            .and(read_err)
            .map_err(|e| Error::environment(format!("failed to {}: {e}", what())))?;
        if let Some(status) = status {
            if status.status.as_deref() == Some("Failure") {
                let stderr = String::from_utf8_lossy(&err);
                return Err(Error::environment(format!(
                    "failed to {}: {} {}",
                    what(),
                    status.message.unwrap_or_default(),
                    stderr.trim()
                )));
            }
        }
        Ok(out)
    }

    /// The running pod files of pod `name`'s claims move through: `name` itself while it
    /// runs; once it ended, a short-lived pod mounting the same claims on the same node
    /// (`Some` of its name: the caller deletes it). A pod's own memory and empty dirs are
    /// gone with it.
    /// A path off the ended pod's claims (its runtime directory, say) is gone with it:
    /// `None`.
    async fn through(&self, name: &str, path: &str) -> Result<Option<(String, Option<String>)>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .ok_or_else(|| Error::environment(format!("pod '{name}' does not exist")))?;
        if container_info(&pod).running() {
            return Ok(Some((name.to_string(), None)));
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let main = spec.containers.first().cloned().unwrap_or_default();
        let claims: Vec<Volume> = spec
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| v.persistent_volume_claim.is_some())
            .collect();
        let mounts: Vec<VolumeMount> = main
            .volume_mounts
            .unwrap_or_default()
            .into_iter()
            .filter(|m| claims.iter().any(|v| v.name == m.name))
            .collect();
        let on_a_claim = mounts.iter().any(|m| {
            let dir = m.mount_path.trim_end_matches('/');
            path == dir || path.starts_with(&format!("{dir}/"))
        });
        if !on_a_claim {
            return Ok(None);
        }
        let helper = format!("{name}-files");
        let labels = [
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (
                crate::session::names::labels::MANAGED.to_string(),
                "true".to_string(),
            ),
        ]
        .into_iter()
        .chain(
            meta::merged(&pod.metadata)
                .into_iter()
                .filter(|(k, _)| k == crate::session::names::labels::SESSION),
        )
        .chain([(
            crate::session::names::labels::ROLE.to_string(),
            crate::session::names::roles::PROBE.to_string(),
        )])
        .collect::<HashMap<_, _>>();
        let pod_spec = PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            node_name: spec.node_name.clone(),
            security_context: spec.security_context.clone(),
            termination_grace_period_seconds: Some(0),
            containers: vec![Container {
                name: "files".into(),
                image: main.image.clone(),
                image_pull_policy: main.image_pull_policy.clone(),
                command: Some(vec!["sleep".into(), "600".into()]),
                security_context: main.security_context.clone(),
                volume_mounts: Some(mounts),
                ..Default::default()
            }],
            volumes: Some(claims),
            ..Default::default()
        };
        // A leftover of an earlier attempt goes first.
        self.remove_container(&helper, true).await?;
        let image = main.image.clone().unwrap_or_default();
        let made = async {
            self.create_pod(&self.pod(&helper, &labels, pod_spec))
                .await?;
            self.wait_running(&helper, &image).await
        };
        if let Err(e) = made.await {
            let _ = self.remove_container(&helper, true).await;
            return Err(e.into());
        }
        Ok(Some((helper.clone(), Some(helper))))
    }

    /// Runs `argv` with `input` through [`Self::through`] pod `name`, for `path`: its
    /// stdout; `None` when `path` went with the ended pod.
    async fn exec_files(
        &self,
        name: &str,
        path: &str,
        argv: &[&str],
        input: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>> {
        let Some((pod, helper)) = self.through(name, path).await? else {
            return Ok(None);
        };
        let out = self.exec(&pod, argv, input).await;
        if let Some(helper) = helper {
            let _ = self.remove_container(&helper, true).await;
        }
        out.map(Some)
    }

    /// Attaches to container `container` of pod `name` (`None`: its only one).
    async fn attach_to(
        &self,
        name: &str,
        container: Option<String>,
        stdin: bool,
        tty: bool,
    ) -> Result<Attached> {
        let mut params = AttachParams::default()
            .stdin(stdin)
            .stdout(true)
            .stderr(!tty)
            .tty(tty)
            .max_stdout_buf_size(64 * 1024)
            .max_stderr_buf_size(64 * 1024)
            .max_stdin_buf_size(64 * 1024);
        if let Some(c) = container {
            params = params.container(c);
        }
        let mut process = self
            .pods()
            .attach(name, &params)
            .await
            .map_err(|e| failed(format!("attach to pod '{name}'"), &e))?;
        if let Some(mut sender) = process.terminal_size() {
            let resize: Resizer = Box::new(move |width, height| {
                sender
                    .try_send(kube::api::TerminalSize { width, height })
                    .is_ok()
            });
            if let Ok(mut terminals) = self.terminals.lock() {
                terminals.insert(name.to_string(), resize);
            }
        }
        let stdout = process.stdout().expect("stdout was asked for");
        let stderr: OutputStream = match process.stderr() {
            Some(stderr) => chunks(stderr, OutputChunk::Stderr),
            // A terminal has one stream.
            None => Box::pin(futures_util::stream::empty()),
        };
        let input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> = match process.stdin() {
            Some(w) => Box::pin(w),
            None => Box::pin(tokio::io::sink()),
        };
        // The attachment lives as long as its output is read.
        let keep = futures_util::stream::once(async move {
            let _ = process.join().await;
            None
        })
        .filter_map(|x: Option<Result<OutputChunk>>| async move { x });
        let output = futures_util::stream::select(chunks(stdout, OutputChunk::Stdout), stderr);
        let output = futures_util::stream::select(output, keep);
        Ok(Attached {
            output: Box::pin(output),
            input,
        })
    }

    /// The name of pod `name`'s main container (the agent's, in a turn pod that has a
    /// broker beside it: exec, attach and logs must name one there); `None` when the pod
    /// is gone.
    async fn main_container(&self, name: &str) -> Result<Option<String>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        Ok(pod.and_then(|p| Some(p.spec?.containers.first()?.name.clone())))
    }

    fn pod(&self, name: &str, labels: &HashMap<String, String>, spec: PodSpec) -> Pod {
        let (labels, annotations) = meta::split(labels);
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(spec),
            ..Default::default()
        }
    }
}

/// Where a pod is on its way to running.
enum Progress {
    Waiting(String),
    Running,
    Ended(i64),
    ImageMissing(String),
}

/// Whether pod's egress init container ([`egress_init`]) ended in failure.
fn egress_init_failed(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == EGRESS_INIT)
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .any(|t| t.exit_code != 0)
}

fn pod_progress(pod: &Pod) -> Progress {
    let status = pod.status.clone().unwrap_or_default();
    // An init container that cannot get its image (the turn's own): the main container
    // only says PodInitializing meanwhile.
    let init_waiting = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.clone())
        .find_map(|w| {
            w.reason
                .filter(|r| r.contains("Image"))
                .map(|r| (r, w.message))
        });
    if let Some((reason, message)) = init_waiting {
        if reason != "ImagePulled" {
            return Progress::ImageMissing(format!("{reason}: {}", message.unwrap_or_default()));
        }
    }
    // The agent's container (a broker beside it ends after it); else the only one.
    let main = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let statuses = status.container_statuses.clone().unwrap_or_default();
    let container = statuses
        .iter()
        .find(|c| Some(&c.name) == main.as_ref())
        .or(statuses.first())
        .cloned();
    if let Some(state) = container.as_ref().and_then(|c| c.state.clone()) {
        if let Some(t) = state.terminated {
            return Progress::Ended(t.exit_code.into());
        }
        if state.running.is_some() {
            return Progress::Running;
        }
        if let Some(w) = state.waiting {
            let reason = w.reason.unwrap_or_default();
            if matches!(
                reason.as_str(),
                "ErrImageNeverPull" | "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
            ) {
                return Progress::ImageMissing(format!(
                    "{reason}: {}",
                    w.message.unwrap_or_default()
                ));
            }
            return Progress::Waiting(format!("{reason} {}", w.message.unwrap_or_default()));
        }
    }
    let phase = status.phase.clone().unwrap_or_default();
    if phase == "Failed" || phase == "Succeeded" {
        // Ended before its container ran (an init container failed).
        return Progress::Ended(if phase == "Failed" { 1 } else { 0 });
    }
    let why = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.status != "True")
        .filter_map(|c| c.message)
        .next()
        .unwrap_or_default();
    Progress::Waiting(format!("{phase} {why}").trim().to_string())
}

/// Reads a pod's memory cgroup counters (cgroup v1 and v2; one of them is there).
const OOM_COUNTERS: &str =
    "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null; true";

/// The kernel's OOM kills in [`OOM_COUNTERS`]' output (`oom_kill N` lines).
fn oom_kills(counters: &str) -> u64 {
    counters
        .lines()
        .filter_map(|l| l.trim().strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum()
}

/// The result line of a turn whose pod hit its memory limit.
fn out_of_memory(pod: &Pod) -> String {
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("memory")
                .cloned()
        })
        .map(|q| format!("its memory limit of {} (--memory)", readable_bytes(&q.0)))
        .unwrap_or_else(|| "the node's memory".to_string());
    format!("the turn's pod was OOM-killed: a process of it used up {limit}")
}

/// A quantity of bytes as written (`134217728` is `128Mi`).
fn readable_bytes(quantity: &str) -> String {
    match quantity.parse::<u64>() {
        Ok(n) if n > 0 && n % (1 << 30) == 0 => format!("{}Gi", n >> 30),
        Ok(n) if n > 0 && n % (1 << 20) == 0 => format!("{}Mi", n >> 20),
        _ => quantity.to_string(),
    }
}

/// Why the cluster ended a pod, when its status says: the kubelet evicted it (node
/// pressure), or killed its container for memory.
fn pod_failure(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        return Some(format!(
            "the turn's pod was evicted by its node: {}",
            status
                .message
                .as_deref()
                .unwrap_or("no reason given")
                .trim()
        ));
    }
    let oom = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .any(|t| t.reason.as_deref() == Some("OOMKilled"));
    oom.then(|| out_of_memory(pod))
}

/// A turn's pod gone before the turn ended: the API's eviction (a node drain) deletes the
/// pod, and on this side that looks as a deletion does.
/// The namespace's PodSecurity admission refused pod `name` (`message`, the API server's):
/// under `--allow-host` its egress init container needs NET_ADMIN and root, which the
/// `baseline` and `restricted` levels forbid.
pub fn pod_security_refused(name: &str, message: &str) -> Error {
    let why = if message.contains(EGRESS_INIT) || message.contains("NET_ADMIN") {
        "--allow-host needs an init container with NET_ADMIN and NET_RAW running as root, which the namespace's PodSecurity level (baseline or restricted) forbids"
    } else {
        "the namespace's PodSecurity level forbids it"
    };
    let first = message.lines().next().unwrap_or(message);
    Error::environment(format!(
        "the API server refused pod '{name}': {why} ({first})"
    ))
    .with_hint("run the turn in a namespace labelled pod-security.kubernetes.io/enforce=privileged, or drop --allow-host")
}

fn deleted_under_turn(name: &str) -> Error {
    let id = name.strip_prefix("caw-box-").unwrap_or(name);
    Error::environment(format!(
        "the turn's pod '{name}' was deleted before the turn ended: evicted (a node drain, the Eviction API) or deleted by someone"
    ))
    .with_hint(format!(
        "the session is kept: resume it with `caw-box resume {id}`"
    ))
}

fn pod_scheduled(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True")
}

fn container_info(pod: &Pod) -> ContainerInfo {
    let status = pod.status.clone().unwrap_or_default();
    let (state, finished) = if pod.metadata.deletion_timestamp.is_some() {
        (ContainerState::Removing, false)
    } else {
        match pod_progress(pod) {
            Progress::Running => (ContainerState::Running, false),
            Progress::Ended(_) => (ContainerState::Exited, true),
            _ => match status.phase.as_deref() {
                Some("Succeeded") | Some("Failed") => (ContainerState::Exited, true),
                _ => (ContainerState::Created, false),
            },
        }
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let claims: HashMap<String, String> = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| Some((v.name, v.persistent_volume_claim?.claim_name)))
        .collect();
    let mounts = spec
        .containers
        .first()
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| Some((m.mount_path, claims.get(&m.name)?.clone())))
        .collect();
    ContainerInfo {
        id: pod.metadata.uid.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: meta::merged(&pod.metadata),
        state,
        created: pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| std::time::SystemTime::from(t.0)),
        finished,
        mounts,
    }
}

/// `uid:gid` into numbers.
fn parse_user(user: &str) -> Option<(i64, i64)> {
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// The pod's volumes and mounts for caw-box's mounts: claims only (a host directory is not
/// something a cluster has).
fn claim_mounts(mounts: &[&MountSpec]) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let mut volumes = Vec::new();
    let mut volume_mounts = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let claim = match &m.source {
            MountSource::Volume(v) => v.clone(),
            MountSource::HostDir(dir) => {
                return Err(Error::usage(format!(
                    "the kubernetes backend cannot mount the host directory {dir}"
                ))
                .with_hint("use --workspace-mode copy (the default on Kubernetes)"))
            }
        };
        let name = format!("v{i}");
        volumes.push(Volume {
            name: name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: Some(m.read_only),
            }),
            ..Default::default()
        });
        volume_mounts.push(VolumeMount {
            name,
            mount_path: m.target.clone(),
            read_only: Some(m.read_only),
            ..Default::default()
        });
    }
    Ok((volumes, volume_mounts))
}

fn empty_dir(name: &str, memory: bool, limit: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: memory.then(|| "Memory".to_string()),
            size_limit: Some(Quantity(limit.to_string())),
        }),
        ..Default::default()
    }
}

/// The sandbox every agent pod gets: non-root, no capabilities, no privilege escalation,
/// a read-only root filesystem.
fn hardened(uid: i64, gid: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(uid != 0),
        run_as_user: Some(uid),
        run_as_group: Some(gid),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        ..Default::default()
    }
}

fn pod_security(gid: i64) -> PodSecurityContext {
    PodSecurityContext {
        fs_group: Some(gid),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

fn pull_policy() -> String {
    std::env::var("CAW_BOX_IMAGE_PULL_POLICY").unwrap_or_else(|_| "IfNotPresent".to_string())
}

/// The pod of a turn (see the module docs).
pub fn turn_pod_spec(spec: &TurnSpec) -> Result<PodSpec> {
    let interactive = spec.interactive.is_some();
    match &spec.network {
        NetworkPolicy::Default => {}
        other => {
            return Err(Error::usage(format!(
                "--network {other:?} is not available with the kubernetes backend: pods use the cluster's network (--allow-host holds a turn's egress to a list)"
            )))
        }
    }
    let (uid, gid) = (i64::from(spec.user.0), i64::from(spec.user.1));
    let held = !spec.egress_allow.is_empty();
    if held && [PROXY_UID, BROKER_UID].contains(&uid) {
        return Err(Error::usage(format!(
            "the agent's uid {uid} is the one the kubernetes backend keeps for its proxy or broker sidecar: --allow-host could not tell them apart"
        )));
    }
    if !interactive && !spec.runtime.files.is_empty() {
        return Err(Error::environment(
            "a turn's runtime files travel on its stdin on Kubernetes: none can be put in a pod before it starts",
        ));
    }
    let mounts: Vec<&MountSpec> = spec.mounts().collect();
    let (mut volumes, mut volume_mounts) = claim_mounts(&mounts)?;
    // The runtime directory holds secrets for a moment: memory, never a node's disk.
    volumes.push(empty_dir("runtime", true, "64Mi"));
    volume_mounts.push(VolumeMount {
        name: "runtime".into(),
        mount_path: spec.runtime.mount.clone(),
        ..Default::default()
    });
    volumes.push(empty_dir("tmp", false, "1Gi"));
    volume_mounts.push(VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    });
    let mut limits = BTreeMap::new();
    if let Some(memory) = spec.limits.memory {
        limits.insert("memory".to_string(), Quantity(memory.to_string()));
    }
    if let Some(cpus) = spec.limits.cpus {
        limits.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (cpus * 1000.0).ceil() as i64)),
        );
    }
    let sidecars = spec.broker.is_some() || held;
    if sidecars {
        // Shared by the agent's container and its sidecars: the agent's end marker.
        volumes.push(empty_dir("pod-end", true, "1Mi"));
        volume_mounts.push(VolumeMount {
            name: "pod-end".into(),
            mount_path: POD_END_DIR.into(),
            ..Default::default()
        });
    }
    if held {
        // For iptables-legacy's lock (the egress init container's root is read-only).
        volumes.push(empty_dir("xtables", true, "1Mi"));
    }
    let handoff_wait = spec
        .runtime_over_stdin
        .then(|| format!("CAW_BOX_HANDOFF_WAIT={}", HANDOFF_WAIT.as_secs()));
    let proxy_wait = held.then(|| format!("CAW_BOX_PROXY_WAIT={PROXY_PORT}"));
    let env = spec
        .env
        .iter()
        .chain(handoff_wait.as_ref())
        .chain(proxy_wait.as_ref())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            k8s_openapi::api::core::v1::EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                value_from: None,
            }
        })
        .collect();
    let broker = spec
        .broker
        .as_ref()
        .map(|command| broker_container(spec, command, gid));
    let brokered = broker.is_some();
    let proxy = held.then(|| proxy_container(spec, gid));
    // A TUI's runtime files are put in once the pod runs (a terminal's stdin is no way for
    // an archive): the image's entrypoint starts when they are there. Beside a broker, the
    // entrypoint leaves the end marker when it ended.
    let command = match (interactive, sidecars) {
        (false, false) => None,
        (true, _) => Some(tui_command(&spec.runtime.mount, sidecars)),
        (false, true) => Some(marked_entry()),
    };
    let mut containers = vec![Container {
        name: AGENT.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(pull_policy()),
        command,
        args: Some(spec.argv.clone()),
        env: Some(env),
        working_dir: Some(spec.working_dir.clone()),
        stdin: Some(spec.runtime_over_stdin || interactive),
        // Open across attachments: the driver's attachment may end (a detached turn's
        // driver killed) and another caw-box hand the record in (`adopt`).
        stdin_once: Some(false),
        tty: Some(interactive),
        security_context: Some(hardened(uid, gid)),
        resources: Some(ResourceRequirements {
            limits: (!limits.is_empty()).then_some(limits),
            ..Default::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Default::default()
    }];
    containers.extend(broker);
    containers.extend(proxy);
    let mut init_containers = Vec::new();
    if held {
        init_containers.push(egress_init(spec, brokered));
    }
    init_containers.push(seed_home(spec, uid, gid));
    Ok(PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security(gid)),
        termination_grace_period_seconds: Some(10),
        init_containers: Some(init_containers),
        containers,
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// The agent's container in a turn pod (the first).
const AGENT: &str = "agent";

/// The uid of a turn pod's proxy sidecar (`--allow-host`), and of its broker sidecar: each
/// its own, not the agent's, as the pod's firewall lets out these two alone
/// ([`egress_init`]).
pub const PROXY_UID: i64 = 10_001;
pub const BROKER_UID: i64 = 10_002;

/// The credential broker beside the agent (`crate::session::broker`): the same image and
/// sandbox under a uid of its own, its keys on its stdin (never in its spec), the pod's end
/// marker read-only.
fn broker_container(spec: &TurnSpec, command: &[String], gid: i64) -> Container {
    Container {
        stdin: Some(true),
        stdin_once: Some(false),
        ..sidecar(SIDECAR, spec, command.to_vec(), BROKER_UID, gid, "256Mi")
    }
}

/// A helper beside the agent: the turn's image and the agent's sandbox under a uid of its
/// own, a memory limit, and the pod's end marker read-only (it exits when it appears).
fn sidecar(
    name: &str,
    spec: &TurnSpec,
    command: Vec<String>,
    uid: i64,
    gid: i64,
    memory: &str,
) -> Container {
    Container {
        name: name.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(pull_policy()),
        command: Some(command),
        security_context: Some(hardened(uid, gid)),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity(memory.into()),
            )])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "pod-end".into(),
            mount_path: POD_END_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// `--allow-host` on Kubernetes, held inside the turn pod's own network namespace (as
/// Istio's init container does), so no NetworkPolicy is needed and any CNI will do: this
/// init container (the turn's image, root with NET_ADMIN and NET_RAW alone, no privilege
/// escalation) sets the pod's OUTPUT rules, IPv4 and IPv6: loopback, the proxy sidecar's
/// uid and (brokered) the broker's uid get out; every other packet is rejected. The
/// agent's container then reaches only the proxy on 127.0.0.1, which admits the allowed
/// hosts. It has no secret. A PodSecurity level of `baseline` or `restricted` forbids it.
fn egress_init(spec: &TurnSpec, brokered: bool) -> Container {
    let mut uids = vec![PROXY_UID];
    if brokered {
        uids.push(BROKER_UID);
    }
    let uids = uids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    Container {
        name: EGRESS_INIT.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(pull_policy()),
        command: Some(vec![
            "bash".into(),
            "-c".into(),
            EGRESS_RULES.into(),
            "caw-box-egress".into(),
            uids,
        ]),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(false),
            run_as_user: Some(0),
            run_as_group: Some(0),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: Some(vec!["NET_ADMIN".to_string(), "NET_RAW".to_string()]),
            }),
            ..Default::default()
        }),
        // iptables-legacy's lock file, on a read-only root.
        volume_mounts: Some(vec![VolumeMount {
            name: "xtables".into(),
            mount_path: "/run".into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The egress init container's name.
pub const EGRESS_INIT: &str = "egress";

/// [`egress_init`]'s rules, `$1` the uids let out: nft if the node's kernel has it, else
/// legacy; IPv6 too unless the pod has none.
const EGRESS_RULES: &str = r#"set -e
pick() {
  for v in nft legacy; do
    if "$1-$v" -w -S OUTPUT >/dev/null 2>&1; then echo "$1-$v"; return 0; fi
  done
  return 1
}
hold() {
  "$1" -w -A OUTPUT -o lo -j ACCEPT
  for u in $2; do "$1" -w -A OUTPUT -m owner --uid-owner "$u" -j ACCEPT; done
  "$1" -w -A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
  "$1" -w -A OUTPUT -j REJECT
}
command -v iptables-nft >/dev/null || command -v iptables-legacy >/dev/null ||
  { echo "caw-box: the image has no iptables" >&2; exit 1; }
v4=$(pick iptables) || { echo "caw-box: iptables works neither as nft nor as legacy in this pod" >&2; exit 1; }
hold "$v4" "$1"
if v6=$(pick ip6tables); then
  hold "$v6" "$1"
elif [ -e /proc/net/if_inet6 ]; then
  echo "caw-box: the pod has IPv6 but ip6tables works neither as nft nor as legacy" >&2; exit 1
fi
echo "caw-box: egress held to uids $1 ($v4${v6:+, $v6})""#;

/// The proxy beside the agent under `--allow-host` (the image's proxy.js, as on Docker):
/// on the pod's loopback only, a uid of its own, the same sandbox; it exits on the pod's
/// end marker, as the broker does.
fn proxy_container(spec: &TurnSpec, gid: i64) -> Container {
    let marker = serde_json::Value::String(format!("{POD_END_DIR}/{POD_END_FILE}"));
    let script = format!(
        "setInterval(()=>{{if(require('fs').existsSync({marker}))process.exit(0);}},300);require('/usr/local/lib/caw-box/proxy.js');"
    );
    let env = [
        ("CAW_BOX_ALLOW", spec.egress_allow.join(",")),
        ("CAW_BOX_PROXY_PORT", PROXY_PORT.to_string()),
        ("CAW_BOX_PROXY_HOST", "127.0.0.1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| k8s_openapi::api::core::v1::EnvVar {
        name: k.to_string(),
        value: Some(v),
        value_from: None,
    })
    .collect();
    let command = vec!["node".into(), "-e".into(), script];
    Container {
        env: Some(env),
        ..sidecar(PROXY_SIDECAR, spec, command, PROXY_UID, gid, "128Mi")
    }
}

/// Runs its arguments (the image's entrypoint and the turn's argv) as bash's child (once the
/// proxy sidecar listens, given `CAW_BOX_PROXY_WAIT`, its port), passing on its
/// stdin and the stop signals, and leaves the pod's end marker once it ended, with its
/// exit code: the broker beside it then exits, so the pod completes. (Bash starts a
/// background child with SIGINT ignored: `env --default-signal` gives it back, so the
/// entrypoint can forward it.)
const MARKED_ENTRY: &str = r#"if [ -n "${CAW_BOX_PROXY_WAIT:-}" ]; then
  for _ in $(seq 100); do (: <"/dev/tcp/127.0.0.1/$CAW_BOX_PROXY_WAIT") 2>/dev/null && break; sleep 0.1; done
fi
trap 'kill -TERM "$p" 2>/dev/null' TERM
trap 'kill -INT "$p" 2>/dev/null' INT
trap 'kill -HUP "$p" 2>/dev/null' HUP
env --default-signal=INT,QUIT "$@" <&0 &
p=$!
rc=
until [ -n "$rc" ]; do
  wait "$p" 2>/dev/null; r=$?
  if [ "$r" -le 128 ] || ! kill -0 "$p" 2>/dev/null; then
    wait "$p" 2>/dev/null; r2=$?
    if [ "$r2" -eq 127 ]; then rc=$r; else rc=$r2; fi
  fi
done
: > "$CAW_BOX_POD_END"
exit "$rc""#;

/// The agent container's command beside a broker: tini, then [`MARKED_ENTRY`].
fn marked_entry() -> Vec<String> {
    vec![
        "/usr/bin/tini".into(),
        "--".into(),
        "env".into(),
        format!("CAW_BOX_POD_END={POD_END_DIR}/{POD_END_FILE}"),
        "bash".into(),
        "-c".into(),
        MARKED_ENTRY.into(),
        "caw-box-agent".into(),
        "/usr/local/bin/caw-box-entry".into(),
    ]
}

/// The file in a TUI pod's runtime directory that says its runtime files are all there.
const RUNTIME_READY: &str = ".caw-box-ready";

/// A TUI pod's command: waits for its runtime files, then becomes the caw-box image's
/// entrypoint (tini, `caw-box-entry`) with the turn's argv.
fn tui_command(run_dir: &str, brokered: bool) -> Vec<String> {
    let entry = if brokered {
        marked_entry()
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        "/usr/bin/tini -- /usr/local/bin/caw-box-entry".to_string()
    };
    let script = format!(
        "while [ ! -e {ready} ]; do sleep 0.1; done; exec {entry} \"$@\"",
        ready = shell_quote(&format!("{run_dir}/{RUNTIME_READY}"))
    );
    vec!["sh".into(), "-c".into(), script, "caw-box-tui".into()]
}

/// Where [`seed_home`] mounts the state claim.
const SEED_MOUNT: &str = "/caw-box-seed";
/// The marker [`seed_home`] leaves in HOME once it copied the image's HOME.
pub const SEEDED_MARKER: &str = ".caw-box/image-home-copied";

/// An init container that copies the image's own HOME (the vendors' config files the
/// images ship, e.g. codex's config.toml that turns its background traffic off, gemini's
/// settings.json) into the state claim once, without replacing anything there. Docker
/// does that by itself for a named volume mounted over a non-empty directory the first
/// time; a PVC starts empty.
fn seed_home(spec: &TurnSpec, uid: i64, gid: i64) -> Container {
    let home = spec.home.target.trim_end_matches('/');
    let script = format!(
        "[ -e {seed}/{marker} ] && exit 0; cp -a -n {home}/. {seed}/ 2>/dev/null; mkdir -p {seed}/.caw-box && : > {seed}/{marker}",
        seed = SEED_MOUNT,
        marker = SEEDED_MARKER,
        home = shell_quote(home),
    );
    Container {
        name: "seed-home".into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some(pull_policy()),
        command: Some(vec!["sh".into(), "-c".into(), script]),
        security_context: Some(hardened(uid, gid)),
        volume_mounts: Some(vec![VolumeMount {
            // The first volume is the state claim (`claim_mounts` of `spec.mounts()`).
            name: "v0".into(),
            mount_path: SEED_MOUNT.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// The pod of a helper: `sleep` while files move through it (`hold`), or the helper's own
/// command run to its end.
pub fn helper_pod_spec(spec: &HelperSpec, hold: bool) -> Result<PodSpec> {
    if spec.network != NetworkPolicy::None && spec.network != NetworkPolicy::Default {
        return Err(Error::usage(
            "helpers on a named network (an egress proxy) are not available with the kubernetes backend yet",
        ));
    }
    let mounts: Vec<&MountSpec> = spec.mounts.iter().collect();
    let (mut volumes, mut volume_mounts) = claim_mounts(&mounts)?;
    volumes.push(empty_dir("tmp", false, "256Mi"));
    volume_mounts.push(VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..Default::default()
    });
    let (uid, gid) = spec
        .user
        .as_deref()
        .and_then(parse_user)
        .unwrap_or_else(|| {
            let (u, g) = crate::dirs::agent_ids();
            (u.into(), g.into())
        });
    let mut security = hardened(uid, gid);
    if !spec.add_capabilities.is_empty() {
        if let Some(caps) = security.capabilities.as_mut() {
            caps.add = Some(spec.add_capabilities.clone());
        }
    }
    let command = if hold {
        vec!["sleep".to_string(), "3600".to_string()]
    } else {
        spec.entrypoint.clone()
    };
    Ok(PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security(gid)),
        termination_grace_period_seconds: Some(0),
        containers: vec![Container {
            name: "helper".into(),
            image: Some(spec.image.clone()),
            image_pull_policy: Some(pull_policy()),
            command: (!command.is_empty()).then_some(command),
            args: (!hold && !spec.argv.is_empty()).then(|| spec.argv.clone()),
            env: Some(
                spec.env
                    .iter()
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        k8s_openapi::api::core::v1::EnvVar {
                            name: k.to_string(),
                            value: Some(v.to_string()),
                            value_from: None,
                        }
                    })
                    .collect(),
            ),
            security_context: Some(security),
            volume_mounts: Some(volume_mounts),
            ..Default::default()
        }],
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// A reader as a stream of output chunks.
fn chunks(
    reader: impl AsyncRead + Unpin + Send + 'static,
    wrap: fn(Vec<u8>) -> OutputChunk,
) -> OutputStream {
    Box::pin(futures_util::stream::unfold(
        reader,
        move |mut r| async move {
            let mut buf = vec![0u8; 16 * 1024];
            match r.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(wrap(buf)), r))
                }
                Err(e) => Some((
                    Err(Error::environment(format!(
                        "reading a pod's output failed: {e}"
                    ))),
                    r,
                )),
            }
        },
    ))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Backend for KubeBackend {
    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>> {
        let params = ListParams::default().labels(&label_selector(labels));
        let pods = self
            .pods()
            .list(&params)
            .await
            .map_err(|e| failed(format!("list pods in namespace '{}'", self.namespace), &e))?;
        Ok(pods
            .items
            .iter()
            .map(container_info)
            .filter(|c| meta::matches(&c.labels, labels))
            .collect())
    }

    async fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> std::result::Result<String, CreateError> {
        let pod_spec = turn_pod_spec(spec).map_err(CreateError::Other)?;
        self.create_pod(&self.pod(name, &spec.labels, pod_spec))
            .await?;
        self.wait_running(name, &spec.image).await?;
        if spec.interactive.is_some() {
            let dir = &spec.runtime.mount;
            let mut files = spec.runtime.tar_files();
            files.push(TarFile {
                path: RUNTIME_READY,
                contents: b"",
                mode: 0o600,
            });
            let put = self
                .upload_files(name, dir, &files, spec.user)
                .await
                .map_err(CreateError::Other);
            if let Err(e) = put {
                let _ = self.remove_container(name, true).await;
                return Err(e);
            }
        }
        Ok(name.to_string())
    }

    async fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<String, CreateError> {
        let pod_spec = helper_pod_spec(spec, true).map_err(CreateError::Other)?;
        self.create_pod(&self.pod(name, &spec.labels, pod_spec))
            .await?;
        self.wait_running(name, &spec.image).await?;
        Ok(name.to_string())
    }

    async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        Ok(pod.as_ref().map(container_info))
    }

    async fn attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        let tty = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .and_then(|p| p.spec?.containers.first().cloned());
        let main = tty.as_ref().map(|c| c.name.clone());
        let tty = tty.and_then(|c| c.tty).unwrap_or(false);
        self.attach_to(name, main, stdin, tty).await
    }

    fn brokers_in_turn_pod(&self) -> bool {
        true
    }

    fn holds_egress_in_turn_pod(&self) -> bool {
        true
    }

    async fn attach_sidecar(&self, name: &str, sidecar: &str) -> Result<Attached> {
        // Running, or the attachment would wait for nothing.
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .ok_or_else(|| Error::environment(format!("pod '{name}' does not exist")))?;
        let running = pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == sidecar && c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if !running {
            return Err(Error::environment(format!(
                "the container '{sidecar}' of pod '{name}' does not run"
            )));
        }
        self.attach_to(name, Some(sidecar.to_string()), true, false)
            .await
    }

    async fn resize_tty(&self, name: &str, columns: u16, rows: u16) -> Result<()> {
        let mut terminals = self
            .terminals
            .lock()
            .map_err(|_| Error::environment("the terminal sizes' lock is poisoned"))?;
        if let Some(resize) = terminals.get_mut(name) {
            if !resize(columns, rows) {
                terminals.remove(name);
            }
        }
        Ok(())
    }

    async fn start_container(&self, _name: &str) -> Result<()> {
        // A pod runs once created (create_turn waited for it); its entrypoint waits for
        // the runtime files on stdin.
        Ok(())
    }

    async fn wait_container(&self, name: &str) -> Result<i64> {
        loop {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
            let Some(pod) = pod else {
                return Err(deleted_under_turn(name));
            };
            if let Progress::Ended(code) = pod_progress(&pod) {
                return Ok(code);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn removed_under_turn(&self, name: &str) -> Error {
        deleted_under_turn(name)
    }

    async fn ended_by_environment(&self, name: &str) -> Option<String> {
        let pod = self.pods().get_opt(name).await.ok().flatten()?;
        if let Some(why) = pod_failure(&pod) {
            return Some(why);
        }
        if !container_info(&pod).running() {
            return None;
        }
        // The pod still waits for its record: its memory cgroup counts the kernel's kills
        // (cgroup v1 `memory.oom_control`, v2 `memory.events`), those of a tool's process
        // as well as the CLI's.
        let out = self
            .exec(name, &["sh", "-c", OOM_COUNTERS], None)
            .await
            .ok()?;
        (oom_kills(&String::from_utf8_lossy(&out)) > 0).then(|| out_of_memory(&pod))
    }

    async fn stop_container(&self, name: &str, grace: Duration) -> Result<()> {
        // tini forwards the signal to the entrypoint, which stops the CLI and cleans up.
        if self.exec(name, &["kill", "-TERM", "1"], None).await.is_ok() {
            let ended = tokio::time::timeout(grace, self.wait_container(name)).await;
            if ended.is_ok() {
                return Ok(());
            }
        }
        self.remove_container(name, true).await
    }

    fn surely_shares_paths(&self) -> bool {
        false
    }

    fn turns_outlive_driver(&self) -> bool {
        true
    }

    async fn note_stop(&self, name: &str) -> Result<()> {
        let key = crate::session::names::labels::STOP_REQUESTED;
        let patch = serde_json::json!({"metadata": {"annotations": {key: "true"}}});
        self.pods()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|e| failed(format!("annotate pod '{name}'"), &e))?;
        Ok(())
    }

    /// A turn pod's init container ([`seed_home`]) copies the image's HOME into the claim
    /// without replacing anything caw-box put there first.
    async fn fills_volumes_at_create(&self) -> bool {
        true
    }

    async fn keeps_stdin_across_attaches(&self) -> bool {
        false
    }

    async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        self.delete_pod(name, None, force).await
    }

    async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
        let uid = (!found.id.is_empty()).then(|| found.id.clone());
        self.delete_pod(&found.name, uid, true).await
    }

    async fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        let pod_spec = helper_pod_spec(spec, false).map_err(CreateError::Other)?;
        self.create_pod(&self.pod(name, &spec.labels, pod_spec))
            .await?;
        let run = async {
            self.wait_running(name, &spec.image).await?;
            let code = self
                .wait_container(name)
                .await
                .map_err(CreateError::Other)?;
            // Kubernetes keeps one log per container: stdout and stderr together.
            let logs = self
                .pods()
                .logs(name, &LogParams::default())
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

    fn follow_logs(&self, name: &str) -> OutputStream {
        // `<pod>/<container>` names a sidecar's log (the proxy's: what it refused).
        let (name, sidecar) = match name.split_once('/') {
            Some((pod, container)) => (pod.to_string(), Some(container.to_string())),
            None => (name.to_string(), None),
        };
        let (this, pods) = (self.clone(), self.pods());
        let stream = async move {
            let container = match sidecar {
                Some(c) => Some(c),
                // The agent's, not the broker's beside it.
                None => this.main_container(&name).await.ok().flatten(),
            };
            let params = LogParams {
                follow: true,
                container,
                ..Default::default()
            };
            match pods.log_stream(&name, &params).await {
                Ok(reader) => {
                    use tokio_util::compat::FuturesAsyncReadCompatExt;
                    chunks(reader.compat(), OutputChunk::Stdout)
                }
                Err(e) => {
                    let e = failed(format!("follow pod '{name}'s logs"), &e);
                    Box::pin(futures_util::stream::once(async move { Err(e) })) as OutputStream
                }
            }
        };
        Box::pin(futures_util::stream::once(stream).flatten())
    }

    async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        // The API server does not say which images its nodes have: a missing one shows
        // when a pod cannot start (`CreateError::ImageMissing`).
        Ok(Some(ImageInfo {
            tags: vec![image.to_string()],
            ..Default::default()
        }))
    }

    async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        let (k8s_labels, annotations) = meta::split(&labels);
        let metadata = ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(k8s_labels),
            annotations: Some(annotations),
            ..Default::default()
        };
        let role = labels.get(crate::session::names::labels::ROLE);
        let created = if role.map(String::as_str) == Some(crate::session::names::roles::TURN_RECORD)
        {
            let map = ConfigMap {
                metadata,
                ..Default::default()
            };
            self.config_maps()
                .create(&PostParams::default(), &map)
                .await
                .map(|_| ())
        } else {
            let class = std::env::var("CAW_BOX_STORAGE_CLASS").ok();
            if let Some(class) = &class {
                self.check_storage_class(name, class).await?;
            }
            let size = std::env::var("CAW_BOX_VOLUME_SIZE").unwrap_or_else(|_| "1Gi".into());
            let claim = PersistentVolumeClaim {
                metadata,
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: class,
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size))])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            self.claims()
                .create(&PostParams::default(), &claim)
                .await
                .map(|_| ())
        };
        match created {
            // Docker's create is idempotent by name; so is this.
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(e) => Err(failed(format!("create volume '{name}'"), &e)),
            Ok(()) => Ok(()),
        }
    }

    async fn inspect_volume(&self, name: &str) -> Result<Option<VolumeInfo>> {
        let claim = self
            .claims()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read claim '{name}'"), &e))?;
        if let Some(c) = claim {
            if c.metadata.deletion_timestamp.is_none() {
                return Ok(Some(meta::volume(&c.metadata)));
            }
            return Ok(None);
        }
        let map = self
            .config_maps()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read config map '{name}'"), &e))?;
        Ok(map.map(|m| meta::volume(&m.metadata)))
    }

    async fn list_volumes(&self, labels: &[String]) -> Result<Vec<VolumeInfo>> {
        let params = ListParams::default().labels(&label_selector(labels));
        let (claim_api, map_api) = (self.claims(), self.config_maps());
        let (claims, maps) = tokio::join!(
            claim_api.list_metadata(&params),
            map_api.list_metadata(&params)
        );
        let what = format!("list volumes in namespace '{}'", self.namespace);
        let claims = claims.map_err(|e| failed(&what, &e))?;
        let maps = maps.map_err(|e| failed(&what, &e))?;
        Ok(claims
            .items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| meta::volume(&c.metadata))
            .chain(maps.items.iter().map(|m| meta::volume(&m.metadata)))
            .filter(|v| meta::matches(&v.labels, labels))
            .collect())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        let params = DeleteParams::default();
        let (claim_api, map_api) = (self.claims(), self.config_maps());
        let (claim, map) = tokio::join!(
            claim_api.delete(name, &params),
            map_api.delete(name, &params)
        );
        for r in [claim.map(|_| ()), map.map(|_| ())] {
            match r {
                Ok(()) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(failed(format!("delete volume '{name}'"), &e)),
            }
        }
        Ok(())
    }

    async fn create_network(
        &self,
        name: &str,
        _internal: bool,
        _labels: HashMap<String, String>,
    ) -> Result<()> {
        Err(Error::usage(format!(
            "cannot create network '{name}': networks are not available with the kubernetes backend (--allow-host is held in the turn's pod)"
        )))
    }

    async fn list_networks(&self, _labels: &[String]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    async fn remove_network(&self, _name: &str) -> Result<()> {
        Ok(())
    }

    async fn connect_network(&self, network: &str, _container: &str, _alias: &str) -> Result<()> {
        Err(Error::usage(format!(
            "cannot connect to network '{network}': networks are not available with the kubernetes backend yet"
        )))
    }

    async fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        owner: (u32, u32),
    ) -> Result<()> {
        let tar = super::build_tar(files, owner.0.into(), owner.1.into())?;
        self.upload_tar(name, dir, tar).await
    }

    async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        // Not as root: tar keeps the files' modes, and they belong to the pod's user.
        let script = format!(
            "mkdir -p {d} && tar -x --no-same-owner -m -f - -C {d}",
            d = shell_quote(dir)
        );
        let put = self
            .exec_files(name, dir, &["sh", "-c", &script], Some(tar))
            .await?;
        if put.is_none() {
            return Err(Error::environment(format!(
                "pod '{name}' has ended: {dir} went with it"
            )));
        }
        Ok(())
    }

    async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let script = format!(
            "if [ -f {p} ]; then printf Y; cat {p}; else printf N; fi",
            p = shell_quote(path)
        );
        self.exec_marked(name, path, &script).await
    }

    async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let p = std::path::Path::new(path);
        let parent = p.parent().map(|x| x.to_string_lossy().into_owned());
        let base = p
            .file_name()
            .map(|x| x.to_string_lossy().into_owned())
            .unwrap_or_else(|| ".".into());
        let (parent, base) = if path.ends_with("/.") {
            (path.trim_end_matches("/.").to_string(), ".".to_string())
        } else {
            (parent.unwrap_or_else(|| "/".into()), base)
        };
        let script = format!(
            "if [ -e {p} ]; then printf Y; tar -c -f - -C {parent} {base}; else printf N; fi",
            p = shell_quote(path),
            parent = shell_quote(&parent),
            base = shell_quote(&base)
        );
        self.exec_marked(name, path, &script).await
    }
}

impl KubeBackend {
    /// A claim of a storage class that does not exist would stay Pending for ever: refused
    /// before it is made. Where the user may not read storage classes (cluster-scoped), the
    /// claim's binding tells instead ([`Self::wait_running`]).
    async fn check_storage_class(&self, claim: &str, class: &str) -> Result<()> {
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        match classes.get_opt(class).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Error::environment(format!(
                "cannot create claim '{claim}': storage class '{class}' (CAW_BOX_STORAGE_CLASS) does not exist, so the claim would stay Pending"
            ))
            .with_hint("`kubectl get storageclass` lists the classes; unset CAW_BOX_STORAGE_CLASS for the default one")),
            Err(e) if is_status(&e, 403) => Ok(()),
            Err(e) => Err(failed(format!("read storage class '{class}'"), &e)),
        }
    }

    /// The claims of pod `pod` that are not bound yet, with their phase.
    async fn unbound_claims(&self, pod: &Pod) -> Vec<String> {
        let mut unbound = Vec::new();
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        for claim in volumes
            .into_iter()
            .filter_map(|v| v.persistent_volume_claim)
        {
            let name = claim.claim_name;
            let (phase, class) = match self.claims().get_opt(&name).await {
                Ok(Some(c)) => (
                    c.status.and_then(|s| s.phase).unwrap_or_default(),
                    c.spec.and_then(|s| s.storage_class_name),
                ),
                Ok(None) => ("missing".to_string(), None),
                Err(_) => continue,
            };
            if phase != "Bound" {
                let class = class
                    .map(|c| format!("storage class '{c}'"))
                    .unwrap_or_else(|| "the default storage class".to_string());
                unbound.push(format!("'{name}' ({phase}, {class})"));
            }
        }
        unbound
    }

    /// Runs `script` in `name` for `path`: its output after a leading `Y` (found), or `None`
    /// (`N`: not there, or the pod is gone).
    async fn exec_marked(&self, name: &str, path: &str, script: &str) -> Result<Option<Vec<u8>>> {
        let Some(out) = self
            .exec_files(name, path, &["sh", "-c", script], None)
            .await?
        else {
            return Ok(None);
        };
        match out.split_first() {
            Some((b'Y', rest)) => Ok(Some(rest.to_vec())),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
