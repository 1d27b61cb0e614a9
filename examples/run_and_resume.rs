//! The library in a nutshell: start a session, run a turn while watching its events, keep
//! the handle, and resume the conversation from the handle alone.
//!
//! ```text
//! cargo run --example run_and_resume -- codex http://model-gateway:8080 my-network
//! ```
//! (the key comes from OPENAI_API_KEY / ANTHROPIC_API_KEY / GEMINI_API_KEY in the
//! environment; the images come from `caw-box image build --all`).

#![allow(clippy::print_stdout)] // an example prints its results

use caw_box::{Client, Event, NewSession, ProviderKind, TurnOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> caw_box::Result<()> {
    let mut args = std::env::args().skip(1);
    let provider: ProviderKind = args.next().unwrap_or_else(|| "codex".into()).parse()?;
    let endpoint = args.next();
    let network = args.next();

    let client = Client::connect().await?;
    let workspace = std::env::current_dir().expect("a current directory");
    let mut new = NewSession::new(provider, workspace.display().to_string());
    new.settings.endpoint = endpoint;
    if let Some(network) = network {
        new.settings.network = network;
    }
    let key_env: Vec<(String, String)> = provider
        .endpoint_key_vars()
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();

    let mut session = client.start_session(new).await?;
    let turn = TurnOptions {
        env: key_env.clone(),
        ..TurnOptions::prompt("Please REMEMBER:marmalade")
    };
    let first = session
        .send(turn, |event| {
            if let Event::Text { text } = event {
                print!("{text}");
            }
        })
        .await?;
    println!("\nturn {} ended: {}", first.turn, first.status);

    // The handle alone is enough to come back, from any process on this Docker host.
    let handle = session.handle().to_json();
    let mut again = client.open(&handle).await?;
    let turn = TurnOptions {
        env: key_env,
        ..TurnOptions::prompt("RECALL")
    };
    let second = again.send(turn, |_| {}).await?;
    println!("turn {}: {}", second.turn, second.result);
    Ok(())
}
