//! `caw-box mcp` over stdio, the transport an orchestrator that spawns the server uses: until
//! the client closes stdin, or SIGTERM or SIGINT stops it (shutdown.rs).
//!
//! Not here: the tools (mod.rs), HTTP (http.rs).

use rmcp::ServiceExt;

use super::shutdown::{self, Signals};
use super::{Defaults, Delegation};
use crate::error::{Error, Result};

/// Serves MCP on this process's stdin and stdout until the client goes, or until SIGTERM or
/// SIGINT: then a `wait` in flight answers at once, rmcp sends the answers of the calls in
/// flight (for up to 2 s), and it returns 0.
pub async fn serve_stdio(defaults: Defaults) -> Result<i32> {
    let mut signals = Signals::install()?;
    let stopping = defaults.shutdown.clone();
    let stdio = (stdin()?, tokio::io::stdout());
    let starting = Delegation::new(defaults).serve(stdio);
    let service = tokio::select! {
        service = starting => service
            .map_err(|e| Error::environment(format!("the MCP connection failed to start: {e}")))?,
        _ = signals.recv() => return Ok(0),
    };
    let stop = service.cancellation_token();
    let mut waiting = std::pin::pin!(service.waiting());
    let quit = tokio::select! {
        quit = &mut waiting => Some(quit),
        _ = signals.recv() => None,
    };
    let quit = match quit {
        Some(quit) => quit,
        None => {
            stopping.cancel();
            stop.cancel();
            match tokio::time::timeout(shutdown::CALLS_GRACE, waiting).await {
                Ok(quit) => quit,
                Err(_) => return Ok(0),
            }
        }
    };
    quit.map_err(|e| Error::environment(format!("the MCP server ended: {e}")))?;
    Ok(0)
}

/// This process's stdin, copied by a thread of its own into a socket the
/// runtime reads. tokio's own stdin reads on the runtime's blocking pool, and a runtime that
/// ends waits for that pool: a read of a client's stdin, still open when a signal stops the
/// server, would never let the process exit. This thread is simply left behind at exit.
fn stdin() -> Result<tokio::net::UnixStream> {
    let err = |e| Error::environment(format!("cannot read stdin: {e}"));
    let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().map_err(err)?;
    std::thread::Builder::new()
        .name("mcp-stdin".into())
        .spawn(move || {
            // Ends at stdin's end (the socket's end then tells the server) or once the server
            // dropped its side.
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut theirs);
        })
        .map_err(err)?;
    ours.set_nonblocking(true).map_err(err)?;
    tokio::net::UnixStream::from_std(ours).map_err(err)
}
