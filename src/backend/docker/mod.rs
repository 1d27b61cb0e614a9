//! The Docker backend: the only code that talks to the Docker daemon (through bollard).
//!
//! Each method does one Docker thing and turns bollard's errors into caw-box [`Error`]s that
//! say what was being done to what, and what to do next. Orchestration (what to create, in
//! which order, what a failure means for a session) belongs to the session layer, not here.
//! No bollard type leaves this folder: callers see caw-box's own types (`crate::backend`).
//!
//! - `mod.rs`: connecting, and turning bollard's errors into caw-box's
//! - `api_version.rs`: the per-host cache of the negotiated API version
//! - `containers.rs`: create (the lock), attach, start, wait, stop, remove, helper runs
//! - `volumes.rs`: volumes and networks
//! - `images.rs`: inspect, build, list
//! - `archive.rs`: files in and out of containers, and the tar helpers
//! - `egress.rs`, `broker.rs`: a turn's `--allow-host` proxy and credential broker, as
//!   containers on networks
//! - `seam.rs`: [`crate::backend::Backend`] for Docker, over the methods above

use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::Docker;

use crate::backend::BackendSettings;
use crate::error::{Error, Result};

mod api_version;
mod archive;
mod broker;
mod containers;
pub(super) mod doctor;
mod egress;
pub mod endpoint;
mod images;
mod seam;
mod spec;
mod volumes;
mod warm;

pub use super::CreateError;
pub use archive::{build_tar, first_file};
pub use broker::broker_route;
pub use images::{managed_filter, BuildEvent, BuildSpec, BuildStream};

/// A long request timeout: turns, attaches and builds legitimately last for hours. Only
/// `connect` bounds its probe tightly, so an unreachable daemon fails fast.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected Docker daemon.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    docker: Docker,
    /// Where the daemon is, and why there (for `doctor` and error lines).
    endpoint: std::sync::Arc<endpoint::Endpoint>,
    /// Whether the daemon is Podman's service: from the API version cache, else asked when
    /// it connected.
    podman: bool,
    /// What this daemon can do, worked out when it connected.
    capabilities: std::sync::Arc<crate::backend::Capabilities>,
    /// The OCI runtimes the daemon lists, asked once (`--runtime`: checked by `run` before
    /// anything is made, and again by the session layer).
    runtimes: std::sync::Arc<tokio::sync::OnceCell<Runtimes>>,
    /// The turns this process runs in warm containers, by turn name (`warm.rs`).
    warm: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, warm::WarmTurn>>>,
}

/// The OCI runtimes a daemon has (`docker info`), by name, and its default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runtimes {
    pub names: Vec<String>,
    pub default: Option<String>,
}

/// Whether this process runs in a container that is not the daemon's own host: Docker's
/// or Podman's marker file, and no daemon data root beside it (a machine image built from
/// a container image keeps the marker, and runs its daemon itself).
fn in_a_job_container() -> bool {
    let exists = |p: &str| std::path::Path::new(p).exists();
    (exists("/.dockerenv") || exists("/run/.containerenv")) && !exists("/var/lib/docker")
}

/// Whether the daemon at `host` certainly sees this process's paths as they are: a local
/// socket, and this process is not in a job's container. Otherwise it may or may not (a
/// socket mounted into a CI job's container, a remote `DOCKER_HOST`): ask it.
fn surely_shares_paths(host: &str) -> bool {
    host.starts_with("unix://") && !in_a_job_container()
}

/// Whether the daemon is Podman's Docker-compatible service, asked once per connection
/// (`GET /version`, some 10 ms) where the API version cache does not say: every turn needs
/// the answer (where its broker runs).
async fn ask_podman(docker: &Docker) -> bool {
    match docker.version().await {
        Ok(v) => v
            .components
            .unwrap_or_default()
            .iter()
            .any(|c| c.name.starts_with("Podman")),
        Err(e) => {
            tracing::debug!("could not ask the daemon for its version: {e}");
            false
        }
    }
}

/// The daemon `settings` name and why it is that one (`unix://`, `tcp://`, or
/// `ssh://user@host`, reached through the user's `ssh` and `docker system dial-stdio` on
/// the far side): its context or host as given, the docker CLI's own variables beside them
/// (TLS, its config directory, the runtime directory's sockets) as this process has them.
pub fn endpoint(settings: &BackendSettings) -> Result<endpoint::Endpoint> {
    let get = |name: &str| match name {
        "DOCKER_CONTEXT" => settings.docker_context.clone(),
        "DOCKER_HOST" => settings.docker_host.clone(),
        other => std::env::var(other).ok(),
    };
    endpoint::resolve(&get, &|p| p.exists())
}

/// An error with the causes under it (`client error (Connect): invalid peer certificate:
/// UnknownIssuer`), each once: a connection failure's reason is at the bottom.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

fn unreachable(at: &endpoint::Endpoint, e: impl std::fmt::Display) -> Error {
    let at = format!("{} ({})", at.host, at.why);
    Error::environment(format!("cannot reach the Docker daemon at {at}: {e}")).with_hint(
        "is Docker running? start it (e.g. `sudo systemctl start docker`) or set DOCKER_HOST",
    )
}

/// Whether a bollard error is the daemon's "404 not found".
pub fn is_not_found(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn is_conflict(e: &BollardError) -> bool {
    matches!(
        e,
        BollardError::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// A create refused because the name is taken: Docker answers 409; Podman (4.3) answers 500
/// "... the container name \"X\" is already in use by ...".
fn is_name_taken(e: &BollardError) -> bool {
    is_conflict(e)
        || matches!(e, BollardError::DockerResponseServerError { status_code: 500, message }
            if message.contains("is already in use"))
}

/// The daemon's own message for an error, without bollard's wrapping.
pub fn daemon_message(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message.trim().to_string(),
        other => other.to_string(),
    }
}

/// What failed to be done (`what`) on the daemon at `at`: the daemon's own message, or that
/// it could not be reached.
fn failed(at: &endpoint::Endpoint, what: impl std::fmt::Display, e: &BollardError) -> Error {
    let error = match e {
        BollardError::DockerResponseServerError { .. } => {
            Error::environment(format!("failed to {what}: {}", daemon_message(e)))
        }
        other => unreachable(
            at,
            format!("while trying to {what}: {}", with_causes(other)),
        ),
    };
    error.with_source(SourceError(e.to_string()))
}

/// A bollard error kept as an [`Error`]'s source (bollard's own type is not `Clone`).
#[derive(Debug)]
struct SourceError(String);

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceError {}

impl DockerBackend {
    /// Connects to the daemon `settings` name ([`endpoint()`]) and checks that it answers.
    pub async fn connect(settings: &BackendSettings) -> Result<Self> {
        let endpoint = endpoint(settings)?;
        if let Some(docker) = Self::connect_cached(&endpoint).await? {
            return Ok(docker);
        }
        let host = endpoint.host.clone();
        let unreachable = |e: String| unreachable(&endpoint, e);
        let api = bollard::API_DEFAULT_VERSION;
        let secs = PING_TIMEOUT.as_secs();
        let docker = if host.starts_with("unix://") {
            Docker::connect_with_unix(&host, secs, api)
        } else if let (Some(tls), true) = (&endpoint.tls, host.starts_with("tcp://")) {
            Docker::connect_with_ssl(&host, &tls.key, &tls.cert, &tls.ca, secs, api)
        } else if host.starts_with("tcp://") || host.starts_with("http://") {
            Docker::connect_with_http(&host, secs, api)
        } else if host.starts_with("ssh://") {
            Docker::connect_with_ssh(&host, secs, api, None)
        } else {
            return Err(Error::environment(format!(
                "the Docker endpoint '{host}' is not unix://, tcp:// or ssh://"
            )));
        }
        .map_err(|e| unreachable(e.to_string()))?;
        let docker = docker.with_timeout(PING_TIMEOUT);
        let docker = match tokio::time::timeout(PING_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return Err(unreachable(with_causes(&e))),
            Err(_) => return Err(unreachable("no answer within 10 s".into())),
        };
        let docker = docker.with_timeout(REQUEST_TIMEOUT);
        let podman = ask_podman(&docker).await;
        if host.starts_with("unix://") {
            let known = api_version::Known {
                version: docker.client_version(),
                podman,
            };
            api_version::store(&host, &known);
        }
        Ok(Self::connected(docker, endpoint, podman))
    }

    /// The backend over the daemon at `endpoint` that answered: what it can do worked out
    /// once.
    fn connected(docker: Docker, endpoint: endpoint::Endpoint, podman: bool) -> Self {
        let host_dirs = if surely_shares_paths(&endpoint.host) {
            crate::backend::HostDirs::Shared
        } else {
            crate::backend::HostDirs::Unknown
        };
        let (broker_place, fill_volume_first) = if podman {
            (crate::backend::BrokerPlace::OwnContainer, true)
        } else {
            (crate::backend::BrokerPlace::SharedContainer, false)
        };
        let capabilities = crate::backend::Capabilities {
            scope: crate::backend::Scope::default(),
            words: crate::backend::Words {
                here: "this Docker host".into(),
                elsewhere: "another Docker host".into(),
                engine: "the Docker daemon".into(),
            },
            host_dirs,
            runtime_dir: crate::backend::RuntimeDir::KeptWithContainer,
            broker_place,
            keeps_warm: true,
            // A container of uid 0 keeps the capabilities chown needs until its start
            // drops them (spec.rs `HAND_OVER`); any other uid's are gone at its first exec.
            hands_over_to_root: true,
            // Podman fills a volume when a container that mounts it first starts.
            fill_volume_first,
            // Proven on Docker's engine; Podman's volumes and capabilities are not yet.
            checkpoints: !podman,
            warm_checkpoints: !podman,
            finishes_behind: !podman,
            forks_from_volumes: !podman,
            pools: !podman,
            // Podman keeps no stdin across attaches: no lease could reach a shared proxy.
            shared_proxy: !podman,
            proxy_in_turn: false,
        };
        DockerBackend {
            docker,
            endpoint: std::sync::Arc::new(endpoint),
            podman,
            capabilities: std::sync::Arc::new(capabilities),
            runtimes: Default::default(),
            warm: Default::default(),
        }
    }

    /// What this daemon can do ([`crate::backend::Backend::capabilities`]).
    pub fn capabilities(&self) -> &crate::backend::Capabilities {
        &self.capabilities
    }

    /// The daemon's address and why it is that one.
    pub fn endpoint(&self) -> &endpoint::Endpoint {
        &self.endpoint
    }

    /// What failed to be done (`what`) on this daemon ([`failed`]).
    fn failed(&self, what: impl std::fmt::Display, e: &BollardError) -> Error {
        failed(&self.endpoint, what, e)
    }

    /// A connection at the cached API version (see [`api_version`]), when there is one and
    /// the daemon still takes it; `None` means negotiate.
    async fn connect_cached(endpoint: &endpoint::Endpoint) -> Result<Option<Self>> {
        let host = endpoint.host.as_str();
        if !host.starts_with("unix://") {
            return Ok(None);
        }
        let Some(api_version::Known { version, podman }) = api_version::load(host) else {
            return Ok(None);
        };
        let docker = Docker::connect_with_unix(host, PING_TIMEOUT.as_secs(), &version)
            .map_err(|e| unreachable(endpoint, e))?;
        match tokio::time::timeout(PING_TIMEOUT, docker.ping()).await {
            Ok(Ok(_)) => Ok(Some(Self::connected(
                docker.with_timeout(REQUEST_TIMEOUT),
                endpoint.clone(),
                podman,
            ))),
            Ok(Err(e @ BollardError::DockerResponseServerError { .. })) => {
                tracing::debug!("the daemon refused the cached API version: {e}");
                Ok(None)
            }
            Ok(Err(e)) => Err(unreachable(endpoint, with_causes(&e))),
            Err(_) => Err(unreachable(endpoint, "no answer within 10 s")),
        }
    }

    /// Whether the daemon is Podman's Docker-compatible service (known from the API version
    /// cache, else asked when it connected).
    pub fn is_podman(&self) -> bool {
        self.podman
    }

    /// The OCI runtimes the daemon has (`docker info`), names sorted.
    pub async fn runtimes(&self) -> Result<Runtimes> {
        self.runtimes
            .get_or_try_init(|| async {
                let info = self
                    .docker
                    .info()
                    .await
                    .map_err(|e| self.failed("ask the Docker daemon for its runtimes", &e))?;
                let mut names: Vec<String> =
                    info.runtimes.unwrap_or_default().into_keys().collect();
                names.sort();
                Ok(Runtimes {
                    names,
                    default: info.default_runtime.filter(|d| !d.is_empty()),
                })
            })
            .await
            .cloned()
    }

    /// Refuses (exit 3) a runtime the daemon does not list. Podman's service lists the
    /// runtimes its configuration names (installed or not), and its API does not choose one
    /// per container (4.3 takes `HostConfig.Runtime`, and the libpod API's `oci_runtime`,
    /// and runs the container on its default all the same): there only its default is
    /// what a container runs on.
    pub async fn check_runtime(&self, name: &str) -> Result<()> {
        let runtimes = self.runtimes().await?;
        if self.is_podman() {
            if runtimes.default.as_deref() == Some(name) {
                return Ok(());
            }
            let default = runtimes.default.as_deref().unwrap_or("its own");
            return Err(Error::environment(format!(
                "--runtime {name}: Podman's Docker-compatible API does not choose a container's runtime (it would run the agent on {default}, its default)"
            ))
            .with_hint(format!(
                "use Docker for --runtime, or make {name} the Podman service's default (`runtime = \"{name}\"` under [engine] in containers.conf), or drop --runtime"
            )));
        }
        if runtimes.names.iter().any(|n| n == name) {
            return Ok(());
        }
        let has = if runtimes.names.is_empty() {
            "it lists none".to_string()
        } else {
            format!("it has {}", runtimes.names.join(", "))
        };
        Err(Error::environment(format!(
            "--runtime {name}: the Docker daemon has no runtime '{name}' ({has})"
        ))
        .with_hint("pick one of those, or install it and add it to the daemon's `runtimes` (daemon.json, then reload the daemon); for gVisor: `apt-get install runsc`, `caw-box doctor` says how"))
    }

    /// "20.10.24 (API 1.41)", "Podman 4.3.1 (API 1.41)".
    pub async fn server_version(&self) -> Result<String> {
        let v = self
            .docker
            .version()
            .await
            .map_err(|e| self.failed("ask Docker for its version", &e))?;
        let podman = v
            .components
            .iter()
            .flatten()
            .any(|c| c.name.starts_with("Podman"));
        Ok(format!(
            "{}{} (API {})",
            if podman { "Podman " } else { "" },
            v.version.unwrap_or_default(),
            v.api_version.unwrap_or_default()
        ))
    }
}
