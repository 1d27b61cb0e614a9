//! The command groups with subcommands of their own: `auth`, `config`, `session`, `image`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{SettingsArgs, StoreArg};

const IMAGE_BUILD_EXAMPLES: &str = "\
Examples:
  caw-box image build --all
  caw-box image build --provider codex --cli-version 0.169.0
  caw-box image build --all --base node:20-bookworm-slim --ca-cert /etc/ssl/certs/corp-ca.pem";

const IMAGE_PULL_EXAMPLES: &str = "\
Examples:
  caw-box image pull --image-repo ghcr.io/OWNER/caw-box --provider codex
  caw-box --image-repo ghcr.io/OWNER/caw-box run --provider codex \"fix the test\"
  CAW_BOX_IMAGE_REPO=ghcr.io/OWNER/caw-box caw-box image pull --all --tag 0.1.0";

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
    /// Log in with the vendor CLI's own headless flow in a short-lived container of its
    /// image (no vendor CLI on this host), or store an API key read from stdin; the result
    /// goes to caw-box's store only, never to the host's vendor directories.
    #[command(after_help = AUTH_LOGIN_EXAMPLES)]
    Login(AuthLoginArgs),
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

const AUTH_LOGIN_EXAMPLES: &str = "\
Examples:
  caw-box auth login --provider codex                 # prints a URL and a one-time code
  caw-box auth login --provider opencode              # ChatGPT, the same device code flow
  caw-box auth login --provider claude                # prints a URL; paste the code it shows
  caw-box auth login --provider gemini                # Google: a URL; paste the code it shows
  printenv OPENAI_API_KEY | caw-box auth login --provider codex --with-api-key
  caw-box auth login --provider gemini --with-api-key # type the key (not echoed), Enter
  caw-box auth login --provider claude --with-api-key # paste what `claude setup-token` printed

Flows (docs/credentials.md): codex `codex login --device-auth`; opencode `opencode auth login`
with ChatGPT Pro/Plus (headless); claude `claude auth login` (the code the page shows after
approval, `code#state`, pasted here); gemini its Google login in its own UI, on a terminal of
the container (the code the page shows, pasted here).
The login's container has no workspace and reaches only the vendor's auth hosts; with
--backend kubernetes it is a pod of the namespace, and the login lands in this host's store.";

/// `auth login`'s flags.
#[derive(Debug, Args)]
pub struct AuthLoginArgs {
    /// The provider to log in to.
    #[arg(long, short = 'p')]
    pub provider: String,
    /// Read an API key (or claude's long-lived token) from stdin instead of running the
    /// vendor's login: never an argument, never echoed.
    #[arg(long)]
    pub with_api_key: bool,
    /// The Docker network the login's egress proxy goes out on (`open`: the default
    /// bridge; NAME: an existing network, e.g. behind a gateway). Kubernetes: `open` only.
    #[arg(long, value_name = "NAME", default_value = "open")]
    pub network: String,
    /// A CA certificate (PEM) the vendor's CLI trusts besides its own (a TLS-intercepting
    /// corporate proxy).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// The image to run the vendor's CLI from (default: the provider's).
    #[arg(long)]
    pub image: Option<String>,
    /// Give up after this long (the vendor's codes last 15 minutes).
    #[arg(long, value_name = "DURATION", default_value = "15m")]
    pub timeout: String,
    /// For programs: the URL and code as one JSON object on stdout (`{"provider","url",
    /// "code"}`; claude's and gemini's: `{"provider","url","needs":"code"}`, then the code is
    /// read as one line from stdin) instead of a line on stderr, and at the end
    /// `{"provider","stored":[...]}` (the items stored, never a secret).
    #[arg(long)]
    pub json: bool,
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
        after_help = "Examples:\n  caw-box session export fixer fixer.tar.gz\n  caw-box session export 5b0c - | ssh ci-runner caw-box session import -\n  caw-box session export fixer fixer.tar.gz --checkpoints all   # forkable at any turn after import"
    )]
    Export {
        /// A handle, session id, unique id prefix (4+ characters) or session name.
        target: String,
        /// The archive to write (`-` for stdout).
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
        /// Which checkpoints go with it: `latest` (none in the archive; the import takes one
        /// of the latest turn, which `fork` then starts from) or `all` (every turn's, for a
        /// fork at any turn after the import).
        #[arg(long, value_name = "WHICH", default_value = "latest", value_parser = ["latest", "all"])]
        checkpoints: String,
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
    /// The vendor CLI version to install (default: the pinned one). One outside the tested
    /// range (docs/compatibility.md) builds, with a one-line warning.
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

pub const MCP_EXAMPLES: &str = "\
Examples:
  claude mcp add caw-box -- caw-box mcp               # Claude Code delegates through it
  caw-box mcp --egress locked                         # no sub-agent reaches any other host
  caw-box mcp --workspace-root ~/src --runtime runsc  # calls name dirs under ~/src; gVisor
  caw-box mcp --max-parallel 2                        # more turns than that wait, queued
  caw-box mcp --http 8765                             # Streamable HTTP on 127.0.0.1:8765/mcp
  caw-box mcp --http 0.0.0.0:8765 --token-file token  # off loopback: a bearer token
  caw-box mcp --network agents --endpoint http://gateway:8080 --env OPENAI_API_KEY

Tools: start, reply, fork, wait, status, events, result, diff, apply, cancel, list, remove
(docs/mcp.md). The flags are the defaults of every `start`, and its ceilings: a call's
arguments may narrow them (fewer hosts or tools, less time, memory or money), never widen
them (kind `forbidden`, naming the flag that would allow it); config files and CAW_BOX_*
variables come under them, as for `run`. Sessions live in Docker, not in the server: a new
server of the same --scope sees those an earlier one started. Credentials are brokered as
for `run`: neither the server nor the sub-agents hold a real key.";

/// `caw-box mcp`: the delegation server's settings.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// An environment variable for every sub-agent's CLI: `K=V`, or `K` to pass this
    /// host's value (repeatable). Not remembered by sessions: passed to every turn.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Run at most N of this server's turns at once: `start` and `reply` beyond that return
    /// status `queued`, and the turns start in the order they were asked for as running
    /// ones end. Queued turns live in the server: they are lost if it ends before they start.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub max_parallel: Option<u16>,
    /// Keep N boxes ready (1 to 16) for each kind of session this server starts (its
    /// provider and settings: `caw-box pool`, docs/pools.md): the first `start` of a kind
    /// makes its pool, the next ones' first turns start in ready boxes. The server's pools
    /// go when it stops. Docker's engine only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub pool: Option<u32>,
    /// What this server's sessions may spend together, in USD. Each turn it starts gets a
    /// session limit (--max-cost) of that session's spend plus its share of what is left
    /// (a turn running or queued counts at its limit); once nothing is left, `start` and
    /// `reply` are refused (kind `budget`). Counted by this server process: a new server
    /// counts from zero.
    #[arg(long, value_name = "USD")]
    pub max_cost_usd: Option<f64>,
    /// Serve MCP's Streamable HTTP transport on ADDR (`HOST:PORT`, or `PORT` on 127.0.0.1)
    /// instead of stdio, at http://ADDR/mcp. An address other than loopback needs
    /// --token-file.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// With --http: a file holding a bearer token (16+ characters), its owner's alone
    /// (`chmod 600`: one its group or others may read is refused); every request must carry
    /// `Authorization: Bearer <token>`, else 401.
    #[arg(long, value_name = "FILE", requires = "http")]
    pub token_file: Option<PathBuf>,
    /// A directory a tool call's `workspace` (and an `@FILE` in a prompt argument) must lie
    /// in, symlinks followed (repeatable). Default: --workspace if given, else the directory
    /// the server was started in.
    #[arg(long = "workspace-root", value_name = "DIR")]
    pub workspace_roots: Vec<PathBuf>,
    /// Let a tool call ask for `workspace_mode: bind`, a sub-agent editing the directory
    /// itself (by default only `copy` and `none`: changes come back by `diff` and `apply`).
    #[arg(long)]
    pub allow_bind: bool,
    /// The sessions this server starts, lists and may touch: it labels its sessions with the
    /// scope, and a session outside it (one `caw-box run` started, another scope's) is
    /// `not_found` to every tool. A new server of the same scope picks up what an earlier one
    /// started.
    #[arg(long, value_name = "NAME", default_value = "mcp")]
    pub scope: String,
    /// `park`: a session of this server stopped by its account's usage limit is `parked`
    /// (`status`: `resumes_at`), and so is every parking session of the account meanwhile;
    /// each goes on in its own conversation when the limit resets. `fail` (the default): the
    /// turn ends `usage_limit`.
    #[arg(long, value_name = "fail|park")]
    pub on_limit: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Make a pool for new sessions of these settings (`run`'s flags), and fill it.
    ///
    /// Its key (printed) names it; a pool of the same settings is resized. A box takes no
    /// prompt, name or `--env`: the `run` that claims one brings them.
    #[command(
        after_help = POOL_START_EXAMPLES,
        mut_arg("prompt", |a| a.hide(true)),
        mut_arg("prompt_file", |a| a.hide(true)),
        mut_arg("name", |a| a.hide(true)),
        mut_arg("detach", |a| a.hide(true)),
        mut_arg("env", |a| a.hide(true)),
        mut_arg("output", |a| a.hide(true))
    )]
    Start(Box<PoolStartArgs>),
    /// The pools of this host and their boxes: each box's age and whether it is ready.
    #[command(after_help = "Examples:\n  caw-box pool ls\n  caw-box pool ls --json")]
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove pools: their ready boxes (no container, volume or network of them stays) and
    /// their settings. Sessions that claimed a box are theirs and stay.
    #[command(
        after_help = "Examples:\n  caw-box pool stop 3f9a1c2b7d4e\n  caw-box pool stop --all"
    )]
    Stop {
        /// The pools' keys (`caw-box pool ls`).
        keys: Vec<String>,
        /// Every pool of this host.
        #[arg(long, conflicts_with = "keys")]
        all: bool,
    },
    /// Bring a pool to its size: replace stale boxes (an older image, past the pool's age)
    /// and make new ones. A claim starts this in the background.
    #[command(after_help = "Examples:\n  caw-box pool fill 3f9a1c2b7d4e")]
    Fill {
        /// The pool's key (`caw-box pool ls`).
        key: String,
        /// Start once process PID ended, or a few seconds passed (a claim's refill).
        #[arg(long, value_name = "PID", hide = true)]
        after: Option<u32>,
    },
}

const POOL_START_EXAMPLES: &str = "\
Examples:
  caw-box pool start --provider codex --size 2
  caw-box run --provider codex \"fix the failing test\"    # its first turn takes a ready box
  caw-box pool start --provider claude --size 4 --max-age 1h --egress locked
  caw-box pool start --provider codex --size 8 --serve  # a service that keeps it full
  caw-box --backend kubernetes pool start --provider codex --size 2   # warm pods
  caw-box pool ls
  caw-box pool stop --all";

/// `pool start`: the pool's size and age, and `run`'s flags for the settings of its boxes.
#[derive(Debug, Args)]
pub struct PoolStartArgs {
    /// How many boxes to keep ready (1 to 16).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub size: u32,
    /// How long a box waits for a claim before it is replaced: 90s, 30m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    pub max_age: String,
    /// Keep running, as a service, and keep the pool full: what is claimed, removed from
    /// outside or too old is replaced within seconds. Ctrl-C (or SIGTERM) ends the
    /// service and leaves the pool as it is (`caw-box pool stop` removes it); a `pool stop`
    /// from elsewhere ends it too.
    #[arg(long)]
    pub serve: bool,
    #[command(flatten)]
    pub run: super::RunArgs,
}
