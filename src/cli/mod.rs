//! The command line, as clap types only: data, no logic. `settings` resolves these into
//! what the commands act on.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const RUN_EXAMPLES: &str = "\
Examples:
  caw-box run --provider claude \"fix the failing test\"
  caw-box run --provider codex --name fixer -o json \"explain src/main.rs\"
  echo \"summarise the README\" | caw-box run --provider gemini -
  caw-box run --provider opencode --endpoint http://gateway:8080 --env OPENAI_API_KEY \"hi\"
  caw-box run --provider codex --name live      # no prompt: codex's own TUI, in this terminal
  caw-box run --provider claude --allow-host @provider \"fix it\"   # recommended locked-down setup
  caw-box run --provider claude --system-prompt @reviewer.md --effort high \"review src/\"
  caw-box run --provider gemini --tools read,web --deny-tool web_fetch \"what does it do?\"
  caw-box run --provider claude --mcp \"docs=node /workspace/tools/mcp.js\" \"look it up\"
  caw-box run --provider opencode --on-limit wait --max-wait 30m \"fix it\"   # wait out a limit
  caw-box run --provider codex --on-limit fallback=claude,gemini \"fix it\"    # or go elsewhere

A collected API key, Claude login, codex or opencode ChatGPT login or gemini Google login
never enters the agent's container: the CLI gets a placeholder, and a credential broker
outside it adds the real key (or access token, which it refreshes) on the way to the model
(opencode's login goes to chatgpt.com whatever its settings: the turn's own broker stands
in for that host with a certificate of a CA made for the turn, which only that turn's
container trusts). --credentials inject hands the CLI the real ones through a private file
instead; --network host and logins on the kubernetes backend are always injected for now.

Settings not given as flags come from CAW_BOX_* variables, then the project's .caw-box.toml,
then ~/.config/caw-box/config.toml: `caw-box config show` says which.";

const RESUME_EXAMPLES: &str = "\
Examples:
  caw-box resume fixer \"now add a test\"
  caw-box resume 5b0c \"and the docs\"            # a unique id prefix
  caw-box resume \"$(caw-box handle fixer)\" \"go on\"  # the handle alone
  caw-box resume --group team \"rebase on main\"      # every session of a group
  caw-box resume fixer                          # no prompt: the same conversation in the TUI
  caw-box resume fixer --on-limit wait \"go on\"   # a usage limit: wait for its reset, then again

A resumed session keeps the settings it was started with (flags override them); of the config
files and CAW_BOX_* variables only env_pass and labels apply to its turns.";

const IMAGE_BUILD_EXAMPLES: &str = "\
Examples:
  caw-box image build --all
  caw-box image build --provider codex --cli-version 0.169.0
  caw-box image build --all --base node:20-bookworm-slim --ca-cert /etc/ssl/certs/corp-ca.pem";

/// `caw-box --version`: caw-box's version and the vendor CLI versions its images pin.
fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{}\nvendor CLIs the images pin (`image build --cli-version` overrides):\n{}",
            env!("CARGO_PKG_VERSION"),
            crate::provider::pinned_cli_versions()
        )
    })
}

const IMAGE_PULL_EXAMPLES: &str = "\
Examples:
  caw-box image pull --image-repo ghcr.io/OWNER/caw-box --provider codex
  caw-box --image-repo ghcr.io/OWNER/caw-box run --provider codex \"fix the test\"
  CAW_BOX_IMAGE_REPO=ghcr.io/OWNER/caw-box caw-box image pull --all --tag 0.1.0";

#[derive(Debug, Parser)]
#[command(
    name = "caw-box",
    version,
    long_version = long_version(),
    about = "Run coding-agent CLIs (Claude Code, Codex, opencode, Gemini CLI) in Docker, unattended and resumable",
    after_help = "Examples:\n  caw-box image build --all\n  caw-box run --provider claude \"fix the failing test\"\n  caw-box resume <id> \"now add a test\"\n  caw-box doctor"
)]
pub struct Cli {
    /// More detail on stderr (repeat for debug logs, timed from the start; CAW_BOX_LOG takes
    /// a tracing filter such as `caw_box=debug,bollard=debug`).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// The Docker context to use, as `docker --context` (also DOCKER_CONTEXT); with
    /// `--backend kubernetes`, the kubeconfig context.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The repository of the images: `REPO/<image>:latest` is built, pulled and run (also
    /// CAW_BOX_IMAGE_REPO, config key image_repo; default caw-box, local builds).
    #[arg(long, global = true, value_name = "REPO")]
    pub image_repo: Option<String>,
    /// Where sessions run: docker (the default) or kubernetes (also CAW_BOX_BACKEND).
    #[arg(
        long,
        global = true,
        value_name = "BACKEND",
        env = "CAW_BOX_BACKEND",
        hide_env = true
    )]
    pub backend: Option<String>,
    /// The Kubernetes namespace (also CAW_BOX_NAMESPACE; default: the kubeconfig's).
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        env = "CAW_BOX_NAMESPACE",
        hide_env = true
    )]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The `-o` format of the command (`run`, `resume`, `wait`); text for the others.
    pub fn output_format(&self) -> OutputFormat {
        match &self.command {
            Command::Run(args) => args.turn.output,
            Command::Resume(args) => args.turn.output,
            Command::Wait { output, .. } => *output,
            _ => OutputFormat::Text,
        }
    }
}

/// The `-o`/`--output` format an unparsable command line asks for (text if none, or if its
/// value is the bad part): so that a bad flag under `-o json` still answers in JSON.
pub fn output_format_in(args: impl IntoIterator<Item = std::ffi::OsString>) -> OutputFormat {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .take_while(|a| a != "--")
        .collect();
    let mut format = OutputFormat::Text;
    for (i, arg) in args.iter().enumerate() {
        let value = match arg.as_str() {
            "-o" | "--output" => args.get(i + 1).map(String::as_str),
            a => a
                .strip_prefix("--output=")
                .or_else(|| a.strip_prefix("-o="))
                .or_else(|| a.strip_prefix("-o").filter(|v| !v.is_empty())),
        };
        if let Some(f) = value.and_then(|v| OutputFormat::from_str(v, false).ok()) {
            format = f;
        }
    }
    format
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a session and run its first turn (headless, or the vendor's TUI).
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Run the next turn of an existing session (headless, or the vendor's TUI).
    #[command(after_help = RESUME_EXAMPLES)]
    Resume(ResumeArgs),
    /// List sessions, newest first (from Docker itself).
    #[command(after_help = "Examples:\n  caw-box ls\n  caw-box ls --group team --json")]
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// Also sessions that were removed from Docker but are still in the host cache.
        #[arg(long)]
        all: bool,
        /// Only the sessions of this group.
        #[arg(long)]
        group: Option<String>,
    },
    /// A session's turns: prompt, result, status, usage, duration.
    #[command(after_help = "Examples:\n  caw-box show fixer\n  caw-box show 5b0c --json")]
    Show {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        #[arg(long)]
        json: bool,
    },
    /// A turn's unified events, one JSON object per line (or the CLI's raw output).
    #[command(
        after_help = "Examples:\n  caw-box logs fixer\n  caw-box logs fixer --turn 1 --raw\n  caw-box logs fixer -f      # follow the running turn"
    )]
    Logs {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// Which turn (default: the latest).
        #[arg(long, value_name = "N")]
        turn: Option<u32>,
        /// The CLI's own output instead of unified events.
        #[arg(long)]
        raw: bool,
        /// Follow the running turn until it ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Wait for a session's running turn to end and print its result.
    #[command(
        after_help = "Examples:\n  id=$(caw-box run -d --provider codex \"long task\")\n  caw-box wait \"$id\" -o json"
    )]
    Wait {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Stop a session's running turn; the session stays resumable.
    #[command(after_help = "Examples:\n  caw-box stop fixer")]
    Stop {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
    },
    /// Copy a copy-mode session's workspace out to DIR.
    #[command(
        after_help = "Examples:\n  caw-box export fixer ./fixer-result\n  caw-box export fixer . --force"
    )]
    Export {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        dir: std::path::PathBuf,
        /// Write into a non-empty DIR, over files of the same name.
        #[arg(long)]
        force: bool,
    },
    /// What the agent changed: a listing (copy mode), or a patch (`--patch`).
    ///
    /// The listing is of a copy-mode workspace; the patch, of a copy-mode workspace or of a
    /// bind-mode git workspace, against the workspace as it was at session start.
    #[command(
        after_help = "Examples:\n  caw-box diff fixer\n  caw-box diff fixer --patch fixer.patch && git apply fixer.patch\n  caw-box diff fixer --patch | git apply --check"
    )]
    Diff {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// A patch that `git apply` takes on the workspace as it was at session start (new,
        /// deleted, renamed, binary and mode changes), to FILE, or stdout without one (or `-`).
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
        patch: Option<PathBuf>,
    },
    /// Delete sessions: their containers and volumes.
    #[command(after_help = "Examples:\n  caw-box rm fixer\n  caw-box rm --group team --force")]
    Rm {
        /// Handles, session ids, unique id prefixes or session names.
        targets: Vec<String>,
        /// Also sessions whose turn is running (stops it).
        #[arg(long)]
        force: bool,
        /// Every session of this group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Delete finished sessions with no activity for a while.
    #[command(
        after_help = "Examples:\n  caw-box gc --older-than 7d --dry-run\n  caw-box gc --older-than 12h"
    )]
    Gc {
        /// How long a session must have been idle.
        #[arg(long, value_name = "DURATION", default_value = "7d")]
        older_than: String,
        /// List what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Only sessions of this group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Print a session's resume handle.
    #[command(after_help = "Examples:\n  caw-box handle fixer\n  caw-box handle 5b0c")]
    Handle {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
    },
    /// Collect host credentials into caw-box's store, and manage them.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Build and list caw-box's images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Move a session to another Docker host: export it to one archive, import it there.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Check the daemon, images and credentials; say what is wrong and how to fix it.
    #[command(after_help = "Examples:\n  caw-box doctor")]
    Doctor,
    /// Config files: the settings `run` would use here and where each comes from, and which
    /// files are read.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print caw-box's man page (roff), or write one page per command into --dir.
    #[command(
        hide = true,
        after_help = "Examples:\n  caw-box man > /usr/local/share/man/man1/caw-box.1\n  caw-box man --dir target/man"
    )]
    Man {
        /// Write caw-box.1 and one caw-box-COMMAND.1 per command into this directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Runs one detached turn (started by `run/resume --detach`; reads its job on stdin).
    #[command(name = "__drive", hide = true)]
    Drive,
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  caw-box completions bash > /etc/bash_completion.d/caw-box\n  caw-box completions zsh > \"${fpath[1]}/_caw-box\""
    )]
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    /// The answer and tool calls, readable, streaming.
    #[default]
    Text,
    /// One JSON object when the turn ends.
    Json,
    /// One unified event per line.
    StreamJson,
}

impl From<OutputFormat> for crate::output::Format {
    fn from(f: OutputFormat) -> Self {
        match f {
            OutputFormat::Text => crate::output::Format::Text,
            OutputFormat::Json => crate::output::Format::Json,
            OutputFormat::StreamJson => crate::output::Format::StreamJson,
        }
    }
}

/// `auth collect --store`: where caw-box keeps the secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    Files,
    Keyring,
}

impl From<StoreArg> for crate::auth::store::StoreKind {
    fn from(s: StoreArg) -> Self {
        match s {
            StoreArg::Files => crate::auth::store::StoreKind::Files,
            StoreArg::Keyring => crate::auth::store::StoreKind::Keyring,
        }
    }
}

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
    /// Read the prompt from a file.
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
    /// again in the same session), or `fallback=PROVIDER[,PROVIDER]` (the same prompt and
    /// settings in a new, linked session of the next provider; `show` and `ls` show the link).
    #[arg(long, value_name = "fail|wait|fallback=P[,P]")]
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
    /// Memory limit, e.g. `2g`.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU limit, e.g. `1.5`.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Process limit.
    #[arg(long, value_name = "N")]
    pub pids_limit: Option<i64>,
    /// `open` (default bridge), `host`, or an existing network's name (e.g. an internal one
    /// with a model gateway on it). `none` is refused: the CLI could not reach its model;
    /// `--allow-host @provider` is the locked-down setup.
    #[arg(long)]
    pub network: Option<String>,
    /// Egress only to this host (repeatable), through caw-box's proxy: `HOST[:PORT]`,
    /// `*.example.com`, or `@provider` for the provider's API host (or the --endpoint host).
    /// Recommended, with a collected API key: `--allow-host @provider`: model traffic leaves
    /// through the credential broker, the provider's host need not be reachable from the
    /// agent, and the agent holds no key. On Kubernetes it is held inside the turn's pod
    /// (an init container's iptables rules and the proxy as a sidecar: no NetworkPolicy
    /// needed; the namespace's PodSecurity level must allow NET_ADMIN).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,
    /// Send the CLI's model traffic to this base URL (a proxy, gateway or local server).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Replace the CLI's default system prompt with TEXT (or @FILE's contents). Remembered
    /// by the session.
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

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Copy what each CLI needs from this host (files, keyring entries, API-key variables)
    /// into caw-box's private store.
    #[command(
        after_help = "Examples:\n  caw-box auth collect\n  caw-box auth collect --provider claude --provider codex\n  caw-box auth collect --store keyring"
    )]
    Collect {
        /// The provider to collect for (repeatable; default: all).
        #[arg(long, short = 'p')]
        provider: Vec<String>,
        /// Where caw-box keeps the secrets: private files, or the OS keyring.
        #[arg(long, value_enum, default_value = "files")]
        store: StoreArg,
    },
    /// What is stored, from where, when, and when it expires.
    #[command(after_help = "Examples:\n  caw-box auth status\n  caw-box auth status --json")]
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The docker flags a plain `docker run` of a caw-box image needs (no secret values).
    #[command(
        after_help = "Examples:\n  docker run --rm $(caw-box auth flags --provider codex) caw-box/codex:latest codex exec \"hi\""
    )]
    Flags {
        #[arg(long, short = 'p')]
        provider: String,
    },
    /// Delete stored credentials.
    #[command(after_help = "Examples:\n  caw-box auth rm --provider gemini\n  caw-box auth rm")]
    Rm {
        /// The provider whose credentials to delete (repeatable; default: all).
        #[arg(long, short = 'p')]
        provider: Vec<String>,
    },
}

const CONFIG_SHOW_EXAMPLES: &str = "\
Examples:
  caw-box config show
  caw-box config show --json
  caw-box config show --provider codex --model gpt-5.5   # as `run` with these flags would
  caw-box config show --workspace ~/src/app              # the project file of another directory

Files (the nearer wins; flags > CAW_BOX_* variables > project > user > defaults):
  user     $CAW_BOX_CONFIG, else $XDG_CONFIG_HOME/caw-box/config.toml (XDG_CONFIG_HOME: ~/.config)
  project  .caw-box.toml in the workspace or a parent, up to the repository root (.git)

  # .caw-box.toml
  provider = \"codex\"
  model = \"gpt-5.5\"
  allow_host = [\"@provider\"]
  memory = \"2g\"
  timeout = \"30m\"
  env_pass = [\"OPENAI_API_KEY\"]   # names of host variables, never values";

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// The settings a new session would get here, and where each came from (flag, variable,
    /// project file, user file or default).
    #[command(after_help = CONFIG_SHOW_EXAMPLES)]
    Show(Box<ConfigShowArgs>),
    /// The config files caw-box reads here, in order, and whether each exists.
    #[command(
        after_help = "Examples:\n  caw-box config path\n  caw-box config path --workspace ~/src/app"
    )]
    Path {
        /// Where to look for the project file (default: the current directory).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
    },
}

/// `config show`: the flags `run` takes that settle settings, to see them win.
#[derive(Debug, Args)]
pub struct ConfigShowArgs {
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The provider `run` would be given.
    #[arg(long, short = 'p')]
    pub provider: Option<String>,
    /// The group `run` would be given.
    #[arg(long)]
    pub group: Option<String>,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Write a session (its state, its copy-mode workspace, its labels and record) to one
    /// archive. Never a credential: collected logins and keys stay on this host.
    #[command(
        after_help = "Examples:\n  caw-box session export fixer fixer.tar.gz\n  caw-box session export 5b0c - | ssh ci-runner caw-box session import -"
    )]
    Export {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// The archive to write (`-` for stdout).
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Recreate an exported session on this Docker host; its handle resumes it here.
    #[command(
        after_help = "Examples:\n  caw-box session import fixer.tar.gz\n  caw-box session import fixer.tar.gz --force\n  caw-box resume fixer \"go on\""
    )]
    Import {
        /// The archive (`-` for stdin).
        file: PathBuf,
        /// Replace a session of the same id on this host.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the base image and provider images from the Dockerfiles built into caw-box.
    #[command(after_help = IMAGE_BUILD_EXAMPLES)]
    Build(ImageBuildArgs),
    /// Pull the provider images from the image repository (`--image-repo`), instead of
    /// building them.
    #[command(after_help = IMAGE_PULL_EXAMPLES)]
    Pull(ImagePullArgs),
    /// List caw-box images: provider, CLI version, size, age.
    Ls,
    /// Remove untagged caw-box images left behind by earlier builds.
    Prune,
}

#[derive(Debug, Args)]
pub struct ImagePullArgs {
    /// The provider whose image to pull (repeatable).
    #[arg(long, short = 'p')]
    pub provider: Vec<String>,
    /// Pull all four provider images.
    #[arg(long, conflicts_with = "provider")]
    pub all: bool,
    /// The tag to pull (it is tagged `REPO/<image>:latest` here too, which `run` uses).
    #[arg(long, value_name = "TAG", default_value = "latest")]
    pub tag: String,
}

#[derive(Debug, Args)]
pub struct ImageBuildArgs {
    /// The provider whose image to build (repeatable).
    #[arg(long, short = 'p')]
    pub provider: Vec<String>,
    /// Build all four provider images.
    #[arg(long, conflicts_with = "provider")]
    pub all: bool,
    /// The image the base is built FROM (needs node >= 20).
    #[arg(long, value_name = "IMAGE", default_value = "node:20-bookworm-slim")]
    pub base: String,
    /// The vendor CLI version to install (default: the pinned one).
    #[arg(long, value_name = "V")]
    pub cli_version: Option<String>,
    /// A CA certificate (PEM) the install steps trust, e.g. a TLS-intercepting proxy's.
    /// The final image does not contain it.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Build even when the image is up to date (same Dockerfile, base image, CLI version
    /// and CA as the image that has the tag).
    #[arg(long)]
    pub force: bool,
    /// Build without the layer cache (implies --force).
    #[arg(long)]
    pub no_cache: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_of(line: &str) -> OutputFormat {
        output_format_in(line.split_whitespace().map(Into::into))
    }

    #[test]
    fn the_output_flag_is_found_in_any_spelling() {
        assert_eq!(
            format_of("caw-box run -o json --memory x"),
            OutputFormat::Json
        );
        assert_eq!(
            format_of("caw-box run --output=stream-json"),
            OutputFormat::StreamJson
        );
        assert_eq!(
            format_of("caw-box wait x --output json"),
            OutputFormat::Json
        );
        assert_eq!(format_of("caw-box run -ojson"), OutputFormat::Json);
        assert_eq!(format_of("caw-box run -o xml"), OutputFormat::Text);
        assert_eq!(format_of("caw-box run --bogus"), OutputFormat::Text);
        assert_eq!(format_of("caw-box run -- -o json"), OutputFormat::Text);
    }
}
