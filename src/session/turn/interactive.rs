//! An interactive turn: the vendor's own TUI in the turn's container, attached to the
//! user's terminal through the backend's attach ([`crate::backend::Backend::attach`]).
//!
//! The terminal is in raw mode for the whole turn, so every key (Ctrl-C too) reaches the
//! TUI, whose container terminal does the line discipline; the container's terminal follows
//! the window size. Whatever way the turn ends, the terminal is restored, and the turn is
//! recorded like a headless one: the vendor key of the conversation the TUI wrote is read
//! from the session's state by the adapter's [`Provider::latest_key_script`], so that
//! headless and interactive turns resume each other.
//!
//! [`Provider::latest_key_script`]: crate::provider::Provider::latest_key_script

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{signal, SignalKind};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::event::{Event, Status, TurnResult};
use crate::session::store::history::{save_record, Ending, StoredHistory, TurnLogs};
use crate::session::store::record::{now_secs, SessionRecord, TurnRecord};
use crate::session::turn::runtime::{has_file, RUN_DIR, STOP_REQUEST};
use crate::session::turn::{
    append_event, handle_of, place_home_files, sleep_until, Interrupts, TurnContext, STOP_GRACE,
};
use crate::terminal::{self, Keys, RawMode};

/// The file in the turn's runtime directory where the entrypoint leaves the output of the
/// adapter's key script.
const RESUME_KEY_FILE: &str = "resume-key";

pub(in crate::session) async fn drive_tui(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    interrupts: &mut Interrupts,
    sink: &mut (dyn FnMut(&Event) + Send),
) -> Result<TurnResult> {
    let &TurnContext {
        backend,
        name,
        turn,
        options,
        home_files,
        home_out: _,
        runtime_payload: _,
        egress,
        adopted_egress: _,
        broker_ready: _,
        guard: _,
        user,
        armed: _,
    } = ctx;
    place_home_files(backend, name, home_files, user).await?;
    sink(&Event::Session {
        session_id: record.session_id.to_string(),
        provider: record.provider,
        resume_key: (!record.resume_key.is_empty()).then(|| record.resume_key.clone()),
    });
    let raw = RawMode::enter().map_err(|e| {
        Error::environment(format!("cannot switch the terminal to raw mode: {e}"))
            .with_hint("run it in a terminal, or pass a PROMPT for a headless turn")
    })?;

    let started = Instant::now();
    let started_at = now_secs();
    let attached = async {
        let attach = backend.attach(name, true).await?;
        backend.start_container(name).await?;
        if let Some(e) = egress {
            e.watch_agent(backend, name).await;
        }
        Ok::<_, Error>((attach, StoredHistory::fetch(backend, name, record, turn)))
    }
    .await;
    let (attach, history) = match attached {
        Ok(a) => {
            record.turn_started = true;
            a
        }
        Err(e) => {
            drop(raw);
            return Err(e);
        }
    };
    follow_size(backend, name).await;

    let mut output = attach.output;
    let mut input = attach.input;
    let ended_early = relay(
        backend,
        name,
        &mut output,
        &mut input,
        options.timeout,
        interrupts,
    )
    .await;
    drop(raw);
    let exit_code = backend.wait_container(name).await?;
    let stopped = has_file(backend, name, STOP_REQUEST).await;
    if ended_early.is_some() || stopped {
        // The TUI was killed, not quit: it had no chance to put the terminal back.
        terminal::reset_after_kill();
    }

    if let Some(key) = key_of_the_tui(backend, name, record).await {
        record.resume_key = key;
        record.key_confirmed = true;
    }
    let (status, result) = tui_ending(ended_early, stopped, exit_code, options.timeout);
    let duration_ms = started.elapsed().as_millis() as u64;
    let egress = match egress {
        Some(e) => Some(e.record(backend).await),
        None => None,
    };
    let turn_record = TurnRecord {
        turn,
        prompt: String::new(),
        status,
        result,
        usage: Default::default(),
        started_at,
        duration_ms,
        exit_code: status.exit_code(),
        cumulative_usage: record.last_cumulative_usage(),
        interactive: true,
        limit_resets_at: None,
        account: None,
        inherited: false,
        resume_key: record.resume_key.clone(),
        egress,
    };
    record_tui_turn(ctx, record, turn_record, history, sink).await
}

/// Relays the TUI's output to the terminal and the user's keys (and a SIGINT sent from
/// elsewhere) to the TUI until it ends: `None` when it ended by itself, else how it was
/// ended early (stopped, and what it still wrote shown). The keys stop being read
/// before the caller leaves raw mode.
async fn relay(
    backend: &impl Backend,
    name: &str,
    output: &mut crate::backend::OutputStream,
    input: &mut (impl tokio::io::AsyncWrite + Unpin),
    timeout: Option<Duration>,
    interrupts: &mut Interrupts,
) -> Option<Status> {
    let mut keys = Keys::read();
    let mut keys_open = true;
    let mut resized = signal(SignalKind::window_change()).ok();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut screen = crate::terminal::Screen::stdout();
    let ended_early = loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(chunk)) => {
                    screen.show(&chunk.into_bytes());
                }
                Some(Err(e)) => {
                    tracing::debug!("reading the TUI's output failed: {e}");
                    break None;
                }
                None => break None,
            },
            typed = keys.recv(), if keys_open => match typed {
                Some(bytes) => {
                    if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
                        keys_open = false;
                    }
                }
                None => keys_open = false,
            },
            _ = window_changed(&mut resized) => follow_size(backend, name).await,
            // A SIGINT not typed on this terminal (`kill -INT`): the TUI gets it as a Ctrl-C.
            _ = crate::session::turn::next(&mut interrupts.int) => {
                let _ = input.write_all(b"\x03").await;
                let _ = input.flush().await;
            }
            _ = crate::session::turn::next(&mut interrupts.term) => break Some(Status::Interrupted),
            _ = crate::session::turn::next(&mut interrupts.hup) => break Some(Status::Interrupted),
            _ = sleep_until(deadline) => break Some(Status::Timeout),
        }
    };
    if ended_early.is_some() {
        let _ = backend.stop_container(name, STOP_GRACE).await;
        let drain = async {
            while let Some(Ok(chunk)) = output.next().await {
                screen.show(&chunk.into_bytes());
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    }
    drop(keys);
    ended_early
}

/// The vendor key of the conversation the TUI wrote, as the entrypoint left it.
async fn key_of_the_tui(
    backend: &impl Backend,
    name: &str,
    record: &SessionRecord,
) -> Option<String> {
    let key_file = format!("{RUN_DIR}/{RESUME_KEY_FILE}");
    let key_text = backend.download_file(name, &key_file).await.ok().flatten();
    let mut key = key_text.and_then(|t| plausible_key(&String::from_utf8_lossy(&t)));
    if key.is_none()
        && backend.capabilities().runtime_dir == crate::backend::RuntimeDir::GoesWithTurn
    {
        // A pod's runtime directory is gone with it: the same script, on the state claim.
        key = key_in_state(backend, record).await;
    }
    key
}

/// How the TUI's turn ended, and the words for it: how it was ended early, else whether
/// `caw-box stop` asked, else its exit code.
fn tui_ending(
    ended_early: Option<Status>,
    stopped: bool,
    exit_code: i64,
    timeout: Option<Duration>,
) -> (Status, String) {
    match ended_early {
        Some(Status::Timeout) => (
            Status::Timeout,
            format!(
                "the session timed out after {}",
                humantime::format_duration(timeout.unwrap_or_default())
            ),
        ),
        Some(status) => (status, "the session was interrupted".to_string()),
        None if stopped => (
            Status::Interrupted,
            "the session was stopped with `caw-box stop`".to_string(),
        ),
        None if exit_code == 0 => (Status::Success, "the interactive session ended".to_string()),
        None => (
            Status::Error,
            format!("the CLI exited with code {exit_code}"),
        ),
    }
}

/// Records the TUI's turn like a headless one (its result event the only one in its
/// events log) and hands the record back, then tells `sink` the result.
async fn record_tui_turn(
    ctx: &TurnContext<'_, impl Backend>,
    record: &mut SessionRecord,
    turn_record: TurnRecord,
    history: StoredHistory,
    sink: &mut (dyn FnMut(&Event) + Send),
) -> Result<TurnResult> {
    let &TurnContext {
        backend,
        name,
        turn,
        home_out,
        guard,
        ..
    } = ctx;
    let (status, result, duration_ms, egress) = (
        turn_record.status,
        turn_record.result.clone(),
        turn_record.duration_ms,
        turn_record.egress.clone().map(Box::new),
    );
    record.turns.push(turn_record);
    let mut result = TurnResult {
        session_id: record.session_id.to_string(),
        name: record.name.clone(),
        provider: record.provider,
        turn,
        status,
        result,
        resume_handle: handle_of(record, &backend.capabilities().scope).to_json(),
        usage: Default::default(),
        priced: true,
        duration_ms,
        exit_code: status.exit_code(),
        quarantined: None,
        egress,
    };
    let result_event = Event::Result {
        result: result.clone(),
    };
    let mut events_log = Vec::new();
    append_event(&mut events_log, &result_event);
    let logs = TurnLogs {
        raw: &[],
        events: &events_log,
        stderr: &[],
    };
    let ending = Ending {
        handoff: None,
        output: None,
        home_out,
        guard,
        armed: ctx.armed,
    };
    result.quarantined = save_record(backend, name, record, turn, history, logs, ending).await?;
    sink(&Event::Result {
        result: result.clone(),
    });
    Ok(result)
}

/// Gives the container's terminal the size of ours. Docker may refuse a resize for a
/// moment after the start, so it is tried a few times.
async fn follow_size(backend: &impl Backend, name: &str) {
    let Some((columns, rows)) = terminal::size() else {
        return;
    };
    for _ in 0..10 {
        match backend.resize_tty(name, columns, rows).await {
            Ok(()) => return,
            Err(e) => tracing::debug!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn window_changed(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// The vendor key of the conversation the TUI wrote, read from the session's state by a
/// helper that runs the adapter's key script there (where the turn's runtime directory,
/// which held the entrypoint's answer, went with its pod).
async fn key_in_state(backend: &impl Backend, record: &SessionRecord) -> Option<String> {
    use crate::session::store::names;
    let id = record.session_id;
    let spec = crate::backend::HelperSpec {
        image: record.settings.image.clone(),
        entrypoint: vec![
            "bash".into(),
            "-c".into(),
            record.provider.adapter().latest_key_script(),
        ],
        env: vec![format!("HOME={}", crate::provider::AGENT_HOME)],
        user: Some({
            let (uid, gid) = record.owner_ids();
            format!("{uid}:{gid}")
        }),
        labels: names::LabelSet::new(id, names::roles::PROBE).finish(),
        mounts: vec![crate::backend::MountSpec::volume(
            names::state_volume(id),
            crate::provider::AGENT_HOME,
        )
        .read_only()],
        network: crate::backend::NetworkPolicy::None,
        drop_all_capabilities: true,
        no_new_privileges: true,
        ..Default::default()
    };
    let name = names::helper_container(id, "key");
    match backend.run_to_completion(&name, &spec).await {
        Ok((0, out, _)) => plausible_key(&out),
        Ok((code, _, err)) => {
            tracing::debug!("the key script exited with {code}: {err}");
            None
        }
        Err(e) => {
            tracing::debug!(
                "cannot read the TUI's key from the state: {}",
                Error::from(e)
            );
            None
        }
    }
}

/// The key the adapter's script found, if it looks like one.
fn plausible_key(text: &str) -> Option<String> {
    let key = text.trim();
    let plausible = !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plausible.then(|| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plausible_keys_are_taken() {
        let key = plausible_key;
        assert_eq!(
            key("019a2b3c-0000-7000-8000-000000000001\n").as_deref(),
            Some("019a2b3c-0000-7000-8000-000000000001")
        );
        assert_eq!(
            key("ses_dff0ce389ffewoNmbnmRIhGfD4").as_deref(),
            Some("ses_dff0ce389ffewoNmbnmRIhGfD4")
        );
        assert_eq!(key(""), None);
        assert_eq!(key("a key with spaces"), None);
        assert_eq!(key("../../etc/passwd"), None);
    }
}
