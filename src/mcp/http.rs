//! `caw-box mcp --http ADDR`: the same server over MCP's Streamable HTTP transport, for an
//! orchestrator on another machine (or in a container): rmcp's `StreamableHttpService` at
//! `/mcp` of an axum Router, served by `axum::serve`. A loopback address is the default and
//! needs nothing more (rmcp checks the `Host` header against loopback names: DNS rebinding);
//! any other address is refused without `--token-file`, and with one every request must carry
//! `Authorization: Bearer <token>` (else 401), since whoever reaches the port can run agents
//! with this host's credentials.
//!
//! Made to hold under load and against hostile clients: a cap on connections and deadlines
//! for stalled and idle ones (listener.rs), a request body limit ([`MAX_BODY`]) and timeout,
//! and on SIGTERM or SIGINT a bounded stop that answers the calls in flight (shutdown.rs).
//!
//! Not here: the tools (mod.rs and the modules beside it), TLS (a reverse proxy's job).

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, Response, StatusCode};
use axum::middleware::Next;
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::validate_request::{ValidateRequest, ValidateRequestHeaderLayer};

use super::listener::{self, Capped, ConnTrack, Timeouts};
use super::shutdown::{self, Signals};
use super::{Defaults, Delegation};
use crate::error::{Error, Result};

/// The largest request body served; larger ones are answered 413. Well above what the
/// largest call needs: `run`'s 1 MiB prompt cap, every byte JSON-escaped as `\u00XX` (6
/// bytes), is 6 MiB.
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// A connection must send a request's head within this (of opening, or of its first byte
/// after an idle spell), and a request's body may pause at most this long between its
/// pieces: a stalled client holds its slot that long at most.
pub const STALL: Duration = Duration::from_secs(10);

/// A connection with no request in progress is closed after this. Longer than clients keep
/// idle connections themselves (httpx 5 s, Node 4 s), so the server rarely closes one a
/// client is about to reuse.
pub const IDLE: Duration = Duration::from_secs(60);

/// `ADDR`: `HOST:PORT`, or a bare `PORT` on 127.0.0.1.
pub fn parse_addr(addr: &str) -> Result<SocketAddr> {
    let full = if addr.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{addr}")
    } else {
        addr.to_string()
    };
    full.parse().map_err(|_| {
        Error::usage(format!("--http '{addr}' is not HOST:PORT or PORT"))
            .with_hint("e.g. --http 127.0.0.1:8765, or --http 8765")
    })
}

/// The bearer token `--token-file` holds (surrounding whitespace trimmed). Like ssh with a
/// private key, a file others may read (or write) is refused: its token would not be secret.
fn read_token(file: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let cannot = |e: std::io::Error| {
        Error::usage(format!(
            "cannot read --token-file '{}': {e}",
            file.display()
        ))
    };
    // The mode of the file opened, not of a path that could change under us.
    let mut f = std::fs::File::open(file).map_err(cannot)?;
    let mode = f.metadata().map_err(cannot)?.permissions().mode();
    refuse_loose_mode(file, mode)?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(cannot)?;
    let token = text.trim().to_string();
    if token.len() < 16 || token.chars().any(char::is_whitespace) {
        return Err(Error::usage(format!(
            "--token-file '{}' must hold one token of at least 16 characters",
            file.display()
        ))
        .with_hint("e.g. `openssl rand -hex 32 > token`"));
    }
    Ok(token)
}

/// A token file's mode must give its group and others nothing (as ssh's private keys).
fn refuse_loose_mode(file: &Path, mode: u32) -> Result<()> {
    if mode & 0o077 == 0 {
        return Ok(());
    }
    Err(Error::usage(format!(
        "--token-file '{}' is open to its group or others (mode {:04o}): its token would not be secret",
        file.display(),
        mode & 0o7777
    ))
    .with_hint(format!("chmod 600 '{}'", file.display())))
}

/// The address and token checked before anything is bound: a non-loopback address without a
/// token is refused (exit 2).
pub fn checked(addr: &str, token_file: Option<&Path>) -> Result<(SocketAddr, Option<String>)> {
    let addr = parse_addr(addr)?;
    let token = token_file.map(read_token).transpose()?;
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(Error::usage(format!(
            "--http {addr} is reachable from other machines: it needs --token-file FILE"
        ))
        .with_hint("clients then send `Authorization: Bearer <the token>`; or bind a loopback address (127.0.0.1)"));
    }
    Ok((addr, token))
}

/// The credentials of an `Authorization` header value if its scheme is `Bearer`, in any case
/// (RFC 9110: schemes are case-insensitive), after one or more spaces.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    Some(&rest[start..])
}

/// The bearer token's check: only its SHA-256 is kept (nothing to print), and a header's
/// credentials are compared to it by their own SHA-256 in constant time, so neither the
/// token's bytes nor its length show in the time a refusal takes.
#[derive(Clone)]
struct BearerToken {
    sha256: [u8; 32],
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(****)")
    }
}

impl BearerToken {
    fn new(token: &str) -> Self {
        BearerToken {
            sha256: Sha256::digest(token.as_bytes()).into(),
        }
    }

    fn admits(&self, header: Option<&[u8]>) -> bool {
        header
            .and_then(bearer_credentials)
            .is_some_and(|given| bool::from(Sha256::digest(given).ct_eq(&self.sha256)))
    }
}

impl<B> ValidateRequest<B> for BearerToken {
    type ResponseBody = Body;

    fn validate(&mut self, request: &mut Request<B>) -> Result<(), Response<Body>> {
        let header = request.headers().get(header::AUTHORIZATION);
        if self.admits(header.map(HeaderValue::as_bytes)) {
            return Ok(());
        }
        let mut r = Response::new(Body::from(
            "{\"error\":\"unauthorized: send Authorization: Bearer <token>\"}",
        ));
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        let headers = r.headers_mut();
        headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Err(r)
    }
}

/// What every request passes first: whether the server still takes calls, and the calls in
/// flight it answers before it stops.
#[derive(Debug, Clone)]
struct Gate {
    stopping: CancellationToken,
    calls: TaskTracker,
}

/// The first layer: refuses what the server will not take (it is stopping; a body declared
/// larger than [`MAX_BODY`], answered before any of it is read), and marks the request in
/// progress on its connection (no deadline for it) and, but for the client's standing GET
/// event stream, as a call in flight, both until its response was sent.
async fn admit(State(gate): State<Gate>, request: Request, next: Next) -> Response<Body> {
    if gate.stopping.is_cancelled() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("a request body is at most {MAX_BODY} bytes"),
        );
    }
    let in_progress = request
        .extensions()
        .get::<ConnectInfo<ConnTrack>>()
        .map(|ConnectInfo(conn)| conn.begin());
    let call = (request.method() != Method::GET).then(|| gate.calls.token());
    let response = next.run(request).await;
    // Held by the body: released once the response was sent (or its client went).
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _held = (&in_progress, &call);
            frame
        }))
    })
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(text.to_string()));
    *r.status_mut() = status;
    r
}

type Mcp = StreamableHttpService<Delegation, LocalSessionManager>;

/// The routes: rmcp's service at `/mcp`, behind the token when there is one, and [`admit`].
fn router(mcp: Mcp, token: Option<BearerToken>, gate: Gate) -> axum::Router {
    let mcp = tower::ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(STALL))
        .service(mcp);
    let mut app = axum::Router::new()
        .route_service("/mcp", mcp)
        .fallback(|| async { plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp") });
    if let Some(token) = token {
        app = app.layer(ValidateRequestHeaderLayer::custom(token));
    }
    app.layer(axum::middleware::from_fn_with_state(gate, admit))
}

/// Serves MCP over Streamable HTTP on `addr` until SIGTERM or SIGINT: then it takes no new
/// call, answers those in flight (a `wait` at once) for up to [`shutdown::CALLS_GRACE`],
/// closes the sessions and returns 0. The turns go on, in their own processes.
pub async fn serve(defaults: Defaults, addr: SocketAddr, token: Option<String>) -> Result<i32> {
    let mut signals = Signals::install()?;
    let sessions_end = CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(MAX_BODY)
        .with_cancellation_token(sessions_end.clone());
    if !addr.ip().is_loopback() {
        // Reached by a name this server cannot know: the bearer token guards it instead of
        // the loopback Host check.
        config = config.disable_allowed_hosts();
    }
    let waits_end = defaults.shutdown.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(Delegation::new(defaults.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::environment(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let timeouts = Timeouts {
        head: STALL,
        idle: IDLE,
    };
    listener::raise_open_file_limit();
    let listener = Capped::new(listener, listener::connection_cap(), timeouts);
    let gate = Gate {
        stopping: CancellationToken::new(),
        calls: TaskTracker::new(),
    };
    let app = router(mcp, token.as_deref().map(BearerToken::new), gate.clone());
    let mut server = tokio::spawn(
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<ConnTrack>(),
        )
        .with_graceful_shutdown(gate.stopping.clone().cancelled_owned())
        .into_future(),
    );
    crate::output::eprintln(&format!(
        "caw-box mcp: serving MCP (Streamable HTTP) on http://{bound}/mcp{}",
        if token.is_some() {
            ", bearer token required"
        } else {
            ""
        }
    ));
    let signal = tokio::select! {
        name = signals.recv() => name,
        ended = &mut server => {
            return Err(Error::environment(format!("the HTTP server ended: {ended:?}")));
        }
    };
    crate::output::eprintln(&format!(
        "caw-box mcp: {signal}: stopping; answering the calls in flight (the turns go on)"
    ));
    gate.stopping.cancel();
    waits_end.cancel();
    gate.calls.close();
    if tokio::time::timeout(shutdown::CALLS_GRACE, gate.calls.wait())
        .await
        .is_err()
    {
        tracing::warn!("{} calls were not answered in time", gate.calls.len());
    }
    // The sessions' event streams (the clients' standing GETs) end; so do their connections.
    sessions_end.cancel();
    let _ = tokio::time::timeout(shutdown::CLOSE_GRACE, server).await;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_alone_is_loopback_and_other_addresses_need_a_token() {
        assert_eq!(parse_addr("8765").unwrap().to_string(), "127.0.0.1:8765");
        assert_eq!(parse_addr("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert_eq!(parse_addr("nope").unwrap_err().exit_code(), 2);
        assert!(checked("127.0.0.1:0", None).is_ok());
        let e = checked("0.0.0.0:8765", None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.message.contains("--token-file"), "{}", e.message);
        let file = token_file("short\n", 0o600);
        assert_eq!(
            checked("0.0.0.0:1", Some(file.path()))
                .unwrap_err()
                .exit_code(),
            2
        );
        let file = token_file("0123456789abcdef0123\n", 0o600);
        let (_, token) = checked("0.0.0.0:1", Some(file.path())).unwrap();
        assert_eq!(token.as_deref(), Some("0123456789abcdef0123"));
    }

    fn token_file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        use std::os::unix::fs::PermissionsExt;
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        file
    }

    #[test]
    fn a_token_file_open_to_group_or_others_is_refused_with_the_fix() {
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o666] {
            let file = token_file("0123456789abcdef0123\n", mode);
            let e = checked("127.0.0.1:0", Some(file.path())).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{mode:o}");
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(&file.path().display().to_string()), "{line}");
            assert!(line.contains(&format!("mode {mode:04o}")), "{line}");
            assert!(line.contains("chmod 600"), "{line}");
            assert!(
                !line.contains("0123456789abcdef"),
                "the token in an error: {line}"
            );
        }
        for mode in [0o600, 0o400] {
            let file = token_file("0123456789abcdef0123\n", mode);
            assert!(
                checked("127.0.0.1:0", Some(file.path())).is_ok(),
                "{mode:o}"
            );
        }
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case_and_only_the_exact_token_passes() {
        let t = BearerToken::new("0123456789abcdef");
        for good in [
            &b"Bearer 0123456789abcdef"[..],
            b"bearer 0123456789abcdef",
            b"BEARER 0123456789abcdef",
            b"bEaReR   0123456789abcdef",
        ] {
            assert!(t.admits(Some(good)), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"Bearer 0123456789abcdeX"[..],
            b"Bearer 0123456789abcde",
            b"Bearer 0123456789abcdef0",
            b"Bearer  ",
            b"Bearer",
            b"Basic 0123456789abcdef",
            b"Bearer0123456789abcdef",
            b"0123456789abcdef",
            b"",
        ] {
            assert!(!t.admits(Some(bad)), "{}", String::from_utf8_lossy(bad));
        }
        assert!(!t.admits(None));
        assert_eq!(format!("{t:?}"), "BearerToken(****)");
    }

    /// The router as served, without a connection: a body over [`MAX_BODY`] is 413 whether
    /// its length is declared (refused before it is read) or not (rmcp stops reading it).
    #[tokio::test]
    async fn a_body_over_the_limit_is_413_declared_or_streamed() {
        use tower::ServiceExt;
        let gate = Gate {
            stopping: CancellationToken::new(),
            calls: TaskTracker::new(),
        };
        // No session is made: a refused request never reaches one.
        let mcp: Mcp = StreamableHttpService::new(
            || Err(std::io::Error::other("no session in this test")),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_max_request_body_bytes(MAX_BODY),
        );
        let app = router(mcp, Some(BearerToken::new("0123456789abcdef")), gate);
        let post = || {
            axum::http::Request::post("/mcp")
                .header(header::HOST, "127.0.0.1")
                .header(header::AUTHORIZATION, "bearer 0123456789abcdef")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "application/json, text/event-stream")
        };
        let declared = post()
            .header(header::CONTENT_LENGTH, (20 << 20).to_string())
            .body(Body::empty())
            .unwrap();
        let r = app.clone().oneshot(declared).await.unwrap();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let chunks = (0..20).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1 << 20]));
        let streamed = post()
            .body(Body::from_stream(futures_util::stream::iter(chunks)))
            .unwrap();
        let r = app.clone().oneshot(streamed).await.unwrap();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let unauthorized = axum::http::Request::post("/mcp")
            .header(header::AUTHORIZATION, "Bearer wrong-token-0000000")
            .body(Body::empty())
            .unwrap();
        let r = app.oneshot(unauthorized).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
