//! A turn handed to a background `caw-box __drive` process, which runs it to its end after
//! the process that started it returned: what `run -d`, `resume -d`, the Python package and
//! the MCP server (`caw-box mcp`) start turns with, and what `__drive` reads.
//!
//! Not here: waiting for such a turn or stopping it (any process does that through the
//! backend: [`crate::Client::wait`], [`crate::Client::stop`]).

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Client, Session};
use crate::backend::Backend;
use crate::error::{Error, ErrorKind, Result};
use crate::session::lifecycle::liveness;
use crate::session::record::{self, labels, SessionSettings};
use crate::session::runner::{self, TurnOptions};
use crate::session::target;

/// What a detached turn's driver process is told, on its stdin (it may hold secrets).
#[derive(Debug, Serialize, Deserialize)]
struct DriveJob {
    session_id: String,
    settings: SessionSettings,
    prompt: String,
    env: Vec<(String, String)>,
    /// Milliseconds, not seconds: `--timeout 500ms` must not become zero.
    timeout_ms: Option<u64>,
    #[serde(default)]
    user_files: Vec<crate::provider::HomeFile>,
    #[serde(default)]
    inject_credentials: bool,
    #[serde(default)]
    keep_warm_given: bool,
}

impl DriveJob {
    fn new(session_id: String, settings: SessionSettings, options: &TurnOptions) -> Self {
        DriveJob {
            session_id,
            settings,
            prompt: options.prompt.clone(),
            env: options.env.clone(),
            timeout_ms: options
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            user_files: options.user_files.clone(),
            inject_credentials: options.inject_credentials,
            keep_warm_given: options.keep_warm_given,
        }
    }

    /// The turn the driver runs (the job's settings and session are applied separately).
    fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            prompt: self.prompt.clone(),
            env: self.env.clone(),
            timeout: self.timeout_ms.map(Duration::from_millis),
            interactive: false,
            idle_timeout: None,
            connect_timeout: None,
            user_files: self.user_files.clone(),
            inject_credentials: self.inject_credentials,
            keep_warm_given: self.keep_warm_given,
        }
    }
}

impl Session {
    /// Starts the turn `options` describe in a background `caw-box __drive` process (the
    /// executable of [`crate::connection::driver`]) that outlives this one, and returns once
    /// its container runs (or with the error that kept it from starting: a busy session, no
    /// credentials, …). [`Client::wait`] and [`Client::stop`] reach it from any process.
    pub async fn start_detached(&self, options: &TurnOptions) -> Result<()> {
        // Refused here, not by the driver: nothing is started for a turn that cannot run.
        runner::check_prompt_size(options.prompt.len())?;
        let backend = &self.backend;
        let job = DriveJob::new(self.id().to_string(), self.record.settings.clone(), options);
        let json = serde_json::to_vec(&job).expect("jobs serialize");
        let (mut child, driver_pid, log_path) = spawn_driver(self.id(), &json).await?;
        let container = runner::container_name(&self.record);
        let turn = self.record.next_turn().to_string();
        loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| Error::environment(format!("lost the background turn: {e}")))?
            {
                let stderr = std::fs::read_to_string(&log_path).unwrap_or_default();
                let _ = std::fs::remove_file(&log_path);
                return driver_ended(status.code(), &stderr);
            }
            // Our turn's container, not any turn N: a turn N already running (this session
            // is busy) carries the same turn label, but another driver's pid.
            let started = match backend.inspect_container(&container).await? {
                // A warm container's labels are its first turn's: the turn in it says.
                Some(c) if c.label(crate::backend::warm::WARM_LABEL).is_some() => {
                    let ours = backend.turn_in_warm(&container).await?;
                    ours.is_some_and(|(t, pid)| {
                        t.to_string() == turn && pid.to_string() == driver_pid
                    })
                }
                c => c
                    .filter(|c| {
                        c.label(labels::TURN) == Some(turn.as_str())
                            && c.label(labels::DRIVER_PID) == Some(driver_pid.as_str())
                    })
                    .is_some_and(|c| c.running() || c.finished),
            };
            // Or waiting for a slot of its account (`--per-account`): it starts later.
            let queued = crate::session::admission::queued_turn(self.id())
                .is_some_and(|q| q.turn.to_string() == turn && q.pid.to_string() == driver_pid);
            if started || queued {
                drop(child);
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// After a first turn that could not be started detached: deletes the new session's
    /// volumes unless the backend holds a recorded turn of it (when it cannot tell, keeps
    /// them: nothing is deleted on a guess).
    pub async fn discard_unless_recorded(&self) {
        let recorded = match target::resolve_view(&self.backend, &self.id().to_string()).await {
            Ok(view) => view.last.is_some(),
            Err(_) => true,
        };
        if !recorded {
            let _ = self.discard_if_unused().await;
        }
    }
}

/// Starts a background `caw-box __drive` (the executable of [`crate::connection::driver`])
/// for session `id` and hands it `json`, its job. Its stderr goes to a file of this host,
/// not to this process: it outlives this one, and what it says when it fails mid-turn is
/// its last words for `wait`. Returns it, its pid and that file.
async fn spawn_driver(
    id: uuid::Uuid,
    json: &[u8],
) -> Result<(tokio::process::Child, String, std::path::PathBuf)> {
    let exe = crate::connection::driver()
        .map_err(|e| Error::environment(format!("cannot find caw-box's own executable: {e}")))?;
    let logs = liveness::driver_logs(id)?;
    let log = tempfile::NamedTempFile::new_in(&logs)
        .map_err(|e| Error::environment(format!("cannot write in '{}': {e}", logs.display())))?;
    let log_writer = log
        .reopen()
        .map_err(|e| Error::environment(format!("cannot write in '{}': {e}", logs.display())))?;
    let mut child = {
        // tokio's child: dropped while it runs, it is reaped by the runtime's SIGCHLD
        // handling, so a long-lived caller (the MCP server) keeps neither a zombie nor a
        // thread per turn.
        tokio::process::Command::new(exe)
            .args(["-q", "__drive"])
            // This process's backend, context and image repository, as it connected.
            .envs(crate::connection::installed().child_env())
            // The labels config resolved for this turn's objects.
            .env(
                "CAW_BOX_LABELS",
                record::render_labels(&record::extra_labels()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log_writer)
            // Its own process group: a Ctrl-C meant for this terminal does not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| Error::environment(format!("cannot start the background turn: {e}")))?
    };
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        stdin.write_all(json).await.map_err(|e| {
            Error::environment(format!("cannot hand the turn to the background: {e}"))
        })?;
    }
    let driver_pid = child.id().map(|p| p.to_string()).unwrap_or_default();
    let log_path = liveness::driver_log(&logs, &driver_pid);
    log.persist(&log_path)
        .map_err(|e| Error::environment(format!("cannot write in '{}': {e}", logs.display())))?;
    Ok((child, driver_pid, log_path))
}

/// Starts a new driver for each queued turn whose driver died while it waited (its job
/// kept: `session::admission`): it takes the turn's place in line. Any caw-box that
/// connects does this, so a queue outlives the processes that queued.
pub(super) async fn adopt_orphaned_turns() {
    let Ok(accounts) = crate::session::admission::Accounts::here() else {
        return;
    };
    for json in accounts.claim_orphans() {
        let Ok(job) = serde_json::from_slice::<DriveJob>(&json) else {
            continue;
        };
        let Ok(id) = job.session_id.parse() else {
            continue;
        };
        match spawn_driver(id, &json).await {
            Ok((child, pid, _)) => {
                tracing::info!("started the queued turn of session {id} again (driver {pid})");
                drop(child);
            }
            Err(e) => tracing::warn!("could not start the queued turn of session {id} again: {e}"),
        }
    }
}

/// What a detached turn's driver said by exiting before its container was seen running:
/// `Ok` if it ran the turn (a quick one, or one that failed fast), else why it could not.
///
/// The exit code alone cannot tell: 1, 4, 5, 124 and 130 are both turn statuses and error
/// kinds (exit 4 is an `auth_error` turn, or no credentials at all). What tells is how
/// `__drive` ends: after a turn it prints nothing (it runs with `-q` and returns the
/// turn's exit code), while an error is always its last stderr line, `caw-box: error: …`.
fn driver_ended(code: Option<i32>, stderr: &str) -> Result<()> {
    // Its error's report, written just before its error line: the kind as it was.
    if let Some(e) = stderr
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(DRIVER_ERROR_REPORT))
        .and_then(|json| serde_json::from_str(json).ok())
        .and_then(|report| Error::from_report(&report))
    {
        return Err(e);
    }
    let last = stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let error = last.strip_prefix("caw-box: error: ");
    let turn_status_code = matches!(code, Some(0 | 1 | 4 | 5 | 124 | 130));
    if error.is_none() && turn_status_code {
        // The turn ran and is recorded: `wait` reports how it ended.
        return Ok(());
    }
    let kind = code
        .and_then(ErrorKind::from_exit_code)
        .unwrap_or(ErrorKind::Environment);
    let message = match (error, code) {
        (Some(line), _) => line.to_string(),
        // Not one of ours (a panic, say): its own last words say the most.
        _ if !last.is_empty() => last.to_string(),
        (None, Some(c)) => {
            format!("the background turn ended before it started (its caw-box exited with {c})")
        }
        (None, None) => {
            "the background turn ended before it started (its caw-box was killed)".to_string()
        }
    };
    Err(Error::new(kind, message))
}

/// The prefix of the line on which a failed `__drive` writes its error's `-o json` report,
/// before its `caw-box: error: …` line.
pub const DRIVER_ERROR_REPORT: &str = "caw-box: error-report: ";

/// `__drive`: reads the job [`Session::start_detached`] wrote on stdin and runs that turn
/// to its end, recording it in the session's volume; the turn's exit code.
pub async fn drive_from_stdin() -> Result<i32> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| Error::usage(format!("__drive: cannot read the job: {e}")))?;
    let job: DriveJob = serde_json::from_slice(&input)
        .map_err(|e| Error::usage(format!("__drive: malformed job: {e}")))?;
    // A turn that may wait in its account's queue keeps its job meanwhile, so that the
    // next caw-box starts it again if this process dies first (removed once admitted).
    let _kept = (job.settings.per_account.is_some() || job.settings.park)
        .then(|| KeptJob::write(&job.session_id, &input))
        .flatten();
    let client = Client::connect().await?;
    let mut session = client.open(&job.session_id).await?;
    let options = job.turn_options();
    *session.settings_mut() = job.settings;
    let result = session.send(options, |_| {}).await?;
    // Recorded: no last words to keep.
    if let Ok(logs) = liveness::driver_logs(session.id()) {
        let _ = std::fs::remove_file(liveness::driver_log(&logs, std::process::id()));
    }
    Ok(result.exit_code)
}

/// Keeps the job of `session`'s next turn, `options`, while it waits in its account's queue
/// (as `__drive` keeps its own): removed when it is admitted, or started by the next caw-box
/// if this process dies first (best effort: a turn whose job is lost still waits, while its
/// process lives). Removed when dropped.
pub(super) fn keep_job(session: &Session, options: &TurnOptions) -> Option<KeptJob> {
    let job = DriveJob::new(
        session.id().to_string(),
        session.record.settings.clone(),
        options,
    );
    let json = serde_json::to_vec(&job).expect("jobs serialize");
    KeptJob::write(&session.id().to_string(), &json)
}

/// A detached turn's job, kept private while it may wait in a queue
/// (`session::admission::job_path`); removed when its driver ends.
pub(super) struct KeptJob(std::path::PathBuf);

impl KeptJob {
    fn write(session_id: &str, json: &[u8]) -> Option<KeptJob> {
        let path = crate::session::admission::job_path(session_id.parse().ok()?).ok()?;
        crate::dirs::write_private_unsynced(&path, json).ok()?;
        Some(KeptJob(path))
    }
}

impl Drop for KeptJob {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(timeout: Option<Duration>) -> TurnOptions {
        TurnOptions {
            prompt: "hi".into(),
            env: vec![("K".into(), "V".into())],
            timeout,
            interactive: false,
            ..Default::default()
        }
    }

    /// What `__drive` reads back from what `--detach` wrote.
    fn through_the_pipe(options: &TurnOptions) -> TurnOptions {
        let job = DriveJob::new("id".into(), SessionSettings::default(), options);
        let json = serde_json::to_vec(&job).unwrap();
        serde_json::from_slice::<DriveJob>(&json)
            .unwrap()
            .turn_options()
    }

    #[test]
    fn a_driver_that_ran_its_turn_is_told_from_one_that_could_not() {
        // A turn that ran and ended (fast) before its container was seen: started.
        for code in [0, 1, 4, 5, 124, 130] {
            assert!(driver_ended(Some(code), "").is_ok(), "{code}");
        }
        // Log lines of a turn that ran are not an error.
        assert!(driver_ended(Some(1), "ERROR caw_box::session: cli crashed\n").is_ok());
        // The driver's own error line: refused, with its message and exit code.
        let busy = driver_ended(
            Some(2),
            "caw-box: error: session x is busy: turn 3 is running right now\n",
        )
        .unwrap_err();
        assert_eq!(busy.exit_code(), 2);
        assert_eq!(
            busy.message,
            "session x is busy: turn 3 is running right now"
        );
        // With its report, the kind the driver's error had: `busy`, not `usage`.
        let reported = driver_ended(
            Some(2),
            &format!(
                "{DRIVER_ERROR_REPORT}{}\ncaw-box: error: session x is busy\n",
                serde_json::to_string(&Error::busy("session x is busy").report()).unwrap()
            ),
        )
        .unwrap_err();
        assert_eq!(reported.kind, ErrorKind::Busy);
        assert_eq!(reported.message, "session x is busy");
        // Exit 4 with an error line is missing credentials, not an auth_error turn.
        let creds =
            driver_ended(Some(4), "caw-box: error: no credentials for codex\n").unwrap_err();
        assert_eq!(creds.exit_code(), 4);
        // Anything else never started the turn.
        assert_eq!(driver_ended(Some(3), "").unwrap_err().exit_code(), 3);
        assert_eq!(driver_ended(None, "").unwrap_err().exit_code(), 3);
        let panic = driver_ended(Some(101), "thread 'main' panicked at x\n").unwrap_err();
        assert_eq!(panic.exit_code(), 3);
        assert!(panic.message.contains("panicked"), "{}", panic.message);
    }

    #[test]
    fn a_detached_turn_keeps_a_sub_second_timeout() {
        for t in [
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(1800),
        ] {
            assert_eq!(through_the_pipe(&options(Some(t))).timeout, Some(t));
        }
        assert_eq!(through_the_pipe(&options(None)).timeout, None);
        let back = through_the_pipe(&options(None));
        assert_eq!(back.prompt, "hi");
        assert_eq!(back.env, vec![("K".to_string(), "V".to_string())]);
        assert!(!back.interactive);
    }
}
