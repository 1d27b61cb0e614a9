//! `stub-model`: listens on 0.0.0.0:$PORT (default 8080) until SIGTERM or SIGINT.
//! Env: `PORT`, `STUB_EXPECT_KEY` (the key every model request must carry), `STUB_MODELS`
//! (what `GET /v1/models` lists).

use std::process::ExitCode;

use stub_model::{serve, Config};
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
    };
    tokio::select! {
        () = serve(listener, config) => {}
        _ = term.recv() => eprintln!("stub-model: SIGTERM, exiting"),
        _ = tokio::signal::ctrl_c() => eprintln!("stub-model: SIGINT, exiting"),
    }
    Ok(())
}
