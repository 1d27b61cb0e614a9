//! `config show` and `config path`: what the config files, variables and flags resolve to
//! here, and which files are read. Reading and resolving is `crate::config`'s.

use serde::Serialize;

use crate::cli::ConfigShowArgs;
use crate::config::{ConfigFile, Layer, Origin, Resolved, Value};
use crate::error::Result;
use crate::output;

/// One row of `config show --json`.
#[derive(Debug, Serialize)]
struct Setting {
    key: &'static str,
    value: Option<Value>,
    #[serde(flatten)]
    origin: Origin,
}

#[derive(Debug, Serialize)]
struct Shown {
    files: Vec<ConfigFile>,
    settings: Vec<Setting>,
}

pub fn show(args: &ConfigShowArgs) -> Result<i32> {
    let flags = Layer::from_flags(
        args.provider.as_deref(),
        args.group.as_deref(),
        &args.settings,
    );
    let resolved = Resolved::load(flags, args.settings.workspace.as_deref())?;
    let settings: Vec<Setting> = resolved
        .table()
        .into_iter()
        .map(|(key, value, origin)| Setting {
            key: key.name(),
            value,
            origin,
        })
        .collect();
    if args.json {
        output::print_json(&Shown {
            files: resolved.files,
            settings,
        });
        return Ok(0);
    }
    let rows: Vec<[String; 3]> = settings
        .iter()
        .map(|s| {
            [
                s.key.to_string(),
                s.value.as_ref().map_or("-".to_string(), Value::display),
                s.origin.to_string(),
            ]
        })
        .collect();
    let width = |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0);
    let (w0, w1) = (width(0), width(1));
    output::println(&format!("{:<w0$}  {:<w1$}  FROM", "KEY", "VALUE"));
    for [k, v, from] in &rows {
        output::println(&format!("{k:<w0$}  {v:<w1$}  {from}"));
    }
    Ok(0)
}

pub fn path(workspace: Option<&std::path::Path>) -> Result<i32> {
    for f in crate::config::files_here(workspace)? {
        let state = if f.exists { "exists" } else { "missing" };
        output::println(&format!("{:<8} {state:<8} {}", f.kind, f.path.display()));
    }
    Ok(0)
}
