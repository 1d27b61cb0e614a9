//! Shaping the agent through the library: a session whose system prompt is replaced, whose
//! effort is set, whose agent gets no shell and an MCP server run from the workspace
//! (remembered by the session), then one turn with an appended prompt.
//!
//! ```text
//! cargo run --example agent_config -- codex http://model-gateway:8080 my-network
//! ```
//! (the key comes from OPENAI_API_KEY / ANTHROPIC_API_KEY / GEMINI_API_KEY in the
//! environment; a setting the provider's CLI cannot take is refused with exit status 2).

#![allow(clippy::print_stdout)] // an example prints its results

use caw_box::agent_config::{Effort, McpServer, ToolGroup, ToolPolicy};
use caw_box::{Client, NewSession, ProviderKind, TurnOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> caw_box::Result<()> {
    let mut args = std::env::args().skip(1);
    let provider: ProviderKind = args.next().unwrap_or_else(|| "codex".into()).parse()?;
    let workspace = std::env::current_dir().expect("a current directory");
    let mut new = NewSession::new(provider, workspace.display().to_string());
    new.settings.endpoint = args.next();
    if let Some(network) = args.next() {
        new.settings.network = network;
    }
    // Remembered by the session: every later turn, resumed ones too, gets them.
    new.settings.system_prompt = Some("You review code. Answer in one paragraph.".into());
    new.settings.effort = Some(Effort::High);
    // Every group but the shell (each provider can take that one away).
    new.settings.tools = Some(ToolPolicy {
        groups: Some(vec![
            ToolGroup::Read,
            ToolGroup::Edit,
            ToolGroup::Web,
            ToolGroup::Mcp,
        ]),
        ..ToolPolicy::default()
    });
    // A stdio MCP server, run in the agent's container (here a script the workspace would
    // hold; one that does not start only leaves the agent without its tools). Its token is a
    // secret: only the name
    // is remembered, the value goes with each turn's env.
    let mut docs = McpServer::parse("docs=node /workspace/tools/docs-mcp.js", "mcp")?;
    docs.env = vec!["DOCS_TOKEN".into()];
    new.settings.mcp = vec![docs];
    let mut env: Vec<(String, String)> = provider
        .endpoint_key_vars()
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    if let Ok(token) = std::env::var("DOCS_TOKEN") {
        env.push(("DOCS_TOKEN".into(), token));
    }

    let client = Client::connect().await?;
    let mut session = client.start_session(new).await?;
    let turn = TurnOptions {
        env: env.clone(),
        ..TurnOptions::prompt("What does src/main.rs do?")
    };
    let first = session.send(turn, |_| {}).await?;
    println!("turn {}: {}", first.turn, first.result);

    // For this process's next turns only (not remembered): an addition to the prompt.
    session.settings_mut().append_system_prompt = Some("Mention one risk.".into());
    let turn = TurnOptions {
        env,
        ..TurnOptions::prompt("And src/lib.rs?")
    };
    let second = session.send(turn, |_| {}).await?;
    println!("turn {}: {}", second.turn, second.result);
    println!("resume with: caw-box resume {}", session.id());
    Ok(())
}
