//! `caw-box mcp`: a Model Context Protocol server (the official Rust SDK, `rmcp`, over
//! stdio, or Streamable HTTP with `--http`) that lets an orchestrating agent (Claude Code, Codex, opencode, Cursor, a
//! program) delegate work to boxed, resumable sub-agents: `start` a turn, `wait` for it,
//! read its `result` and `diff`, `apply` it, `reply`, `cancel`, `fork` a session at a turn.
//!
//! It is a thin layer over the library ([`crate::Client`], [`crate::Session`]): a turn
//! runs detached, in a background `caw-box __drive` process ([`crate::Session::start_detached`]),
//! as `run -d` does; a tool call's arguments become `run`'s and `resume`'s flags and go
//! through the same resolution and checks ([`crate::commands::turn::new_session`]). The
//! server keeps no state of its own: sessions live in the backend, so a new server of the same
//! scope lists, waits on, reads and resumes what an earlier one started. Its tool calls run
//! on the server's own runtime (no thread per call).
//!
//! - `mod.rs`: the server, its instructions, the tool table
//! - `args.rs`: the tools' arguments (their JSON schemas); `schema.rs` narrows them to what
//!   this server allows
//! - `policy.rs`: what a call may ask for (workspace roots, `@FILE`s, bind mode, the scope);
//!   `ceilings.rs`: the server's settings as the widest a sub-agent gets
//! - `turns.rs`: `start`, `reply`, `cancel`, `wait`
//! - `fork.rs`: `fork`, its forks' first turns started as `reply` starts one
//! - `read.rs`: `status`, `events`, `result`, `diff`'s patch, `list`
//! - `diff.rs`: `diff`, bounded by `max_bytes`
//! - `apply.rs`: `apply`
//!
//! - `queue.rs`: `--max-parallel`
//! - `http.rs`: `--http ADDR`, the Streamable HTTP transport and its bearer token
//! - `listener.rs`: the HTTP connections: their cap and deadlines
//! - `stdio.rs`: the stdio transport
//! - `shutdown.rs`: stopping on SIGTERM or SIGINT, the calls in flight answered
//!
//! Not here: spend limits.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, Peer, RoleServer, ServerHandler};
use serde_json::{json, Value};

use crate::cli::SettingsArgs;
use crate::error::{Error, Result};

mod apply;
mod args;
mod budget;
mod ceilings;
mod diff;
mod fork;
pub mod http;
mod listener;
pub mod policy;
mod queue;
mod read;
mod schema;
mod shutdown;
mod stdio;
mod turns;

pub use budget::ServerBudget;
pub use policy::{Policy, PolicyArgs};
pub use queue::Queue;
pub use stdio::serve_stdio;

use args::{
    ApplyArgs, DiffArgs, EventsArgs, ForkArgs, ListArgs, RemoveArgs, ReplyArgs, ResultArgs,
    SessionArg, StartArgs, WaitArgs,
};

/// What an orchestrating agent is told when it connects.
pub const INSTRUCTIONS: &str = "\
caw-box runs coding-agent CLIs (claude_code, codex, opencode, gemini) as sub-agents, each in \
its own sandboxed container with its own copy of a directory, resumable at any time. \
To delegate: `start` {provider, prompt, workspace} returns at once with a session id (status \
`running`); `wait` {sessions: [id]} blocks until the turn ended (or timeout_s: then call it \
again; `status` is the cheap poll); `result` {session} gives the final message, usage, cost and \
the files changed; `diff` {session} gives the changes as a patch; `apply` {session} writes them \
into the directory the session was started from (the default workspace_mode `copy` leaves that \
directory untouched until then). `reply` {session, prompt} continues the same conversation; \
`cancel` stops a running turn (the session stays resumable). `start` with n: 3 runs the same \
task three times in one group: wait with mode `all`, compare the results and diffs, apply the \
best, `remove` the rest. `fork` {session, n, prompt} starts n new sessions from a session's \
conversation and workspace at a finished turn (`at_turn`, default its latest), so several go on \
from one common start: one session reads the repository and plans, three forks implement. \
Sessions outlive this server: `list` shows them.";

/// The server's own settings: the defaults of every `start` (`run`'s settings flags given to
/// `caw-box mcp`; config files and `CAW_BOX_*` variables under them), the `--env` passed to
/// every turn, and its walls.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub settings: SettingsArgs,
    pub env: Vec<String>,
    /// Ceilings, places and scope: what a tool call may ask for.
    pub policy: std::sync::Arc<Policy>,
    /// `--max-parallel`: the queue of turns beyond it.
    pub queue: Option<std::sync::Arc<Queue>>,
    /// `--max-cost-usd`: what the server's sessions may spend together.
    pub budget: Option<std::sync::Arc<budget::ServerBudget>>,
    /// Cancelled when the server stops: a `wait` in flight answers then.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// `--pool`: how many boxes each kind of session this server starts keeps ready, and
    /// the keys of the pools it made (removed when it stops).
    pub pool: Option<(u32, std::sync::Arc<std::sync::Mutex<Vec<String>>>)>,
}

impl Defaults {
    /// Whether session `id` has a turn in this server's queue.
    pub fn queued(&self, id: uuid::Uuid) -> bool {
        self.queue.as_ref().is_some_and(|q| q.holds(id))
    }
}

/// `--pool`: makes a pool of `size` boxes for sessions of `provider` and `settings` (the
/// session just started), where this server has none yet, and fills it in the background.
pub fn keep_pool(
    backend: &impl crate::backend::Backend,
    provider: crate::provider::ProviderKind,
    settings: &crate::session::record::SessionSettings,
    size: u32,
    made: &std::sync::Mutex<Vec<String>>,
) {
    use crate::session::lifecycle::pool;
    if !backend.capabilities().pools {
        return;
    }
    let scope = pool::scope_of(backend);
    let key = pool::key_of(&scope, provider, settings);
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    // (One the person made with `pool start` is theirs: used, never changed or removed.)
    if made.contains(&key) || pool::load(&key).is_some() {
        return;
    }
    let def = pool::PoolDef {
        key: key.clone(),
        provider,
        settings: settings.clone(),
        size,
        max_age_secs: pool::DEFAULT_MAX_AGE_SECS,
        created_at: crate::clock::now_secs(),
        scope,
    };
    match pool::save(&def) {
        Ok(()) => {
            pool::fill_in_background(&key);
            made.push(key);
        }
        Err(e) => tracing::warn!("no pool for these sessions: {e}"),
    }
}

/// Removes the pools this server made (`--pool`), when it stops.
pub async fn stop_pools(made: &std::sync::Mutex<Vec<String>>) {
    use crate::session::lifecycle::pool;
    let keys = made.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if keys.is_empty() {
        return;
    }
    let Ok(backend) = crate::client::connect_backend().await else {
        return;
    };
    for key in keys {
        if let Some(def) = pool::load(&key) {
            if let Err(e) = pool::stop(&backend, &def).await {
                tracing::warn!("could not remove pool {key}: {e}");
            }
        }
    }
}

/// The MCP server.
#[derive(Debug, Clone)]
pub struct Delegation {
    defaults: Defaults,
    tool_router: ToolRouter<Self>,
}

/// Where `wait` reports progress: the client's progress token, if it sent one.
#[derive(Debug)]
pub struct Progress {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
}

impl Progress {
    pub async fn send(&self, step: u32, message: &str) {
        if let Some(token) = &self.token {
            let param = ProgressNotificationParam::new(token.clone(), f64::from(step))
                .with_message(message);
            if let Err(e) = self.peer.notify_progress(param).await {
                tracing::debug!("progress notification not sent: {e}");
            }
        }
    }
}

/// A tool's answer: the JSON as text (what every client shows the model) and as structured
/// content; an error as the JSON object `-o json` prints for it, with `isError`.
fn answer(outcome: Result<Value>) -> CallToolResult {
    match outcome {
        Ok(value) => {
            let text = serde_json::to_string_pretty(&value).expect("values serialize");
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if value.is_object() {
                r.structured_content = Some(value);
            }
            r
        }
        Err(e) => error_result(&e),
    }
}

fn error_result(e: &Error) -> CallToolResult {
    let report = serde_json::to_value(e.report()).expect("reports serialize");
    let mut r = CallToolResult::error(vec![ContentBlock::text(report.to_string())]);
    r.structured_content = Some(report);
    r
}

/// A reading tool's work, dropped (and so stopped) when the client cancels the request
/// (`notifications/cancelled`) or goes away. The tools that change something (`start`,
/// `reply`, `fork`, `cancel`, `apply`, `remove`) are not: each is short, and stopping one
/// half-way would leave half of what it makes.
async fn cancellable<T>(
    context: &RequestContext<RoleServer>,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        outcome = work => outcome,
        () = context.ct.cancelled() => Err(Error::new(
            crate::error::ErrorKind::Interrupted,
            "the call was cancelled",
        )),
    }
}

#[tool_router]
impl Delegation {
    pub fn new(defaults: Defaults) -> Self {
        let mut tool_router = Self::tool_router();
        for tool in ["start", "reply", "fork"] {
            if let Some(route) = tool_router.map.get_mut(tool) {
                let mut schema = (*route.attr.input_schema).clone();
                schema::narrow(&mut schema, &defaults.policy);
                route.attr.input_schema = std::sync::Arc::new(schema);
            }
        }
        Delegation {
            defaults,
            tool_router,
        }
    }

    fn policy(&self) -> &Policy {
        &self.defaults.policy
    }

    /// The session `target` names in this server's scope, as its full id.
    async fn session(&self, target: &str) -> Result<String> {
        let client = crate::Client::connect().await?;
        Ok(turns::scoped(&client, self.policy(), target)
            .await?
            .facts
            .session_id
            .to_string())
    }

    #[tool(
        description = "Start a sub-agent on a task: a new session (or n sessions of one group) whose first turn runs in the background. Returns at once with each session's id, name, handle and status `running`; then `wait`. The server's settings are ceilings: an argument may narrow the sub-agent's box (fewer hosts, tools, less time or money), never widen it (`forbidden`)."
    )]
    async fn start(&self, Parameters(a): Parameters<StartArgs>) -> CallToolResult {
        answer(turns::start(&self.defaults, a).await)
    }

    #[tool(
        description = "Send a session its next prompt; the turn runs in the background and this returns at once. A session whose turn is still running is refused (`busy`)."
    )]
    async fn reply(&self, Parameters(a): Parameters<ReplyArgs>) -> CallToolResult {
        answer(turns::reply(&self.defaults, a).await)
    }

    #[tool(
        description = "Fork a session at a finished turn: n new sessions (1-8) whose conversation and workspace are the session's as they were at the end of that turn (default: its latest), so several sub-agents go on from one common start, e.g. one session plans and three forks implement. With a prompt each fork's first turn runs in the background, as `reply` starts one (then `wait`); without, the forks wait for a `reply`. Returns each fork's id, name, handle and `forked_from`. The session itself is only read."
    )]
    async fn fork(&self, Parameters(a): Parameters<ForkArgs>) -> CallToolResult {
        answer(fork::fork(&self.defaults, a).await)
    }

    #[tool(
        description = "Wait until the sessions' running turns ended (mode `all`) or one did (`any`), or timeout_s passed; returns each session's status. Sends progress notifications (the latest event of each) every few seconds when the call carries a progress token."
    )]
    async fn wait(
        &self,
        Parameters(a): Parameters<WaitArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let progress = Progress {
            token: context.meta.get_progress_token(),
            peer: context.peer.clone(),
        };
        let queue = self.defaults.queue.clone();
        let work = turns::wait(self.policy(), a, queue, progress);
        answer(
            cancellable(
                &context,
                shutdown::until_stopping(&self.defaults.shutdown, work),
            )
            .await,
        )
    }

    #[tool(
        description = "A session's status, cheap enough to poll: status, turn, elapsed seconds, the latest event (at most 200 characters), usage and cost so far."
    )]
    async fn status(
        &self,
        Parameters(a): Parameters<SessionArg>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            read::status(&id, self.defaults.queue.clone()).await
        };
        answer(cancellable(&context, work).await)
    }

    #[tool(
        description = "A turn's unified events (text, tool_call, tool_result, usage, error, result) after a cursor, at most `limit` (200) of them, the next cursor and whether there are `more`."
    )]
    async fn events(
        &self,
        Parameters(a): Parameters<EventsArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            read::events(&id, a.turn, a.cursor.unwrap_or(0), a.limit).await
        };
        answer(cancellable(&context, work).await)
    }

    #[tool(
        description = "How a finished turn ended: status and exit code, the final message, usage, cost, duration, the files changed (path, lines added and removed) and the resume handle."
    )]
    async fn result(
        &self,
        Parameters(a): Parameters<ResultArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            read::result(&id, a.turn).await
        };
        answer(cancellable(&context, work).await)
    }

    #[tool(
        description = "The session's changes as a patch that `git apply` takes on the directory as it was when the session started: the first text block is the patch, byte for byte what `apply` applies and `caw-box diff --patch` writes (protected paths such as .git/hooks are left out). At most `max_bytes` (1 MiB) of it: a longer one is cut where a file begins and says `truncated: true`; its size and files changed are in the structured content."
    )]
    async fn diff(
        &self,
        Parameters(a): Parameters<DiffArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            diff::diff(&id, a.max_bytes).await
        };
        cancellable(&context, work)
            .await
            .unwrap_or_else(|e| error_result(&e))
    }

    #[tool(
        description = "Apply a copy-mode session's patch to the directory it was started from. All or nothing: on a conflict nothing is written and the error says why (`conflict`). `check: true` only checks."
    )]
    async fn apply(&self, Parameters(a): Parameters<ApplyArgs>) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            apply::apply(&id, a.check.unwrap_or(false)).await
        };
        answer(work.await)
    }

    #[tool(
        description = "Stop a session's running turn; returns within 10 seconds. The session stays resumable: `reply` continues it."
    )]
    async fn cancel(&self, Parameters(a): Parameters<SessionArg>) -> CallToolResult {
        answer(turns::cancel(self.policy(), &a.session).await)
    }

    #[tool(
        description = "This server's sessions, newest first (also those an earlier server of the same scope started): id, name, group, provider, turns, status, cost, handle."
    )]
    async fn list(
        &self,
        Parameters(a): Parameters<ListArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let queue = self.defaults.queue.clone();
        let work = read::list(&self.policy().scope, a.group, a.status.as_deref(), queue);
        answer(cancellable(&context, work).await)
    }

    #[tool(
        description = "Delete one of this server's sessions with its container and volumes. A session whose turn is running is refused unless force."
    )]
    async fn remove(&self, Parameters(a): Parameters<RemoveArgs>) -> CallToolResult {
        let work = async {
            let id = self.session(&a.session).await?;
            let client = crate::Client::connect().await?;
            let id = client.remove(&id, a.force.unwrap_or(false)).await?;
            Ok(json!({ "removed": id.to_string() }))
        };
        answer(work.await)
    }
}

// The server's own router (its schemas narrowed to its ceilings), not a fresh one per call.
#[tool_handler(router = self.tool_router)]
impl ServerHandler for Delegation {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("caw-box", crate::VERSION)
                    .with_title("caw-box delegation server"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}
