//! Which vendor CLI: the provider's name, image and the facts about it that are pure data.
//!
//! A leaf module, so the event vocabulary, the records and the provider adapters all use it
//! without importing each other. The adapter itself is [`ProviderKind::adapter`], in
//! `provider/`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The repository caw-box's images are tagged under: the `image_repo` setting that the
/// command resolved (`--image-repo`, `$CAW_BOX_IMAGE_REPO`, a config file; see
/// [`set_image_repo`]), else `$CAW_BOX_IMAGE_REPO`, else `caw-box` (local builds). E.g. a
/// registry path the images workflow publishes to: `ghcr.io/OWNER/caw-box`.
pub fn image_repo() -> String {
    IMAGE_REPO
        .get()
        .cloned()
        .or_else(|| crate::connection::var("CAW_BOX_IMAGE_REPO"))
        .map(|r| r.trim_end_matches('/').to_string())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| DEFAULT_IMAGE_REPO.to_string())
}

/// The repository `image build` tags under when nothing names another.
pub const DEFAULT_IMAGE_REPO: &str = "caw-box";

static IMAGE_REPO: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the repository of this process's images once, from the resolved settings.
pub fn set_image_repo(repo: &str) {
    let _ = IMAGE_REPO.set(repo.to_string());
}

/// Every provider's pinned CLI, for `caw-box --version`: one line each.
pub fn pinned_cli_versions() -> String {
    ProviderKind::ALL
        .iter()
        .map(|p| {
            format!(
                "  {:<12} {} {}",
                p.image_name(),
                p.npm_package(),
                p.default_cli_version()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `caw-box --version --json`: caw-box's version and, per provider, its image, npm package
/// and pinned CLI version. The one place scripts (`make drift`) read the pins from.
pub fn version_report(caw_box_version: &str) -> serde_json::Value {
    let providers: Vec<serde_json::Value> = ProviderKind::ALL
        .iter()
        .map(|p| {
            serde_json::json!({
                "provider": p.as_str(),
                "image": p.image_name(),
                "npm_package": p.npm_package(),
                "cli_version": p.default_cli_version(),
            })
        })
        .collect();
    serde_json::json!({"version": caw_box_version, "providers": providers})
}

/// The numeric parts of a CLI version (`2.1.332`, `0.171.0-alpha.2` as `0.171.0`); `None`
/// for anything else (`latest`, empty).
fn parse_version(version: &str) -> Option<Vec<u64>> {
    let core = version.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    core.split('.').map(|p| p.parse().ok()).collect()
}

/// Whether the CLI `version` (an image's `io.caw-box.cli-version` label) is `since` or newer.
/// An unknown version (no label: an image built some other way) counts as new: it is taken
/// to behave like the pins, the versions caw-box follows.
pub fn cli_version_at_least(version: Option<&str>, since: &str) -> bool {
    let (Some(have), Some(since)) = (version.and_then(parse_version), parse_version(since)) else {
        return true;
    };
    let len = have.len().max(since.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..len)
        .map(|i| at(&have, i).cmp(&at(&since, i)))
        .find(|o| o.is_ne())
        .is_none_or(|o| o.is_gt())
}

/// One vendor CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    ClaudeCode,
    Codex,
    Opencode,
    Gemini,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::ClaudeCode,
        ProviderKind::Codex,
        ProviderKind::Opencode,
        ProviderKind::Gemini,
    ];

    /// The canonical name used in labels, handles and output.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::ClaudeCode => "claude_code",
            ProviderKind::Codex => "codex",
            ProviderKind::Opencode => "opencode",
            ProviderKind::Gemini => "gemini",
        }
    }

    /// The image name under `caw-box/` and the directory under `images/`.
    pub fn image_name(self) -> &'static str {
        match self {
            ProviderKind::ClaudeCode => "claude-code",
            ProviderKind::Codex => "codex",
            ProviderKind::Opencode => "opencode",
            ProviderKind::Gemini => "gemini",
        }
    }

    /// The image a session uses unless `--image` says otherwise:
    /// `<repo>/<image_name>:latest`, where the repository is [`image_repo`].
    pub fn default_image(self) -> String {
        format!("{}/{}:latest", image_repo(), self.image_name())
    }

    /// The npm package of the vendor CLI.
    pub fn npm_package(self) -> &'static str {
        match self {
            ProviderKind::ClaudeCode => "@anthropic-ai/claude-code",
            ProviderKind::Codex => "@openai/codex",
            ProviderKind::Opencode => "opencode-ai",
            ProviderKind::Gemini => "@google/gemini-cli",
        }
    }

    /// The CLI version images are built with by default (observed in VENDORS.md).
    pub fn default_cli_version(self) -> &'static str {
        match self {
            ProviderKind::ClaudeCode => "2.1.332",
            ProviderKind::Codex => "0.171.0",
            ProviderKind::Opencode => "1.18.33",
            ProviderKind::Gemini => "0.61.0",
        }
    }

    /// The CLI versions caw-box is tested with: the oldest and the newest whose `make drift`
    /// passed every check (docs/compatibility.md has the table). The oldest is the previous
    /// pin, kept working for the sessions started on its images (e2e
    /// `compat::claude_session_on_the_previous_pin_resumes_after_the_pin_moved`).
    pub fn tested_cli_range(self) -> (&'static str, &'static str) {
        match self {
            ProviderKind::ClaudeCode => ("2.1.267", "2.1.332"),
            ProviderKind::Codex => ("0.169.0", "0.171.0"),
            ProviderKind::Opencode => ("1.18.33", "1.18.33"),
            ProviderKind::Gemini => ("0.61.0", "0.61.0"),
        }
    }

    /// Whether `version` lies outside [`Self::tested_cli_range`] (one that does not parse as
    /// a version, e.g. `latest`, does: it may be anything).
    pub fn untested_cli_version(self, version: &str) -> bool {
        let (oldest, newest) = self.tested_cli_range();
        !(cli_version_at_least(Some(version), oldest)
            && cli_version_at_least(Some(newest), version)
            && parse_version(version).is_some())
    }

    /// The CLI's executable inside the image.
    pub fn executable(self) -> &'static str {
        match self {
            ProviderKind::ClaudeCode => "claude",
            ProviderKind::Codex => "codex",
            ProviderKind::Opencode => "opencode",
            ProviderKind::Gemini => "gemini",
        }
    }

    /// The vendor's API hosts, for `--allow-host @provider`.
    pub fn api_hosts(self) -> &'static [&'static str] {
        match self {
            ProviderKind::ClaudeCode => &["api.anthropic.com:443"],
            ProviderKind::Codex => &["api.openai.com:443", "chatgpt.com:443"],
            ProviderKind::Opencode => &["api.openai.com:443", "api.anthropic.com:443"],
            ProviderKind::Gemini => &["generativelanguage.googleapis.com:443"],
        }
    }

    /// The environment variables that carry the model key when `--endpoint` is used.
    pub fn endpoint_key_vars(self) -> &'static [&'static str] {
        match self {
            ProviderKind::ClaudeCode => &["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"],
            ProviderKind::Codex | ProviderKind::Opencode => &["OPENAI_API_KEY"],
            ProviderKind::Gemini => &["GEMINI_API_KEY"],
        }
    }

    /// "claude_code (aliases: claude, cc), codex, opencode, gemini" for error messages.
    pub fn valid_names() -> &'static str {
        "claude_code (or claude, cc), codex, opencode, gemini"
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing an unknown provider name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown provider '{0}'; valid providers: claude_code (or claude, cc), codex, opencode, gemini"
)]
pub struct UnknownProvider(pub String);

impl FromStr for ProviderKind {
    type Err = UnknownProvider;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "claude_code" | "claude" | "cc" => Ok(ProviderKind::ClaudeCode),
            "codex" => Ok(ProviderKind::Codex),
            "opencode" => Ok(ProviderKind::Opencode),
            "gemini" => Ok(ProviderKind::Gemini),
            _ => Err(UnknownProvider(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_their_numbers() {
        assert!(cli_version_at_least(Some("2.1.332"), "2.1.268"));
        assert!(cli_version_at_least(Some("2.1.268"), "2.1.268"));
        assert!(!cli_version_at_least(Some("2.1.267"), "2.1.268"));
        assert!(!cli_version_at_least(Some("2.1.99"), "2.1.268"));
        assert!(cli_version_at_least(Some("2.2"), "2.1.268"));
        assert!(cli_version_at_least(Some("0.171.0-alpha.1"), "0.171.0"));
        // Unknown: taken to behave like the pins.
        assert!(cli_version_at_least(None, "2.1.268"));
        assert!(cli_version_at_least(Some("latest"), "2.1.268"));
    }

    #[test]
    fn the_compatibility_page_states_the_tested_ranges() {
        let page = include_str!("../docs/compatibility.md");
        for p in ProviderKind::ALL {
            let (oldest, newest) = p.tested_cli_range();
            let row = format!("| {p} | {oldest} | {newest} | `{}` |", p.npm_package());
            assert!(page.contains(&row), "docs/compatibility.md lacks: {row}");
        }
    }

    #[test]
    fn the_pins_lie_in_the_tested_range() {
        for p in ProviderKind::ALL {
            assert!(!p.untested_cli_version(p.default_cli_version()), "{p}");
            let (oldest, newest) = p.tested_cli_range();
            assert!(!p.untested_cli_version(oldest) && !p.untested_cli_version(newest));
        }
        let claude = ProviderKind::ClaudeCode;
        assert!(claude.untested_cli_version("2.1.266"));
        assert!(claude.untested_cli_version("2.1.333"));
        assert!(!claude.untested_cli_version("2.1.300"));
        assert!(claude.untested_cli_version("latest"));
    }
}
