//! `caw-box mcp --http ADDR`: the same server over MCP's Streamable HTTP transport, for an
//! orchestrator on another machine (or in a container). A loopback address is the default
//! and needs nothing more; any other address is refused without `--token-file`, and with
//! one every request must carry `Authorization: Bearer <token>` (else 401), since whoever
//! reaches the port can run agents with this host's credentials.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::{Defaults, Delegation};
use crate::error::{Error, Result};

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

/// The bearer token `--token-file` holds (surrounding whitespace trimmed).
fn read_token(file: &Path) -> Result<String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        Error::usage(format!(
            "cannot read --token-file '{}': {e}",
            file.display()
        ))
    })?;
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

/// Whether `header` is `Bearer <token>`, compared in constant time.
fn authorized(header: Option<&[u8]>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
        return false;
    };
    let want = token.as_bytes();
    given.len() == want.len()
        && given
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
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

/// Serves MCP over Streamable HTTP on `addr` until the process is stopped.
pub async fn serve(defaults: Defaults, addr: SocketAddr, token: Option<String>) -> Result<i32> {
    let mut config = StreamableHttpServerConfig::default();
    if !addr.ip().is_loopback() {
        // Reached by a name this server cannot know: the bearer token guards it instead of
        // the loopback Host check.
        config = config.with_allowed_hosts(Vec::<String>::new());
    }
    let service = StreamableHttpService::new(
        move || Ok(Delegation::new(defaults.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::environment(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    crate::output::eprintln(&format!(
        "caw-box mcp: serving MCP (Streamable HTTP) on http://{bound}/mcp{}",
        if token.is_some() {
            ", bearer token required"
        } else {
            ""
        }
    ));
    let token = Arc::new(token);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                continue;
            }
        };
        let service = service.clone();
        let token = Arc::clone(&token);
        tokio::spawn(async move {
            let handle =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut service = service.clone();
                    let token = Arc::clone(&token);
                    async move {
                        if let Some(token) = token.as_deref() {
                            let header = req
                                .headers()
                                .get(hyper::header::AUTHORIZATION)
                                .map(|v| v.as_bytes());
                            if !authorized(header, token) {
                                return Ok::<_, Infallible>(unauthorized());
                            }
                        }
                        tower_service::Service::call(&mut service, req).await
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, handle)
                .await
            {
                tracing::debug!("an HTTP connection ended: {e}");
            }
        });
    }
}

fn unauthorized() -> hyper::Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    let mut r = hyper::Response::new(
        Full::new(Bytes::from_static(
            b"{\"error\":\"unauthorized: send Authorization: Bearer <token>\"}",
        ))
        .boxed(),
    );
    *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
    r.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
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
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "short\n").unwrap();
        assert_eq!(
            checked("0.0.0.0:1", Some(file.path()))
                .unwrap_err()
                .exit_code(),
            2
        );
        std::fs::write(file.path(), "0123456789abcdef0123\n").unwrap();
        let (_, token) = checked("0.0.0.0:1", Some(file.path())).unwrap();
        assert_eq!(token.as_deref(), Some("0123456789abcdef0123"));
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let t = "0123456789abcdef";
        assert!(authorized(Some(b"Bearer 0123456789abcdef"), t));
        for bad in [
            &b"Bearer 0123456789abcdeX"[..],
            b"Bearer 0123456789abcde",
            b"bearer 0123456789abcdef",
            b"0123456789abcdef",
            b"",
        ] {
            assert!(
                !authorized(Some(bad), t),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(!authorized(None, t));
    }
}
