//! `stub-model`: listens on 0.0.0.0:$PORT (default 8080) until SIGTERM or SIGINT.
//! Env: `PORT`, `STUB_EXPECT_KEY` (the key every model request must carry), `STUB_MODELS`
//! (what `GET /v1/models` lists), `STUB_ACCOUNT_REQUESTS` and `STUB_ACCOUNT_WINDOW` (the
//! account limit model responses report); `STUB_TLS_CERT` and `STUB_TLS_KEY` (PEM texts: a
//! certificate chain and its key) add a TLS listener on `STUB_TLS_PORT` (default 443), for
//! the stub under a vendor's host name.

use std::process::ExitCode;

use std::sync::Arc;

use stub_model::account::AccountLimit;
use stub_model::{serve_tls, Config};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("stub-model: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let port = match std::env::var("PORT") {
        Ok(port) => port
            .parse::<u16>()
            .map_err(|_| format!("PORT is not a port number: {port:?}"))?,
        Err(_) => 8080,
    };
    let expect_key = std::env::var("STUB_EXPECT_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let account = AccountLimit::from_env()?;
    let address = format!("0.0.0.0:{port}");
    let listener = TcpListener::bind(&address)
        .await
        .map_err(|err| format!("cannot listen on {address}: {err}"))?;
    let bound = listener
        .local_addr()
        .map_or_else(|_| address.clone(), |a| a.to_string());
    let key_note = if expect_key.is_some() {
        "expecting a key"
    } else {
        "no key check"
    };
    eprintln!("stub-model listening on {bound} ({key_note})");

    // As PID 1 in a container nothing ends the process on SIGTERM unless it asks to.
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let models = std::env::var("STUB_MODELS")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    let config = Config {
        expect_key,
        echo: true,
        models,
        account,
    };
    let tls = tls_listener().await?;
    tokio::select! {
        () = serve_tls(listener, tls, config) => {}
        _ = term.recv() => eprintln!("stub-model: SIGTERM, exiting"),
        _ = tokio::signal::ctrl_c() => eprintln!("stub-model: SIGINT, exiting"),
    }
    Ok(())
}

/// The TLS listener of `STUB_TLS_CERT`/`STUB_TLS_KEY`/`STUB_TLS_PORT`, if they are set.
async fn tls_listener() -> Result<Option<(TcpListener, tokio_rustls::TlsAcceptor)>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (Ok(cert), Ok(key)) = (
        std::env::var("STUB_TLS_CERT"),
        std::env::var("STUB_TLS_KEY"),
    ) else {
        return Ok(None);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("STUB_TLS_CERT: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("STUB_TLS_KEY: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("STUB_TLS_CERT/KEY: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let port = std::env::var("STUB_TLS_PORT").unwrap_or_else(|_| "443".into());
    let address = format!("0.0.0.0:{port}");
    let listener = TcpListener::bind(&address)
        .await
        .map_err(|err| format!("cannot listen on {address}: {err}"))?;
    eprintln!("stub-model: TLS on {address}");
    Ok(Some((
        listener,
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    )))
}
