//! The command line, as clap types only: data, no logic. `settings` resolves these into
//! what the commands act on.
//!
//! - `mod.rs`: the top level (global flags, the commands) and the value enums that become
//!   other modules' types (`-o`, `--store`)
//! - `turn.rs`: `run` and `resume`: a turn's flags and the session settings
//! - `subcommands.rs`: `auth`, `config`, `session` and `image`, each with subcommands
//!
//! The files beside this one use clap and this module, nothing else of caw-box's.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

mod subcommands;
mod turn;

pub use subcommands::{
    AuthCommand, AuthLoginArgs, ConfigCommand, ConfigShowArgs, ImageBuildArgs, ImageCommand,
    ImagePullArgs, McpArgs, PoolCommand, PoolStartArgs, SessionCommand,
};
pub use turn::{
    parse_on_off, CredentialsArg, ForkArgs, ResumeArgs, RunArgs, SettingsArgs, TurnArgs,
    WorkspaceModeArg,
};

const RUN_EXAMPLES: &str = "\
Examples:
  caw-box run --provider claude \"fix the failing test\"
  caw-box run --provider codex --name fixer -o json \"explain src/main.rs\"
  echo \"summarise the README\" | caw-box run --provider gemini -
  caw-box run --provider codex --prompt-file task.md   # a long prompt (up to 1 MiB)
  caw-box run --provider opencode --endpoint http://gateway:8080 --env OPENAI_API_KEY \"hi\"
  caw-box run --provider codex --name live      # no prompt: codex's own TUI, in this terminal
  caw-box run --provider claude --egress locked \"fix it\"   # only the model's API is reachable
  caw-box run --provider codex --allow-host docs.internal:443 \"fix it\"   # and one host more
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
  git diff main | caw-box resume fixer -         # the prompt on stdin (up to 1 MiB)
  caw-box resume \"$(caw-box handle fixer)\" \"go on\"  # the handle alone
  caw-box resume --group team \"rebase on main\"      # every session of a group
  caw-box resume fixer                          # no prompt: the same conversation in the TUI
  caw-box resume fixer --on-limit wait \"go on\"   # a usage limit: wait for its reset, then again

A resumed session keeps the settings it was started with (flags override them); of the config
files and CAW_BOX_* variables only env_pass and labels apply to its turns.";

const FORK_EXAMPLES: &str = "\
Examples:
  caw-box fork fixer --at 3 --name retry           # a new session as fixer was after turn 3
  caw-box fork fixer -n 3 \"try another approach\"   # three forks of the latest turn, each runs it
  caw-box fork fixer -n 3 -d --group tries \"go\"    # the same, detached; `caw-box wait` each
  caw-box fork 5b0c -o json                        # {\"sessions\":[{\"session_id\",\"name\",\"handle\",\"forked_from\"}]}
  caw-box fork fixer --provider gemini \"review it\"  # gemini takes over: a handoff, not a copy

The forks remember exactly the turns up to TURN, for every provider; `show --json`, `ls --json`
and the handle carry `forked_from: {session, turn}`. With --provider of another vendor the fork
starts its own conversation, whose first turn gets the handoff ahead of its prompt.";

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
    /// With --version: one JSON object, caw-box's version and each provider's image, npm
    /// package and pinned CLI version (e.g. `caw-box --version --json`).
    #[arg(long = "json", requires = "version")]
    pub version_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The `-o` format of the command (`run`, `resume`, `wait`); text for the others.
    pub fn output_format(&self) -> OutputFormat {
        match &self.command {
            Command::Run(args) => args.turn.output,
            Command::Resume(args) => args.turn.output,
            Command::Fork(args) => args.turn.output,
            Command::Wait { output, .. } => *output,
            _ => OutputFormat::Text,
        }
    }

    /// The TARGET arguments of a command that names sessions (`resume`, `show`, `wait`,
    /// `logs`, `rm`, ...): where a resume handle may be, whose backend, namespace and kube
    /// context the process then takes when no flag says otherwise.
    pub fn targets(&self) -> Vec<&str> {
        match &self.command {
            Command::Resume(args) if args.group.is_none() => {
                args.target.as_deref().into_iter().collect()
            }
            Command::Fork(args) => vec![args.target.as_str()],
            Command::Show { target, .. }
            | Command::Logs { target, .. }
            | Command::Wait { target, .. }
            | Command::Stop { target }
            | Command::Warm { target, .. }
            | Command::Export { target, .. }
            | Command::Diff { target, .. }
            | Command::Handle { target, .. }
            | Command::Session(SessionCommand::Export { target, .. }) => vec![target.as_str()],
            Command::Rm { targets, .. } => targets.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether a `--version` that clap answered asked for JSON: `--json` before or after it
/// (clap answers at `--version` and reads no further).
pub fn version_json_in(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
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
    /// New sessions from a session's checkpoint: its conversation and workspace as they were
    /// at the end of a turn
    ///
    /// Every turn's end is a checkpoint (`caw-box show` lists them). Each fork is a whole
    /// session of its own (its own volumes, handle and name), resumable, exportable and
    /// removable without touching TARGET, which stays as it is. With a PROMPT, each fork's
    /// first turn runs it (in parallel; `-d` detaches them). A bind-mode session's workspace
    /// is your directory, which no checkpoint holds: its forks get a copy of it as it is now.
    #[command(
        after_help = FORK_EXAMPLES,
        mut_arg("prompt", |a| a.help(
            "The first turn of each fork; `-` reads it from stdin. Without one, the forks are \
             made and no turn runs"
        ).long_help(None::<&str>))
    )]
    Fork(ForkArgs),
    /// List sessions, newest first (from Docker itself).
    #[command(
        after_help = "Examples:\n  caw-box ls\n  caw-box ls --group team --json\n  caw-box ls --tree"
    )]
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// Draw each session's forks under it (`caw-box fork`), each with the turn it was
        /// forked at; sessions without family are listed as without `--tree`.
        #[arg(long, conflicts_with = "json")]
        tree: bool,
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
    /// Start a session's container ahead of its next turn, which runs in it
    ///
    /// See `--keep-warm`: idle, the container holds no credential and runs no CLI, and ends
    /// itself when DURATION passes without a turn.
    #[command(
        after_help = "Examples:\n  caw-box warm fixer --for 10m     # then: caw-box resume fixer \"...\"\n  caw-box warm fixer               # as long as the session's --keep-warm"
    )]
    Warm {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// How long the container waits for a turn (and after each): 90s, 10m, 1h. Default:
        /// the session's --keep-warm.
        #[arg(long = "for", value_name = "DURATION")]
        for_: Option<String>,
    },
    /// Keep boxes ready for new sessions: a first turn starts in a running container
    ///
    /// A pool's boxes are made for the settings `run` would give a new session here (the
    /// same flags, config files and variables); a `run` (also `-d`, Python's
    /// `start_session`, MCP's `start`) whose settings are exactly those claims one, and a
    /// new one is made in the background. A box holds no credential and no prompt: those
    /// reach the turn that claims it.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Copy a copy-mode session's workspace out to DIR.
    ///
    /// The agent's changes to the session's protected paths (`.git/config`, `.git/hooks/`,
    /// `.envrc`, `.vscode/`, ... as `caw-box show` lists them) are left out and named on
    /// stderr: programs on this machine would run them by themselves. Protected files the
    /// agent left as they were copied are written as usual.
    #[command(
        after_help = "Examples:\n  caw-box export fixer ./fixer-result\n  caw-box export fixer . --force\n  caw-box export fixer ./fixer-result --json\n  caw-box export fixer ./review --include-protected   # also the agent's hooks, config, ..."
    )]
    Export {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        dir: std::path::PathBuf,
        /// Write into a non-empty DIR, over files of the same name.
        #[arg(long)]
        force: bool,
        /// Also write the agent's changes to protected paths (git hooks and config, `.envrc`,
        /// editor tasks, ...). Read them before git, direnv or an editor runs them, e.g.
        /// `caw-box export fixer ./review --include-protected`.
        #[arg(long)]
        include_protected: bool,
        /// Print what was written as one JSON object on stdout (with the protected changes,
        /// each `included` or not), e.g. `caw-box export fixer ./out --json`.
        #[arg(long)]
        json: bool,
    },
    /// What the agent changed: a listing (copy mode), or a patch (`--patch`).
    ///
    /// The listing is of a copy-mode workspace; the patch, of a copy-mode workspace or of a
    /// bind-mode git workspace, against the workspace as it was at session start. The patch
    /// leaves out the agent's changes to the session's protected paths and names them on
    /// stderr (a patch never carries `.git` itself).
    #[command(
        after_help = "Examples:\n  caw-box diff fixer\n  caw-box diff fixer --patch fixer.patch && git apply fixer.patch\n  caw-box diff fixer --patch | git apply --check\n  caw-box diff fixer --patch fixer.patch --json\n  caw-box diff fixer --patch fixer.patch --include-protected"
    )]
    Diff {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// A patch that `git apply` takes on the workspace as it was at session start (new,
        /// deleted, renamed, binary and mode changes), to FILE, or stdout without one (or `-`).
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
        patch: Option<PathBuf>,
        /// Let the patch carry the agent's changes to protected paths too (`.envrc`,
        /// `.vscode/`, `.gitmodules`, ...), e.g. `caw-box diff fixer --patch f.patch
        /// --include-protected`.
        #[arg(long, requires = "patch")]
        include_protected: bool,
        /// With `--patch FILE`: print what was written as one JSON object on stdout (with the
        /// protected changes, each `included` or not), e.g. `caw-box diff fixer --patch
        /// f.patch --json`.
        #[arg(long, requires = "patch")]
        json: bool,
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
    /// Delete finished sessions with no activity for a while, or (`--checkpoints`) prune
    /// sessions' old checkpoints.
    #[command(
        after_help = "Examples:\n  caw-box gc --older-than 7d --dry-run\n  caw-box gc --older-than 12h\n  caw-box gc --checkpoints              # each session keeps its latest checkpoint\n  caw-box gc --checkpoints --keep 3 --group team"
    )]
    Gc {
        /// How long a session must have been idle.
        #[arg(long, value_name = "DURATION", default_value = "7d")]
        older_than: String,
        /// Remove no session: prune each session's checkpoints to its latest (`--keep`), never
        /// its latest one. The oldest kept is first made whole where it held only changes. A
        /// session running a turn is left alone.
        #[arg(long, conflicts_with = "older_than")]
        checkpoints: bool,
        /// With `--checkpoints`: how many of each session's latest checkpoints stay (1 or more).
        #[arg(long, value_name = "N", default_value_t = 1, requires = "checkpoints")]
        keep: u32,
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
    /// Collect host credentials or log in, into caw-box's store; manage them.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Build and list caw-box's images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Move a session to another Docker host: export it to one archive, import it there.
    #[command(subcommand)]
    Session(SessionCommand),
    /// An MCP server (stdio) through which an agent delegates to boxed, resumable sub-agents
    ///
    /// An MCP server for Claude Code, Codex, opencode, Cursor or any MCP client. Its tools
    /// start sessions (`start`, also n at once), continue them (`reply`), wait with progress
    /// (`wait`), read them (`status`, `events`, `result`, `diff`), bring their changes back
    /// (`apply`), stop them (`cancel`) and clean up (`list`, `remove`).
    #[command(after_help = subcommands::MCP_EXAMPLES)]
    Mcp(McpArgs),
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
    /// Waits for the container that finishes a session's turn behind it, and removes it
    /// (started in the background by the turn's end).
    #[command(name = "__settle", hide = true)]
    Settle { session: uuid::Uuid },
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
