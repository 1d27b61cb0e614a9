//! The backend a process runs sessions on, chosen once: Docker (the default) or Kubernetes
//! (`--backend kubernetes`, `CAW_BOX_BACKEND`), and the [`Backend`] that dispatches to it.
//! The session layer stays generic over `impl Backend`; commands that need a backend's own
//! operations (image builds, `doctor`) match on [`Engine`].

use std::collections::HashMap;
use std::time::Duration;

use super::{
    Attached, Backend, ContainerInfo, CreateError, DockerBackend, HelperSpec, ImageInfo,
    KubeBackend, OutputStream, TarFile, TurnSpec, VolumeInfo,
};
use crate::error::{Error, Result};

/// `caw-box doctor`: checks the chosen backend, saying each line to `say` as it is known; `images` are the
/// provider images to look for, (provider, image). An `Err` (exit 3): the backend could
/// not be reached or checked; what was said before it stands.
pub async fn checkup(
    images: &[(String, String)],
    say: &mut (dyn FnMut(&super::doctor::Check) + Send),
) -> Result<()> {
    match BackendKind::chosen()? {
        BackendKind::Docker => super::docker::doctor::checkup(images, say).await,
        BackendKind::Kubernetes => {
            use super::kubernetes::doctor::checks;
            let get = crate::connection::setting;
            let (context, namespace) = (get("CAW_BOX_KUBE_CONTEXT"), get("CAW_BOX_NAMESPACE"));
            let (lines, reached) = checks(context.as_deref(), namespace.as_deref(), images).await;
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

    /// The backend this process was asked for: `--backend` or a client's setting, else
    /// `CAW_BOX_BACKEND`, else the config files' `backend` (project, then user: read by the
    /// reader [`read_config_by`] registered), else Docker.
    pub fn chosen() -> Result<Self> {
        if let Some(v) = crate::connection::setting("CAW_BOX_BACKEND") {
            return Self::parse(&v);
        }
        let from_files = CONFIGURED.get().and_then(|read| read());
        Self::parse(from_files.as_deref().unwrap_or(""))
    }
}

/// How the config files' `backend` is read: by the layer that reads config files
/// (`config::install`), which this one does not import.
static CONFIGURED: std::sync::OnceLock<fn() -> Option<String>> = std::sync::OnceLock::new();

/// Registers how [`BackendKind::chosen`] reads the config files' `backend` (the first call
/// wins). Without it, only `--backend` and `CAW_BOX_BACKEND` choose.
pub fn read_config_by(read: fn() -> Option<String>) {
    let _ = CONFIGURED.set(read);
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

static SCOPE: std::sync::OnceLock<Scope> = std::sync::OnceLock::new();

/// The scope of the backend this process connected to; before it connected, the one it
/// was asked for (the namespace only when given).
pub fn scope() -> Scope {
    SCOPE.get().cloned().unwrap_or_else(|| Scope {
        kind: BackendKind::chosen().unwrap_or_default(),
        namespace: crate::connection::setting("CAW_BOX_NAMESPACE"),
        context: kube_context(),
    })
}

/// The kubeconfig context named for this process (`--context`), if any.
fn kube_context() -> Option<String> {
    crate::connection::setting("CAW_BOX_KUBE_CONTEXT")
}

/// A connected backend.
#[derive(Debug, Clone)]
pub enum Engine {
    Docker(DockerBackend),
    Kubernetes(KubeBackend),
}

/// Connects to the chosen backend: `CAW_BOX_BACKEND`; Kubernetes takes its context from
/// `CAW_BOX_KUBE_CONTEXT` (`--context`) and namespace from `CAW_BOX_NAMESPACE`
/// (`--namespace`), else the kubeconfig's.
pub async fn connect() -> Result<Engine> {
    let engine = match BackendKind::chosen()? {
        BackendKind::Docker => Engine::Docker(DockerBackend::connect().await?),
        BackendKind::Kubernetes => {
            let context = crate::connection::setting("CAW_BOX_KUBE_CONTEXT");
            let namespace = crate::connection::setting("CAW_BOX_NAMESPACE");
            Engine::Kubernetes(
                KubeBackend::connect(context.as_deref(), namespace.as_deref()).await?,
            )
        }
    };
    let _ = SCOPE.set(engine.scope());
    Ok(engine)
}

impl Engine {
    pub fn scope(&self) -> Scope {
        match self {
            Engine::Docker(_) => Scope::default(),
            Engine::Kubernetes(k) => Scope {
                kind: BackendKind::Kubernetes,
                namespace: Some(k.namespace().to_string()),
                context: kube_context(),
            },
        }
    }

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
    fn hands_over_in_turn(&self, user: (u32, u32)) -> bool {
        dispatch!(self, b => Backend::hands_over_in_turn(b, user))
    }
    fn runtime_dir(&self) -> super::RuntimeDir {
        dispatch!(self, b => Backend::runtime_dir(b))
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
    fn words(&self) -> super::Words {
        dispatch!(self, b => Backend::words(b))
    }
    fn logs_hint(&self, name: &str) -> String {
        dispatch!(self, b => Backend::logs_hint(b, name))
    }
    fn refuse_settings(&self, network: &str, pids_limit: Option<i64>) -> Result<()> {
        dispatch!(self, b => Backend::refuse_settings(b, network, pids_limit))
    }
    fn host_dirs(&self) -> crate::backend::HostDirs {
        dispatch!(self, b => Backend::host_dirs(b))
    }
    async fn note_stop(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::note_stop(b, name).await)
    }
    async fn fill_new_volume(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<Option<(i64, String, String)>, CreateError> {
        dispatch!(self, b => Backend::fill_new_volume(b, name, spec).await)
    }
    async fn broker_place(&self) -> super::BrokerPlace {
        dispatch!(self, b => Backend::broker_place(b).await)
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
    async fn hold_refresh(
        &self,
        login: &str,
        limit: std::time::Duration,
    ) -> Option<super::RefreshHold> {
        dispatch!(self, b => Backend::hold_refresh(b, login, limit).await)
    }
    async fn check_runtime(&self, name: &str) -> Result<()> {
        dispatch!(self, b => Backend::check_runtime(b, name).await)
    }
    async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        dispatch!(self, b => Backend::remove_container(b, name, force).await)
    }
    async fn remove_found(&self, found: &ContainerInfo) -> Result<()> {
        dispatch!(self, b => Backend::remove_found(b, found).await)
    }
    fn keeps_warm(&self) -> bool {
        dispatch!(self, b => Backend::keeps_warm(b))
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
    async fn inspect_image(&self, image: &str) -> Result<Option<ImageInfo>> {
        dispatch!(self, b => Backend::inspect_image(b, image).await)
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
