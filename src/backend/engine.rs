//! The backend a process runs sessions on: Docker (the default) or Kubernetes, connected
//! with the [`BackendSettings`] its caller resolved (the command line, a
//! [`crate::Client`]'s builder), and the [`Backend`] that dispatches to it. The session
//! layer stays generic over `impl Backend`; commands that need a backend's own operations
//! (image builds, `doctor`) match on [`Engine`].

use std::collections::HashMap;
use std::time::Duration;

use super::{
    Attached, Backend, ContainerInfo, CreateError, DockerBackend, HelperSpec, ImageInfo,
    KubeBackend, OutputStream, TarFile, TurnSpec, VolumeInfo,
};
use crate::error::{Error, Result};

/// `caw-box doctor`: checks the backend `settings` name, saying each line to `say` as it
/// is known; `images` are the provider images to look for, (provider, image). An `Err`
/// (exit 3): the backend could not be reached or checked; what was said before it stands.
pub async fn checkup(
    settings: &BackendSettings,
    images: &[(String, String)],
    say: &mut (dyn FnMut(&super::doctor::Check) + Send),
) -> Result<()> {
    match settings.kind {
        BackendKind::Docker => super::docker::doctor::checkup(settings, images, say).await,
        BackendKind::Kubernetes => {
            use super::kubernetes::doctor::checks;
            let (lines, reached) = checks(settings, images).await;
            for line in &lines {
                say(line);
            }
            if reached {
                return Ok(());
            }
            Err(
                Error::environment("the Kubernetes API server is not reachable")
                    .with_hint("check KUBECONFIG and --context, then run `caw-box doctor` again"),
            )
        }
    }
}

/// Which backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    #[default]
    Docker,
    Kubernetes,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Docker => "docker",
            BackendKind::Kubernetes => "kubernetes",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "docker" | "" => Ok(BackendKind::Docker),
            "kubernetes" | "k8s" => Ok(BackendKind::Kubernetes),
            other => Err(Error::usage(format!(
                "unknown backend '{other}': valid backends are docker, kubernetes"
            ))),
        }
    }
}

/// What a backend is connected with, as values. Its caller resolves them (the command line
/// and [`crate::Client`]: flags and a client's settings, then the variables, then the config
/// files, then these defaults); a backend reads no caw-box setting of this process itself.
/// What it does read is its engine's own client configuration, as that engine's CLI would:
/// the docker CLI's config directory and TLS variables (`DOCKER_CONFIG`, `DOCKER_TLS_VERIFY`,
/// `DOCKER_CERT_PATH`), the kubeconfig (`KUBECONFIG`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendSettings {
    /// Which backend (`--backend`, `CAW_BOX_BACKEND`, the config files' `backend`).
    pub kind: BackendKind,
    /// Kubernetes: the namespace (`--namespace`, `CAW_BOX_NAMESPACE`); `None`: the
    /// kubeconfig context's.
    pub namespace: Option<String>,
    /// Kubernetes: the kubeconfig context (`--context`, `CAW_BOX_KUBE_CONTEXT`); `None`:
    /// the kubeconfig's current one, or the in-cluster service account.
    pub kube_context: Option<String>,
    /// Docker: the context (`--context`, `DOCKER_CONTEXT`); `None` (or empty): the docker
    /// CLI's current one, else the local socket.
    pub docker_context: Option<String>,
    /// Docker: the daemon's address (`DOCKER_HOST`), where no context is named.
    pub docker_host: Option<String>,
    /// Kubernetes: what every claim and pod caw-box makes gets, beside what its session asks.
    pub cluster: ClusterSettings,
}

/// What every claim and pod caw-box makes on a cluster gets, beside what its session asks
/// (docs/kubernetes.md), for a cluster that needs it (a storage class of its own, a registry
/// it may not pull from, no DNS for a host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The storage class of a session's claims (`CAW_BOX_STORAGE_CLASS`); `None`: the
    /// cluster's default.
    pub storage_class: Option<String>,
    /// The storage a session's claim requests (`CAW_BOX_VOLUME_SIZE`); `None`: 1Gi.
    pub volume_size: Option<String>,
    /// When a pod's images are pulled (`CAW_BOX_IMAGE_PULL_POLICY`); `None`: only when the
    /// node does not have them (`IfNotPresent`).
    pub image_pull_policy: Option<String>,
    /// `HOST:IP` lines of every pod's hosts file (`CAW_BOX_HOST_ALIASES`, comma-separated).
    pub host_aliases: Vec<String>,
}

/// Where sessions live: the backend, and for Kubernetes the namespace. A handle names it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scope {
    pub kind: BackendKind,
    /// The Kubernetes namespace (`None` on Docker).
    pub namespace: Option<String>,
    /// The kubeconfig context, when one was named (`--context`, `CAW_BOX_KUBE_CONTEXT`).
    pub context: Option<String>,
}

/// A connected backend.
#[derive(Debug, Clone)]
pub enum Engine {
    Docker(DockerBackend),
    Kubernetes(KubeBackend),
}

/// Connects to the backend `settings` name: Docker at its context or host, else the docker
/// CLI's; Kubernetes through its kubeconfig context (else the current one), in its
/// namespace (else the context's).
pub async fn connect(settings: &BackendSettings) -> Result<Engine> {
    Ok(match settings.kind {
        BackendKind::Docker => Engine::Docker(DockerBackend::connect(settings).await?),
        BackendKind::Kubernetes => Engine::Kubernetes(KubeBackend::connect(settings).await?),
    })
}

impl Engine {
    /// The Docker backend, for Docker-only commands; on Kubernetes a usage error.
    pub fn docker(&self, what: &str) -> Result<&DockerBackend> {
        match self {
            Engine::Docker(d) => Ok(d),
            Engine::Kubernetes(_) => Err(Error::usage(format!(
                "{what} is not available with the kubernetes backend yet"
            ))),
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            Engine::Docker($b) => $e,
            Engine::Kubernetes($b) => $e,
        }
    };
}

impl Backend for Engine {
    fn capabilities(&self) -> &super::Capabilities {
        dispatch!(self, b => b.capabilities())
    }
    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>> {
        dispatch!(self, b => b.list_containers(labels).await)
    }
    async fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> std::result::Result<String, CreateError> {
        dispatch!(self, b => Backend::create_turn(b, name, spec).await)
    }
    async fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<String, CreateError> {
        dispatch!(self, b => Backend::create_helper(b, name, spec).await)
    }
    async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
        dispatch!(self, b => Backend::inspect_container(b, name).await)
    }
    async fn attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        dispatch!(self, b => Backend::attach(b, name, stdin).await)
    }
    async fn resize_tty(&self, name: &str, columns: u16, rows: u16) -> Result<()> {
        dispatch!(self, b => Backend::resize_tty(b, name, columns, rows).await)
    }
    async fn start_container(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::start_container(b, name).await)
    }
    async fn wait_container(&self, name: &str) -> Result<i64> {
        dispatch!(self, b => Backend::wait_container(b, name).await)
    }
    async fn stop_container(&self, name: &str, grace: Duration) -> Result<()> {
        dispatch!(self, b => Backend::stop_container(b, name, grace).await)
    }
    async fn stop_noted(&self, name: &str) -> bool {
        dispatch!(self, b => Backend::stop_noted(b, name).await)
    }
    fn removed_under_turn(&self, name: &str) -> Error {
        dispatch!(self, b => Backend::removed_under_turn(b, name))
    }
    async fn ended_by_environment(&self, name: &str) -> Option<String> {
        dispatch!(self, b => Backend::ended_by_environment(b, name).await)
    }
    fn logs_hint(&self, name: &str) -> String {
        dispatch!(self, b => Backend::logs_hint(b, name))
    }
    fn refuse_settings(&self, network: &str, pids_limit: Option<i64>) -> Result<()> {
        dispatch!(self, b => Backend::refuse_settings(b, network, pids_limit))
    }
    async fn note_stop(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::note_stop(b, name).await)
    }
    fn broker_route(&self, plan: &super::BrokerPlan) -> super::BrokerRoute {
        dispatch!(self, b => Backend::broker_route(b, plan))
    }
    async fn broker_address(&self, plan: &super::BrokerPlan) -> Result<Option<String>> {
        dispatch!(self, b => Backend::broker_address(b, plan).await)
    }
    fn egress_route(&self, plan: &super::EgressPlan) -> super::EgressRoute {
        dispatch!(self, b => Backend::egress_route(b, plan))
    }
    async fn open_egress(&self, plan: &super::EgressPlan) -> std::result::Result<(), CreateError> {
        dispatch!(self, b => Backend::open_egress(b, plan).await)
    }
    async fn close_egress(&self, plan: &super::EgressPlan) {
        dispatch!(self, b => Backend::close_egress(b, plan).await)
    }
    async fn start_proxy(
        &self,
        plan: &super::EgressPlan,
    ) -> std::result::Result<Attached, CreateError> {
        dispatch!(self, b => Backend::start_proxy(b, plan).await)
    }
    async fn agent_address(&self, name: &str, route: &super::EgressRoute) -> Option<String> {
        dispatch!(self, b => Backend::agent_address(b, name, route).await)
    }
    async fn open_broker(&self, plan: &super::BrokerPlan) -> Result<()> {
        dispatch!(self, b => Backend::open_broker(b, plan).await)
    }
    async fn start_broker(
        &self,
        plan: &super::BrokerPlan,
    ) -> std::result::Result<Attached, CreateError> {
        dispatch!(self, b => Backend::start_broker(b, plan).await)
    }
    async fn attach_broker(&self, turn: &str) -> Result<Attached> {
        dispatch!(self, b => Backend::attach_broker(b, turn).await)
    }
    async fn close_broker(&self, plan: &super::BrokerPlan) {
        dispatch!(self, b => Backend::close_broker(b, plan).await)
    }
    async fn sweep(&self, labels: &[String], keep: &[&str]) -> Result<()> {
        dispatch!(self, b => Backend::sweep(b, labels, keep).await)
    }
    async fn remove_unused_networks(&self, labels: &[String]) -> Result<Vec<String>> {
        dispatch!(self, b => Backend::remove_unused_networks(b, labels).await)
    }
    async fn remove_unused_volumes(&self, labels: &[String]) -> Result<Vec<String>> {
        dispatch!(self, b => Backend::remove_unused_volumes(b, labels).await)
    }
    async fn hold_refresh(&self, login: &str, limit: std::time::Duration) -> Option<super::Hold> {
        dispatch!(self, b => Backend::hold_refresh(b, login, limit).await)
    }
    async fn try_account_slot(&self, account: &str, cap: u32) -> Result<Option<super::Hold>> {
        dispatch!(self, b => Backend::try_account_slot(b, account, cap).await)
    }
    async fn check_runtime(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::check_runtime(b, name).await)
    }
    async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        dispatch!(self, b => Backend::remove_container(b, name, force).await)
    }
    async fn rename_container(&self, name: &str, to: &str) -> Result<()> {
        dispatch!(self, b => Backend::rename_container(b, name, to).await)
    }

    async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
        dispatch!(self, b => Backend::remove_found(b, found).await)
    }
    async fn claim_warm(&self, name: &str) -> Result<Option<ContainerInfo>> {
        dispatch!(self, b => Backend::claim_warm(b, name).await)
    }
    fn exec_in_warm(&self, name: &str, exec: super::warm::WarmExec) {
        dispatch!(self, b => Backend::exec_in_warm(b, name, exec))
    }
    async fn turn_in_warm(&self, name: &str) -> Result<Option<(u32, u32)>> {
        dispatch!(self, b => Backend::turn_in_warm(b, name).await)
    }
    async fn warm_idle_for(&self, name: &str) -> Result<Option<u64>> {
        dispatch!(self, b => Backend::warm_idle_for(b, name).await)
    }
    async fn idle_warm(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::idle_warm(b, name).await)
    }
    async fn pool_park(&self, name: &str, box_name: &str) -> Result<()> {
        dispatch!(self, b => Backend::pool_park(b, name, box_name).await)
    }
    async fn pool_prime(&self, box_name: &str, argv: Vec<String>) -> Result<i64> {
        dispatch!(self, b => Backend::pool_prime(b, box_name, argv).await)
    }
    async fn pool_claim(&self, box_name: &str, name: &str) -> Result<bool> {
        dispatch!(self, b => Backend::pool_claim(b, box_name, name).await)
    }
    async fn remove_warm(&self, name: &str) -> Result<bool> {
        dispatch!(self, b => Backend::remove_warm(b, name).await)
    }
    async fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        dispatch!(self, b => Backend::run_to_completion(b, name, spec).await)
    }
    fn follow_logs(&self, name: &str) -> OutputStream {
        dispatch!(self, b => Backend::follow_logs(b, name))
    }
    fn logs_so_far(&self, name: &str) -> OutputStream {
        dispatch!(self, b => Backend::logs_so_far(b, name))
    }
    fn logs_since(&self, name: &str, since: std::time::SystemTime, follow: bool) -> OutputStream {
        dispatch!(self, b => Backend::logs_since(b, name, since, follow))
    }
    async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        dispatch!(self, b => Backend::inspect_image(b, image).await)
    }
    async fn snapshot_class(&self) -> Result<Option<String>> {
        dispatch!(self, b => Backend::snapshot_class(b).await)
    }
    async fn clone_volume(
        &self,
        class: &str,
        from: &str,
        to: &str,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        dispatch!(self, b => Backend::clone_volume(b, class, from, to, labels).await)
    }
    async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        dispatch!(self, b => Backend::create_volume(b, name, labels).await)
    }
    async fn inspect_volume(&self, name: &str) -> Result<Option<VolumeInfo>> {
        dispatch!(self, b => Backend::inspect_volume(b, name).await)
    }
    async fn list_volumes(&self, labels: &[String]) -> Result<Vec<VolumeInfo>> {
        dispatch!(self, b => Backend::list_volumes(b, labels).await)
    }
    async fn remove_volume(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::remove_volume(b, name).await)
    }
    async fn upload_files(
        &self,
        name: &str,
        dir: &str,
        files: &[TarFile<'_>],
        owner: (u32, u32),
    ) -> Result<()> {
        dispatch!(self, b => Backend::upload_files(b, name, dir, files, owner).await)
    }
    async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        dispatch!(self, b => Backend::upload_tar(b, name, dir, tar).await)
    }
    async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        dispatch!(self, b => Backend::download_file(b, name, path).await)
    }
    async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        dispatch!(self, b => Backend::download_tar(b, name, path).await)
    }
}
