//! Containers: create (the name is the lock), attach, start, wait, stop, remove, and short
//! helper runs; what the daemon says about them.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, ContainerInspectResponse};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    ResizeContainerTTYOptions, StopContainerOptions, WaitContainerOptions,
};

use bollard::models::{ContainerStateStatusEnum, ContainerSummary, ContainerSummaryStateEnum};

use super::{
    daemon_message, is_conflict, is_name_taken, is_not_found, spec, CreateError, DockerBackend,
};
use crate::backend::{
    Attached, ContainerInfo, ContainerState, HelperSpec, OutputChunk, OutputStream, TurnSpec,
};
use crate::error::{Error, Result};

/// A listing that failed on Podman's own "stopped" state (see `list_containers`).
fn is_podman_stopped_state(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::JsonDataError { message, .. }
        if message.contains("unknown variant `stopped`"))
}

/// A request that failed because Podman removed a container while serving it (Podman
/// issues #418, #10120: a listing looks each one up after taking the list; an inspect or
/// remove finds the name, then no container).
fn is_podman_listing_race(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { message, .. }
        if message.contains("does not exist in database"))
}

impl DockerBackend {
    /// Containers (running or not) carrying all of `labels`.
    pub async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>> {
        let filters = HashMap::from([("label".to_string(), labels.to_vec())]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        // Podman (4.3; newer ones map it to "exited") lists a container that has stopped
        // but is not cleaned up yet as "stopped", a state Docker's API (and bollard) does
        // not have: the whole list fails to parse. It lasts until Podman's cleanup runs:
        // ask again, for up to 10 s.
        let mut attempts = 0;
        let list = loop {
            match self.docker.list_containers(Some(options.clone())).await {
                Err(e)
                    if attempts < 100
                        && (is_podman_stopped_state(&e) || is_podman_listing_race(&e)) =>
                {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                other => break other.map_err(|e| self.failed("list containers", &e))?,
            }
        };
        Ok(list.into_iter().map(summary_info).collect())
    }

    /// Creates a turn's container; a taken name (the session's lock) is
    /// [`CreateError::NameTaken`], atomically.
    pub async fn create_turn(
        &self,
        name: &str,
        spec: &TurnSpec,
    ) -> std::result::Result<String, CreateError> {
        let id = self.create_container(name, spec::turn_body(spec)).await?;
        if spec.runtime_over_stdin {
            return Ok(id);
        }
        // The runtime files, into the container's own scratch volume before it starts.
        if let Err(e) = self
            .upload_files(
                name,
                &spec.runtime.mount,
                &spec.runtime.tar_files(),
                spec.runtime.owner,
            )
            .await
        {
            let _ = self.remove_container(name, true).await;
            return Err(CreateError::Other(e));
        }
        Ok(id)
    }

    /// Creates (does not start) one of caw-box's helper containers.
    pub async fn create_helper(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<String, CreateError> {
        let id = self.create_container(name, spec::helper_body(spec)).await?;
        if let Some((network, alias)) = &spec.join {
            if let Err(e) = self.connect_network(network, name, alias).await {
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(e));
            }
        }
        if let Some(s) = &spec.scratch {
            if let Err(e) = self
                .upload_files(name, &s.mount, &s.tar_files(), s.owner)
                .await
            {
                let _ = self.remove_container(name, true).await;
                return Err(CreateError::Other(e));
            }
        }
        Ok(id)
    }

    async fn create_container(
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
            Err(e) if is_name_taken(&e) => Err(CreateError::NameTaken),
            // Docker answers 404 for a missing image and for a missing network alike; only
            // its message tells them apart (the one place caw-box reads Docker's wording:
            // "No such image: X"; Podman's is "no such image: X: image not known").
            Err(e)
                if is_not_found(&e)
                    && daemon_message(&e)
                        .to_ascii_lowercase()
                        .contains("no such image") =>
            {
                Err(CreateError::ImageMissing(
                    self.failed(format_args!("create container '{name}'"), &e),
                ))
            }
            Err(e) => Err(CreateError::Other(
                self.failed(format_args!("create container '{name}'"), &e),
            )),
        }
    }

    pub async fn inspect_container(&self, name: &str) -> Result<Option<ContainerInfo>> {
        // As in `list_containers`: Podman's passing "stopped" state, asked again.
        for _ in 0..100 {
            match self.docker.inspect_container(name, None).await {
                Err(e) if is_podman_stopped_state(&e) => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Ok(c) => return Ok(Some(inspect_info(c))),
                // Podman: removed between its lookup of the name and reading the container.
                Err(e) if is_not_found(&e) || is_podman_listing_race(&e) => return Ok(None),
                Err(e) => return Err(self.failed(format_args!("inspect container '{name}'"), &e)),
            }
        }
        Err(Error::environment(format!(
            "container '{name}' stayed in Podman's \"stopped\" state for 10 s; `podman container cleanup {name}` ends it"
        )))
    }

    /// A running container's IP address on `network` (`None`: not on it, or not running).
    pub async fn container_address(&self, name: &str, network: &str) -> Result<Option<String>> {
        let c = match self.docker.inspect_container(name, None).await {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.failed(format_args!("inspect container '{name}'"), &e)),
        };
        Ok(c.network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(network))
            .and_then(|n| n.ip_address)
            .filter(|ip| !ip.is_empty()))
    }

    /// Attaches to stdout and stderr (and stdin when `stdin`); call before `start` so no
    /// output is missed.
    pub async fn attach(&self, name: &str, stdin: bool) -> Result<Attached> {
        let what = format!("read the output of container '{name}'");
        let attached = self
            .docker
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
            .map_err(|e| self.failed(format_args!("attach to container '{name}'"), &e))?;
        Ok(Attached {
            output: self.output_stream(attached.output, what),
            input: attached.input,
        })
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
                self.failed(
                    format_args!("resize the terminal of container '{name}'"),
                    &e,
                )
            })
    }

    pub async fn start_container(&self, name: &str) -> Result<()> {
        self.docker
            .start_container(name, None)
            .await
            .map_err(|e| self.failed(format_args!("start container '{name}'"), &e))
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
            Some(Err(e)) => Err(self.failed(format_args!("wait for container '{name}'"), &e)),
            None => {
                // The stream ended without a status: ask the container itself.
                let c = self.docker.inspect_container(name, None).await.ok();
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
            Err(e) => Err(self.failed(format_args!("stop container '{name}'"), &e)),
        }
    }

    pub async fn remove_container(&self, name: &str, force: bool) -> Result<()> {
        match self
            .docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force,
                    // Its anonymous volumes (the runtime scratch), never named ones.
                    v: true,
                    link: false,
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) || is_podman_listing_race(&e) => Ok(()),
            // "removal already in progress"
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(self.failed(format_args!("remove container '{name}'"), &e)),
        }
    }

    /// Renames container `name` to `to` (`Backend::rename_container`).
    pub async fn rename_container(&self, name: &str, to: &str) -> Result<()> {
        self.docker
            .rename_container(
                name,
                bollard::query_parameters::RenameContainerOptions {
                    name: to.to_string(),
                },
            )
            .await
            .map_err(|e| self.failed(format_args!("rename container '{name}'"), &e))
    }

    /// Runs a short helper container to completion and removes it: (exit code, stdout,
    /// stderr). For caw-box's own chores (a `git diff` in a workspace volume), never a turn.
    pub async fn run_to_completion(
        &self,
        name: &str,
        spec: &HelperSpec,
    ) -> std::result::Result<(i64, String, String), CreateError> {
        match self.create_helper(name, spec).await {
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
                    Ok(OutputChunk::Stdout(message)) => out.extend_from_slice(&message),
                    Ok(OutputChunk::Stderr(message)) => err.extend_from_slice(&message),
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

    /// A container's output from its start, following it until the container stops.
    pub fn follow_logs(&self, name: &str) -> OutputStream {
        self.logs(name, true)
    }

    /// A container's stdout from its start, followed until it stops or to now.
    pub fn logs(&self, name: &str, follow: bool) -> OutputStream {
        self.logs_from(name, follow, None)
    }

    /// A container's stdout from the second of `since` on, each line after its time.
    pub fn logs_since(
        &self,
        name: &str,
        since: std::time::SystemTime,
        follow: bool,
    ) -> OutputStream {
        self.logs_from(name, follow, Some(since))
    }

    fn logs_from(
        &self,
        name: &str,
        follow: bool,
        since: Option<std::time::SystemTime>,
    ) -> OutputStream {
        let secs = since
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let logs = self.docker.logs(
            name,
            Some(bollard::query_parameters::LogsOptions {
                follow,
                stdout: true,
                stderr: false,
                since: i32::try_from(secs).unwrap_or(0),
                timestamps: since.is_some(),
                ..Default::default()
            }),
        );
        self.output_stream(logs, format!("read the output of container '{name}'"))
    }
}

impl DockerBackend {
    /// bollard's output stream as caw-box's: chunks of caw-box's own type, errors saying
    /// what was being read.
    pub(super) fn output_stream(
        &self,
        stream: impl futures_util::Stream<Item = std::result::Result<LogOutput, BollardError>>
            + Send
            + 'static,
        what: String,
    ) -> OutputStream {
        let endpoint = self.endpoint.clone();
        Box::pin(stream.map(move |item| match item {
            Ok(LogOutput::StdOut { message }) => Ok(OutputChunk::Stdout(message.to_vec())),
            Ok(LogOutput::StdErr { message }) => Ok(OutputChunk::Stderr(message.to_vec())),
            Ok(LogOutput::Console { message }) => Ok(OutputChunk::Console(message.to_vec())),
            Ok(LogOutput::StdIn { message }) => Ok(OutputChunk::Console(message.to_vec())),
            Err(e) => Err(super::failed(&endpoint, &what, &e)),
        }))
    }
}

fn inspect_info(c: ContainerInspectResponse) -> ContainerInfo {
    let state = c.state.as_ref();
    let created = c.created.as_deref().and_then(rfc3339);
    ContainerInfo {
        id: c.id.clone().unwrap_or_default(),
        name: c
            .name
            .as_deref()
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string(),
        labels: c
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default(),
        state: if state.and_then(|s| s.running).unwrap_or(false) {
            ContainerState::Running
        } else {
            match state.and_then(|s| s.status) {
                Some(ContainerStateStatusEnum::CREATED) => ContainerState::Created,
                Some(ContainerStateStatusEnum::RUNNING) => ContainerState::Running,
                Some(ContainerStateStatusEnum::EXITED) => ContainerState::Exited,
                Some(ContainerStateStatusEnum::REMOVING) => ContainerState::Removing,
                Some(ContainerStateStatusEnum::DEAD) => ContainerState::Dead,
                _ => ContainerState::Other,
            }
        },
        created,
        finished: state
            .and_then(|s| s.finished_at.as_deref())
            .is_some_and(|f| !f.starts_with("0001")),
        mounts: c
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| Some((m.destination?, m.source?)))
            .collect(),
    }
}

/// An RFC 3339 time as the engine gives it (Docker's in UTC, Podman's in its local offset),
/// to the nanosecond: a container made within the same second as a log line is told apart
/// from it (`session::walls::refusals`: an address a shared proxy saw may have been an
/// earlier container's).
fn rfc3339(t: &str) -> Option<std::time::SystemTime> {
    let at = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    let nanos = u64::try_from(at.unix_timestamp_nanos()).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_nanos(nanos))
}

fn summary_info(c: ContainerSummary) -> ContainerInfo {
    ContainerInfo {
        id: c.id.unwrap_or_default(),
        name: c
            .names
            .unwrap_or_default()
            .join("")
            .trim_start_matches('/')
            .to_string(),
        labels: c.labels.unwrap_or_default(),
        state: match c.state {
            Some(ContainerSummaryStateEnum::CREATED) => ContainerState::Created,
            Some(ContainerSummaryStateEnum::RUNNING) => ContainerState::Running,
            Some(ContainerSummaryStateEnum::EXITED) => ContainerState::Exited,
            Some(ContainerSummaryStateEnum::REMOVING) => ContainerState::Removing,
            Some(ContainerSummaryStateEnum::DEAD) => ContainerState::Dead,
            _ => ContainerState::Other,
        },
        created: c
            .created
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| std::time::UNIX_EPOCH + Duration::from_secs(s)),
        finished: false,
        mounts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Docker's and Podman's forms, to the nanosecond; what is not a time is none.
    #[test]
    fn creation_times_keep_their_nanoseconds_and_offsets() {
        let at = |t| {
            rfc3339(t)
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
        };
        assert_eq!(
            at("2026-12-02T06:30:07.123456789Z"),
            Duration::new(1_796_193_007, 123_456_789)
        );
        assert_eq!(
            at("2026-12-02T07:30:07.5+01:00"),
            Duration::new(1_796_193_007, 500_000_000)
        );
        assert_eq!(rfc3339("0001-01-01T00:00:00Z"), None);
        assert_eq!(rfc3339("yesterday"), None);
    }
}
