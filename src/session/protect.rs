//! Protected paths: the workspace files that programs on the host run or trust by themselves
//! (git's hooks and config, direnv, editors' tasks, dev containers, hook managers). In bind
//! mode the agent cannot write those that exist, and those it creates are moved aside after
//! the turn; `export` and `diff --patch` leave them out of what comes back from a copy.
//!
//! Paths are relative to the workspace's top, `/`-separated; a directory covers what is in it.

/// The default set, each with why it is there (README lists the same).
pub const DEFAULT_PROTECTED: &[(&str, &str)] = &[
    (
        ".git/config",
        "names programs git runs: filters, core.fsmonitor, core.sshCommand, aliases",
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
        ".gitmodules",
        "submodule URLs and paths git fetches on update",
    ),
    (".envrc", "run by direnv on entering the directory"),
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
        ".pre-commit-config.yaml",
        "commands the pre-commit hook runs",
    ),
    (".husky", "hooks run by git when core.hooksPath names it"),
    ("lefthook.yml", "commands the lefthook hook runs"),
    (
        ".caw-box.toml",
        "caw-box's own project file: the network, endpoint and host variables of the next run",
    ),
    (".lefthook.yml", "commands the lefthook hook runs"),
];

/// Normalises a user's path to the form of the set: relative, `/`-separated, no `./`,
/// no trailing `/`. `None` for a path that leaves the workspace or names its top.
pub fn normalise(path: &str) -> Option<String> {
    let path = path.trim();
    let relative = match path.strip_prefix('/') {
        Some(_) => path.strip_prefix("/workspace/")?,
        None => path,
    };
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_and_may_not_leave_the_workspace() {
        assert_eq!(normalise("./.git/hooks/").as_deref(), Some(".git/hooks"));
        assert_eq!(normalise("/workspace/.envrc").as_deref(), Some(".envrc"));
        assert_eq!(normalise("a//b").as_deref(), Some("a/b"));
        assert_eq!(normalise("../x"), None);
        assert_eq!(normalise("a/../../x"), None);
        assert_eq!(normalise("/etc/passwd"), None);
        assert_eq!(normalise("."), None);
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
}
