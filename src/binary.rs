//! The `caw-box` binary's body: parse the command line, install its settings, run the
//! command, map the outcome to an exit code. The command line ([`crate::cli`]) and the
//! commands are private to the crate; this is the one door the binary target uses.

use clap::Parser;

use crate::cli::{self, Cli, OutputFormat};
use crate::output;
use crate::{Client, Error};

/// The whole `caw-box` command: parse, run, exit with the outcome's code.
pub fn main() -> ! {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => refuse_command_line(e),
    };
    let format = cli.output_format();
    let driver = matches!(cli.command, cli::Command::Drive);
    init_tracing(cli.verbose, cli.quiet);
    // Before any thread: the backend, its context and the image repository become this
    // process's settings (values, not variables), here as in the detached driver.
    // A handle among the targets names where its session lives: its backend, namespace and
    // kube context apply where no flag (or variable) says otherwise. A flag that contradicts
    // it is refused when the handle is checked against the backend (exit 2, saying both).
    let handle = cli
        .targets()
        .into_iter()
        .find_map(crate::session::ResumeHandle::in_target);
    let backend = match (&cli.backend, &handle) {
        (Some(b), _) => crate::backend::BackendKind::parse(b),
        (None, Some(h)) => crate::backend::BackendKind::parse(h.backend_name()),
        // CAW_BOX_BACKEND, the config files' `backend`, or Docker.
        (None, None) => crate::client::chosen_backend(),
    };
    let backend = match backend {
        Ok(b) => b,
        Err(e) => {
            report(&e, format);
            std::process::exit(e.exit_code());
        }
    };
    let mut settings = Client::builder();
    if cli.backend.is_some() || handle.is_some() {
        settings = settings.backend(backend.as_str());
    }
    let kube = backend == crate::backend::BackendKind::Kubernetes;
    let from_handle = |f: fn(&crate::session::ResumeHandle) -> &Option<String>| {
        handle.as_ref().filter(|_| kube).and_then(|h| f(h).clone())
    };
    if let Some(namespace) = cli
        .namespace
        .clone()
        .or_else(|| from_handle(|h| &h.namespace))
    {
        settings = settings.namespace(namespace);
    }
    // A --context (or CAW_BOX_KUBE_CONTEXT) of this machine's kubeconfig wins over the
    // handle's: context names are local (another machine may call the same cluster otherwise).
    let context_set = crate::connection::setting("CAW_BOX_KUBE_CONTEXT").is_some();
    let handle_context = from_handle(|h| &h.context).filter(|_| !context_set);
    if let Some(context) = cli.context.clone().or(handle_context) {
        settings = settings.context(context);
    }
    if let Some(repo) = &cli.image_repo {
        settings = settings.image_repo(repo);
    }
    if let Err(e) = settings.install() {
        report(&e, format);
        std::process::exit(e.exit_code());
    }
    let runtime = match runtime_for(&cli.command) {
        Ok(r) => r,
        Err(e) => {
            let e = Error::environment(format!("cannot start the async runtime: {e}"));
            report(&e, format);
            std::process::exit(e.exit_code());
        }
    };
    let code = match runtime.block_on(crate::commands::dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            if driver {
                // For the process that started this detached turn: the error's kind, which
                // its exit code alone does not tell (`busy` and `usage` are both 2).
                output::eprintln(&format!(
                    "{}{}",
                    crate::client::detach::DRIVER_ERROR_REPORT,
                    serde_json::to_string(&e.report()).expect("reports serialize")
                ));
            }
            report(&e, format);
            e.exit_code()
        }
    };
    // Leave the turn's background tasks (signal listeners, streams) behind: we are done.
    drop(runtime);
    std::process::exit(code);
}

/// The async runtime a command runs on: one thread, but for `caw-box mcp`, a long-lived server
/// whose tool calls run side by side on a few workers (and a bounded pool for blocking work),
/// so a burst of calls neither waits on one thread nor grows the process's threads.
fn runtime_for(command: &cli::Command) -> std::io::Result<tokio::runtime::Runtime> {
    if matches!(command, cli::Command::Mcp(_)) {
        return tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(16)
            .enable_all()
            .build();
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The one error line on stderr; under `-o json`/`stream-json` also the error object on
/// stdout (its last line), unless the failed turn's result object is there already.
fn report(e: &Error, format: OutputFormat) {
    output::eprintln(&format!("caw-box: error: {e}"));
    if format != OutputFormat::Text && !e.result_printed() {
        output::print_json_line(&e.report());
    }
}

/// A command line clap refused (or `--help`/`--version`): clap's own answer, and under
/// `-o json` (found by scanning the arguments: clap could not read them) the error object.
fn refuse_command_line(e: clap::Error) -> ! {
    if e.kind() == clap::error::ErrorKind::DisplayVersion
        && cli::version_json_in(std::env::args_os())
    {
        output::print_json_line(&crate::provider::version_report(env!("CARGO_PKG_VERSION")));
        std::process::exit(0);
    }
    let format = cli::output_format_in(std::env::args_os());
    if !e.use_stderr() || format == OutputFormat::Text {
        e.exit();
    }
    output::eprintln(e.render().to_string().trim_end());
    let error = Error::from_clap(&e);
    output::print_json_line(&error.report());
    std::process::exit(error.exit_code());
}

fn init_tracing(verbose: u8, quiet: bool) {
    let default = match (quiet, verbose) {
        (true, _) => "error",
        (_, 0) => "warn",
        (_, 1) => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAW_BOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("caw_box={default}")));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Debug logs carry the time since start, to see where a turn's time goes.
    if verbose >= 2 || std::env::var_os("CAW_BOX_LOG").is_some() {
        fmt.with_timer(tracing_subscriber::fmt::time::uptime())
            .init();
    } else {
        fmt.without_time().init();
    }
}
