//! How a caller shapes the agent the same way for every vendor: the system prompt (replaced or
//! appended to) and the reasoning effort. These are settings a session remembers; each
//! provider adapter maps them to its CLI's own mechanism, and one that has no such mechanism
//! is refused up front (exit 2, naming the provider), never silently ignored.
//!
//! Not here: the mapping itself (each adapter in `provider/`), nor the flags (`cli.rs`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::provider::ProviderKind;

/// Where the texts go in the agent's HOME (relative to it): files the CLI reads, so a long
/// prompt stays out of the container's argv and environment (and `docker inspect`).
pub const SYSTEM_PROMPT_FILE: &str = ".caw-box/agent/system-prompt.md";
pub const APPEND_SYSTEM_PROMPT_FILE: &str = ".caw-box/agent/append-system-prompt.md";

/// The longest system prompt text taken (either kind): it is remembered in the session's
/// volume labels, which Docker keeps in memory for every `ls`.
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;

/// `--effort`: how hard the model thinks, in the vocabulary every provider shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    Low,
    Medium,
    High,
}

impl Effort {
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }

    pub fn parse(s: &str, what: &str) -> Result<Effort> {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" => Ok(Effort::Low),
            "medium" => Ok(Effort::Medium),
            "high" => Ok(Effort::High),
            _ => Err(Error::usage(format!(
                "{what} '{s}' is not an effort: low, medium or high"
            ))),
        }
    }
}

/// What a provider's CLI can be told: checked before anything is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Support {
    /// It can replace its default system prompt.
    pub replace: bool,
    /// It can add to its default system prompt.
    pub append: bool,
    /// It has a reasoning-effort knob.
    pub effort: bool,
}

/// `TEXT` as is, or `@FILE`'s contents; `what` names the flag or key in errors.
pub fn read_prompt_arg(value: &str, what: &str) -> Result<String> {
    let text = match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Error::usage(format!("{what}: cannot read the file '{path}': {e}")))?,
        None => value.to_string(),
    };
    if text.trim().is_empty() {
        return Err(Error::usage(format!("{what} is empty"))
            .with_hint("give the text, or @FILE to read it from a file"));
    }
    if text.len() > MAX_PROMPT_BYTES {
        return Err(Error::usage(format!(
            "{what} is {} bytes; at most {MAX_PROMPT_BYTES} are taken",
            text.len()
        )));
    }
    Ok(text)
}

/// Refuses (exit 2) what `provider`'s CLI cannot do, naming the provider.
pub fn check_support(
    provider: ProviderKind,
    system_prompt: bool,
    append_system_prompt: bool,
    effort: bool,
) -> Result<()> {
    refuse_unsupported(
        provider,
        provider.adapter().support(),
        [system_prompt, append_system_prompt, effort],
    )
}

/// `wanted`: system prompt, appended prompt, effort.
fn refuse_unsupported(provider: ProviderKind, support: Support, wanted: [bool; 3]) -> Result<()> {
    let [system_prompt, append_system_prompt, effort] = wanted;
    let refuse = |what: &str, hint: &str| {
        Err(
            Error::usage(format!("{what} is not supported by the {provider} CLI"))
                .with_hint(hint.to_string()),
        )
    };
    if system_prompt && !support.replace {
        return refuse(
            "--system-prompt (replacing the default system prompt)",
            "use --append-system-prompt, or another provider",
        );
    }
    if append_system_prompt && !support.append {
        return refuse(
            "--append-system-prompt",
            "use --system-prompt with the whole prompt, or another provider",
        );
    }
    if effort && !support.effort {
        return refuse("--effort", "leave --effort out for this provider");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_args_read_text_or_a_file_and_refuse_empty_ones() {
        assert_eq!(
            read_prompt_arg("be brief", "--system-prompt").unwrap(),
            "be brief"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.md");
        std::fs::write(&file, "from a file\n").unwrap();
        let arg = format!("@{}", file.display());
        assert_eq!(read_prompt_arg(&arg, "x").unwrap(), "from a file\n");
        let missing = read_prompt_arg("@/nonexistent/p.md", "--system-prompt").unwrap_err();
        assert!(
            missing.message.contains("/nonexistent/p.md"),
            "{}",
            missing.message
        );
        assert!(read_prompt_arg("  \n", "--system-prompt").is_err());
        let long = "x".repeat(MAX_PROMPT_BYTES + 1);
        assert!(read_prompt_arg(&long, "x").is_err());
    }

    #[test]
    fn efforts_parse_case_insensitively() {
        assert_eq!(Effort::parse("HIGH", "x").unwrap(), Effort::High);
        assert!(Effort::parse("max", "--effort")
            .unwrap_err()
            .message
            .contains("low, medium or high"));
    }

    use crate::provider::{TurnCommand, TurnRequest};

    const TEXT: &str = "REPLACE-TEXT-1234 be brief";
    const MORE: &str = "APPEND-TEXT-5678 and polite";

    fn command(p: ProviderKind, effort: Option<Effort>, append: bool) -> TurnCommand {
        let support = p.adapter().support();
        p.adapter().turn_command(&TurnRequest {
            prompt: "hi",
            model: Some("caw/stub-model"),
            endpoint: Some("http://stub:8080"),
            system_prompt: Some(TEXT),
            append_system_prompt: (append && support.append).then_some(MORE),
            effort: effort.filter(|_| support.effort),
            ..Default::default()
        })
    }

    fn visible(c: &TurnCommand) -> String {
        let env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{:?} {:?}", c.argv, env)
    }

    /// The texts travel in HOME files the CLI reads, not in argv or env (inspect), except
    /// codex's appended text, which codex takes only as a value.
    #[test]
    fn prompt_texts_go_in_files_the_command_names() {
        for p in ProviderKind::ALL {
            let c = command(p, None, true);
            let shown = visible(&c);
            assert!(!shown.contains(TEXT), "{p}: {shown}");
            assert!(shown.contains(SYSTEM_PROMPT_FILE), "{p}: {shown}");
            let file = c.home_files.iter().find(|f| f.path == SYSTEM_PROMPT_FILE);
            assert_eq!(
                file.map(|f| f.contents.as_slice()),
                Some(TEXT.as_bytes()),
                "{p}"
            );
            if p.adapter().support().append {
                if p == ProviderKind::Codex {
                    assert!(
                        c.argv
                            .iter()
                            .any(|a| a == &format!("developer_instructions=\"{MORE}\"")),
                        "{shown}"
                    );
                } else {
                    // gemini reads it as a context file of its own name in ~/.gemini.
                    assert!(!shown.contains(MORE), "{p}: {shown}");
                    assert!(
                        c.home_files.iter().any(|f| f.contents == MORE.as_bytes()),
                        "{p}"
                    );
                }
            }
        }
    }

    #[test]
    fn effort_maps_to_each_clis_knob() {
        let argv = |p| command(p, Some(Effort::High), false).argv.join(" ");
        assert!(argv(ProviderKind::ClaudeCode).contains("--effort high"));
        assert!(argv(ProviderKind::Codex).contains("-c model_reasoning_effort=\"high\""));
        let opencode = command(ProviderKind::Opencode, Some(Effort::High), false);
        assert!(opencode.argv.contains(&"--variant=high".to_string()));
        let config = &opencode
            .env
            .iter()
            .find(|(k, _)| k == "OPENCODE_CONFIG_CONTENT")
            .unwrap()
            .1;
        let config: serde_json::Value = serde_json::from_str(config).unwrap();
        assert_eq!(
            config["provider"]["caw"]["models"]["stub-model"]["variants"]["high"]
                ["reasoningEffort"],
            "high"
        );
    }

    #[test]
    fn what_a_cli_cannot_take_is_refused_naming_it() {
        // Every pinned CLI takes all three today; the refusal is for a CLI (or version) that
        // does not.
        for p in ProviderKind::ALL {
            assert!(check_support(p, true, true, true).is_ok(), "{p}");
        }
        let none = Support::default();
        for wanted in [
            [true, false, false],
            [false, true, false],
            [false, false, true],
        ] {
            let e = refuse_unsupported(ProviderKind::Gemini, none, wanted).unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.message.contains("gemini CLI"), "{}", e.message);
        }
        assert!(refuse_unsupported(ProviderKind::Gemini, none, [false; 3]).is_ok());
    }
}
