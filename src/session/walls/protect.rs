//! Protected paths: the workspace files that programs on the host run or trust by themselves
//! (git's hooks and config, direnv, mise, editors' tasks, dev containers, hook managers, the
//! coding-agent CLIs' own project settings, caw-box's own project file). In bind mode the
//! agent cannot write those that exist, and those it creates are moved aside after the turn
//! (`quarantine`); `export` and `diff --patch` leave them out of what comes back from a copy.
//!
//! This module is the set and its parsing; `quarantine` applies it to a workspace.
//! Paths are relative to the workspace's top, `/`-separated; a directory covers what is in it.

use crate::error::{Error, Result};

/// The default set, each with why it is there (docs/walls.md lists the same).
pub const DEFAULT_PROTECTED: &[(&str, &str)] = &[
    (
        ".git/config",
        "names programs git runs: filters, core.fsmonitor, core.sshCommand, core.hooksPath, aliases",
    ),
    (
        ".git/config.worktree",
        "read as git config too when extensions.worktreeConfig is on",
    ),
    (
        ".git/hooks",
        "programs git runs on commit, checkout, merge, push",
    ),
    (
        ".git/info",
        "attributes and excludes git applies to every command",
    ),
    (
        ".git/commondir",
        "points git at another repository's config and hooks",
    ),
    (".git/modules", "submodules' own config and hooks"),
    (
        ".git/worktrees",
        "linked worktrees' own config and the pointers to their git directories",
    ),
    (
        ".gitmodules",
        "submodule URLs and paths git fetches on update",
    ),
    (
        ".caw-box.toml",
        "caw-box's own project settings: image, endpoint, network, MCP commands of the next session",
    ),
    (".envrc", "run by direnv on entering the directory"),
    (
        "mise.toml",
        "mise runs its env scripts and hooks on entering the directory (trust is by path)",
    ),
    (
        ".mise.toml",
        "mise runs its env scripts and hooks on entering the directory (trust is by path)",
    ),
    (
        ".vscode",
        "tasks that run on folder open, interpreter and terminal settings",
    ),
    (
        ".idea",
        "run configurations and startup tasks of JetBrains IDEs",
    ),
    (
        ".devcontainer",
        "commands a dev container runs when it is opened",
    ),
    (
        ".devcontainer.json",
        "commands a dev container runs when it is opened",
    ),
    (
        ".pre-commit-config.yaml",
        "commands the pre-commit hook runs",
    ),
    (".husky", "hooks run by git when core.hooksPath names it"),
    ("lefthook.yml", "commands the lefthook hook runs"),
    (".lefthook.yml", "commands the lefthook hook runs"),
    ("lefthook.yaml", "commands the lefthook hook runs"),
    (".lefthook.yaml", "commands the lefthook hook runs"),
    (
        ".claude/settings.json",
        "hooks Claude Code runs in this directory on the host",
    ),
    (
        ".claude/settings.local.json",
        "hooks Claude Code runs in this directory on the host",
    ),
    (".mcp.json", "MCP server commands Claude Code starts"),
    (
        ".codex/config.toml",
        "commands and MCP servers Codex runs in a trusted project",
    ),
    (
        ".gemini/settings.json",
        "MCP server commands and hooks Gemini CLI runs",
    ),
    ("opencode.json", "MCP server commands opencode starts"),
    ("opencode.jsonc", "MCP server commands opencode starts"),
];

/// Normalises a user's path to the form of the set: relative, `/`-separated, no `./`,
/// no trailing `/`, `..` resolved within it. `None` for a path that leaves the workspace or
/// names its top.
pub fn normalise(path: &str) -> Option<String> {
    let path = path.trim();
    let relative = match path.strip_prefix('/') {
        Some(_) => path.strip_prefix("/workspace/")?,
        None => path,
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// A `--protect`/`--unprotect` value (or a config file's): relative to the workspace's top,
/// `/workspace/...`, or an absolute host path inside `workspace`. Anything that leaves the
/// workspace is refused (exit 2).
pub fn parse_arg(raw: &str, what: &str, workspace: Option<&str>) -> Result<String> {
    let trimmed = raw.trim();
    let inside_host = workspace.and_then(|ws| {
        let ws = ws.trim_end_matches('/');
        trimmed
            .strip_prefix(ws)
            .filter(|rest| rest.starts_with('/'))
            .map(|rest| rest.trim_start_matches('/').to_string())
    });
    let candidate = inside_host.as_deref().unwrap_or(trimmed);
    normalise(candidate).ok_or_else(|| {
        Error::usage(format!("{what} '{raw}' is not a path inside the workspace"))
            .with_hint("name it relative to the workspace's top, e.g. .git/hooks")
    })
}

/// The effective set: the defaults without `removed`, with `extra` (both normalised;
/// removing a default's parent or the default itself removes it).
pub fn effective(extra: &[String], removed: &[String]) -> Vec<String> {
    let removed: Vec<String> = removed.iter().filter_map(|p| normalise(p)).collect();
    let covered = |p: &str| {
        removed
            .iter()
            .any(|r| p == r || p.starts_with(&format!("{r}/")))
    };
    let mut set: Vec<String> = DEFAULT_PROTECTED
        .iter()
        .map(|(p, _)| p.to_string())
        .filter(|p| !covered(p))
        .collect();
    for p in extra.iter().filter_map(|p| normalise(p)) {
        if !set.contains(&p) {
            set.push(p);
        }
    }
    set
}

/// Adds `--protect` and `--unprotect` values to a session's lists: a path given now wins
/// over the same path on the other list from before.
pub fn apply(
    protect: &mut Vec<String>,
    unprotect: &mut Vec<String>,
    add: &[String],
    remove: &[String],
    workspace: Option<&str>,
) -> Result<()> {
    for raw in add {
        let path = parse_arg(raw, "--protect", workspace)?;
        unprotect.retain(|p| *p != path);
        if !protect.contains(&path) {
            protect.push(path);
        }
    }
    for raw in remove {
        let path = parse_arg(raw, "--unprotect", workspace)?;
        protect.retain(|p| *p != path);
        if !unprotect.contains(&path) {
            unprotect.push(path);
        }
    }
    Ok(())
}

/// `core.hooksPath` of a git config file's text, read as data (never by running git): the
/// last value in a `[core]` section. Includes are not followed.
pub fn hooks_path(config: &str) -> Option<String> {
    let mut in_core = false;
    let mut found = None;
    for line in config.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix('[') {
            let section = rest.split([']', ' ', '"']).next().unwrap_or("");
            in_core = section.eq_ignore_ascii_case("core");
            // `[core] hooksPath = x` on one line.
            let after = rest.split_once(']').map_or("", |(_, a)| a.trim());
            if in_core && !after.is_empty() {
                found = hooks_path_entry(after).or(found);
            }
            continue;
        }
        if in_core {
            found = hooks_path_entry(line).or(found);
        }
    }
    found
}

/// The value of a `hooksPath = VALUE` line (quotes and a trailing comment removed).
fn hooks_path_entry(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    if !key.trim().eq_ignore_ascii_case("hookspath") {
        return None;
    }
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = value.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                if let Some(next) = chars.next() {
                    out.push(match next {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                }
            }
            '#' | ';' if !quoted => break,
            c => out.push(c),
        }
    }
    let out = out.trim().to_string();
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_may_not_leave_the_workspace() {
        assert_eq!(normalise("./.git/hooks/").as_deref(), Some(".git/hooks"));
        assert_eq!(normalise("/workspace/.envrc").as_deref(), Some(".envrc"));
        assert_eq!(normalise("a//b").as_deref(), Some("a/b"));
        assert_eq!(normalise("a/../b").as_deref(), Some("b"));
        assert_eq!(normalise("../x"), None);
        assert_eq!(normalise("a/../../x"), None);
        assert_eq!(normalise("/etc/passwd"), None);
        assert_eq!(normalise("."), None);
        assert_eq!(normalise("a/.."), None);
    }

    #[test]
    fn arguments_may_name_host_paths_inside_the_workspace_only() {
        let ws = Some("/home/u/repo");
        assert_eq!(
            parse_arg("/home/u/repo/.git/hooks", "--protect", ws).unwrap(),
            ".git/hooks"
        );
        assert_eq!(parse_arg("Makefile", "--protect", ws).unwrap(), "Makefile");
        for outside in [
            "/home/u/repo2/x",
            "/etc/passwd",
            "../x",
            "/home/u/repo",
            ".",
        ] {
            let e = parse_arg(outside, "--unprotect", ws).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{outside}");
            assert!(
                e.message.contains("is not a path inside the workspace"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn the_effective_set_adds_and_removes() {
        let all = effective(&[], &[]);
        assert!(all.contains(&".git/hooks".to_string()));
        assert_eq!(all.len(), DEFAULT_PROTECTED.len());
        let some = effective(
            &["Makefile".into()],
            &[".git/hooks/".into(), ".vscode".into()],
        );
        assert!(!some.contains(&".git/hooks".to_string()));
        assert!(!some.contains(&".vscode".to_string()));
        assert!(some.contains(&"Makefile".to_string()));
        // Removing a parent removes what is under it.
        assert!(!effective(&[], &[".git".into()])
            .iter()
            .any(|p| p.starts_with(".git/")));
    }

    #[test]
    fn a_path_given_now_wins_over_the_other_list() {
        let (mut protect, mut unprotect) = (vec!["Makefile".to_string()], vec![]);
        apply(
            &mut protect,
            &mut unprotect,
            &[],
            &["./Makefile".into(), ".git/hooks".into()],
            None,
        )
        .unwrap();
        assert!(protect.is_empty());
        assert_eq!(unprotect, vec!["Makefile", ".git/hooks"]);
        apply(
            &mut protect,
            &mut unprotect,
            &[".git/hooks/".into()],
            &[],
            None,
        )
        .unwrap();
        assert_eq!(protect, vec![".git/hooks"]);
        assert_eq!(unprotect, vec!["Makefile"]);
        assert!(apply(&mut protect, &mut unprotect, &["../up".into()], &[], None).is_err());
    }

    /// docs/walls.md's table lists the default set, each with its reason.
    #[test]
    fn the_walls_page_lists_every_default() {
        let page = include_str!("../../../docs/walls.md");
        for (path, why) in DEFAULT_PROTECTED {
            assert!(
                page.contains(&format!("| `{path}` | {why} |")),
                "docs/walls.md lacks {path}"
            );
        }
    }

    #[test]
    fn hooks_path_is_read_from_the_config_text() {
        let config = "[core]\n\trepositoryformatversion = 0\n\thooksPath = .githooks # ours\n[remote \"origin\"]\n\thookspath = not-core\n";
        assert_eq!(hooks_path(config).as_deref(), Some(".githooks"));
        assert_eq!(
            hooks_path("[Core]\nHOOKSPATH = \"my hooks\"\n").as_deref(),
            Some("my hooks")
        );
        assert_eq!(
            hooks_path("[core] hooksPath = a\n[core]\nhooksPath = b\n").as_deref(),
            Some("b")
        );
        assert_eq!(hooks_path("[core]\nbare = false\n"), None);
        assert_eq!(hooks_path("[alias]\nhooksPath = x\n"), None);
    }
}
