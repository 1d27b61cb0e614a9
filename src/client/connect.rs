//! What a [`Client`] connects with: the settings a caller gives as values
//! ([`ClientBuilder`], the binary's flags) made this process's ([`crate::connection`]: the
//! detached driver is started with them), and resolved, with the variables and the config
//! files under them, into the [`BackendSettings`] the backend is handed
//! ([`backend_settings`]). The backend reads none of this itself: this is where its
//! settings come from, for every entry point (the binary, the embedding API, the Python
//! package, a library caller).

use super::Client;
use crate::backend::{BackendKind, BackendSettings, ClusterSettings, Engine};
use crate::connection;
use crate::error::{Error, Result};

/// The settings a [`Client`] connects with, as values: each one left unset falls back to its
/// variable (`CAW_BOX_BACKEND`, …), then the config files, as on the command line.
///
/// ```no_run
/// # async fn demo() -> caw_box::Result<()> {
/// let client = caw_box::Client::builder()
///     .backend("kubernetes")
///     .namespace("agents")
///     .context("lab")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClientBuilder {
    backend: Option<String>,
    namespace: Option<String>,
    context: Option<String>,
    docker_host: Option<String>,
    image_repo: Option<String>,
    driver: Option<std::path::PathBuf>,
}

impl ClientBuilder {
    /// `docker` or `kubernetes` (as `--backend`).
    pub fn backend(mut self, backend: impl Into<String>) -> Self {
        self.backend = Some(backend.into());
        self
    }

    /// The Kubernetes namespace (as `--namespace`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The Docker context, or with the kubernetes backend the kubeconfig context (as
    /// `--context`).
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// The Docker daemon's address, e.g. `unix:///run/user/1000/docker.sock` (as
    /// `DOCKER_HOST`).
    pub fn docker_host(mut self, host: impl Into<String>) -> Self {
        self.docker_host = Some(host.into());
        self
    }

    /// The repository the provider images are named under (as `--image-repo`).
    pub fn image_repo(mut self, repo: impl Into<String>) -> Self {
        self.image_repo = Some(repo.into());
        self
    }

    /// The `caw-box` executable that drives detached turns (default: this process's own
    /// executable, which is right for the binary, not for a program embedding the library).
    pub fn driver(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.driver = Some(path.into());
        self
    }

    /// Checks the settings and makes them this process's (see [`crate::connection`]),
    /// without connecting: what the binary does before it dispatches a command.
    pub fn install(self) -> Result<()> {
        let kind = match &self.backend {
            Some(b) => Some(BackendKind::parse(b)?),
            None => None,
        };
        if let Some(repo) = &self.image_repo {
            crate::settings::validate_image_repo(repo, "--image-repo")?;
        }
        // The context is the chosen backend's: given here, by the variable or the files.
        let chosen = match kind {
            Some(k) => k,
            None => chosen_backend()?,
        };
        let (docker_context, kube_context) = match chosen {
            BackendKind::Docker => (self.context, None),
            BackendKind::Kubernetes => (None, self.context),
        };
        crate::connection::install(crate::connection::Connection {
            backend: kind.map(|k| k.as_str().to_string()),
            namespace: self.namespace,
            kube_context,
            docker_context,
            docker_host: self.docker_host,
            image_repo: self.image_repo,
            driver: self.driver,
        })
        .map_err(|installed| {
            Error::usage(format!(
                "this process already connected with other settings ({installed:?}); one backend and daemon per process"
            ))
            .with_hint("start another process for the other settings, or pass the same ones")
        })
    }

    /// Installs the settings and connects.
    pub async fn connect(self) -> Result<Client> {
        self.install()?;
        Client::connect().await
    }
}

/// The backend this process was asked for: `--backend` or a client's setting, else
/// `CAW_BOX_BACKEND`, else the config files' `backend` (project, then user), else Docker.
pub fn chosen_backend() -> Result<BackendKind> {
    if let Some(v) = connection::setting("CAW_BOX_BACKEND") {
        return BackendKind::parse(&v);
    }
    BackendKind::parse(&crate::config::configured_backend().unwrap_or_default())
}

/// This process's backend settings, as the values the backend is connected with: the
/// backend [`chosen_backend`] names, and each of its other settings a [`ClientBuilder`]'s
/// (or the command line's) where it installed one, else its variable
/// (`CAW_BOX_NAMESPACE`, `CAW_BOX_KUBE_CONTEXT`, `DOCKER_CONTEXT`, `DOCKER_HOST`, and a
/// cluster's `CAW_BOX_STORAGE_CLASS`, `CAW_BOX_VOLUME_SIZE`, `CAW_BOX_IMAGE_PULL_POLICY`,
/// `CAW_BOX_HOST_ALIASES`; an empty one counts as unset).
pub fn backend_settings() -> Result<BackendSettings> {
    let host_aliases = connection::setting("CAW_BOX_HOST_ALIASES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    Ok(BackendSettings {
        kind: chosen_backend()?,
        namespace: connection::setting("CAW_BOX_NAMESPACE"),
        kube_context: connection::setting("CAW_BOX_KUBE_CONTEXT"),
        docker_context: connection::var("DOCKER_CONTEXT"),
        docker_host: connection::var("DOCKER_HOST"),
        cluster: ClusterSettings {
            storage_class: connection::setting("CAW_BOX_STORAGE_CLASS"),
            volume_size: connection::setting("CAW_BOX_VOLUME_SIZE"),
            image_pull_policy: connection::setting("CAW_BOX_IMAGE_PULL_POLICY"),
            host_aliases,
        },
    })
}

/// Connects to this process's backend ([`backend_settings`]), for the commands that work on
/// it beside a [`Client`]'s sessions.
pub async fn connect_backend() -> Result<Engine> {
    crate::backend::connect(&backend_settings()?).await
}
