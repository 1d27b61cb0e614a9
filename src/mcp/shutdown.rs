//! How `caw-box mcp` stops on SIGTERM or SIGINT (Ctrl-C), over stdio or HTTP: no new calls,
//! the calls in flight answered within a few seconds (a `wait` answers at once: the server is
//! stopping, its turns go on), then exit 0 well within 10 s. The turns themselves run in
//! background `caw-box __drive` processes of their own process group: a signal to the
//! server's group does not reach them, and a new server finds them.
//!
//! Not here: what each transport does to stop (http.rs, `serve_stdio`), the turns.

use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

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

/// A `wait`'s work, ended when the server stops with an answer saying so: the turns go on.
pub async fn until_stopping<T>(
    stopping: &CancellationToken,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        outcome = work => outcome,
        () = stopping.cancelled() => Err(Error::new(
            ErrorKind::Interrupted,
            "this caw-box mcp server is stopping: the wait ended; the turns go on",
        )
        .with_hint("wait for them again through the next server: sessions outlive it")),
    }
}
