//! `--user-config`: the vendor CLI's non-secret user-level setup (instructions such as
//! `~/.claude/CLAUDE.md`, skills, subagents, commands, settings) copied from the host into
//! a new session's HOME. What is copied is data, per provider, in the `user_config` list of
//! the specs under auth/, each entry with what it is for.
//!
//! Never a secret: JSON settings lose the keys the spec names (credential helpers, the
//! auth choice) and every credential-shaped key (`*token*`, `*secret*`, `*password*`,
//! `*api_key*`, `env`, `headers`, ...); a file that holds a key caw-box knows is left out
//! with a warning; the provider's credential paths are never targets.

use std::path::Path;

use super::spec::{expand, Spec, UserConfigSource};
use crate::error::{Error, Result};
use crate::provider::{HomeFile, ProviderKind};

/// A directory larger than this is refused: the setup is instructions, not a data set.
const MAX_BYTES: u64 = 16 * 1024 * 1024;
const MAX_FILES: usize = 4000;

/// What `gather` found: the files for HOME, and what to tell the user.
#[derive(Debug, Default)]
pub struct Gathered {
    pub files: Vec<HomeFile>,
    /// One line per copied entry: its target and what it is for.
    pub copied: Vec<String>,
    /// Files left out, and why.
    pub warnings: Vec<String>,
}

/// Reads `p`'s user-level setup from the host (paths through `env`, which looks variables
/// up); `secrets` are key values that must not be copied.
pub fn gather(
    p: ProviderKind,
    env: &dyn Fn(&str) -> Option<String>,
    secrets: &[Vec<u8>],
) -> Result<Gathered> {
    let spec = Spec::of(p);
    let credentials = spec.home_targets();
    let mut out = Gathered::default();
    let mut budget = (MAX_BYTES, MAX_FILES);
    for entry in &spec.user_config {
        let Some(source) = expand(&entry.source, env) else {
            continue;
        };
        let source = Path::new(&source);
        let Ok(meta) = std::fs::metadata(source) else {
            continue;
        };
        let before = out.files.len();
        if meta.is_dir() {
            copy_dir(
                source,
                &entry.target,
                &credentials,
                secrets,
                &mut budget,
                &mut out,
            )?;
        } else if let Some(f) = read_file(entry, source, secrets, &mut out.warnings)? {
            out.files.push(f);
        }
        let n = out.files.len() - before;
        if n > 0 {
            let target = if meta.is_dir() {
                format!("~/{}/ ({n} files)", entry.target)
            } else {
                format!("~/{}", entry.target)
            };
            out.copied.push(format!("{target}: {}", entry.what));
        }
    }
    Ok(out)
}

fn read_file(
    entry: &UserConfigSource,
    source: &Path,
    secrets: &[Vec<u8>],
    warnings: &mut Vec<String>,
) -> Result<Option<HomeFile>> {
    let bytes = std::fs::read(source).map_err(|e| {
        Error::usage(format!(
            "--user-config: cannot read {}: {e}",
            source.display()
        ))
    })?;
    let contents = if entry.json {
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            warnings.push(format!("left out {}: not valid JSON", source.display()));
            return Ok(None);
        };
        for path in &entry.drop {
            drop_path(&mut value, path);
        }
        drop_credential_keys(&mut value);
        serde_json::to_vec_pretty(&value).expect("JSON values serialize")
    } else {
        bytes
    };
    if super::holds_any(&contents, secrets) {
        warnings.push(format!(
            "left out {}: it holds a credential",
            source.display()
        ));
        return Ok(None);
    }
    Ok(Some(HomeFile {
        path: entry.target.clone(),
        contents,
        merge_json: entry.json,
    }))
}

fn copy_dir(
    dir: &Path,
    target: &str,
    credentials: &[String],
    secrets: &[Vec<u8>],
    (bytes_left, files_left): &mut (u64, usize),
    out: &mut Gathered,
) -> Result<()> {
    let walker = ignore::WalkBuilder::new(dir)
        .standard_filters(false)
        .hidden(false)
        .follow_links(true)
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for item in walker {
        let item = item.map_err(|e| {
            Error::usage(format!("--user-config: cannot read {}: {e}", dir.display()))
        })?;
        if !item.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let rel = item
            .path()
            .strip_prefix(dir)
            .expect("the walk stays under its root")
            .to_string_lossy()
            .into_owned();
        let path = format!("{target}/{rel}");
        if credentials.contains(&path) {
            continue;
        }
        let contents = std::fs::read(item.path()).map_err(|e| {
            Error::usage(format!(
                "--user-config: cannot read {}: {e}",
                item.path().display()
            ))
        })?;
        let too_big = contents.len() as u64 > *bytes_left || *files_left == 0;
        if too_big {
            return Err(Error::usage(format!(
                "--user-config: {} holds more than {} MiB or {MAX_FILES} files",
                dir.display(),
                MAX_BYTES / 1024 / 1024
            ))
            .with_hint("move what sessions do not need out of it, or leave out --user-config"));
        }
        *bytes_left -= contents.len() as u64;
        *files_left -= 1;
        if super::holds_any(&contents, secrets) {
            out.warnings.push(format!(
                "left out {}: it holds a credential",
                item.path().display()
            ));
            continue;
        }
        out.files.push(HomeFile {
            path,
            contents,
            merge_json: false,
        });
    }
    Ok(())
}

/// Removes a dotted path (`security.auth`) from a JSON object.
fn drop_path(value: &mut serde_json::Value, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else {
        return;
    };
    let mut at = value;
    for part in parts {
        match at.get_mut(part) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(object) = at.as_object_mut() {
        object.remove(last);
    }
}

/// Whether a settings key names something that holds a credential.
fn is_credential_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace(['-', '_'], "");
    // `maxTokens` and `tokenBudget` are settings; `GH_TOKEN` and `clientSecret` are not.
    k.ends_with("token")
        || k.ends_with("secret")
        || [
            "password",
            "apikey",
            "credential",
            "authorization",
            "bearer",
            "cookie",
        ]
        .iter()
        .any(|w| k.contains(w))
        || matches!(k.as_str(), "env" | "headers" | "httpheaders")
}

/// Removes every credential-shaped key, at any depth (MCP servers' `env` and `headers`).
fn drop_credential_keys(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|k, _| !is_credential_key(k));
            map.values_mut().for_each(drop_credential_keys);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_credential_keys),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn home_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let home = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = home.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        home
    }

    fn gather_in(p: ProviderKind, home: &Path, secrets: &[Vec<u8>]) -> Gathered {
        let home = home.to_string_lossy().into_owned();
        gather(p, &|v| (v == "HOME").then(|| home.clone()), secrets).unwrap()
    }

    #[test]
    fn claude_setup_is_copied_without_credentials() {
        let home = home_with(&[
            (".claude/CLAUDE.md", "Always answer in haiku.\n"),
            (".claude/skills/review/SKILL.md", "---\nname: review\n---\n"),
            (".claude/.credentials.json", "{\"claudeAiOauth\":{}}"),
            (
                ".claude/settings.json",
                r#"{"model":"opus","apiKeyHelper":"/bin/key","env":{"X":"1"},
                    "mcpServers":{"gh":{"command":"gh-mcp","env":{"GH_TOKEN":"ghp_x"},"headers":{"A":"b"}}},
                    "permissions":{"allow":["Bash(ls)"]}}"#,
            ),
        ]);
        let g = gather_in(ProviderKind::ClaudeCode, home.path(), &[]);
        let paths: Vec<&str> = g.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".claude/CLAUDE.md",
                ".claude/settings.json",
                ".claude/skills/review/SKILL.md"
            ]
        );
        let settings: serde_json::Value = serde_json::from_slice(&g.files[1].contents).unwrap();
        assert_eq!(
            settings,
            json!({"model": "opus", "mcpServers": {"gh": {"command": "gh-mcp"}},
                   "permissions": {"allow": ["Bash(ls)"]}})
        );
        assert!(g.files[1].merge_json && !g.files[0].merge_json);
        assert_eq!(g.copied.len(), 3, "{:?}", g.copied);
        assert!(
            g.copied[0].starts_with("~/.claude/CLAUDE.md: "),
            "{:?}",
            g.copied
        );
    }

    #[test]
    fn a_file_holding_a_known_key_is_left_out_with_a_warning() {
        let home = home_with(&[
            (".codex/AGENTS.md", "use key sk-test-abcdefghijkl here\n"),
            (".codex/prompts/fix.md", "Fix it.\n"),
        ]);
        let g = gather_in(
            ProviderKind::Codex,
            home.path(),
            &[b"sk-test-abcdefghijkl".to_vec()],
        );
        let paths: Vec<&str> = g.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, [".codex/prompts/fix.md"]);
        assert_eq!(g.warnings.len(), 1);
        assert!(g.warnings[0].contains("AGENTS.md: it holds a credential"));
        assert!(!g.warnings[0].contains("sk-test"));
    }

    #[test]
    fn gemini_settings_lose_the_auth_choice() {
        let home = home_with(&[(
            ".gemini/settings.json",
            r#"{"security":{"auth":{"selectedType":"oauth-personal"},"folderTrust":{"enabled":false}},"ui":{"theme":"x"}}"#,
        )]);
        let g = gather_in(ProviderKind::Gemini, home.path(), &[]);
        let settings: serde_json::Value = serde_json::from_slice(&g.files[0].contents).unwrap();
        assert_eq!(
            settings,
            json!({"security": {"folderTrust": {"enabled": false}}, "ui": {"theme": "x"}})
        );
        assert!(!is_credential_key("maxTokens") && !is_credential_key("tokenBudget"));
        assert!(is_credential_key("GH_TOKEN") && is_credential_key("clientSecret"));
    }

    #[test]
    fn nothing_there_is_nothing_copied() {
        let home = tempfile::tempdir().unwrap();
        for p in ProviderKind::ALL {
            let g = gather_in(p, home.path(), &[]);
            assert!(g.files.is_empty() && g.copied.is_empty() && g.warnings.is_empty());
        }
    }
}
