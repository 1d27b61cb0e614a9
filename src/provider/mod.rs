//! Providers: one adapter per vendor CLI, as pure data and parsing.
//!
//! An adapter says which image a session uses, which command runs a first turn and a resumed
//! turn, which environment and config files the CLI needs for `--endpoint` and `--model`, and
//! how one line of the CLI's stdout becomes unified [`Event`]s. It never talks to Docker:
//! the backend runs what an adapter describes, so every adapter is testable from recorded
//! output under `tests/fixtures/`.

use crate::event::{Event, Status, Usage};

mod claude_code;
mod codex;
mod codex_ahead;
mod common;
pub(crate) use common::exited_with;
pub use common::merge_json;
#[cfg(test)]
mod agent_config_tests;
mod gemini;
mod opencode;
pub mod pricing;
#[cfg(test)]
mod test_support;

/// The agent's HOME inside every container: the state volume is mounted here, always at the
/// same absolute path (codex stores absolute paths in its state).
pub const AGENT_HOME: &str = "/home/agent";
/// The working directory of every turn: the CLIs key sessions by cwd, so it never changes.
pub const WORKSPACE_DIR: &str = "/workspace";

pub use crate::provider_kind::{
    cli_version_at_least, image_repo, pinned_cli_versions, set_image_repo, version_report,
    ProviderKind, UnknownProvider, DEFAULT_IMAGE_REPO,
};

impl ProviderKind {
    /// The adapter for this provider.
    pub fn adapter(self) -> &'static dyn Provider {
        match self {
            ProviderKind::ClaudeCode => &claude_code::ClaudeCode,
            ProviderKind::Codex => &codex::Codex,
            ProviderKind::Opencode => &opencode::Opencode,
            ProviderKind::Gemini => &gemini::Gemini,
        }
    }
}

/// What one turn asks of the CLI: the input to [`Provider::turn_command`].
#[derive(Debug, Clone, Default)]
pub struct TurnRequest<'a> {
    pub prompt: &'a str,
    /// The CLI version of the image the turn runs on (its `io.caw-box.cli-version` label);
    /// `None`: unknown, taken to be the pinned one. The adapter passes what that version
    /// takes, so a session on an older image keeps working after the pin moved.
    pub cli_version: Option<&'a str>,
    /// The vendor's resume key from an earlier turn; `None` on the first turn.
    pub resume_key: Option<&'a str>,
    /// On a first turn, a key chosen up front where the vendor allows it (claude).
    pub new_session_key: Option<&'a str>,
    /// No key, yet earlier turns ran: each ended before the vendor named its conversation
    /// (stopped before the model answered). The CLI continues the conversation it made
    /// last, where it can say so without the key (the session's CLI state is its own).
    pub continue_last: bool,
    pub model: Option<&'a str>,
    /// `--endpoint`: the base URL the CLI's model traffic goes to.
    pub endpoint: Option<&'a str>,
    /// The vendor TUI attached to a terminal instead of a headless JSON stream.
    pub interactive: bool,
    /// Names of the variables the CLI's environment will hold from credentials and `--env`
    /// (names only: their values never reach an adapter).
    pub credential_env: &'a [String],
    /// `--system-prompt`: the text that replaces the CLI's default system prompt.
    pub system_prompt: Option<&'a str>,
    /// `--append-system-prompt`: the text added to the CLI's system prompt.
    pub append_system_prompt: Option<&'a str>,
    /// `--effort`.
    pub effort: Option<crate::agent_config::Effort>,
    /// `--tools`, `--allow-tool`, `--deny-tool`; `None`: every tool.
    pub tools: Option<&'a crate::agent_config::ToolPolicy>,
    /// `--mcp`: the MCP servers to configure (secret values are in the CLI's environment,
    /// which the config names: see `agent_config::McpServer`).
    pub mcp: &'a [crate::agent_config::McpServer],
}

/// A CLI's own tool names per vendor-neutral group (see `agent_config::ToolGroup`).
pub type ToolTable = &'static [(crate::agent_config::ToolGroup, &'static [&'static str])];

/// The entrypoint's variable naming variables it passes on as `CAW_BOX_HIDDEN_<NAME>`
/// instead of `<NAME>` (see `images/base/caw-box-entry`).
pub const HIDE_ENV: &str = "CAW_BOX_HIDE_ENV";
pub const HIDDEN_PREFIX: &str = "CAW_BOX_HIDDEN_";
/// The entrypoint's variable holding a script to run after the CLI, whose output becomes
/// the runtime directory's `resume-key` (see [`Provider::latest_key_script`]).
pub const KEY_SCRIPT_ENV: &str = "CAW_BOX_KEY_SCRIPT";

/// A config file an adapter needs in HOME before the turn (e.g. gemini's settings.json).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HomeFile {
    /// Path relative to [`AGENT_HOME`].
    pub path: String,
    pub contents: Vec<u8>,
    /// Merge into an existing JSON file instead of replacing it (keeps the CLI's own keys).
    pub merge_json: bool,
}

/// Everything needed to start the CLI for one turn, described, not executed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnCommand {
    /// The command line inside the container (after the image's entrypoint).
    pub argv: Vec<String>,
    /// Non-secret environment variables. Secrets never go here: they would show in
    /// `docker inspect`. Key values travel through the entrypoint's env file instead.
    pub env: Vec<(String, String)>,
    /// Files to place in HOME before the turn.
    pub home_files: Vec<HomeFile>,
    /// Bytes for the CLI's stdin, which is then closed. `None`: stdin at EOF from the start.
    pub stdin: Option<Vec<u8>>,
}

/// Context a parser needs from earlier turns.
#[derive(Debug, Clone, Default)]
pub struct ParseContext {
    /// The vendor's cumulative usage counters after the previous turn (codex reports usage
    /// cumulatively over a thread; the adapter turns it into this turn's figures).
    pub previous_cumulative_usage: Option<Usage>,
}

/// What a parser concluded when the CLI's output ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnOutcome {
    pub status: Status,
    /// The agent's final answer (or the error message when the turn failed).
    pub result: String,
    /// This turn's usage only.
    pub usage: Usage,
    /// The vendor's cumulative counters, to pass to the next turn's [`ParseContext`].
    pub cumulative_usage: Option<Usage>,
}

/// Turns one CLI's stdout, line by line, into unified events.
///
/// Tolerant by contract: a line that is not JSON, or JSON of an unknown shape, produces no
/// event (the raw line is kept by the caller for `logs --raw`), never a panic.
pub trait StreamParser: Send {
    /// Feeds one line (without its newline); pushes the events it yields onto `out`.
    fn parse_line(&mut self, line: &str, out: &mut Vec<Event>);
    /// The vendor resume key, once seen in the output.
    fn resume_key(&self) -> Option<&str>;
    /// Called once when the output ended and the CLI exited with `exit_code`.
    fn finish(&mut self, exit_code: i64) -> TurnOutcome;
    /// Feeds one line of the CLI's stderr, where some CLIs report their retries.
    fn parse_stderr_line(&mut self, _line: &str) {}
    /// The CLI's own words while it reports that it cannot reach its model (a connection
    /// error it retries), with no model response since; `None` otherwise. The runner stops
    /// a turn that stays here past `--connect-timeout`.
    fn unreachable(&self) -> Option<&str> {
        None
    }
}

/// A vendor CLI adapter. Pure: no I/O.
pub trait Provider: Send + Sync {
    fn kind(&self) -> ProviderKind;
    /// The command, env and files for one turn.
    fn turn_command(&self, request: &TurnRequest<'_>) -> TurnCommand;
    /// A fresh parser for one turn's output.
    fn parser(&self, context: ParseContext) -> Box<dyn StreamParser>;
    /// Whether the files this turn merges into HOME differ from those the provider's own
    /// image already has (so they are merged even on that image's turns).
    fn merges_unlike_its_image(&self, _request: &TurnRequest<'_>) -> bool {
        false
    }
    /// Whether the vendor lets us choose the resume key before the first turn.
    fn chooses_key_up_front(&self) -> bool {
        false
    }
    /// A command that makes, in a fresh HOME, the state the CLI's first run makes before it
    /// sends anything (its databases, its bundled files), and holds no conversation, no
    /// credential and no prompt: a pool's box runs it ahead of its claim
    /// (`session::lifecycle::pool`). `None`: the CLI's first run has nothing worth it.
    fn prime_argv(&self) -> Option<Vec<String>> {
        None
    }
    /// A command that starts, in a pool's box, the CLI ahead of its first turn's prompt
    /// (waiting on a socket for a turn) and ends once it waits, 0 when it does: it holds no
    /// conversation, no credential and no prompt. `None`: the CLI has no such mode.
    fn prestart_argv(&self) -> Option<Vec<String>> {
        None
    }
    /// A first turn's command `argv` as it runs in a box whose CLI was started ahead
    /// ([`prestart_argv`](Provider::prestart_argv)): it hands the turn to that CLI, or runs
    /// `argv` itself where it cannot. `None`: `argv` runs as it is.
    fn prestarted_turn(&self, _argv: &[String]) -> Option<Vec<String>> {
        None
    }
    /// For an interactive turn: a bash script that runs in the container after the TUI
    /// exited and prints the vendor key of the conversation written last (nothing when there
    /// is none). The TUIs do not report their key in a form meant for programs.
    fn latest_key_script(&self) -> String;
    /// Which of the agent settings (`agent_config`) this CLI can take; the rest is refused
    /// before a turn starts.
    fn support(&self) -> crate::agent_config::Support;
    /// The CLI's built-in tool names per group: what `--tools` takes away and what a
    /// `tool_call` event's group is.
    fn tool_names(&self) -> ToolTable;
}

/// The files holding a turn's system prompt texts (see `agent_config`), for
/// [`TurnCommand::home_files`]: the CLI reads them from there.
pub fn prompt_files(request: &TurnRequest<'_>) -> Vec<HomeFile> {
    use crate::agent_config::{APPEND_SYSTEM_PROMPT_FILE, SYSTEM_PROMPT_FILE};
    [
        (SYSTEM_PROMPT_FILE, request.system_prompt),
        (APPEND_SYSTEM_PROMPT_FILE, request.append_system_prompt),
    ]
    .into_iter()
    .filter_map(|(path, text)| {
        Some(HomeFile {
            path: path.to_string(),
            contents: text?.as_bytes().to_vec(),
            merge_json: false,
        })
    })
    .collect()
}

/// A HOME-relative path as the CLI sees it.
pub fn in_home(path: &str) -> String {
    format!("{AGENT_HOME}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_parse() {
        assert_eq!(
            "claude".parse::<ProviderKind>(),
            Ok(ProviderKind::ClaudeCode)
        );
        assert_eq!("cc".parse::<ProviderKind>(), Ok(ProviderKind::ClaudeCode));
        assert_eq!(
            "claude-code".parse::<ProviderKind>(),
            Ok(ProviderKind::ClaudeCode)
        );
        assert_eq!("Codex".parse::<ProviderKind>(), Ok(ProviderKind::Codex));
        assert_eq!(
            "opencode".parse::<ProviderKind>(),
            Ok(ProviderKind::Opencode)
        );
        assert_eq!("gemini".parse::<ProviderKind>(), Ok(ProviderKind::Gemini));
        let err = "gpt".parse::<ProviderKind>().unwrap_err();
        assert!(err.to_string().contains("claude_code"), "{err}");
    }

    #[test]
    fn every_provider_round_trips_through_its_name() {
        for kind in ProviderKind::ALL {
            assert_eq!(kind.as_str().parse::<ProviderKind>(), Ok(kind));
            assert_eq!(kind.adapter().kind(), kind);
        }
    }
}
