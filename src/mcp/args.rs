//! The tools' arguments: the contract an orchestrating agent reads (every field's doc
//! comment is its JSON-schema description). Choices are JSON-schema enums and numbers carry
//! their bounds, so the schema tells the agent what is allowed; the fields stay plain strings
//! and numbers so that a value outside them is the tool's own `isError` answer (the `-o json`
//! error object), not a protocol error. What this server allows beyond the static schema (its
//! runtime, its spend limit) is written into the schemas when it starts
//! ([`super::Delegation::new`]).

use schemars::JsonSchema;
use serde::Deserialize;

/// Settings a turn may override, as `run`'s and `resume`'s flags of the same names (the same
/// values, the same checks).
#[derive(Debug, Default, PartialEq, Deserialize, JsonSchema)]
pub struct Overrides {
    /// The model the CLI asks for (`--model`), e.g. `gpt-5.5`, `claude-sonnet-4-5`.
    pub model: Option<String>,
    /// How hard the model thinks: `low`, `medium` or `high` (`--effort`).
    #[schemars(extend("enum" = ["low", "medium", "high"]))]
    pub effort: Option<String>,
    /// Replace the CLI's default system prompt with this text (`--system-prompt`); `@FILE`
    /// reads it from a file under the server's workspace roots. A server started with a
    /// system prompt keeps its own first: this text is added after it.
    #[schemars(length(min = 1))]
    pub system_prompt: Option<String>,
    /// Add this text to the CLI's system prompt (`--append-system-prompt`; `@FILE` as for
    /// `system_prompt`), after the server's own if it has one.
    #[schemars(length(min = 1))]
    pub append_system_prompt: Option<String>,
    /// The tool groups the sub-agent may use: some of `read,edit,shell,web,mcp`, or `all` or
    /// `none` (`--tools`), at most the server's. A group the CLI cannot take away is refused.
    pub tools: Option<String>,
    /// Hosts the sub-agent may reach besides its egress policy's, through caw-box's proxy:
    /// `HOST[:PORT]`, `*.example.com`, or `@provider` for the model's API host
    /// (`--allow-host`). Replaces the server's list for this session and must lie within
    /// what the server's sessions reach (`forbidden` otherwise).
    #[schemars(length(min = 1))]
    pub allow_host: Option<Vec<String>>,
    /// What the sub-agent may reach besides its model (`--egress`): `balanced` (the model's
    /// API and common package and source hosts), `locked` (the model's API only) or `open`.
    /// At most as open as the server's: a call may close egress, never open it.
    #[schemars(extend("enum" = ["balanced", "locked", "open"]))]
    pub egress: Option<String>,
    /// The OCI runtime of the sub-agent's container, e.g. `runsc` (gVisor), or `default`
    /// (`--runtime`). A server started with `--runtime R` takes only R.
    pub runtime: Option<String>,
    /// Keep the session's container idle for this long after the turn so the next `reply`
    /// starts at once, e.g. `5m`; `off` to stop (`--keep-warm`). At most the server's: a
    /// server without `--keep-warm` keeps nothing warm.
    pub keep_warm: Option<String>,
    /// Stop the turn after this long, e.g. `30m` (`--timeout`; status `timeout`); at most the
    /// server's `--timeout`.
    pub timeout: Option<String>,
    /// The sub-agent's memory limit, e.g. `2g` (`--memory`); at most the server's.
    pub memory: Option<String>,
    /// The CPUs the sub-agent may use, e.g. 1.5 (`--cpus`); at most the server's.
    #[schemars(range(min = 0.01))]
    pub cpus: Option<f64>,
    /// A spend limit in USD for the session over all its turns (`--max-cost`), e.g. 0.50. A
    /// turn that crosses it ends with status `budget`, and the next `reply` is refused until
    /// one gives a higher limit. opencode reports usage after each step, so its turn is
    /// stopped mid-way; claude, codex and gemini report usage at a turn's end, so such a
    /// turn ends with its answer. At most the server's `--max-cost`.
    #[schemars(range(min = 0.0))]
    pub max_cost_usd: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StartArgs {
    /// The sub-agent's CLI: `claude_code` (or `claude`, `cc`), `codex`, `opencode` or
    /// `gemini`.
    pub provider: String,
    /// The task for the sub-agent: its first turn's prompt.
    pub prompt: String,
    /// The directory the sub-agent works on (default: the server's current directory). It
    /// must lie, symlinks followed, under one of the server's workspace roots. In `copy` mode
    /// it is copied into the session and not touched until `apply`.
    pub workspace: Option<String>,
    /// `copy` (default: the sub-agent works on its own copy; `diff` and `apply` bring its
    /// changes back), `bind` (it edits the directory itself; only on a server started with
    /// `--allow-bind`) or `none` (no workspace).
    #[schemars(extend("enum" = ["copy", "bind", "none"]))]
    pub workspace_mode: Option<String>,
    /// A unique name for the session, usable wherever a session is asked for (with `n` > 1:
    /// `NAME-1` … `NAME-n`).
    pub name: Option<String>,
    /// A group to tag the session with (`list` filters by it). With `n` > 1 and no group, a
    /// new group is made.
    pub group: Option<String>,
    /// Run the same task in this many sessions of one group (1-8, default 1), e.g. to pick
    /// the best of several answers.
    #[schemars(range(min = 1, max = 8))]
    pub n: Option<u32>,
    #[serde(flatten)]
    pub overrides: Overrides,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// The next turn's prompt; the session remembers the conversation so far.
    pub prompt: String,
    #[serde(flatten)]
    pub overrides: Overrides,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkArgs {
    /// The session to fork: its id, a unique id prefix (4+ characters), its name or its
    /// handle. It is only read; one whose turn is running or queued is refused (`busy`).
    pub session: String,
    /// The finished turn whose end the forks start from: their conversation and workspace
    /// are the session's as they were then (default: its latest turn).
    #[schemars(range(min = 1))]
    pub at_turn: Option<u32>,
    /// How many forks to make (1-8, default 1), e.g. 3 to let three sub-agents go on from
    /// one session's plan.
    #[schemars(range(min = 1, max = 8))]
    pub n: Option<u32>,
    /// A unique name for the fork (with `n` > 1: `NAME-1` … `NAME-n`).
    pub name: Option<String>,
    /// A group to tag the forks with (`list` filters by it). With `n` > 1 and no group, a
    /// new group is made.
    pub group: Option<String>,
    /// Each fork's first turn: this prompt, started in the background as `reply` starts a
    /// turn (then `wait` for the forks). Without it the forks are made and wait for a
    /// `reply`; the overrides below need it.
    pub prompt: Option<String>,
    /// Another vendor's CLI for the forks (`claude_code`, `codex`, `opencode`, `gemini`): the
    /// workspace is the turn's, the conversation cannot move between vendors, so each fork's
    /// first turn gets a handoff (the session's prompts and answers up to the turn, the
    /// files it changed) ahead of its prompt. Default: the session's own CLI, its
    /// conversation copied.
    pub provider: Option<String>,
    #[serde(flatten)]
    pub overrides: Overrides,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitArgs {
    /// The sessions to wait for (ids, prefixes, names or handles), 1 to 64.
    #[schemars(length(min = 1, max = 64))]
    pub sessions: Vec<String>,
    /// `all` (default): return when every one's turn ended; `any`: when the first did.
    #[schemars(extend("enum" = ["all", "any"]))]
    pub mode: Option<String>,
    /// Return after this many seconds at the latest (default 300, at most 3600), with the
    /// sessions still running shown as `running`: call `wait` again.
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArg {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct EventsArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Which turn (default: the running one, else the latest).
    #[schemars(range(min = 1))]
    pub turn: Option<u32>,
    /// Return the events after this many (the `next_cursor` of the previous call; default 0).
    pub cursor: Option<usize>,
    /// Return at most this many events (default 200, at most 1000); `more: true` in the
    /// answer says there are more after `next_cursor`: call again with that cursor.
    #[schemars(range(min = 1, max = super::read::EVENTS_MAX_LIMIT))]
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DiffArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Return at most this many bytes of the patch (default 1048576 = 1 MiB, at most
    /// 16777216 = 16 MiB). A longer patch is cut where a file begins (else a line) and the
    /// answer says `truncated: true` and its whole size in `bytes`: call again with a larger
    /// `max_bytes` for all of it. `apply` applies the whole patch either way.
    #[schemars(range(min = 1, max = super::diff::MAX_MAX_BYTES))]
    pub max_bytes: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ResultArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Which turn (default: the latest finished one).
    #[schemars(range(min = 1))]
    pub turn: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ApplyArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Only check that the patch applies cleanly; write nothing.
    pub check: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// Only the sessions of this group.
    pub group: Option<String>,
    /// Only the sessions with this status.
    #[schemars(extend("enum" = ["new", "running", "queued", "parked", "success", "error", "auth_error", "usage_limit", "budget", "timeout", "interrupted", "unreachable"]))]
    pub status: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RemoveArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Also remove a session whose turn is running (the turn is killed).
    pub force: Option<bool>,
}
