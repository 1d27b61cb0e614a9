//! The tools' arguments: the contract an orchestrating agent reads (every field's doc
//! comment is its JSON-schema description).

use schemars::JsonSchema;
use serde::Deserialize;

/// Settings a turn may override, as `run`'s and `resume`'s flags of the same names (the same
/// values, the same checks).
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct Overrides {
    /// The model the CLI asks for (`--model`), e.g. `gpt-5.5`, `claude-sonnet-4-5`.
    pub model: Option<String>,
    /// How hard the model thinks: `low`, `medium` or `high` (`--effort`).
    pub effort: Option<String>,
    /// Replace the CLI's default system prompt with this text (`--system-prompt`).
    pub system_prompt: Option<String>,
    /// Add this text to the CLI's system prompt (`--append-system-prompt`).
    pub append_system_prompt: Option<String>,
    /// The tool groups the sub-agent may use: some of `read,edit,shell,web,mcp`, or `all` or
    /// `none` (`--tools`). A group the CLI cannot take away is refused.
    pub tools: Option<String>,
    /// Egress only to these hosts, through caw-box's proxy: `HOST[:PORT]`, `*.example.com`,
    /// or `@provider` for the model's API host (`--allow-host`, repeatable).
    pub allow_host: Option<Vec<String>>,
    /// The OCI runtime of the sub-agent's container, e.g. `runsc` (gVisor), or `default`
    /// (`--runtime`).
    pub runtime: Option<String>,
    /// Keep the session's container idle for this long after the turn so the next `reply`
    /// starts at once, e.g. `5m`; `off` to stop (`--keep-warm`).
    pub keep_warm: Option<String>,
    /// Stop the turn after this long, e.g. `30m` (`--timeout`; status `timeout`).
    pub timeout: Option<String>,
    /// A spend limit in USD for the session over all its turns (`--max-cost`), e.g. 0.50. A
    /// turn that crosses it ends with status `budget`, and the next `reply` is refused until
    /// one gives a higher limit. opencode reports usage after each step, so its turn is
    /// stopped mid-way; claude, codex and gemini report usage at a turn's end, so such a
    /// turn ends with its answer.
    pub max_cost_usd: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StartArgs {
    /// The sub-agent's CLI: `claude_code` (or `claude`, `cc`), `codex`, `opencode` or
    /// `gemini`.
    pub provider: String,
    /// The task for the sub-agent: its first turn's prompt.
    pub prompt: String,
    /// The directory the sub-agent works on (default: the server's current directory). In
    /// `copy` mode it is copied into the session and not touched until `apply`.
    pub workspace: Option<String>,
    /// `copy` (default: the sub-agent works on its own copy; `diff` and `apply` bring its
    /// changes back), `bind` (it edits the directory itself) or `none` (no workspace).
    pub workspace_mode: Option<String>,
    /// A unique name for the session, usable wherever a session is asked for (with `n` > 1:
    /// `NAME-1` … `NAME-n`).
    pub name: Option<String>,
    /// A group to tag the session with (`list` filters by it). With `n` > 1 and no group, a
    /// new group is made.
    pub group: Option<String>,
    /// Run the same task in this many sessions of one group (1-8, default 1), e.g. to pick
    /// the best of several answers.
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
pub struct WaitArgs {
    /// The sessions to wait for (ids, prefixes, names or handles).
    pub sessions: Vec<String>,
    /// `all` (default): return when every one's turn ended; `any`: when the first did.
    pub mode: Option<String>,
    /// Return after this many seconds at the latest (default 300, at most 3600), with the
    /// sessions still running shown as `running`: call `wait` again.
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
    /// Only the sessions with this status: `running`, `success`, `error`, `interrupted`,
    /// `timeout`, `new`, ...
    pub status: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RemoveArgs {
    /// The session: its id, a unique id prefix (4+ characters), its name or its handle.
    pub session: String,
    /// Also remove a session whose turn is running (the turn is killed).
    pub force: Option<bool>,
}
