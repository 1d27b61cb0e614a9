//! A headless turn: drives the turn's started container to its recorded end, reading the
//! CLI's output line by line into unified events, and ending it early on a timeout, a CLI
//! that cannot reach its model, or an interrupt.

use std::time::{Duration, Instant};

use crate::backend::{Backend, OutputChunk};
use crate::error::Result;
use crate::event::{Event, Status, TurnResult};
use crate::session::store::history::{save_record, Ending, StoredHistory, TurnLogs};
use crate::session::store::record::{now_secs, SessionRecord, TurnRecord};
use crate::session::turn::ended::{last_line, model_host, stopped_outside_result, EndedEarly};
use crate::session::turn::reading::{Reading, TurnReader};
use crate::session::turn::runtime::{has_file, STOP_REQUEST};
use crate::session::turn::{append_event, handle_of, place_home_files, Interrupts, TurnContext};

/// Runs a headless turn in its created container, to its recorded end.
pub(in crate::session) async fn drive_headless(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut (dyn FnMut(&Event) + Send),
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
pub(in crate::session) enum AdoptFrom {
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
/// [`ADOPTABLE`]: crate::session::store::names::labels::ADOPTABLE
pub(in crate::session) async fn adopt(
    backend: &impl Backend,
    record: &mut SessionRecord,
    name: &str,
    turn: u32,
    from: AdoptFrom,
) -> Result<TurnResult> {
    let mut interrupts = Interrupts::install()?;
    let prompt = backend
        .download_file(
            name,
            &format!("{}/{PROMPT_FILE}", crate::session::turn::runtime::RUN_DIR),
        )
        .await
        .ok()
        .flatten()
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_default();
    // The driver's --timeout, kept from the turn's start.
    let timeout = backend
        .download_file(
            name,
            &format!("{}/{TIMEOUT_FILE}", crate::session::turn::runtime::RUN_DIR),
        )
        .await
        .ok()
        .flatten()
        .and_then(|t| String::from_utf8_lossy(&t).trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let options = crate::session::turn::TurnOptions {
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
    // Its egress, from its proxy's log (a shared proxy's by the agent's address: read while
    // the container runs).
    let ended = record
        .turns
        .last()
        .map(|t| std::time::UNIX_EPOCH + Duration::from_secs(t.started_at + t.duration_ms / 1000));
    let adopted_egress = match backend.inspect_container(name).await {
        Ok(Some(c)) => crate::session::walls::refusals::Watch::of(backend, &c, ended).await,
        _ => None,
    };
    let ctx = TurnContext {
        backend,
        name,
        turn,
        options: &options,
        home_files: &[],
        home_out: None,
        runtime_payload: None,
        egress: None,
        adopted_egress,
        // Nothing to feed an adopted turn: no broker to wait for.
        broker_ready: tokio::sync::watch::channel(Some(true)).1,
        // (Kubernetes: the workspace is a copy.)
        guard: None,
        // Its driver's helper ended with it: the checkpoint is taken behind the record.
        armed: None,
        // As its driver decided at the turn's start, by the same rule.
        user: crate::session::walls::owner::turn_ids(&record.settings),
    };
    record.owner = Some(ctx.user);
    // A broker in the turn's own unit holding a login answers to this process now, and
    // what it refreshed without its driver is stored.
    let broker = crate::session::broker::Broker::take_over(backend, record.provider, name).await;
    let result = drive(&ctx, record, &mut interrupts, &mut |_| {}, Some(adopted)).await;
    if let Some(task) = broker {
        let _ = tokio::time::timeout(crate::session::broker::WATCH_END, task).await;
    }
    if backend.capabilities().warm_checkpoints {
        // Nobody waits on an adopter's turn: a warm one's checkpoint, taken behind it, is
        // seen to its end here rather than left to the session's next command.
        if let Err(e) = crate::session::store::checkpoint::settle(backend, record.session_id).await
        {
            tracing::warn!("{e}");
        }
    }
    result
}

/// The runtime file that holds a headless turn's prompt, for [`adopt`] (where the backend
/// keeps the turn for an adopter).
pub(in crate::session) const PROMPT_FILE: &str = "prompt";
/// The runtime file that holds a turn's `--timeout` in milliseconds, for [`adopt`].
pub(in crate::session) const TIMEOUT_FILE: &str = "timeout";

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
    sink: &mut (dyn FnMut(&Event) + Send),
    adopted: Option<Adopted>,
) -> Result<TurnResult> {
    let (backend, name) = (ctx.backend, ctx.name);
    place_home_files(backend, name, ctx.home_files, ctx.user).await?;
    let started = adopted
        .as_ref()
        .and_then(|a| Instant::now().checked_sub(a.running_for))
        .unwrap_or_else(Instant::now);
    let started_at = adopted.as_ref().map_or_else(now_secs, |a| a.started_at);
    let ran = adopted.as_ref().map(|a| a.running_for).unwrap_or_default();
    let mut adopted = adopted;
    let warm = adopted.as_mut().and_then(|a| a.warm.take());
    let warm_exit = warm.as_ref().map(|(_, exit)| *exit);
    let (mut output, feeding) = open_output(ctx, adopted.is_some(), warm).await?;
    record.turn_started = true;
    let history = StoredHistory::fetch(backend, name, record, ctx.turn);

    let mut reading = Reading::new(record, sink);
    // A shared proxy's decisions are this turn's from its agent's address, asked for
    // beside the reading; its refusals become events as they come.
    let watch = async {
        if let Some(e) = ctx.egress {
            e.watch_agent(backend, name).await;
        }
    };
    let mut live = ctx.egress.and_then(|e| e.live(backend));
    let (ended_early, ()) = tokio::join!(
        reading.read(
            &mut output,
            ctx.options,
            ran,
            interrupts,
            adopted.is_some(),
            live.as_mut()
        ),
        watch
    );
    let ended_early = ended_early?;
    if let Some(early) = ended_early {
        reading.stop_early(ctx, &mut output, early).await?;
    }
    reading.finish_lines();
    let exit_code = match (reading.cli_exit, warm_exit) {
        (Some(code), _) | (None, Some(code)) => code,
        (None, None) => match backend.wait_container(name).await {
            Ok(code) => code,
            // Removed from outside (`docker rm -f`) before it could be waited for: said as
            // such, as when the record cannot be written into it.
            Err(e) if matches!(backend.inspect_container(name).await, Ok(None)) => {
                tracing::debug!("{e}");
                return Err(backend.removed_under_turn(name));
            }
            Err(e) => return Err(e),
        },
    };
    let ended = classify(ctx, record, &mut reading, exit_code, ended_early).await;
    let duration_ms = started.elapsed().as_millis() as u64;
    let result = record_turn(record, ctx, &ended, started_at, duration_ms);
    let cli_ended = reading.cli_exit.is_some();
    let TurnReader {
        raw,
        mut events_log,
        session_announced,
        sink,
        ..
    } = reading.reader;
    if !session_announced {
        sink(&Event::Session {
            session_id: record.session_id.to_string(),
            provider: record.provider,
            resume_key: (!record.resume_key.is_empty()).then(|| record.resume_key.clone()),
        });
    }
    append_event(
        &mut events_log,
        &Event::Result {
            result: result.clone(),
        },
    );
    let logs = TurnLogs {
        raw: &raw,
        events: &events_log,
        stderr: &reading.stderr_tail,
    };
    // An adopted turn's record goes in through an attachment of this process's own (a
    // warm one's through its container); a driver's on the stdin it fed.
    let attach_anew = adopted.is_some() && cli_ended && warm_exit.is_none();
    let ending = Ending {
        handoff: handoff_stdin(backend, name, feeding, attach_anew, cli_ended).await,
        // Where the entrypoint says that it took the record.
        output: cli_ended.then_some(&mut output),
        home_out: ctx.home_out,
        guard: ctx.guard,
        armed: ctx.armed,
    };
    let mut result = result;
    result.quarantined =
        save_record(backend, name, record, ctx.turn, history, logs, ending).await?;
    sink(&Event::Result {
        result: result.clone(),
    });
    Ok(result)
}

/// The runtime files' feeding of a driven turn's stdin: the same stdin once they are in.
type Feeding = tokio::task::JoinHandle<std::io::Result<crate::session::store::history::Stdin>>;

/// The turn's output, and its stdin being fed the runtime files: a driver's attachment
/// (the container started after it), an adopted turn's log from its start, or what a warm
/// turn's command kept.
async fn open_output(
    ctx: &TurnContext<'_, impl Backend>,
    adopted: bool,
    warm: Option<(Vec<u8>, i64)>,
) -> Result<(crate::backend::OutputStream, Option<Feeding>)> {
    let (backend, name) = (ctx.backend, ctx.name);
    let attach = match (adopted, warm) {
        // All that the warm turn's command kept; its record goes in through the container.
        (_, Some((stdout, _))) => crate::backend::Attached {
            output: Box::pin(futures_util::stream::iter([Ok(OutputChunk::Stdout(
                stdout,
            ))])),
            input: Box::pin(tokio::io::sink()),
        },
        // The CLI's output so far and to come; nothing to write until the record.
        (true, None) => crate::backend::Attached {
            output: backend.follow_logs(name),
            input: Box::pin(tokio::io::sink()),
        },
        (false, None) => backend.attach(name, ctx.runtime_payload.is_some()).await?,
    };
    // The runtime files go first on stdin; the same stdin takes the record at the end.
    let feeding = ctx.runtime_payload.map(|payload| {
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
    if !adopted {
        backend.start_container(name).await?;
    }
    Ok((attach.output, feeding))
}

/// The stdin the record is handed in on, where the entrypoint waits for it (the CLI ended
/// on its own): a new attachment, or the one the runtime files went in on.
async fn handoff_stdin(
    backend: &impl Backend,
    name: &str,
    feeding: Option<Feeding>,
    attach_anew: bool,
    cli_ended: bool,
) -> Option<crate::session::store::history::Stdin> {
    match feeding {
        _ if attach_anew => match backend.attach(name, true).await {
            Ok(attached) => {
                Some(Box::pin(Attachment(attached)) as crate::session::store::history::Stdin)
            }
            Err(e) => {
                tracing::debug!("cannot attach for the record hand-off: {e}");
                None
            }
        },
        Some(task) if cli_ended => match task.await {
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
    }
}

/// A failed turn's result when its CLI said nothing of why in its output (`result` empty,
/// or no more than its exit code): the last line it wrote on stderr, where there is one.
fn with_stderr(result: String, exit_code: i64, stderr: &[u8]) -> String {
    let bare = crate::provider::exited_with(exit_code);
    match last_line(stderr) {
        Some(line) if result.trim().is_empty() => line,
        Some(line) if result == bare => format!("{bare}: {line}"),
        None if result.trim().is_empty() => bare,
        _ => result,
    }
}

/// Adds the turn to `record` and returns its result.
fn record_turn(
    record: &mut SessionRecord,
    ctx: &TurnContext<'_, impl Backend>,
    ended: &Ended,
    started_at: u64,
    duration_ms: u64,
) -> TurnResult {
    let outcome = &ended.outcome;
    record.turns.push(TurnRecord {
        turn: ctx.turn,
        prompt: ctx.options.prompt.clone(),
        status: outcome.status,
        result: outcome.result.clone(),
        usage: outcome.usage,
        started_at,
        duration_ms,
        exit_code: ended.exit_code,
        cumulative_usage: outcome.cumulative_usage,
        interactive: false,
        limit_resets_at: ended.limit_resets_at,
        account: Some(crate::auth::account::spent_by(record.provider)),
        inherited: false,
        resume_key: record.resume_key.clone(),
        egress: ended.egress.clone(),
    });
    TurnResult {
        session_id: record.session_id.to_string(),
        name: record.name.clone(),
        provider: record.provider,
        turn: ctx.turn,
        status: outcome.status,
        result: outcome.result.clone(),
        resume_handle: handle_of(record, &ctx.backend.capabilities().scope).to_json(),
        usage: outcome.usage,
        priced: crate::provider::pricing::is_priced(&outcome.usage),
        duration_ms,
        exit_code: ended.exit_code,
        quarantined: None,
        egress: ended.egress.clone().map(Box::new),
    }
}

/// How a headless turn ended, in its record's terms: the CLI's outcome (status, result,
/// usage), and the exit code the turn maps to.
struct Ended {
    pub outcome: crate::provider::TurnOutcome,
    pub exit_code: i32,
    /// A `usage_limit` turn: when the vendor said the limit resets.
    pub limit_resets_at: Option<u64>,
    /// What the turn's egress proxy saw of it.
    pub egress: Option<crate::event::EgressRecord>,
}

/// Tells how the turn ended: the CLI's own outcome, unless the turn ended before the CLI
/// did (a timeout, a stop, a model it could not reach), its container was stopped from
/// outside, or its environment failed it.
async fn classify(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    reading: &mut Reading<'_>,
    exit_code: i64,
    mut ended_early: Option<EndedEarly>,
) -> Ended {
    let (backend, name) = (ctx.backend, ctx.name);
    let egress = egress_of(ctx, reading).await;
    let refused: Vec<String> = egress
        .iter()
        .flat_map(|r| r.refused.iter().map(|h| h.target()))
        .collect();
    let cli_exit = reading.cli_exit;
    // `caw-box stop` leaves word in the runtime directory; a CLI that ended on its own
    // was not stopped (and the file is not worth a request). Where the container ended
    // before this could look (a pod's runtime directory is gone with it), `caw-box stop`
    // noted it on the container too.
    let stop_requested = cli_exit.is_none()
        && (has_file(backend, name, STOP_REQUEST).await || backend.stop_noted(name).await);
    if stop_requested {
        ended_early = Some(EndedEarly::Interrupted);
    }
    // Stopped from outside the turn: neither the CLI's own end, nor caw-box's doing.
    let stopped_outside = reading
        .signalled
        .clone()
        .filter(|_| ended_early.is_none() && cli_exit.is_none());
    let parser = &mut reading.reader.parser;
    let mut outcome = parser.finish(exit_code);
    // A CLI that gave up on its own after failing to reach its model, and said so last.
    // The CLI's own words, else the proxy's: it could not reach the model's host, whatever
    // the CLI made of its 502.
    let mut unreachable_words = parser
        .unreachable()
        .map(str::to_string)
        .or_else(|| reading.proxy_unreachable.clone())
        .or_else(|| model_failed(record, egress.as_ref()));
    let failed = outcome.status != Status::Success || exit_code != 0;
    // The egress proxy turned the model's host away (a policy without it): whatever the CLI
    // made of the proxy's 403, it could not reach its model.
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
    // A CLI that failed because its container hit a wall outside it (memory, an
    // eviction): the environment's failure (exit 3), not the agent's.
    let environment = match ended_early {
        None if failed && stopped_outside.is_none() => backend.ended_by_environment(name).await,
        _ => None,
    };
    if let Some(key) = parser.resume_key() {
        record.resume_key = key.to_string();
        record.key_confirmed = true;
    }
    let options = ctx.options;
    if let Some(early) = ended_early {
        let waited = (early == EndedEarly::Unreachable)
            .then(|| Duration::from_secs(reading.alive_at.elapsed().as_secs()));
        let words = unreachable_words.as_deref().unwrap_or("");
        (outcome.status, outcome.result) =
            early.status_and_result(record, options, stop_requested, waited, words, &refused);
    } else if let Some(signal) = &stopped_outside {
        outcome.status = Status::Interrupted;
        outcome.result = stopped_outside_result(signal, &backend.capabilities().words.engine);
    } else if let Some(why) = &environment {
        outcome.status = Status::Error;
        outcome.result = why.clone();
    } else if outcome.status != Status::Success {
        outcome.result = with_stderr(outcome.result, exit_code, &reading.stderr_tail);
    }
    if outcome.status == Status::Success && exit_code != 0 {
        outcome.status = Status::Error;
    }
    // The CLI's own cost when it gives one, else the pricing table's.
    crate::provider::pricing::fill_cost(
        record.provider,
        record.settings.model.as_deref(),
        record.cli_version.as_deref(),
        &record.settings.prices,
        &mut outcome.usage,
    );
    hold_budget(reading, &mut outcome, ended_early);
    let exit_code = match environment {
        Some(_) => crate::error::ErrorKind::Environment.exit_code(),
        None => outcome.status.exit_code(),
    };
    let limit_resets_at = (outcome.status == Status::UsageLimit)
        .then(|| {
            // The CLI's whole output, for the words and events that name the reset
            // (claude's `rate_limit_event`, an API body opencode quotes), not only its
            // final message.
            let said = format!(
                "{}\n{}",
                String::from_utf8_lossy(&reading.reader.raw),
                outcome.result
            );
            crate::session::turn::limits::reset_at(&said, crate::session::turn::limits::now_unix())
        })
        .flatten()
        .map(|at| at.ceil() as u64);
    Ended {
        outcome,
        exit_code,
        limit_resets_at,
        egress,
    }
}

/// The proxy's words where it could reach the model's host never (its record: connections
/// that failed, and nothing came back).
fn model_failed(
    record: &SessionRecord,
    egress: Option<&crate::event::EgressRecord>,
) -> Option<String> {
    let model = model_host(record);
    let host = |t: &str| t.split(':').next().unwrap_or(t).to_ascii_lowercase();
    egress?
        .allowed
        .iter()
        .find(|h| h.failed > 0 && h.bytes_in == 0 && host(&h.host) == host(&model))
        .map(|h| format!("the egress proxy could not reach {}", h.target()))
}

/// The turn's egress record, its refusals said now where they were not as they came.
async fn egress_of(
    ctx: &TurnContext<'_, impl Backend>,
    reading: &mut Reading<'_>,
) -> Option<crate::event::EgressRecord> {
    let record = match (ctx.egress, &ctx.adopted_egress) {
        (Some(e), _) => e.record(ctx.backend).await,
        (None, Some(w)) => w.record(ctx.backend).await,
        (None, None) => return None,
    };
    // What was not said as it came (a proxy's log read late, or none read live).
    for h in &record.refused {
        if !reading.refusals_said.contains(&(h.host.clone(), h.port)) {
            reading.reader.emit(&Event::EgressRefused {
                host: h.host.clone(),
                port: h.port,
                policy: record.policy.clone(),
            });
        }
    }
    Some(record)
}

/// The turn's cost and status against its session's `--max-cost`: a turn stopped mid-way
/// costs at least what its usage events said (its CLI's own total may not have come), and
/// one that took the session over it ends `budget`, said as its last error event (a turn
/// stopped for it, or one whose CLI reported its usage only with its answer).
fn hold_budget(
    reading: &mut Reading<'_>,
    outcome: &mut crate::provider::TurnOutcome,
    ended_early: Option<EndedEarly>,
) {
    let metered = reading.reader.meter.this_turn();
    if metered > outcome.usage.cost_usd.unwrap_or(0.0) {
        outcome.usage.cost_usd = Some(metered);
    }
    let over = reading
        .reader
        .meter
        .over(outcome.usage.cost_usd.unwrap_or(0.0));
    if let Some(why) = over.filter(|_| {
        matches!(ended_early, Some(EndedEarly::Budget))
            || (ended_early.is_none() && outcome.status == Status::Success)
    }) {
        outcome.status = Status::Budget;
        reading.reader.emit(&Event::Error {
            message: format!("{why}; the next turn is refused until a resume raises it"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::with_stderr;

    #[test]
    fn a_bare_exit_code_gets_the_clis_last_stderr_line() {
        let stderr = b"starting\nError: No prompt provided via stdin.\n\n";
        assert_eq!(
            with_stderr("the CLI exited with code 1".into(), 1, stderr),
            "the CLI exited with code 1: Error: No prompt provided via stdin."
        );
        assert_eq!(
            with_stderr(String::new(), 1, stderr),
            "Error: No prompt provided via stdin."
        );
        assert_eq!(
            with_stderr(String::new(), 1, b""),
            "the CLI exited with code 1"
        );
        // What the CLI said of its failure in its output stays.
        assert_eq!(
            with_stderr("model overloaded".into(), 1, stderr),
            "model overloaded"
        );
    }
}
