//! A headless turn: drives the turn's started container to its recorded end, reading the
//! CLI's output line by line into unified events, and ending it early on a timeout, a CLI
//! that cannot reach its model, or an interrupt.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::egress::refused_by_proxy;
use super::ended::{
    last_line, model_host, stopped_outside_result, unreachable_result, EXIT_MARKER, SIGNAL_MARKER,
};
use super::history::{save_record, Ending, StoredHistory, TurnLogs};
use super::runtime::{has_file, signal_file, STOP_NOW, STOP_REQUEST};
use super::turn::{
    append_event, handle_of, place_home_files, sleep_until, Interrupts, TurnContext,
    DEFAULT_CONNECT_TIMEOUT, STOP_GRACE,
};
use crate::backend::{Backend, OutputChunk};
use crate::error::Result;
use crate::event::{Event, Status, TurnResult};
use crate::lines::LineBuffer;
use crate::provider::ParseContext;
use crate::session::record::{now_secs, SessionRecord, TurnRecord};

/// Runs a headless turn in its created container, to its recorded end.
pub(super) async fn drive_headless(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut dyn FnMut(&Event),
) -> Result<TurnResult> {
    drive(ctx, record, interrupts, sink, None).await
}

/// A turn taken over from a driver that is gone: when it started, and what a warm turn's
/// command kept of it.
struct Adopted {
    started_at: u64,
    running_for: Duration,
    warm: Option<(Vec<u8>, i64)>,
}

/// Where an adopted turn's output is read.
#[derive(Debug)]
pub(super) enum AdoptFrom {
    /// The container's log, from its start (a cold turn's container, created then).
    Log {
        created: Option<std::time::SystemTime>,
    },
    /// What a warm turn's command kept of the turn that ended (`backend::warm::ADOPT_FILES`):
    /// its stdout and exit code, and when it started (unix seconds).
    Warm {
        stdout: Vec<u8>,
        exit: i64,
        started_at: u64,
    },
}

/// Finishes the running headless turn `turn` of `record`'s session in container `name`
/// whose driver is gone (a detached turn's `caw-box __drive` killed), which its backend
/// keeps for an adopter (labelled [`ADOPTABLE`], Kubernetes): the CLI's
/// output is read from the container's log from its start (stdout and stderr as one
/// stream: the log keeps them together), and once the CLI ended the record is handed in
/// on the container's stdin, which stayed open, as the driver would have. `record` is the
/// stored one (before this turn). The driver's `--timeout` holds, counted from the pod's
/// start (the driver left it in the runtime directory). A warm turn's output is what its
/// command kept ([`AdoptFrom::Warm`]); its record is written through the container.
///
/// [`ADOPTABLE`]: crate::session::names::labels::ADOPTABLE
pub(super) async fn adopt(
    backend: &impl Backend,
    record: &mut SessionRecord,
    name: &str,
    turn: u32,
    from: AdoptFrom,
) -> Result<TurnResult> {
    let mut interrupts = Interrupts::install()?;
    let prompt = backend
        .download_file(name, &format!("{}/{PROMPT_FILE}", super::runtime::RUN_DIR))
        .await
        .ok()
        .flatten()
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_default();
    // The driver's --timeout, kept from the turn's start.
    let timeout = backend
        .download_file(name, &format!("{}/{TIMEOUT_FILE}", super::runtime::RUN_DIR))
        .await
        .ok()
        .flatten()
        .and_then(|t| String::from_utf8_lossy(&t).trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let options = super::turn::TurnOptions {
        prompt,
        timeout,
        ..Default::default()
    };
    let adopted = match from {
        AdoptFrom::Log { created } => {
            let running_for = created.and_then(|t| t.elapsed().ok()).unwrap_or_default();
            Adopted {
                started_at: now_secs().saturating_sub(running_for.as_secs()),
                running_for,
                warm: None,
            }
        }
        AdoptFrom::Warm {
            stdout,
            exit,
            started_at,
        } => Adopted {
            started_at,
            running_for: Duration::from_secs(now_secs().saturating_sub(started_at)),
            warm: Some((stdout, exit)),
        },
    };
    let ctx = TurnContext {
        backend,
        name,
        turn,
        options: &options,
        home_files: &[],
        home_out: None,
        runtime_payload: None,
        proxy: None,
        // Nothing to feed an adopted turn: no broker to wait for.
        broker_ready: tokio::sync::watch::channel(Some(true)).1,
        // (Kubernetes: the workspace is a copy.)
        guard: None,
        // As its driver decided at the turn's start, by the same rule.
        user: super::owner::turn_ids(&record.settings),
    };
    record.owner = Some(ctx.user);
    // A sidecar broker holding a login answers to this process now, and what it refreshed
    // without its driver is stored.
    // (Only a broker in the turn's own unit is the turn's: a shared one serves others.)
    let in_turn = backend.broker_place().await == crate::backend::BrokerPlace::InTurn;
    let broker = match in_turn {
        true => super::broker::Broker::take_over_in_pod(backend, record.provider, name).await,
        false => None,
    };
    let result = drive(&ctx, record, &mut interrupts, &mut |_| {}, Some(adopted)).await;
    if let Some(task) = broker {
        let _ = tokio::time::timeout(super::broker::WATCH_END, task).await;
    }
    result
}

/// The runtime file that holds a headless turn's prompt, for [`adopt`] (where the backend
/// keeps the turn for an adopter).
pub(super) const PROMPT_FILE: &str = "prompt";
/// The runtime file that holds a turn's `--timeout` in milliseconds, for [`adopt`].
pub(super) const TIMEOUT_FILE: &str = "timeout";

/// The container's stdin for the record hand-off, through an attachment of its own (an
/// adopted turn's): the attachment lives as long as this.
struct Attachment(crate::backend::Attached);

impl tokio::io::AsyncWrite for Attachment {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.input.as_mut().poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.input.as_mut().poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.input.as_mut().poll_shutdown(cx)
    }
}

async fn drive(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut dyn FnMut(&Event),
    adopted: Option<Adopted>,
) -> Result<TurnResult> {
    let &TurnContext {
        backend,
        name,
        turn,
        options,
        home_files,
        home_out,
        runtime_payload,
        proxy,
        broker_ready: _,
        guard,
        user,
    } = ctx;
    place_home_files(backend, name, home_files, user).await?;

    let started = adopted
        .as_ref()
        .and_then(|a| Instant::now().checked_sub(a.running_for))
        .unwrap_or_else(Instant::now);
    let started_at = adopted.as_ref().map_or_else(now_secs, |a| a.started_at);
    let mut adopted = adopted;
    let warm = adopted.as_mut().and_then(|a| a.warm.take());
    let warm_exit = warm.as_ref().map(|(_, exit)| *exit);
    let attach = match (&adopted, warm) {
        // All that the warm turn's command kept; its record goes in through the container.
        (_, Some((stdout, _))) => crate::backend::Attached {
            output: Box::pin(futures_util::stream::iter([Ok(OutputChunk::Stdout(
                stdout,
            ))])),
            input: Box::pin(tokio::io::sink()),
        },
        // The CLI's output so far and to come; nothing to write until the record.
        (Some(_), None) => crate::backend::Attached {
            output: backend.follow_logs(name),
            input: Box::pin(tokio::io::sink()),
        },
        (None, None) => backend.attach(name, runtime_payload.is_some()).await?,
    };
    // The runtime files go first on stdin; the same stdin takes the record at the end.
    let feeding = runtime_payload.map(|payload| {
        let (mut stdin, payload) = (attach.input, payload.to_vec());
        let mut ready = ctx.broker_ready.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // The CLI starts once these are read: not before its broker listens (when it
            // failed, the CLI reports its model unreachable, and the log says why).
            let _ = ready.wait_for(Option::is_some).await;
            stdin.write_all(&payload).await?;
            stdin.flush().await?;
            Ok::<_, std::io::Error>(stdin)
        })
    });
    if adopted.is_none() {
        backend.start_container(name).await?;
    }
    record.turn_started = true;
    let history = StoredHistory::fetch(backend, name, record, turn);

    let mut reader = TurnReader {
        parser: record.provider.adapter().parser(ParseContext {
            previous_cumulative_usage: record.last_cumulative_usage(),
        }),
        sink,
        session_id: record.session_id.to_string(),
        provider: record.provider,
        mcp_servers: record.settings.mcp_names(),
        session_announced: false,
        raw: Vec::new(),
        events_log: Vec::new(),
        events: Vec::new(),
        model_alive: false,
    };
    if !record.resume_key.is_empty() {
        reader.announce(Some(record.resume_key.clone()));
    }

    let mut stderr_tail = Vec::new();
    let mut lines = LineBuffer::default();
    let mut stderr_lines = LineBuffer::default();
    let mut ended_early = None;
    let now = tokio::time::Instant::now;
    // An adopted turn's time started with its pod.
    let ran = adopted.as_ref().map(|a| a.running_for).unwrap_or_default();
    let deadline = options.timeout.map(|t| now() + t.saturating_sub(ran));
    // Reset by every line the CLI prints.
    let mut idle_deadline = options.idle_timeout.map(|t| now() + t);
    // Armed while the CLI reports that it cannot reach its model: `--connect-timeout`
    // after the model's last sign of life (an answer, or a tool's result it asked for).
    let connect_timeout = options.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let mut alive_at = now();
    let mut link_deadline: Option<tokio::time::Instant> = None;
    let mut output = attach.output;
    // The CLI's exit code, as the entrypoint reports it right after the CLI's last output.
    let mut cli_exit: Option<i64> = None;
    // The signal the container got, where the CLI ended after one (SIGNAL_MARKER).
    let mut signalled: Option<String> = None;

    loop {
        let printed = tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(OutputChunk::Stdout(message))) => {
                    lines.feed(&message, |l| {
                        read_stdout_line(l, &mut reader, &mut cli_exit, &mut signalled)
                    });
                    if let Some(code) = cli_exit {
                        // The CLI is done; the entrypoint waits for the record.
                        tracing::debug!("the CLI exited with {code}; handing off the record");
                        break;
                    }
                    true
                }
                Some(Ok(OutputChunk::Stderr(message))) => {
                    stderr_lines.feed(&message, |l| reader.parser.parse_stderr_line(l));
                    stderr_tail.extend_from_slice(&message);
                    if stderr_tail.len() > 64 * 1024 {
                        stderr_tail.drain(..stderr_tail.len() - 32 * 1024);
                    }
                    true
                }
                Some(Ok(_)) => false,
                Some(Err(e)) => {
                    tracing::warn!("reading the CLI's output failed: {e}");
                    break;
                }
                None => break,
            },
            _ = sleep_until(deadline) => {
                ended_early = Some(EndedEarly::Timeout);
                break;
            }
            _ = sleep_until(idle_deadline) => {
                ended_early = Some(EndedEarly::Idle);
                break;
            }
            _ = sleep_until(link_deadline) => {
                ended_early = Some(EndedEarly::Unreachable);
                break;
            }
            _ = interrupts.recv() => {
                if adopted.is_some() {
                    // Only the waiting ends: the turn is not this process's to stop.
                    return Err(crate::Error::new(
                        crate::error::ErrorKind::Interrupted,
                        "interrupted while waiting; the turn goes on",
                    ));
                }
                ended_early = Some(EndedEarly::Interrupted);
                break;
            }
        };
        if printed {
            idle_deadline = options.idle_timeout.map(|t| now() + t);
            if std::mem::take(&mut reader.model_alive) {
                alive_at = now();
            }
            link_deadline = match reader.parser.unreachable() {
                Some(_) if !connect_timeout.is_zero() => Some(alive_at + connect_timeout),
                _ => None,
            };
        }
    }
    if let Some(early) = ended_early {
        if matches!(early, EndedEarly::Unreachable | EndedEarly::Idle) {
            // A stuck CLI gets no grace: the entrypoint kills it at once (and still takes
            // the credentials out of HOME).
            let _ = signal_file(backend, name, STOP_NOW, user).await;
        }
        backend.stop_container(name, STOP_GRACE).await?;
        // Whatever the CLI printed while stopping still counts.
        let drain = async {
            while let Some(Ok(chunk)) = output.next().await {
                if let OutputChunk::Stdout(message) = chunk {
                    // An exit marker: the CLI ended as it was stopped, and the entrypoint
                    // waits for the record (a stop that reached the CLI, not the
                    // entrypoint).
                    lines.feed(&message, |l| {
                        read_stdout_line(l, &mut reader, &mut cli_exit, &mut signalled)
                    });
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    }
    lines.finish(|l| reader.stdout_line(l));
    stderr_lines.finish(|l| reader.parser.parse_stderr_line(l));
    let exit_code = match (cli_exit, warm_exit) {
        (Some(code), _) | (None, Some(code)) => code,
        (None, None) => backend.wait_container(name).await?,
    };
    let refused = match proxy {
        Some(proxy) => refused_by_proxy(backend, proxy).await,
        None => Vec::new(),
    };
    for target in &refused {
        reader.emit(&Event::Error {
            message: format!("egress to {target} was refused: it is not in --allow-host"),
        });
    }
    // `caw-box stop` leaves word in the runtime directory; a CLI that ended on its own
    // was not stopped (and the file is not worth a request).
    // Where the container ended before this could look (a pod's runtime directory is gone
    // with it), `caw-box stop` noted it on the container too.
    let stop_requested = cli_exit.is_none()
        && (has_file(backend, name, STOP_REQUEST).await || backend.stop_noted(name).await);
    if stop_requested {
        ended_early = Some(EndedEarly::Interrupted);
    }
    // Stopped from outside the turn: neither the CLI's own end, nor caw-box's doing.
    let stopped_outside = signalled
        .as_deref()
        .filter(|_| ended_early.is_none() && cli_exit.is_none());

    let mut outcome = reader.parser.finish(exit_code);
    // A CLI that gave up on its own after failing to reach its model, and said so last.
    let mut unreachable_words = reader.parser.unreachable().map(str::to_string);
    let failed = outcome.status != Status::Success || exit_code != 0;
    // The egress proxy turned the model's host away (`--allow-host` without it): whatever
    // the CLI made of the proxy's 403, it could not reach its model.
    let model_refused = {
        let model = model_host(record);
        let host = |t: &str| t.split(':').next().unwrap_or(t).to_ascii_lowercase();
        refused.iter().any(|t| host(t) == host(&model))
    };
    if ended_early.is_none()
        && failed
        && ((unreachable_words.is_some() && outcome.status == Status::Error) || model_refused)
    {
        ended_early = Some(EndedEarly::GaveUp);
        if unreachable_words.is_none() {
            unreachable_words = Some(outcome.result.clone());
        }
    }
    // A CLI that failed because its pod hit a wall outside it (memory, an eviction): the
    // environment's failure (exit 3), not the agent's.
    let environment = match ended_early {
        None if failed && stopped_outside.is_none() => backend.ended_by_environment(name).await,
        _ => None,
    };
    if let Some(key) = reader.parser.resume_key() {
        record.resume_key = key.to_string();
        record.key_confirmed = true;
    }
    if let Some(early) = ended_early {
        (outcome.status, outcome.result) = match early {
            EndedEarly::Timeout => (
                Status::Timeout,
                format!(
                    "the turn timed out after {} (--timeout)",
                    humantime::format_duration(options.timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Idle => (
                Status::Timeout,
                format!(
                    "the CLI printed nothing for {} (--idle-timeout)",
                    humantime::format_duration(options.idle_timeout.unwrap_or_default())
                ),
            ),
            EndedEarly::Unreachable | EndedEarly::GaveUp => (
                Status::Unreachable,
                unreachable_result(
                    record,
                    (early == EndedEarly::Unreachable)
                        .then(|| Duration::from_secs(alive_at.elapsed().as_secs())),
                    unreachable_words.as_deref().unwrap_or(""),
                    &refused,
                ),
            ),
            EndedEarly::Interrupted if stop_requested => (
                Status::Interrupted,
                "the turn was stopped with `caw-box stop`".to_string(),
            ),
            EndedEarly::Interrupted => {
                (Status::Interrupted, "the turn was interrupted".to_string())
            }
        };
    } else if let Some(signal) = stopped_outside {
        outcome.status = Status::Interrupted;
        outcome.result = stopped_outside_result(signal, &backend.words().engine);
    } else if let Some(why) = &environment {
        outcome.status = Status::Error;
        outcome.result = why.clone();
    } else if outcome.status != Status::Success && outcome.result.trim().is_empty() {
        outcome.result = last_line(&stderr_tail)
            .unwrap_or_else(|| format!("the CLI exited with code {exit_code}"));
    }
    if outcome.status == Status::Success && exit_code != 0 {
        outcome.status = Status::Error;
    }
    // The CLI's own cost when it gives one, else the pricing table's.
    crate::provider::pricing::fill_cost(
        record.provider,
        record.settings.model.as_deref(),
        &mut outcome.usage,
    );
    let TurnReader {
        raw,
        mut events_log,
        session_announced,
        sink,
        ..
    } = reader;

    let exit_code = match environment {
        Some(_) => crate::error::ErrorKind::Environment.exit_code(),
        None => outcome.status.exit_code(),
    };
    let duration_ms = started.elapsed().as_millis() as u64;
    // The CLI's whole output, for the words and events that name the reset (claude's
    // `rate_limit_event`, an API body opencode quotes), not only its final message.
    let limit_resets_at = (outcome.status == Status::UsageLimit)
        .then(|| {
            let said = format!("{}\n{}", String::from_utf8_lossy(&raw), outcome.result);
            crate::session::limits::reset_at(&said, crate::session::limits::now_unix())
        })
        .flatten()
        .map(|at| at.ceil() as u64);
    let turn_record = TurnRecord {
        turn,
        prompt: options.prompt.clone(),
        status: outcome.status,
        result: outcome.result.clone(),
        usage: outcome.usage,
        started_at,
        duration_ms,
        exit_code,
        cumulative_usage: outcome.cumulative_usage,
        interactive: false,
        limit_resets_at,
    };
    record.turns.push(turn_record);
    let mut result = TurnResult {
        session_id: record.session_id.to_string(),
        name: record.name.clone(),
        provider: record.provider,
        turn,
        status: outcome.status,
        result: outcome.result,
        resume_handle: handle_of(record).to_json(),
        usage: outcome.usage,
        duration_ms,
        exit_code,
        quarantined: None,
    };
    if !session_announced {
        sink(&Event::Session {
            session_id: record.session_id.to_string(),
            provider: record.provider,
            resume_key: (!record.resume_key.is_empty()).then(|| record.resume_key.clone()),
        });
    }
    let result_event = Event::Result {
        result: result.clone(),
    };
    append_event(&mut events_log, &result_event);

    let logs = TurnLogs {
        raw: &raw,
        events: &events_log,
        stderr: &stderr_tail,
    };
    let stdin = match feeding {
        // An adopted turn's record goes in through an attachment of this process's own.
        _ if adopted.is_some() && cli_exit.is_some() && warm_exit.is_none() => {
            match backend.attach(name, true).await {
                Ok(attached) => Some(Box::pin(Attachment(attached)) as super::history::Stdin),
                Err(e) => {
                    tracing::debug!("cannot attach for the record hand-off: {e}");
                    None
                }
            }
        }
        Some(task) if cli_exit.is_some() => match task.await {
            Ok(Ok(stdin)) => Some(stdin),
            Ok(Err(e)) => {
                tracing::debug!("writing the runtime files failed: {e}");
                None
            }
            Err(e) => {
                tracing::debug!("writing the runtime files failed: {e}");
                None
            }
        },
        _ => None,
    };
    let ending = Ending {
        handoff: stdin,
        home_out,
        guard,
    };
    result.quarantined = save_record(backend, name, record, turn, history, logs, ending).await?;
    sink(&Event::Result {
        result: result.clone(),
    });
    Ok(result)
}

/// One line of the CLI's stdout as the container printed it: the entrypoint's markers
/// (how the CLI ended) are taken out, the rest goes to the reader.
fn read_stdout_line(
    line: &str,
    reader: &mut TurnReader<'_>,
    cli_exit: &mut Option<i64>,
    signalled: &mut Option<String>,
) {
    if let Some(code) = line.strip_prefix(EXIT_MARKER) {
        *cli_exit = code.trim().parse().ok();
    } else if let Some(rest) = line.strip_prefix(SIGNAL_MARKER) {
        let name = rest.split_whitespace().next().unwrap_or("TERM");
        *signalled = Some(name.to_string());
    } else {
        reader.stdout_line(line);
    }
}

/// Why a headless turn ended before its CLI did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndedEarly {
    /// `--timeout`.
    Timeout,
    /// `--idle-timeout`: no output for that long.
    Idle,
    /// The CLI kept reporting that it could not reach its model (`--connect-timeout`).
    Unreachable,
    /// Not early: the CLI itself gave up after failing to reach its model.
    GaveUp,
    /// Ctrl-C, SIGTERM, SIGHUP or `caw-box stop`.
    Interrupted,
}

/// Reads a headless turn's output: each stdout line becomes unified events for the sink
/// and the turn's logs; stderr lines only inform the parser.
struct TurnReader<'s> {
    parser: Box<dyn crate::provider::StreamParser>,
    sink: &'s mut dyn FnMut(&Event),
    session_id: String,
    provider: crate::provider::ProviderKind,
    /// The session's MCP servers, whose tools the events name `mcp__server__tool`.
    mcp_servers: Vec<String>,
    session_announced: bool,
    /// The CLI's stdout, line by line (`logs --raw`).
    raw: Vec<u8>,
    /// The unified events, one JSON line each (`logs`).
    events_log: Vec<u8>,
    events: Vec<Event>,
    /// Set when a line showed the model at work (an answer, or a result of a tool it called).
    model_alive: bool,
}

impl TurnReader<'_> {
    fn announce(&mut self, resume_key: Option<String>) {
        (self.sink)(&Event::Session {
            session_id: self.session_id.clone(),
            provider: self.provider,
            resume_key,
        });
        self.session_announced = true;
    }

    fn emit(&mut self, e: &Event) {
        append_event(&mut self.events_log, e);
        (self.sink)(e);
    }

    fn stdout_line(&mut self, line: &str) {
        self.raw.extend_from_slice(line.as_bytes());
        self.raw.push(b'\n');
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        self.parser.parse_line(line, &mut events);
        crate::agent_config::tag_tool_groups(self.provider, &self.mcp_servers, &mut events);
        if !self.session_announced {
            if let Some(key) = self.parser.resume_key().map(str::to_string) {
                self.announce(Some(key));
            }
        }
        for e in &events {
            self.model_alive |= matches!(
                e,
                Event::Text { .. }
                    | Event::Thinking { .. }
                    | Event::ToolCall { .. }
                    | Event::ToolResult { .. }
                    | Event::Usage { .. }
            );
            self.emit(e);
        }
        self.events = events;
    }
}
