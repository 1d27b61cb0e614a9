//! The `caw-box` binary: parse, run, map the outcome to an exit code. All logic lives in
//! the library.

use clap::Parser;

use caw_box::cli::Cli;

fn main() {
    let cli = Cli::parse();
    init_tracing(cli.verbose, cli.quiet);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            caw_box::output::eprintln(&format!(
                "caw-box: error: cannot start the async runtime: {e}"
            ));
            std::process::exit(3);
        }
    };
    let code = match runtime.block_on(caw_box::commands::dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            caw_box::output::eprintln(&format!("caw-box: error: {e}"));
            e.exit_code()
        }
    };
    // Leave the turn's background tasks (signal listeners, streams) behind: we are done.
    drop(runtime);
    std::process::exit(code);
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
