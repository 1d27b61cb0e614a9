//! How `caw-box mcp` stops on SIGTERM or SIGINT (Ctrl-C), over stdio or HTTP: no new calls,
//! the calls in flight answered within a few seconds (a `wait` answers at once: the server is
//! stopping, its turns go on), then exit 0 well within 10 s. The turns themselves run in
//! background `caw-box __drive` processes of their own process group: a signal to the
//! server's group does not reach them, and a new server finds them.
//!
//! Not here: what each transport does to stop (http.rs, `serve_stdio`), the turns.

use std::time::Duration;

use serde_json::Value;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::{Error, ErrorKind, Result};

/// How long the calls in flight get to be answered once the server stops.
pub const CALLS_GRACE: Duration = Duration::from_secs(5);

/// How long the connections then get to close (HTTP), or rmcp to send the last answers
/// (stdio: its own drain takes up to 2 s), before the process exits anyway.
pub const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// SIGTERM and SIGINT, caught from before the server says it serves: a signal then stops it
/// as it should instead of killing it.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    pub fn install() -> Result<Self> {
        let err = |e| Error::environment(format!("failed to install signal handlers: {e}"));
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    /// The next of them; its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// A token cancelled when either is: a call's own cancellation or the server stopping. The
/// guard ends the link when the call is done.
pub fn either(
    call: &CancellationToken,
    server: &CancellationToken,
) -> (CancellationToken, DropGuard) {
    let both = server.child_token();
    let (call, linked) = (call.clone(), both.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = call.cancelled() => linked.cancel(),
            () = linked.cancelled() => {}
        }
    });
    (both.clone(), both.drop_guard())
}

/// A `wait` the stopping server cut short: said so, and that the turns go on.
pub fn wait_outcome(outcome: Result<Value>, stopping: &CancellationToken) -> Result<Value> {
    match outcome {
        Err(e) if stopping.is_cancelled() && e.kind == ErrorKind::Interrupted => Err(Error::new(
            ErrorKind::Interrupted,
            "this caw-box mcp server is stopping: the wait ended; the turns go on",
        )
        .with_hint("wait for them again through the next server: sessions outlive it")),
        other => other,
    }
}
