//! The library in a nutshell: start a session, run a turn while watching its events, keep
//! the handle, resume the conversation from the handle alone, stop a running turn and wait
//! for its result, and remove the session.
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
        env: key_env.clone(),
        ..TurnOptions::prompt("RECALL")
    };
    let second = again.send(turn, |_| {}).await?;
    println!("turn {}: {}", second.turn, second.result);

    // Any process can stop a session's running turn and wait for its result (here the one
    // this process drives, a third turn): the session stays resumable.
    let session_id = again.id();
    let id = session_id.to_string();
    let turn = TurnOptions {
        env: key_env,
        ..TurnOptions::prompt("Count slowly from one to one thousand, one number a line")
    };
    let sent = std::cell::Cell::new(false);
    let drive = async {
        let result = again.send(turn, |_| {}).await;
        sent.set(true);
        result
    };
    let stop_and_wait = async {
        while !sent.get() && !client.running().await?.contains_key(&session_id) {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        if !sent.get() {
            // It may end on its own first: then there is nothing to stop.
            match client.stop(&id).await {
                Ok(_) => println!("stopped the third turn"),
                Err(e) => println!("not stopped: {e}"),
            }
        }
        client.wait(&id).await
    };
    let (third, waited) = tokio::join!(drive, stop_and_wait);
    let (third, waited) = (third?, waited?);
    println!("turn {} ended: {}", third.turn, third.status);
    println!("wait saw turn {}: {}", waited.turn, waited.status);

    // Removing a session takes its volumes and containers; `force` would also kill a
    // running turn.
    let removed = client.remove(&handle, false).await?;
    println!("removed session {removed}");
    Ok(())
}
