//! `caw-box pool`: boxes made ahead of new sessions (`session::lifecycle::pool`).

use crate::backend::Backend;
use crate::cli::{PoolCommand, PoolStartArgs};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::output;
use crate::session::lifecycle::pool::{self, PoolDef};

/// Runs a `pool` subcommand.
pub async fn pool(command: PoolCommand, quiet: bool) -> Result<i32> {
    match command {
        PoolCommand::Start(args) => start(*args, quiet).await,
        PoolCommand::Ls { json } => ls(json).await,
        PoolCommand::Stop { keys, all } => stop(keys, all, quiet).await,
        PoolCommand::Fill { key, after } => fill(&key, after, quiet).await,
    }
}

fn say(quiet: bool) -> impl Fn(&str) + Sync {
    move |line: &str| {
        if !quiet {
            output::eprintln(line);
        }
    }
}

/// `pool start`: the settings `run` would give a new session here, a pool for them (one of
/// the same settings is resized), filled.
async fn start(mut args: PoolStartArgs, quiet: bool) -> Result<i32> {
    if !(1..=16).contains(&args.size) {
        return Err(Error::usage(format!(
            "--size {} is out of range: a pool keeps 1 to 16 boxes",
            args.size
        )));
    }
    let max_age = crate::settings::parse_duration(&args.max_age, "--max-age")?.as_secs();
    if max_age < 60 {
        return Err(Error::usage(format!(
            "--max-age {} is too short: at least 60s",
            args.max_age
        )));
    }
    let run = &mut args.run;
    if run.turn.prompt.is_some() || run.turn.prompt_file.is_some() {
        return Err(Error::usage("a pool's box holds no prompt").with_hint(
            "start the pool without one, then `caw-box run` with the same flags and the prompt",
        ));
    }
    if run.name.is_some() || run.turn.detach || !run.turn.env.is_empty() {
        return Err(Error::usage(
            "--name, --detach and --env are a session's: a pool's boxes have none",
        )
        .with_hint("pass them to the `caw-box run` that claims a box"));
    }
    // (A run's settings do not depend on its prompt; settling them asks for one.)
    run.turn.prompt = Some("(a pool's box holds no prompt)".to_string());
    let progress = say(quiet);
    let settled =
        crate::commands::turn::settle_new(run, quiet, &progress, &|_, _, _| Ok(())).await?;
    if !settled.client.backend().capabilities().pools {
        return Err(
            Error::usage("this backend keeps no pool: Docker's engine and Kubernetes do")
                .with_hint("run `caw-box pool start` against a Docker daemon or a cluster"),
        );
    }
    let scope = pool::scope_of(settled.client.backend());
    let key = pool::key_of(&scope, settled.provider, &settled.settings);
    let def = PoolDef {
        key: key.clone(),
        provider: settled.provider,
        settings: settled.settings,
        size: args.size,
        max_age_secs: max_age,
        created_at: pool::load(&key).map_or_else(crate::clock::now_secs, |d| d.created_at),
        scope,
    };
    let new = pool::load(&key).is_none();
    pool::save(&def)?;
    let filled = match pool::fill(settled.client.backend(), &def, &progress).await {
        Ok(filled) => filled,
        Err(e) => {
            // A pool that could not make its first box is not left half made.
            if new {
                let _ = pool::stop(settled.client.backend(), &def).await;
            }
            return Err(e);
        }
    };
    progress(&format!(
        "pool {key}: {} {} ready ({} made, {} replaced); `caw-box run` with the same settings claims one",
        filled.ready,
        if filled.ready == 1 { "box" } else { "boxes" },
        filled.made,
        filled.replaced
    ));
    output::println(&key);
    if args.serve {
        serve(settled.client.backend(), &def, quiet).await?;
    }
    Ok(0)
}

/// How often `pool start --serve` looks at its pool.
const SERVE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// `pool start --serve`: fills the pool whenever it is short (a box claimed, removed from
/// outside, stale or too old), until Ctrl-C or SIGTERM, or until the pool is stopped. The
/// pool stays as it is when the service ends.
async fn serve(backend: &impl Backend, def: &PoolDef, quiet: bool) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let failed = |e: std::io::Error| Error::environment(format!("cannot watch for signals: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(failed)?;
    let mut int = signal(SignalKind::interrupt()).map_err(failed)?;
    let progress = say(quiet);
    progress(&format!(
        "serving pool {}: keeping {} ready; Ctrl-C ends the service and leaves the pool",
        def.key, def.size
    ));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            () = tokio::time::sleep(SERVE_EVERY) => {}
        }
        if pool::load(&def.key).is_none() {
            progress(&format!("pool {} was stopped: the service ends", def.key));
            return Ok(());
        }
        let short = pool::list(backend, def)
            .await?
            .iter()
            .filter(|b| b.state == "ready")
            .count()
            < def.size as usize;
        if short {
            // A failed fill (the daemon away for a moment) is said and tried again.
            match pool::fill(backend, def, &progress).await {
                Ok(f) if f.made + f.replaced > 0 => progress(&format!(
                    "pool {}: {} ready ({} made, {} replaced)",
                    def.key, f.ready, f.made, f.replaced
                )),
                Ok(_) => {}
                Err(e) => progress(&format!("pool {}: could not fill it: {e}", def.key)),
            }
        }
    }
    progress(&format!(
        "the service of pool {} ends; the pool stays (`caw-box pool stop {}` removes it)",
        def.key, def.key
    ));
    Ok(())
}

/// `pool ls`: every pool of this host, its settings in short and its boxes.
async fn ls(json: bool) -> Result<i32> {
    let client = Client::connect().await?;
    let defs = pool::here(client.backend())?;
    let mut rows = Vec::new();
    for def in &defs {
        let boxes = pool::list(client.backend(), def).await?;
        rows.push((def, boxes));
    }
    if json {
        let value: Vec<serde_json::Value> = rows
            .iter()
            .map(|(def, boxes)| {
                serde_json::json!({
                    "key": def.key,
                    "provider": def.provider,
                    "size": def.size,
                    "max_age_secs": def.max_age_secs,
                    "image": def.settings.image,
                    "workspace": def.settings.workspace,
                    "workspace_mode": def.settings.workspace_mode,
                    "egress": def.settings.egress(),
                    "ready": boxes.iter().filter(|b| b.state == "ready").count(),
                    "boxes": boxes,
                })
            })
            .collect();
        output::println(&serde_json::to_string_pretty(&value).expect("pools serialize"));
        return Ok(0);
    }
    if rows.is_empty() {
        output::eprintln("no pool here; make one with `caw-box pool start --provider P`");
        return Ok(0);
    }
    for (def, boxes) in rows {
        let ready = boxes.iter().filter(|b| b.state == "ready").count();
        output::println(&format!(
            "{}  {}  {ready}/{} ready  {} egress  {}",
            def.key,
            def.provider,
            def.size,
            def.settings.egress(),
            def.settings.workspace.as_deref().unwrap_or("-"),
        ));
        for b in boxes {
            output::println(&format!(
                "  {}  {}  {}",
                b.session_id,
                age(b.age_secs),
                b.state
            ));
        }
    }
    Ok(0)
}

/// "made 4m ago".
fn age(secs: u64) -> String {
    format!(
        "made {}",
        crate::commands::ago::ago(crate::clock::now_secs().saturating_sub(secs))
    )
}

/// `pool stop`: the named pools, or every one.
async fn stop(keys: Vec<String>, all: bool, quiet: bool) -> Result<i32> {
    if keys.is_empty() && !all {
        return Err(Error::usage("say which pools: KEY… or --all")
            .with_hint("`caw-box pool ls` lists them"));
    }
    let no_pool = |key: &str| {
        Error::not_found(format!("no pool '{key}' here")).with_hint("`caw-box pool ls` lists them")
    };
    // A key no pool of this host has is refused before any backend is reached.
    let known = pool::all()?;
    if let Some(key) = keys.iter().find(|k| !known.iter().any(|d| &d.key == *k)) {
        return Err(no_pool(key));
    }
    let client = Client::connect().await?;
    let defs = pool::here(client.backend())?;
    let mut chosen = Vec::new();
    for key in &keys {
        match defs.iter().find(|d| &d.key == key) {
            Some(d) => chosen.push(d.clone()),
            None => return Err(no_pool(key)),
        }
    }
    if all {
        chosen = defs;
    }
    for def in chosen {
        let removed = pool::stop(client.backend(), &def).await?;
        say(quiet)(&format!(
            "pool {} stopped: {removed} ready {} removed",
            def.key,
            if removed == 1 { "box" } else { "boxes" }
        ));
    }
    Ok(0)
}

/// `pool fill`: brings a pool to its size (a claim runs this in the background, `--after`
/// its own process).
async fn fill(key: &str, after: Option<u32>, quiet: bool) -> Result<i32> {
    if let Some(pid) = after {
        pool::after(pid).await;
    }
    let def = pool::load(key).ok_or_else(|| {
        Error::not_found(format!("no pool '{key}' here")).with_hint("`caw-box pool ls` lists them")
    })?;
    let client = Client::connect().await?;
    let filled = pool::fill(client.backend(), &def, &say(quiet)).await?;
    say(quiet)(&format!(
        "pool {key}: {} ready ({} made, {} replaced)",
        filled.ready, filled.made, filled.replaced
    ));
    Ok(0)
}
