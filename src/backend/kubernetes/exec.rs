//! Processes in pods: `exec` (and the short-lived pod files of an ended pod move through),
//! and attachments to a pod's containers.

use std::collections::HashMap;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};
use kube::api::AttachParams;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::pipes::{Ended, UntilEnded};
use super::status::container_info;
use super::{failed, meta, KubeBackend, Resizer, MANAGED_BY};
use crate::backend::{Attached, Backend, OutputChunk, OutputStream};
use crate::error::{Error, Result};
impl KubeBackend {
    /// Runs `argv` in the running pod `name`, feeding it `input`; its stdout. A pod that
    /// has ended cannot run anything: that is an error saying so.
    pub(super) async fn exec(
        &self,
        name: &str,
        argv: &[&str],
        input: Option<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        self.exec_in(name, None, argv, input).await
    }

    /// [`Self::exec`] in container `container` of the pod (`None`: its main one).
    async fn exec_in(
        &self,
        name: &str,
        container: Option<String>,
        argv: &[&str],
        input: Option<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let what = || format!("run `{}` in pod '{name}'", argv.first().unwrap_or(&""));
        let mut params = AttachParams::default()
            .stdin(input.is_some())
            .stdout(true)
            .stderr(true);
        let container = match container {
            Some(c) => Some(c),
            None => self.main_container(name).await?,
        };
        if let Some(main) = container {
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
        let ended = Ended::new();
        let mut stdout = UntilEnded::new(process.stdout().expect("stdout was asked for"), &ended);
        let mut stderr = UntilEnded::new(process.stderr().expect("stderr was asked for"), &ended);
        // The status comes last, or the loop ends without one: either ends the pipes. (Not
        // `join`: it ends stdin first, and so the exec, when it has none of ours.)
        let status = process.take_status();
        let ends = async {
            let status = match status {
                Some(status) => status.await,
                None => None,
            };
            ended.finish();
            status
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (fed, read_out, read_err, status) = tokio::join!(
            feed,
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err),
            ends
        );
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

    /// The running pod (and container: `None`, its main one) files of pod `name`'s claims
    /// move through: `name` itself while it runs; once it ended, its `keep` container for
    /// the directory that holds (a helper's kept directory, `helpers.rs`), else a
    /// short-lived pod mounting the same claims on the same node (`Some` of its name: the
    /// caller deletes it). A pod's own memory and empty dirs are gone with it.
    /// A path off the ended pod's claims (its runtime directory, say) is gone with it:
    /// `None`.
    async fn through(&self, name: &str, path: &str) -> Result<Option<Through>> {
        let pod = self.existing_pod(name).await?;
        if container_info(&pod).running() {
            return Ok(Some((name.to_string(), None, None)));
        }
        if let Some(keeper) = super::helpers::keeper_of(&pod, path) {
            return Ok(Some((name.to_string(), Some(keeper), None)));
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
                crate::labelling::labels::MANAGED.to_string(),
                "true".to_string(),
            ),
        ]
        .into_iter()
        .chain(
            meta::merged(&pod.metadata)
                .into_iter()
                .filter(|(k, _)| k == crate::labelling::labels::SESSION),
        )
        .chain([(
            crate::labelling::labels::ROLE.to_string(),
            crate::labelling::roles::PROBE.to_string(),
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
        Ok(Some((helper.clone(), None, Some(helper))))
    }

    /// Runs `argv` with `input` through [`Self::through`] pod `name`, for `path`: its
    /// stdout; `None` when `path` went with the ended pod.
    pub(super) async fn exec_files(
        &self,
        name: &str,
        path: &str,
        argv: &[&str],
        input: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>> {
        let Some((pod, container, helper)) = self.through(name, path).await? else {
            return Ok(None);
        };
        let out = self.exec_in(&pod, container, argv, input).await;
        if let Some(helper) = helper {
            let _ = self.remove_container(&helper, true).await;
        }
        out.map(Some)
    }

    /// Attaches to container `container` of pod `name` (`None`: its only one).
    pub(super) async fn attach_to(
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
        let t0 = std::time::Instant::now();
        let mut process = self.attach_retried(name, &params).await?;
        super::timeline("attach", t0);
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
        let ended = Ended::new();
        let stdout = UntilEnded::new(process.stdout().expect("stdout was asked for"), &ended);
        let stderr: OutputStream = match process.stderr() {
            Some(stderr) => chunks(UntilEnded::new(stderr, &ended), OutputChunk::Stderr),
            // A terminal has one stream.
            None => Box::pin(futures_util::stream::empty()),
        };
        // (A headless agent's end is announced after its stdin's last use, and answered.)
        type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;
        let (input, shared): (Input, Option<super::ends::Shared>) = match process.stdin() {
            Some(w) if !tty => {
                let w: Input = Box::pin(w);
                let shared = std::sync::Arc::new(std::sync::Mutex::new(w));
                (
                    Box::pin(super::ends::KeepOpen(shared.clone())),
                    Some(shared),
                )
            }
            Some(w) => (Box::pin(w), None),
            None => (Box::pin(tokio::io::sink()), None),
        };
        // The attachment lives as long as its output is read; its end ends the pipes. Its
        // status future resolves when its loop ends (or just before): only then `join`,
        // which would end stdin first, and an attachment with none of ours with it.
        let pod = name.to_string();
        let status = process.take_status();
        let keep = futures_util::stream::once(async move {
            if let Some(status) = status {
                let _ = status.await;
            }
            if let Err(e) = process.join().await {
                tracing::debug!(pod, "the attachment ended: {e}");
            }
            ended.finish();
            None
        })
        .filter_map(|x: Option<Result<OutputChunk>>| async move { x });
        let stdout = chunks(stdout, OutputChunk::Stdout);
        // A headless agent announces its end on stdout (a terminal's is not read so).
        let stdout = match shared {
            Some(stdin) => super::ends::watched(name, stdout, self.ends.clone(), stdin),
            None => stdout,
        };
        let output = futures_util::stream::select(stdout, stderr);
        let output = futures_util::stream::select(output, keep);
        Ok(Attached {
            output: Box::pin(output),
            input,
        })
    }

    /// Attaches with `params`, again for a moment while the kubelet answers the upgrade with
    /// a server error: it does so for a container the runtime is still starting (seen on a
    /// node that has just come up), and an attach that never began loses nothing.
    async fn attach_retried(
        &self,
        name: &str,
        params: &AttachParams,
    ) -> Result<kube::api::AttachedProcess> {
        use kube::client::UpgradeConnectionError::ProtocolSwitch;
        let mut tries = 0;
        loop {
            match self.pods().attach(name, params).await {
                Ok(process) => return Ok(process),
                Err(kube::Error::UpgradeConnection(ProtocolSwitch(status)))
                    if status.is_server_error() && tries < 10 =>
                {
                    tries += 1;
                    tracing::debug!(pod = name, %status, "attach refused; again");
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                Err(e) => return Err(failed(format!("attach to pod '{name}'"), &e)),
            }
        }
    }

    /// A pod's stdout (its agent's, or `<pod>/<container>`: a sidecar's, the proxy's that
    /// says what it refused), from its start: followed until it ends, or to now.
    pub(super) fn logs(&self, name: &str, follow: bool) -> OutputStream {
        self.logs_with(name, follow, None)
    }

    /// [`Self::logs`] from the second of `since` on (or a second before), each line after
    /// its time.
    pub(super) fn logs_since(
        &self,
        name: &str,
        since: std::time::SystemTime,
        follow: bool,
    ) -> OutputStream {
        // Seconds before now, rounded up: the API's `sinceSeconds` is relative (none: from
        // the start).
        let ago = (since > std::time::UNIX_EPOCH)
            .then(|| {
                std::time::SystemTime::now()
                    .duration_since(since)
                    .map_or(1, |d| d.as_secs() + 1)
            })
            .map(|s| i64::try_from(s).unwrap_or(i64::MAX));
        self.logs_with(name, follow, Some(ago))
    }

    /// `since`: `None`, the log as it is; `Some(seconds)`, each line after its time, from
    /// `seconds` ago (or from the start).
    fn logs_with(&self, name: &str, follow: bool, since: Option<Option<i64>>) -> OutputStream {
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
            let params = kube::api::LogParams {
                follow,
                container,
                since_seconds: since.flatten(),
                timestamps: since.is_some(),
                ..Default::default()
            };
            match pods.log_stream(&name, &params).await {
                Ok(reader) => {
                    use tokio_util::compat::FuturesAsyncReadCompatExt;
                    chunks(reader.compat(), OutputChunk::Stdout)
                }
                Err(e) => {
                    let e = failed(format!("read pod '{name}'s logs"), &e);
                    Box::pin(futures_util::stream::once(async move { Err(e) })) as OutputStream
                }
            }
        };
        Box::pin(futures_util::stream::once(stream).flatten())
    }

    /// The name of pod `name`'s main container (the agent's, in a turn pod that has a
    /// broker beside it: exec, attach and logs must name one there); `None` when the pod
    /// is gone.
    pub(super) async fn main_container(&self, name: &str) -> Result<Option<String>> {
        let pod = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| failed(format!("read pod '{name}'"), &e))?;
        Ok(pod.and_then(|p| Some(p.spec?.containers.first()?.name.clone())))
    }

    /// Runs `script` in `name` for `path`: its output after a leading `Y` (found), or `None`
    /// (`N`: not there, or the pod is gone).
    pub(super) async fn exec_marked(
        &self,
        name: &str,
        path: &str,
        script: &str,
    ) -> Result<Option<Vec<u8>>> {
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

/// Where files move through ([`KubeBackend::through`]): a pod, the container (`None`: its
/// main one), and a short-lived pod made for it (the caller deletes it).
type Through = (String, Option<String>, Option<String>);

/// A reader as a stream of output chunks.
pub(super) fn chunks(
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
