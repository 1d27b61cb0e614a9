//! Waiting out a usage limit through the library, as `--on-limit wait --max-wait 30m` does:
//! a turn stopped by the vendor's limit is sent again in the same session once the reset the
//! CLI named has passed; a reset further off than the bound leaves the `usage_limit` result.
//! With `FALLBACK=claude_code,gemini` in the environment it falls back instead, as
//! `--on-limit fallback=claude_code,gemini` does: the same prompt in a new, linked session of
//! the next provider.
//! The cost of each turn is in `usage.cost_usd` (the CLI's own, else caw-box's price table).
//!
//! ```text
//! cargo run --example on_limit -- opencode http://model-gateway:8080 my-network
//! ```
//! (the key comes from OPENAI_API_KEY / ANTHROPIC_API_KEY / GEMINI_API_KEY in the environment).

#![allow(clippy::print_stdout, clippy::print_stderr)] // an example prints its results

use std::time::Duration;

use caw_box::{Client, NewSession, ProviderKind, TurnOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> caw_box::Result<()> {
    let mut args = std::env::args().skip(1);
    let provider: ProviderKind = args.next().unwrap_or_else(|| "opencode".into()).parse()?;
    let workspace = std::env::current_dir().expect("a current directory");
    let mut new = NewSession::new(provider, workspace.display().to_string());
    new.settings.endpoint = args.next();
    if let Some(network) = args.next() {
        new.settings.network = network;
    }
    let env: Vec<(String, String)> = provider
        .endpoint_key_vars()
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();

    let client = Client::connect().await?;
    let mut session = client.start_session(new).await?;
    let turn = TurnOptions {
        env,
        ..TurnOptions::prompt("Summarise the README in three lines.")
    };
    let fallback: Vec<ProviderKind> = std::env::var("FALLBACK")
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::parse::<ProviderKind>)
        .collect::<Result<_, _>>()?;
    let result = if fallback.is_empty() {
        session
            .send_waiting(
                turn,
                Duration::from_secs(30 * 60),
                |progress| eprintln!("{progress}"),
                |_| {},
            )
            .await?
    } else {
        client
            .send_falling_back(
                &mut session,
                turn,
                &fallback,
                |progress| eprintln!("{progress}"),
                |_| {},
            )
            .await?
    };
    println!(
        "{} after turn {}: {}",
        result.status, result.turn, result.result
    );
    match result.usage.cost_usd {
        Some(cost) => println!("cost: ${cost:.4}"),
        None => println!("cost: unknown (a model caw-box has no price for)"),
    }
    Ok(())
}
