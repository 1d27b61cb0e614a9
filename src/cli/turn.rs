//! `run` and `resume`: the flags of a turn, and the session settings they share with config
//! files and `config show` ([`SettingsArgs`]).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::OutputFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkspaceModeArg {
    /// Bind when the Docker daemon sees the directory, else copy (the default).
    Auto,
    /// Mount the directory itself: the agent's changes are in it.
    Bind,
    /// Copy it into a volume of the session's own; the directory is never touched.
    Copy,
    /// No workspace.
    None,
}

/// Options shared by `run` and `resume`.
#[derive(Debug, Args, Clone, Default)]
pub struct TurnArgs {
    /// The prompt; `-` reads it from stdin. Without one, on a terminal, the vendor's own
    /// interactive TUI opens in the container (quit it to end the turn).
    pub prompt: Option<String>,
    /// Read the prompt from a file: the way for a long one (a command-line argument holds at
    /// most 128 KiB; `-` reads stdin). A prompt takes up to 1 MiB.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// An environment variable for the CLI: `K=V`, or `K` to pass the host's value. Values
    /// are treated as secrets and not remembered: pass them again on resume.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: OutputFormat,
    /// Start the turn in the background, print the session id, and return at once.
    #[arg(short, long)]
    pub detach: bool,
    /// `broker` (default where it works): a collected API key, Claude login
    /// (`.credentials.json`, Keychain), codex or opencode ChatGPT login (`auth.json`) or
    /// gemini Google login stays outside the agent's container; the CLI gets a placeholder,
    /// and a credential broker (one per network and key, shared by the turns there; a
    /// turn's own for opencode's login, which it reaches as chatgpt.com by TLS interception
    /// with a CA of that turn) adds the real key on the way to the model, and refreshes the
    /// login for all of them (on Kubernetes the broker is a sidecar in the turn's pod, for
    /// API keys). `inject`: the real credentials reach the CLI through a private file
    /// (always so for logins on Kubernetes and `--network none|host`, for now).
    #[arg(long, value_enum, value_name = "MODE", env = "CAW_BOX_CREDENTIALS")]
    pub credentials: Option<CredentialsArg>,
    /// When the vendor's usage or rate limit stops the turn: `fail` (exit 5, the default),
    /// `wait` (for the reset the CLI reports, with a progress line; then the same prompt
    /// again in the same session), `park` (the session is `parked` until the reset, and so is
    /// every parking session of the same account meanwhile; then it goes on in its own
    /// conversation, started by whichever caw-box is there; works with --detach and is
    /// remembered by the session), or `fallback=PROVIDER[,PROVIDER]` (the same prompt and
    /// settings in a new, linked session of the next provider; `show` and `ls` show the link).
    #[arg(long, value_name = "fail|wait|park|fallback=P[,P]")]
    pub on_limit: Option<String>,
    /// The longest `--on-limit wait` waits in all, e.g. `10m` (default 6h); a reset further
    /// off ends the turn with exit 5.
    #[arg(long, value_name = "DURATION")]
    pub max_wait: Option<String>,
}

/// How a turn gets its credentials (`--credentials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CredentialsArg {
    Broker,
    Inject,
}

/// The settings of a session that flags, `CAW_BOX_*` variables and config files can set
/// (`config` resolves them; `settings` checks them).
#[derive(Debug, Args, Clone, Default)]
pub struct SettingsArgs {
    /// The host directory mounted at /workspace (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// How the workspace reaches the container.
    #[arg(long, value_enum, value_name = "MODE")]
    pub workspace_mode: Option<WorkspaceModeArg>,
    /// The image to run (default: caw-box/<provider>:latest).
    #[arg(long)]
    pub image: Option<String>,
    /// The model the CLI asks for.
    #[arg(long)]
    pub model: Option<String>,
    /// Stop the turn after this long, e.g. `30m` (exit 124).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Stop the turn when the CLI prints nothing for this long, e.g. `10m` (exit 124;
    /// `off` to disable). Off by default; CI jobs want it.
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<String>,
    /// Stop the turn when the CLI reports that it cannot reach its model and no answer came
    /// for this long (exit 3, status `unreachable`; default 60s; `off` to disable).
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
    /// Keep the session's container idle for this long after a headless turn, e.g. `5m`:
    /// the next turn runs in it instead of a new one (no container start). It ends itself when
    /// that passes without a turn. `off` to stop keeping it.
    #[arg(long, value_name = "DURATION")]
    pub keep_warm: Option<String>,
    /// `off`: keep no checkpoint of the session's turns (`on`, the default: every turn's end
    /// is one, which `caw-box fork` starts from; a turn then costs a few percent more, and a
    /// copy-mode workspace is held once more in the session's first checkpoint). Remembered
    /// by the session; a resume's `--checkpoints` applies to its turn.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub checkpoints: Option<bool>,
    /// Memory limit, e.g. `2g`.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU limit, e.g. `1.5`.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// What the session may spend over all its turns, in USD (e.g. `2.50`), priced from the
    /// CLI's usage by caw-box's price table (or the CLI's own cost). A turn that crosses it
    /// ends with status `budget` (exit 6) and the next turn is refused; a resume's
    /// `--max-cost` raises it. opencode reports usage after each step, so its turn is
    /// stopped mid-way; claude, codex and gemini report it only at the turn's end, so their
    /// turn runs to its answer and the next one is refused.
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// Process limit.
    #[arg(long, value_name = "N")]
    pub pids_limit: Option<i64>,
    /// At most N turns of this session's account (its stored login or key) in flight at
    /// once, across every caw-box process of this host; a turn over it is `queued` until
    /// one ends. `0`: no cap.
    #[arg(long, value_name = "N")]
    pub per_account: Option<i64>,
    /// `open` (default bridge), `host`, or an existing network's name (e.g. an internal one
    /// with a model gateway on it): where the egress proxy (under `--egress open`, the agent)
    /// reaches out. `none` is refused: the CLI could not reach its model; `host` takes only
    /// `--egress open`.
    #[arg(long)]
    pub network: Option<String>,
    /// A host the agent may reach besides its --egress policy's (repeatable), through
    /// caw-box's proxy: `HOST[:PORT]`, `*.example.com`, or `@provider` for the provider's API
    /// host (or the --endpoint host). With a collected API key, model traffic leaves through
    /// the credential broker: the provider's host need not be reachable from the agent, and
    /// the agent holds no key. On Kubernetes egress is held inside the turn's pod (an init
    /// container's iptables rules and the proxy as a sidecar: no NetworkPolicy needed; the
    /// namespace's PodSecurity level must allow NET_ADMIN).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,
    /// What the agent may reach besides its model, through caw-box's egress proxy:
    /// `balanced` (the default: the model's API and the common package and source hosts,
    /// npm, PyPI, crates.io, GitHub...), `locked` (the model's API only) or `open`
    /// (anything). --allow-host adds hosts to balanced or locked. A refused host gets an
    /// HTTP 403 that names it; every turn records the hosts it reached and was refused
    /// (`caw-box show`). Remembered by the session; a resume's --egress applies to its turn.
    #[arg(long, value_name = "POLICY", value_parser = ["balanced", "locked", "open"])]
    pub egress: Option<String>,
    /// Keep PATH read-only to the agent in a bound workspace (repeatable), beyond the
    /// defaults, e.g. `--protect Makefile`; relative to the workspace's top. Remembered by
    /// the session; a resume's --protect/--unprotect apply to its turn.
    #[arg(long = "protect", value_name = "PATH", long_help = protect_help())]
    pub protect: Vec<String>,
    /// Let the agent write a default protected PATH (or what is under it) in this session
    /// (repeatable), e.g. `--unprotect .git/hooks`. Config key `unprotect` (user file or
    /// CAW_BOX_UNPROTECT; a project file cannot). Remembered by the session.
    #[arg(long = "unprotect", value_name = "PATH")]
    pub unprotect: Vec<String>,
    /// Send the CLI's model traffic to this base URL (a proxy, gateway or local server).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The OCI runtime of the agent's container, e.g. `--runtime runsc` (gVisor: the agent
    /// gets a kernel of its own, not the host's), or any runtime the daemon lists (`caw-box
    /// doctor` shows them and how to add gVisor); `default`: the daemon's default. On
    /// Kubernetes, the turn pod's RuntimeClass (`runtimeClassName`). One the daemon (the
    /// cluster) does not have is refused, exit 3, before anything is created. Remembered by
    /// the session; a resume's `--runtime` runs that turn so.
    #[arg(long, value_name = "NAME")]
    pub runtime: Option<String>,
    /// Replace the CLI's default system prompt with TEXT (or @FILE's contents). Remembered
    /// by the session. claude keeps its one identity line before it (docs/agent-settings.md).
    #[arg(long, value_name = "TEXT|@FILE")]
    pub system_prompt: Option<String>,
    /// Add TEXT (or @FILE's contents) to the CLI's system prompt. Remembered by the session.
    #[arg(long, value_name = "TEXT|@FILE")]
    pub append_system_prompt: Option<String>,
    /// How hard the model thinks: low, medium or high. Remembered by the session.
    #[arg(long, value_name = "LEVEL")]
    pub effort: Option<String>,
    /// The tool groups the agent may use: some of read,edit,shell,web,mcp (the others are
    /// taken away), `all` or `none`. A group the CLI cannot take away is refused (exit 2).
    /// Remembered by the session.
    #[arg(long, value_name = "GROUPS")]
    pub tools: Option<String>,
    /// Keep this tool (the CLI's own name) although its group is not in --tools
    /// (repeatable). Remembered by the session.
    #[arg(long = "allow-tool", value_name = "NAME")]
    pub allow_tool: Vec<String>,
    /// Take this tool (the CLI's own name) away (repeatable). Remembered by the session.
    #[arg(long = "deny-tool", value_name = "NAME")]
    pub deny_tool: Vec<String>,
    /// An MCP server for the agent (repeatable): `NAME=COMMAND ARGS...` runs in the agent's
    /// container (stdio), `NAME=URL` is an HTTP server (with --allow-host, its host is
    /// admitted). Remembered by the session; a resume's `--mcp NAME=...` replaces NAME.
    #[arg(long = "mcp", value_name = "NAME=COMMAND|URL")]
    pub mcp: Vec<String>,
    /// A variable for MCP server NAME's process (repeatable). The value is a secret: not
    /// remembered, never in container config or logs; pass it again on resume.
    #[arg(long = "mcp-env", value_name = "NAME:KEY=VALUE")]
    pub mcp_env: Vec<String>,
    /// A header for HTTP MCP server NAME (repeatable), e.g. `docs:Authorization=Bearer x`.
    /// The value is a secret like --mcp-env's.
    #[arg(long = "mcp-header", value_name = "NAME:HEADER=VALUE")]
    pub mcp_header: Vec<String>,
}

/// `on` or `off` (also `true`/`false`, `yes`/`no`, `1`/`0`, as config values read).
pub fn parse_on_off(value: &str) -> Result<bool, String> {
    match value.trim() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        other => Err(format!("'{other}' is neither on nor off")),
    }
}

/// `--protect`'s long help, with the default set (docs/walls.md explains each).
fn protect_help() -> String {
    let defaults: Vec<&str> = crate::session::protect::DEFAULT_PROTECTED
        .iter()
        .map(|(p, _)| *p)
        .collect();
    format!(
        "Keep PATH read-only to the agent in a bound workspace (repeatable), beyond the defaults, \
e.g. `--protect Makefile`; relative to the workspace's top. A protected path that exists when a \
turn starts is read-only in the agent's container; one the agent creates is moved after the turn \
to a quarantine directory the warning names. Remembered by the session (config key `protect`); \
a resume's --protect/--unprotect apply to its turn. `show` lists a session's set.\n\n\
Protected by default: {}",
        defaults.join(", ")
    )
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// claude_code (or claude, cc), codex, opencode, gemini (or `provider` in a config file).
    #[arg(long, short = 'p')]
    pub provider: Option<String>,
    /// A unique name for the session.
    #[arg(long)]
    pub name: Option<String>,
    /// Tag the session with a group.
    #[arg(long)]
    pub group: Option<String>,
    /// Copy your own setup of the CLI (e.g. ~/.claude/CLAUDE.md, skills, agents,
    /// commands, settings without credentials) into the new session's HOME.
    #[arg(long)]
    pub user_config: bool,
    #[command(flatten)]
    pub turn: TurnArgs,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// A handle, session id, unique id prefix (4+ characters) or session name.
    /// With --group, leave it out: the first argument is then the prompt.
    pub target: Option<String>,
    /// Send the prompt to every session of this group, in parallel.
    #[arg(long)]
    pub group: Option<String>,
    #[command(flatten)]
    pub turn: TurnArgs,
}

/// `caw-box fork`'s flags: which session and turn, how many forks, and (for the forks'
/// first turn, when a PROMPT is given) a turn's flags, as `resume` takes them.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// A handle, session id, unique id prefix (4+ characters) or session name.
    pub target: String,
    /// The turn whose end the forks start from (default: the session's latest turn).
    #[arg(long, value_name = "TURN")]
    pub at: Option<u32>,
    /// How many forks to make, 1 to 8.
    #[arg(short = 'n', long = "count", value_name = "N", default_value_t = 1)]
    pub count: u32,
    /// The fork's name; with -n, NAME-1 ... NAME-N.
    #[arg(long)]
    pub name: Option<String>,
    /// Put the forks in this group.
    #[arg(long)]
    pub group: Option<String>,
    /// Fork into another vendor's CLI (claude_code, codex, opencode, gemini). A
    /// conversation cannot move between vendors: the forks get the checkpoint's workspace
    /// and a handoff (the source's prompts and answers up to the turn, the files it
    /// changed) ahead of their first prompt. A handoff, not a copy.
    #[arg(long, short = 'p', value_name = "PROVIDER")]
    pub provider: Option<String>,
    #[command(flatten)]
    pub turn: TurnArgs,
}
