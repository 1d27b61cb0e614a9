//! Commands: orchestration of settings, providers and the backend, one module per area.
//! Each returns the process exit code, or an error that `main` prints once.

pub mod doctor;
pub mod image;
pub mod turn;

use crate::cli::{Cli, Command, ImageCommand};
use crate::error::Result;

/// Runs the parsed command line.
pub async fn dispatch(cli: Cli) -> Result<i32> {
    let verbose = cli.verbose > 0;
    match cli.command {
        Command::Run(args) => turn::run(args, cli.quiet, verbose).await,
        Command::Resume(args) => turn::resume(args, cli.quiet, verbose).await,
        Command::Handle { target } => turn::handle(&target).await,
        Command::Image(ImageCommand::Build(args)) => image::build(args, verbose, cli.quiet).await,
        Command::Image(ImageCommand::Ls) => image::ls().await,
        Command::Doctor => doctor::doctor().await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "caw-box", &mut std::io::stdout());
            Ok(0)
        }
    }
}
