//! `caw-box doctor`: what is wrong with this machine for caw-box, one line per problem with
//! the command that fixes it. Exit 0 only when all is well.

use crate::backend::checkup;
use crate::backend::doctor::Check;
use crate::error::{Error, Result};
use crate::output;
use crate::provider::ProviderKind;

/// The chosen backend's checks (the backend says them), then the credentials.
pub async fn doctor() -> Result<i32> {
    let images: Vec<(String, String)> = ProviderKind::ALL
        .iter()
        .map(|p| (p.to_string(), p.default_image()))
        .collect();
    let mut problems = 0;
    let settings = crate::client::backend_settings()?;
    checkup(&settings, &images, &mut |check| {
        if matches!(check, Check::Problem(_)) {
            problems += 1;
        }
        output::println(&check.line());
    })
    .await?;
    problems += credentials()?;
    output::println(&egress_line());
    if let Some(line) = pools_line() {
        output::println(&line);
    }
    verdict(problems)
}

/// The pools of this host (`caw-box pool`), where there are any: they hold boxes (memory)
/// while no session runs.
fn pools_line() -> Option<String> {
    let defs = crate::session::lifecycle::pool::all().ok()?;
    if defs.is_empty() {
        return None;
    }
    let each: Vec<String> = defs
        .iter()
        .map(|d| format!("{} ({}, {} boxes)", d.key, d.provider, d.size))
        .collect();
    Some(
        Check::Ok(format!(
            "pools: {}; `caw-box pool ls` shows their boxes, `caw-box pool stop --all` removes them",
            each.join(", ")
        ))
        .line(),
    )
}

/// What a new session's agent may reach, and where that was set.
fn egress_line() -> String {
    use crate::config::{Key, Resolved};
    let resolved = Resolved::load(crate::config::Layer::default(), None).ok();
    let set = resolved.as_ref().and_then(|r| r.str(Key::Egress));
    let line = match set.as_deref() {
        Some(p) => format!("egress: new sessions are {p} (set by your config or CAW_BOX_EGRESS)"),
        None => "egress: new sessions are balanced, the default since this version (was open): \
                 the model's API and the common package and source hosts; --egress open for \
                 anything (docs/walls.md)"
            .to_string(),
    };
    Check::Ok(line).line()
}

/// Exit 0 when all is well, else the count of problems (exit 3).
fn verdict(problems: usize) -> Result<i32> {
    if problems == 0 {
        Ok(0)
    } else {
        Err(Error::environment(format!(
            "{problems} problem{} found",
            if problems == 1 { "" } else { "s" }
        ))
        .with_hint("run the fixes listed above"))
    }
}

/// A line per provider's stored credentials; the count of problems.
fn credentials() -> Result<usize> {
    let mut problems = 0;
    let store = crate::auth::store::Store::open()?;
    let now = crate::session::record::now_secs();
    for p in ProviderKind::ALL {
        let manifest = store.manifest(p);
        let in_env: Vec<&str> = p
            .endpoint_key_vars()
            .iter()
            .copied()
            .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
            .collect();
        if manifest.items.is_empty() {
            if in_env.is_empty() {
                output::println(&format!(
                    "- {p}: no credentials stored; fix: caw-box auth collect --provider {p}"
                ));
            } else {
                output::println(&format!(
                    "- {p}: {} set here but not collected; fix: caw-box auth collect --provider {p}",
                    in_env.join(", ")
                ));
            }
            continue;
        }
        let expired: Vec<&str> = manifest
            .items
            .iter()
            .filter(|i| i.expires_at.is_some_and(|e| e <= now))
            .map(|i| i.target.as_str())
            .collect();
        let has_key = manifest
            .items
            .iter()
            .any(|i| i.kind == "env" || i.kind == "derived");
        if !expired.is_empty() && !has_key {
            problems += 1;
            output::println(&format!(
                "✗ {p}: stored login expired ({}); fix: log in again on this host, then caw-box auth collect --provider {p}",
                expired.join(", ")
            ));
        } else {
            let names: Vec<&str> = manifest.items.iter().map(|i| i.target.as_str()).collect();
            output::println(&format!("✓ {p}: credentials stored ({})", names.join(", ")));
        }
    }
    Ok(problems)
}
