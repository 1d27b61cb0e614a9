//! The Docker backend: the only code that talks to the Docker daemon (through bollard).
//!
//! Each method does one Docker thing and turns bollard's errors into caw-box [`Error`]s that
//! say what was being done to what, and what to do next. Orchestration (what to create, in
//! which order, what a failure means for a session) belongs to the commands, not here.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ImageInspect, ImageSummary, Volume,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, DownloadFromContainerOptions,
    ListContainersOptions, ListImagesOptions, ListVolumesOptions, RemoveContainerOptions,
    RemoveImageOptions, RemoveVolumeOptions, ResizeContainerTTYOptions, StopContainerOptions,
    UploadToContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use crate::error::{Error, Result};

pub use bollard::container::AttachContainerResults;
pub use bollard::container::LogOutput;

/// A long request timeout: turns, attaches and builds legitimately last for hours. Only
/// `connect` bounds its probe tightly, so an unreachable daemon fails fast.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected Docker daemon.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    docker: Docker,
}

/// Why a container could not be created.
#[derive(Debug)]
pub enum CreateError {
    /// A container of that name exists already (Docker enforces names atomically).
    NameTaken,
    /// The image to run is not on the Docker host.
    ImageMissing(Error),
    Other(Error),
}

impl From<CreateError> for Error {
    fn from(e: CreateError) -> Error {
        match e {
            CreateError::NameTaken => Error::environment("a container of that name exists already"),
            CreateError::ImageMissing(e) | CreateError::Other(e) => e,
        }
    }
}

fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string())
}

fn unreachable(e: impl std::fmt::Display) -> Error {
    Error::environment(format!(
        "cannot reach the Docker daemon at {}: {e}",
        docker_host()
    ))
    .with_hint(
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

/// The daemon's own message for an error, without bollard's wrapping.
pub fn daemon_message(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message.trim().to_string(),
        other => other.to_string(),
    }
}

fn failed(what: impl std::fmt::Display, e: &BollardError) -> Error {
    let error = match e {
        BollardError::DockerResponseServerError { .. } => {
            Error::environment(format!("failed to {what}: {}", daemon_message(e)))
        }
        other => unreachable(format!("while trying to {what}: {other}")),
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

/// Docker's API version as last negotiated with a daemon, kept for a day.
///
/// Negotiating asks `GET /version`, for which the daemon runs `runc --version`: about 8 ms
/// before every command, a visible share of a short turn. With a cached version, a
/// versioned `GET /_ping` (well under a millisecond) both checks that the daemon answers
/// and that it still accepts that version (it answers 400 to one too new or too old), so a
/// daemon upgraded or downgraded meanwhile only costs one renegotiation. (bollard 0.21
/// drops the version from request paths, so the daemon answers at its own version anyway;
/// the cache keeps caw-box right if that changes.)
mod api_version {
    use std::path::PathBuf;
    use std::time::{Duration, SystemTime};

    use bollard::ClientVersion;

    const FILE: &str = "docker-api-version";
    const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

    fn path() -> Option<PathBuf> {
        crate::dirs::data_dir().ok().map(|d| d.join(FILE))
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// One line of the cache file, "HOST MAJOR.MINOR SAVED_AT" (seconds since the epoch).
    fn entry(line: &str) -> Option<(&str, ClientVersion, u64)> {
        let (rest, saved_at) = line.rsplit_once(' ')?;
        let (host, v) = rest.rsplit_once(' ')?;
        let (major, minor) = v.split_once('.')?;
        let v = ClientVersion {
            major_version: major.parse().ok()?,
            minor_version: minor.parse().ok()?,
        };
        Some((host, v, saved_at.parse().ok()?))
    }

    /// `host`'s version in the cache file, if it was saved less than a day before `now`.
    pub(super) fn parse(contents: &str, host: &str, now: u64) -> Option<ClientVersion> {
        contents.lines().find_map(|line| {
            let (h, v, saved_at) = entry(line)?;
            (h == host && now.saturating_sub(saved_at) <= MAX_AGE.as_secs()).then_some(v)
        })
    }

    /// The cache file with `host`'s entry set to `v` as of `now`; other hosts' entries kept.
    pub(super) fn updated(contents: &str, host: &str, v: &ClientVersion, now: u64) -> String {
        let mut out: String = contents
            .lines()
            .filter(|l| entry(l).is_some_and(|(h, _, _)| h != host))
            .map(|l| format!("{l}\n"))
            .collect();
        out.push_str(&format!(
            "{host} {}.{} {now}\n",
            v.major_version, v.minor_version
        ));
        out
    }

    pub(super) fn load(host: &str) -> Option<ClientVersion> {
        parse(&std::fs::read_to_string(path()?).ok()?, host, now())
    }

    /// Best effort: without the cache, the next command negotiates again.
    pub(super) fn store(host: &str, v: &ClientVersion) {
        let Some(path) = path() else { return };
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        if let Err(e) =
            crate::dirs::write_private_unsynced(&path, updated(&old, host, v, now()).as_bytes())
        {
            tracing::debug!("could not cache Docker's API version: {e}");
        }
    }
}

impl DockerBackend {
    /// Connects (honouring DOCKER_HOST) and checks that the daemon answers.
    pub async fn connect() -> Result<Self> {
        let host = docker_host();
        if let Some(docker) = Self::connect_cached(&host).await? {
            return Ok(docker);
        }
        let docker = Docker::connect_with_defaults().map_err(unreachable)?;
        let docker = docker.with_timeout(PING_TIMEOUT);
        let docker = match tokio::time::timeout(PING_TIMEOUT, docker.negotiate_version()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return Err(unreachable(e)),
            Err(_) => return Err(unreachable("no answer within 10 s")),
        };
        if host.starts_with("unix://") {
            api_version::store(&host, &docker.client_version());
        }
        Ok(DockerBackend {
            docker: docker.with_timeout(REQUEST_TIMEOUT),
        })
    }

    /// A connection at the cached API version (see [`api_version`]), when there is one and
    /// the daemon still takes it; `None` means negotiate.
    async fn connect_cached(host: &str) -> Result<Option<Self>> {
        if !host.starts_with("unix://") {
            return Ok(None);
        }
        let Some(version) = api_version::load(host) else {
            return Ok(None);
        };
        let docker = Docker::connect_with_unix(host, PING_TIMEOUT.as_secs(), &version)
            .map_err(unreachable)?;
        match tokio::time::timeout(PING_TIMEOUT, docker.ping()).await {
            Ok(Ok(_)) => Ok(Some(DockerBackend {
                docker: docker.with_timeout(REQUEST_TIMEOUT),
            })),
            Ok(Err(e @ BollardError::DockerResponseServerError { .. })) => {
                tracing::debug!("the daemon refused the cached API version: {e}");
                Ok(None)
            }
            Ok(Err(e)) => Err(unreachable(e)),
            Err(_) => Err(unreachable("no answer within 10 s")),
        }
    }

    /// The raw client, for the few callers that stream (attach, build).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// "20.10.24 (API 1.41)".
    pub async fn server_version(&self) -> Result<String> {
        let v = self
            .docker
            .version()
            .await
            .map_err(|e| failed("ask Docker for its version", &e))?;
        Ok(format!(
            "{} (API {})",
            v.version.unwrap_or_default(),
            v.api_version.unwrap_or_default()
        ))
    }

    pub async fn inspect_image(&self, image: &str) -> Result<Option<ImageInspect>> {
        match self.docker.inspect_image(image).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(failed(format_args!("inspect image '{image}'"), &e)),
        }
    }

    /// Top-level images matching Docker's image list `filters` (e.g. `label`, `dangling`).
    pub async fn list_images(
        &self,
        filters: HashMap<String, Vec<String>>,
    ) -> Result<Vec<ImageSummary>> {
        self.docker
            .list_images(Some(ListImagesOptions {
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| failed("list images", &e))
    }

    /// Removes an image by id, with its untagged parents (never forced). `Ok(false)` when
    /// Docker keeps it: in use by a container, a parent of another image, or gone already.
    pub async fn remove_image(&self, id: &str) -> Result<bool> {
        match self
            .docker
            .remove_image(
                id,
                Some(RemoveImageOptions {
                    force: false,
                    noprune: false,
                    ..Default::default()
                }),
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(false),
            Err(e) => Err(failed(format_args!("remove image '{id}'"), &e)),
        }
    }

    pub async fn create_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<()> {
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| failed(format_args!("create volume '{name}'"), &e))
    }

    pub async fn inspect_volume(&self, name: &str) -> Result<Option<Volume>> {
        match self.docker.inspect_volume(name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(failed(format_args!("inspect volume '{name}'"), &e)),
        }
    }

    /// Volumes carrying all of `labels` (`key=value` or bare `key`): one Docker call.
    pub async fn list_volumes(&self, labels: &[String]) -> Result<Vec<Volume>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        let res = self
            .docker
            .list_volumes(Some(ListVolumesOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| failed("list volumes", &e))?;
        Ok(res.volumes.unwrap_or_default())
    }

    pub async fn remove_volume(&self, name: &str) -> Result<()> {
        match self
            .docker
            .remove_volume(name, Some(RemoveVolumeOptions { force: false }))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(failed(format_args!("remove volume '{name}'"), &e)),
        }
    }

    /// Containers (running or not) carrying all of `labels`.
    pub async fn list_containers(
        &self,
        labels: &[String],
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| failed("list containers", &e))
    }

    pub async fn create_container(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> std::result::Result<String, CreateError> {
        match self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                body,
            )
            .await
        {
            Ok(r) => Ok(r.id),
            Err(e) if is_conflict(&e) => Err(CreateError::NameTaken),
            // Docker answers 404 for a missing image and for a missing network alike; only
            // its message tells them apart (the one place caw-box reads Docker's wording).
            Err(e) if is_not_found(&e) && daemon_message(&e).contains("No such image") => Err(
                CreateError::ImageMissing(failed(format_args!("create container '{name}'"), &e)),
            ),
            Err(e) => Err(CreateError::Other(failed(
                format_args!("create container '{name}'"),
                &e,
            ))),
        }
    }

    pub async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInspectResponse>> {
        match self.docker.inspect_container(name, None).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(failed(format_args!("inspect container '{name}'"), &e)),
        }
    }

    /// Attaches to stdout and stderr (and stdin when `stdin`); call before `start` so no
    /// output is missed.
    pub async fn attach(&self, name: &str, stdin: bool) -> Result<AttachContainerResults> {
        self.docker
            .attach_container(
                name,
                Some(AttachContainerOptions {
                    stream: true,
                    stdin,
                    stdout: true,
                    stderr: true,
                    // A terminal session starts drawing once attached: no replay.
                    logs: !stdin,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| failed(format_args!("attach to container '{name}'"), &e))
    }

    /// Sets the size of a running container's terminal.
    pub async fn resize_tty(&self, name: &str, columns: u16, rows: u16) -> Result<()> {
        self.docker
            .resize_container_tty(
                name,
                ResizeContainerTTYOptions {
                    h: rows.into(),
                    w: columns.into(),
                },
            )
            .await
            .map_err(|e| {
                failed(
                    format_args!("resize the terminal of container '{name}'"),
                    &e,
                )
            })
    }

    pub async fn start_container(&self, name: &str) -> Result<()> {
        self.docker
            .start_container(name, None)
            .await
            .map_err(|e| failed(format_args!("start container '{name}'"), &e))
    }

    /// Waits until the container stops; returns its exit code.
    pub async fn wait_container(&self, name: &str) -> Result<i64> {
        let mut stream = self.docker.wait_container(
            name,
            Some(WaitContainerOptions {
                condition: "not-running".to_string(),
            }),
        );
        match stream.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(failed(format_args!("wait for container '{name}'"), &e)),
            None => {
                // The stream ended without a status: ask the container itself.
                let c = self.inspect_container(name).await?;
                Ok(c.and_then(|c| c.state)
                    .and_then(|s| s.exit_code)
                    .unwrap_or(-1))
            }
        }
    }

    /// Stops a container: SIGTERM, then SIGKILL after `grace`.
    pub async fn stop_container(&self, name: &str, grace: Duration) -> Result<()> {
        match self
            .docker
            .stop_container(
                name,
                Some(StopContainerOptions {
                    t: Some(grace.as_secs() as i32),
                    signal: None,
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(BollardError::DockerResponseServerError {
                status_code: 304 | 404,
                ..
            }) => Ok(()),
            Err(e) => Err(failed(format_args!("stop container '{name}'"), &e)),
        }
    }

    pub async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        match self
            .docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force,
                    v: false,
                    link: false,
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // "removal already in progress"
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(failed(format_args!("remove container '{name}'"), &e)),
        }
    }

    /// Runs a short helper container to completion and removes it: (exit code, stdout,
    /// stderr). For caw-box's own chores (a `git diff` in a workspace volume), never a turn.
    pub async fn run_to_completion(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        match self.create_container(name, body).await {
            Ok(_) => {}
            Err(CreateError::NameTaken) => {
                return Err(CreateError::Other(Error::environment(format!(
                    "a helper container '{name}' exists already"
                ))))
            }
            Err(e) => return Err(e),
        }
        let outcome = async {
            let attach = self.attach(name, false).await?;
            self.start_container(name).await?;
            let mut output = attach.output;
            let (mut out, mut err) = (Vec::new(), Vec::new());
            while let Some(chunk) = output.next().await {
                match chunk {
                    Ok(LogOutput::StdOut { message }) => out.extend_from_slice(&message),
                    Ok(LogOutput::StdErr { message }) => err.extend_from_slice(&message),
                    _ => {}
                }
            }
            let code = self.wait_container(name).await?;
            Ok((
                code,
                String::from_utf8_lossy(&out).to_string(),
                String::from_utf8_lossy(&err).to_string(),
            ))
        }
        .await;
        let _ = self.remove_container(name, true).await;
        outcome.map_err(CreateError::Other)
    }

    /// Creates a network (`internal`: no route out of it) with labels.
    pub async fn create_network(
        &self,
        name: &str,
        internal: bool,
        labels: HashMap<String, String>,
    ) -> Result<()> {
        self.docker
            .create_network(bollard::models::NetworkCreateRequest {
                name: name.to_string(),
                internal: Some(internal),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| failed(format_args!("create network '{name}'"), &e))
    }

    /// The names of the networks carrying every one of `labels` ("key=value").
    pub async fn list_networks(&self, labels: &[String]) -> Result<Vec<String>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        let networks = self
            .docker
            .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
                filters: Some(filters),
            }))
            .await
            .map_err(|e| failed("list networks", &e))?;
        Ok(networks.into_iter().filter_map(|n| n.name).collect())
    }

    pub async fn remove_network(&self, name: &str) -> Result<()> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(failed(format_args!("remove network '{name}'"), &e)),
        }
    }

    /// Attaches a (created) container to a network under `alias`.
    pub async fn connect_network(&self, network: &str, container: &str, alias: &str) -> Result<()> {
        self.docker
            .connect_network(
                network,
                bollard::models::NetworkConnectRequest {
                    container: container.to_string(),
                    endpoint_config: Some(bollard::models::EndpointSettings {
                        aliases: Some(vec![alias.to_string()]),
                        ..Default::default()
                    }),
                },
            )
            .await
            .map_err(|e| {
                failed(
                    format_args!("attach container '{container}' to network '{network}'"),
                    &e,
                )
            })
    }

    /// A container's output from its start, following it until the container stops.
    pub fn follow_logs(
        &self,
        name: &str,
    ) -> impl futures_util::Stream<Item = std::result::Result<LogOutput, BollardError>> + '_ {
        self.docker.logs(
            name,
            Some(bollard::query_parameters::LogsOptions {
                follow: true,
                stdout: true,
                stderr: false,
                ..Default::default()
            }),
        )
    }

    /// Extracts a tar archive into `dir` of a (created or stopped) container; writes land in
    /// the container's volumes when `dir` is inside one.
    pub async fn upload_tar(&self, name: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        self.docker
            .upload_to_container(
                name,
                Some(UploadToContainerOptions {
                    path: dir.to_string(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| failed(format_args!("copy files into container '{name}'"), &e))
    }

    /// The contents of the file at `path` in a (created or stopped) container; `None` when
    /// there is no such file.
    pub async fn download_file(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        match self.download_tar(name, path).await? {
            Some(tar) => crate::session::files::first_file(&tar),
            None => Ok(None),
        }
    }

    /// A tar archive of `path` in a container; `None` when the path does not exist.
    pub async fn download_tar(&self, name: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let mut stream = self.docker.download_from_container(
            name,
            Some(DownloadFromContainerOptions {
                path: path.to_string(),
            }),
        );
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => {
                    return Err(failed(
                        format_args!("copy '{path}' out of container '{name}'"),
                        &e,
                    ))
                }
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::api_version::{parse, updated};
    use bollard::ClientVersion;

    const HOST: &str = "unix:///var/run/docker.sock";

    fn v(major_version: usize, minor_version: usize) -> ClientVersion {
        ClientVersion {
            major_version,
            minor_version,
        }
    }

    #[test]
    fn the_api_version_cache_is_per_host() {
        let other = "unix:///run/user/1000/docker.sock";
        let now = 1_800_000_000;
        let file = updated("", HOST, &v(1, 41), now);
        assert_eq!(file, format!("{HOST} 1.41 {now}\n"));
        let file = updated(&file, other, &v(1, 47), now);
        assert_eq!(parse(&file, HOST, now), Some(v(1, 41)));
        assert_eq!(parse(&file, other, now), Some(v(1, 47)));
        // A host's new version replaces its entry and keeps the others.
        let file = updated(&file, HOST, &v(1, 44), now + 10);
        assert_eq!(parse(&file, HOST, now + 10), Some(v(1, 44)));
        assert_eq!(parse(&file, other, now + 10), Some(v(1, 47)));
        assert_eq!(file.lines().count(), 2);
    }

    #[test]
    fn each_entry_is_kept_for_a_day() {
        let other = "unix:///run/user/1000/docker.sock";
        let day = 24 * 3600;
        let file = updated("", other, &v(1, 47), 1000);
        let file = updated(&file, HOST, &v(1, 41), 1000 + day);
        assert_eq!(parse(&file, HOST, 1000 + day), Some(v(1, 41)));
        // Another host's refresh does not keep this one's entry alive.
        assert_eq!(parse(&file, other, 1000 + day), Some(v(1, 47)));
        assert_eq!(parse(&file, other, 1001 + day), None);
        assert_eq!(parse(&file, HOST, 1000 + 2 * day), Some(v(1, 41)));
        assert_eq!(parse(&file, HOST, 1001 + 2 * day), None);
    }

    #[test]
    fn a_damaged_api_version_cache_means_negotiate() {
        for junk in [
            "",
            "garbage",
            &format!("{HOST} 1"),
            &format!("{HOST} one.two 5"),
            &format!("{HOST} 1.41"),
            &format!("{HOST} 1.41 soon"),
        ] {
            assert_eq!(parse(junk, HOST, 5), None, "{junk:?}");
        }
        assert_eq!(parse(&format!("{HOST}x 1.41 5"), HOST, 5), None);
    }
}
