//! Commands: orchestration of settings, providers and the backend, one module per area.
//! Each returns the process exit code, or an error that `main` prints once.

mod ago;
pub mod auth;
pub mod config;
pub mod doctor;
pub mod fork;
pub mod gc;
pub mod image;
pub mod login;
pub mod manage;
pub mod pool;
pub mod portable;
pub mod show;
pub mod turn;
pub mod workspace;

use crate::cli::{AuthCommand, Cli, Command, ConfigCommand, ImageCommand};
use crate::error::Result;

/// Sets this process's image repository from the resolved `image_repo` setting.
fn apply_image_repo(workspace: Option<&std::path::Path>) -> Result<()> {
    use crate::config::{Key, Layer, Resolved};
    if let Some(repo) = Resolved::load(Layer::default(), workspace)?.str(Key::ImageRepo) {
        crate::provider::set_image_repo(&repo);
    }
    Ok(())
}

/// Runs the parsed command line.
pub async fn dispatch(cli: Cli) -> Result<i32> {
    let verbose = cli.verbose > 0;
    // The image repository is a setting like the others (flag > variable > project file >
    // user file), read here for the commands that name images by it.
    match &cli.command {
        Command::Run(args) => apply_image_repo(args.turn.settings.workspace.as_deref())?,
        Command::Config(ConfigCommand::Show(args)) => {
            apply_image_repo(args.settings.workspace.as_deref())?
        }
        Command::Image(_) | Command::Doctor => apply_image_repo(None)?,
        Command::Mcp(args) => apply_image_repo(args.settings.workspace.as_deref())?,
        _ => {}
    }
    match cli.command {
        Command::Run(args) => turn::run(args, cli.quiet, verbose).await,
        Command::Resume(args) => turn::resume(args, cli.quiet, verbose).await,
        Command::Fork(args) => fork::fork(args, cli.quiet).await,
        Command::Handle { target } => turn::handle(&target).await,
        Command::Ls {
            json,
            tree,
            all,
            group,
        } => manage::ls(json, tree, all, group).await,
        Command::Show { target, json } => show::show(&target, json).await,
        Command::Logs {
            target,
            turn,
            raw,
            follow,
        } => manage::logs(&target, turn, raw, follow).await,
        Command::Wait { target, output } => turn::wait(&target, output, cli.quiet).await,
        Command::Stop { target } => turn::stop(&target, cli.quiet).await,
        Command::Warm { target, for_ } => turn::warm(&target, for_.as_deref(), cli.quiet).await,
        Command::Pool(command) => pool::pool(command, cli.quiet).await,
        Command::Rm {
            targets,
            force,
            group,
        } => manage::rm(targets, force, group).await,
        Command::Gc {
            older_than,
            checkpoints,
            keep,
            dry_run,
            group,
        } => gc::gc(&older_than, checkpoints.then_some(keep), dry_run, group).await,
        Command::Drive => turn::detached_driver().await,
        Command::Settle { session } => {
            let client = crate::Client::connect().await?;
            crate::session::checkpoint::settle(client.backend(), session).await?;
            Ok(0)
        }
        Command::Export {
            target,
            dir,
            force,
            include_protected,
            json,
        } => {
            let how = workspace::Outbound {
                include_protected,
                json,
                quiet: cli.quiet,
            };
            workspace::export(&target, &dir, force, how).await
        }
        Command::Diff {
            target,
            patch,
            include_protected,
            json,
        } => {
            let how = workspace::Outbound {
                include_protected,
                json,
                quiet: cli.quiet,
            };
            workspace::diff(&target, patch.as_deref(), how).await
        }
        Command::Session(command) => portable::session(command, cli.quiet).await,
        Command::Auth(AuthCommand::Collect { provider, store }) => {
            auth::collect(&provider, store.into(), cli.quiet)
        }
        Command::Auth(AuthCommand::Login(args)) => login::login(args, cli.quiet, verbose).await,
        Command::Auth(AuthCommand::Status { json }) => auth::status(json),
        Command::Auth(AuthCommand::Flags { provider }) => auth::flags(&provider),
        Command::Auth(AuthCommand::Rm { provider }) => auth::rm(&provider, cli.quiet),
        Command::Image(ImageCommand::Build(args)) => image::build(args, verbose, cli.quiet).await,
        Command::Image(ImageCommand::Pull(args)) => image::pull(args, cli.quiet).await,
        Command::Image(ImageCommand::Ls) => image::ls().await,
        Command::Image(ImageCommand::Prune) => image::prune(cli.quiet).await,
        Command::Doctor => doctor::doctor().await,
        Command::Mcp(args) => mcp(args).await,
        Command::Config(ConfigCommand::Show(args)) => config::show(&args),
        Command::Config(ConfigCommand::Path { workspace }) => config::path(workspace.as_deref()),
        Command::Man { dir } => man(dir.as_deref()),
        Command::Completions { shell } => completions(shell),
    }
}

/// `caw-box mcp --on-limit`: `park` (or `fail`, the default); the server's turns run
/// detached, so `wait` and `fallback` are refused.
fn mcp_parks(on_limit: Option<&str>) -> Result<bool> {
    crate::session::limits::parks(on_limit, || {
        crate::error::Error::usage(
            "caw-box mcp --on-limit takes fail or park: the server's turns run in the background",
        )
        .with_hint("park: a session stopped by its account's usage limit goes on when it resets")
    })
    .map(|p| p.unwrap_or(false))
}

/// `mcp`: the delegation server, over stdio or (`--http`) Streamable HTTP.
async fn mcp(args: crate::cli::McpArgs) -> Result<i32> {
    let http = args
        .http
        .as_deref()
        .map(|a| crate::mcp::http::checked(a, args.token_file.as_deref()))
        .transpose()?;
    let policy = crate::mcp::Policy::new(crate::mcp::PolicyArgs {
        settings: &args.settings,
        env: &args.env,
        workspace_roots: &args.workspace_roots,
        allow_bind: args.allow_bind,
        scope: Some(&args.scope),
        park: mcp_parks(args.on_limit.as_deref())?,
    })?;
    // Every object the server's sessions make carries its scope (and the config's labels),
    // fixed before the first call: a workspace's `.caw-box.toml` cannot relabel them.
    let config = crate::config::Resolved::load(
        crate::config::Layer::default(),
        args.settings.workspace.as_deref(),
    )?;
    let mut labels = config.labels();
    labels.retain(|(k, _)| k != crate::labelling::labels::SCOPE);
    labels.push((
        crate::labelling::labels::SCOPE.to_string(),
        policy.scope.clone(),
    ));
    crate::session::record::set_extra_labels(labels);
    let defaults = crate::mcp::Defaults {
        settings: args.settings,
        env: args.env,
        policy: std::sync::Arc::new(policy),
        queue: args.max_parallel.map(|n| crate::mcp::Queue::new(n.into())),
        budget: args
            .max_cost_usd
            .map(crate::mcp::ServerBudget::new)
            .transpose()?
            .map(std::sync::Arc::new),
        shutdown: Default::default(),
        pool: args.pool.map(|n| (n, Default::default())),
    };
    let pools = defaults.pool.as_ref().map(|(_, made)| made.clone());
    // The server stops itself on SIGTERM and SIGINT; a turn it follows (an orphan `wait`
    // adopts) must not take them as its own stop: the turns go on without the server.
    crate::session::runner::leave_signals_to_the_caller();
    let served = match http {
        Some((addr, token)) => crate::mcp::http::serve(defaults, addr, token).await,
        None => crate::mcp::serve_stdio(defaults).await,
    };
    if let Some(made) = pools {
        crate::mcp::stop_pools(&made).await;
    }
    served
}

/// `completions SHELL`: the shell's completion script on stdout.
fn completions(shell: clap_complete::Shell) -> Result<i32> {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    crate::output::with_stdout(|out| clap_complete::generate(shell, &mut cmd, "caw-box", out));
    Ok(0)
}

/// `man`: the man page (roff) on stdout, or one page per command written into `dir`.
fn man(dir: Option<&std::path::Path>) -> Result<i32> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(cmd, dir))
                .map_err(|e| {
                    crate::Error::usage(format!(
                        "cannot write man pages into '{}': {e}",
                        dir.display()
                    ))
                })?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .map_err(|e| crate::Error::usage(format!("cannot render the man page: {e}")))?;
            crate::output::println(String::from_utf8_lossy(&page).trim_end_matches('\n'));
        }
    }
    Ok(0)
}
