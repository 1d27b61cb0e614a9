//! The Kubernetes backend (kube-rs): the only code that talks to an API server. Not the
//! session layer's business how a "container" or a "volume" is kept here; this module maps
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
//! A headless turn outlives its driver, and its pod says so ([`ADOPTABLE`]): the pod's
//! stdin stays open across attachments and its entrypoint waits hours for the record, so
//! any caw-box can finish a turn whose driver is gone (`session::headless::adopt`).
//! `caw-box stop` annotates the pod (`note_stop`), read after the pod ended.
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
//! `--runtime NAME` is the turn pod's `runtimeClassName` (the agent and its sidecars share
//! the pod's sandbox), checked against the cluster's RuntimeClasses before anything is made.
//!
//! Not here: Docker networks (`--network NAME|host`, refused before a turn), a
//! process limit (a pod has none; a kubelet's `podPidsLimit` is the node's), image builds
//! (images come from a registry, or `k8s-lab load-image` in tests).
//!
//! - `mod.rs`: connecting, the namespace's APIs, RuntimeClasses, and the API server's errors in caw-box's
//! - `seam.rs`: [`Backend`] for Kubernetes, over the files below
//! - `pods.rs`: create (the lock), wait to run, delete
//! - `status.rs`: what a pod's status says (pure)
//! - `spec.rs`: the pod specs of turns (pure)
//! - `helpers.rs`: helpers' pods: created waiting for their start, a login's held egress and
//!   kept HOME
//! - `sandbox.rs`: the sandbox and volumes every container there gets (pure)
//! - `sidecars.rs`: the broker, the egress proxy and its firewall beside the agent (pure)
//! - `exec.rs`: exec and attach, and files through a pod
//! - `meta.rs`: caw-box's labels as Kubernetes labels and annotations
//! - `lease.rs`: a brokered login's refresh lock, a Lease (one refresh at a time across hosts)
//! - `warm.rs`: warm pods (`--keep-warm`): claimed by a patch, turns by exec
//! - `doctor.rs`: what `caw-box doctor` checks of a cluster
//!
//! [`Backend`]: crate::backend::Backend
//! [`ADOPTABLE`]: crate::labelling::labels::ADOPTABLE
//! [`TurnSpec::broker`]: crate::backend::TurnSpec::broker
//! [`TurnSpec::egress_allow`]: crate::backend::TurnSpec::egress_allow
//! [`MARKED_ENTRY`]: spec::MARKED_ENTRY
//! [`egress_init`]: sidecars::egress_init
//! [`proxy_container`]: sidecars::proxy_container

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams};

use crate::error::{Error, Result};

pub mod doctor;
mod ends;
mod exec;
mod helpers;
mod lease;
mod meta;
mod pipes;
mod pods;
mod pool;
mod sandbox;
mod seam;
mod sidecars;
mod snapshots;
mod spec;
mod status;
mod warm;

pub use helpers::helper_pod_spec;
pub use meta::{label_selector, valid_label_value};
pub use sidecars::{broker_route, BROKER_UID, EGRESS_INIT, PROXY_UID};
pub use spec::{turn_pod_spec, SEEDED_MARKER};
pub use status::pod_security_refused;

/// Every object caw-box creates here carries this label too (the Kubernetes convention).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "caw-box");

const POLL: Duration = Duration::from_millis(250);

/// The poll interval of a wait that began at `since`: 100 ms for its first 10 s (a pod's
/// start, a turn's end after its record went in: each poll there is a turn's latency),
/// then [`POLL`] (a long turn's waiters should not load the API server).
fn poll_after(since: std::time::Instant) -> Duration {
    if since.elapsed() < Duration::from_secs(10) {
        Duration::from_millis(100)
    } else {
        POLL
    }
}

/// When this process first talked to the API server: the zero of the timeline.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// One step of where a turn's time goes on the cluster, at `-v`: `kubernetes: 1.84 s pod
/// create 0.04 s` (the time since the process connected, then the step's own). The steps:
/// pod create, scheduling, init and start, attach, CLI (until the pod ended), record
/// hand-off (an attach), ConfigMap (the turn record), delete (until the pod is gone).
fn timeline(step: &str, since: std::time::Instant) {
    let zero = *STARTED.get_or_init(std::time::Instant::now);
    tracing::info!(
        "kubernetes: {:.2} s {step} {:.2} s",
        zero.elapsed().as_secs_f64(),
        since.elapsed().as_secs_f64()
    );
}

/// A connected API server and the namespace caw-box works in.
#[derive(Clone)]
pub struct KubeBackend {
    client: kube::Client,
    namespace: String,
    /// Where the client's configuration came from, for messages.
    origin: String,
    /// What this backend can do, and where its sessions live (the namespace, the context).
    capabilities: std::sync::Arc<crate::backend::Capabilities>,
    /// What every claim and pod it makes gets (a storage class, a pull policy …).
    cluster: std::sync::Arc<crate::backend::ClusterSettings>,
    /// The terminal size senders of this process's TTY attachments, by pod name.
    terminals: std::sync::Arc<std::sync::Mutex<HashMap<String, Resizer>>>,
    /// What the agents of this process's attachments said of their end.
    ends: std::sync::Arc<ends::Ends>,
    /// The turns this process runs in warm pods, by pod name (`warm.rs`).
    warm: warm::WarmTurns,
    /// The helper pods this process created that wait for their start (`helpers.rs`).
    waiting: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
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

/// What a cluster can do, for the sessions of `namespace` made through the kubeconfig
/// context `context` (when one was named).
fn capabilities(namespace: &str, context: Option<&str>) -> crate::backend::Capabilities {
    use crate::backend::{BackendKind, BrokerPlace, HostDirs, RuntimeDir, Scope, Words};
    crate::backend::Capabilities {
        scope: Scope {
            kind: BackendKind::Kubernetes,
            namespace: Some(namespace.to_string()),
            context: context.map(str::to_string),
        },
        words: Words {
            here: format!("namespace '{namespace}' of this cluster"),
            elsewhere: "another namespace or cluster".into(),
            engine: "the cluster".into(),
        },
        // A cluster has no host directories: the workspace is always copied in.
        host_dirs: HostDirs::Never(
            Error::usage(
                "--workspace-mode bind is not available with the kubernetes backend: a pod cannot mount a directory of this host",
            )
            .with_hint("use --workspace-mode copy (the default there) or none"),
        ),
        // The pod's memory: gone with the pod.
        runtime_dir: RuntimeDir::GoesWithTurn,
        broker_place: BrokerPlace::InTurn,
        keeps_warm: true,
        hands_over_to_root: false,
        // The turn pod's init container seeds a new claim.
        fill_volume_first: false,
        // A claim per checkpoint, written by the turn's pod (`spec::pod_volumes`).
        checkpoints: true,
        warm_checkpoints: false,
        finishes_behind: false,
        forks_from_volumes: false,
        pools: true,
        shared_proxy: false,
        proxy_in_turn: true,
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == code)
}

impl KubeBackend {
    /// Connects with the kubeconfig (`KUBECONFIG`, `~/.kube/config`, the settings' context
    /// when given) or the in-cluster service account, in the settings' namespace (else the
    /// context's), and checks that the API server answers. Nothing reads the server's
    /// version: a server whose `/version` has no major/minor works.
    pub async fn connect(settings: &crate::backend::BackendSettings) -> Result<Self> {
        let (context, namespace) = (
            settings.kube_context.as_deref(),
            settings.namespace.as_deref(),
        );
        STARTED.get_or_init(std::time::Instant::now);
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
        let capabilities = capabilities(&namespace, context);
        let backend = KubeBackend {
            client,
            namespace,
            origin,
            capabilities: std::sync::Arc::new(capabilities),
            cluster: std::sync::Arc::new(settings.cluster.clone()),
            terminals: Default::default(),
            ends: Default::default(),
            warm: Default::default(),
            waiting: Default::default(),
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

    /// The namespace's pods that `selector` (a label selector) picks.
    async fn list_pods(&self, selector: &str) -> Result<Vec<Pod>> {
        let params = ListParams::default().labels(selector);
        self.pods()
            .list(&params)
            .await
            .map(|l| l.items)
            .map_err(|e| failed(format!("list pods in namespace '{}'", self.namespace), &e))
    }

    /// The pod `name`; an error when it cannot be read or does not exist.
    async fn existing_pod(&self, name: &str) -> Result<Pod> {
        self.pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?
            .ok_or_else(|| Error::environment(format!("pod '{name}' does not exist")))
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// `--runtime NAME`: a turn pod's `runtimeClassName`, which must name a RuntimeClass
    /// (node.k8s.io/v1) of the cluster: else exit 3, naming it and the classes there are.
    /// Where this user may not read RuntimeClasses (cluster-scoped), the pod's admission
    /// tells instead.
    pub(super) async fn check_runtime_class(&self, name: &str) -> Result<()> {
        let classes: Api<RuntimeClass> = Api::all(self.client.clone());
        match classes.get_opt(name).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => {
                let mut known: Vec<String> = classes
                    .list_metadata(&ListParams::default())
                    .await
                    .map(|l| {
                        l.items
                            .into_iter()
                            .filter_map(|c| c.metadata.name)
                            .collect()
                    })
                    .unwrap_or_default();
                known.sort();
                let has = if known.is_empty() {
                    "it has none".to_string()
                } else {
                    format!("it has {}", known.join(", "))
                };
                Err(Error::environment(format!(
                    "--runtime {name}: the cluster has no RuntimeClass '{name}' ({has})"
                ))
                .with_hint("pick one of `kubectl get runtimeclass`, or ask the cluster's admin for one whose handler the nodes' container runtime has (e.g. runsc for gVisor)"))
            }
            Err(e) if is_status(&e, 403) => {
                tracing::debug!(
                    "may not read RuntimeClass '{name}'; the pod's admission checks it"
                );
                Ok(())
            }
            Err(e) => Err(failed(format!("read RuntimeClass '{name}'"), &e)),
        }
    }
}

#[cfg(test)]
mod tests;
