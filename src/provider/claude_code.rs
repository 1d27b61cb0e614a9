//! The Claude Code adapter: `claude -p … --output-format stream-json --verbose` for headless
//! turns, the TUI for interactive ones, and a parser from its stream-json lines to unified
//! events. It neither runs `claude` nor reads its state files.
//!
//! Usage: one `usage` event per turn, from the final `result` line (`result.usage`, and the
//! cost of this run: `model_usage_since_last_result`, else `total_cost_usd`); claude's
//! `input_tokens` already exclude cache reads and writes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::common::{
    classify_failure, endpoint_root, parse_line, status_for_http, Link, TurnState,
};
use super::*;

#[derive(Debug)]
pub struct ClaudeCode;

const API_KEY_VAR: &str = "ANTHROPIC_API_KEY";

use crate::agent_config::ToolGroup;

/// The MCP servers of `--mcp`, for `--mcp-config` (relative to HOME).
const MCP_CONFIG_FILE: &str = ".caw-box/agent/claude-mcp.json";
/// claude's cache (its MCP logs) when it has MCP servers: outside the state volume.
const MCP_CACHE_DIR: &str = "/tmp/caw-box-cache";

/// claude records the system prompt of a conversation's first request and sends that record
/// on every later one, resumes included, whatever a later launch passes
/// (`--system-prompt-snapshot on`, 2.1.332's default): caw-box turns that off, so a resume's
/// `--system-prompt` takes effect as documented. 2.1.267 (the oldest version tested) takes the
/// option, without effect there; an older claude may not know it, so it gets none.
const PROMPT_SNAPSHOT_SINCE: &str = "2.1.267";

/// Claude Code's built-in tools per group (its MCP tools are `mcp__server__tool`).
const TOOLS: ToolTable = &[
    (
        ToolGroup::Read,
        &["Read", "Glob", "Grep", "LS", "NotebookRead"],
    ),
    (
        ToolGroup::Edit,
        &["Edit", "MultiEdit", "Write", "NotebookEdit"],
    ),
    (
        ToolGroup::Shell,
        &["Bash", "BashOutput", "KillShell", "KillBash"],
    ),
    (ToolGroup::Web, &["WebFetch", "WebSearch"]),
    (
        ToolGroup::Mcp,
        &["ListMcpResourcesTool", "ReadMcpResourceTool"],
    ),
];

impl Provider for ClaudeCode {
    fn kind(&self) -> ProviderKind {
        ProviderKind::ClaudeCode
    }

    fn turn_command(&self, request: &TurnRequest<'_>) -> TurnCommand {
        let mut argv = vec!["claude".to_string()];
        if !request.interactive {
            argv.extend(["-p", "--output-format", "stream-json", "--verbose"].map(String::from));
        }
        match (request.resume_key, request.new_session_key) {
            (Some(key), _) => argv.extend(["--resume".to_string(), key.to_string()]),
            (None, Some(key)) => argv.extend(["--session-id".to_string(), key.to_string()]),
            (None, None) => {}
        }
        argv.push("--dangerously-skip-permissions".to_string());
        if let Some(model) = request.model {
            argv.extend(["--model".to_string(), model.to_string()]);
        }
        // The texts go in files (see `agent_config`): long ones would not fit argv.
        use crate::agent_config::{APPEND_SYSTEM_PROMPT_FILE, SYSTEM_PROMPT_FILE};
        if request.system_prompt.is_some() {
            argv.extend([
                "--system-prompt-file".to_string(),
                in_home(SYSTEM_PROMPT_FILE),
            ]);
        }
        if request.append_system_prompt.is_some() {
            argv.extend([
                "--append-system-prompt-file".to_string(),
                in_home(APPEND_SYSTEM_PROMPT_FILE),
            ]);
        }
        if cli_version_at_least(request.cli_version, PROMPT_SNAPSHOT_SINCE) {
            argv.extend(["--system-prompt-snapshot", "off"].map(String::from));
        }
        if let Some(effort) = request.effort {
            argv.extend(["--effort".to_string(), effort.as_str().to_string()]);
        }
        if let Some(tools) = request.tools {
            // Denied tools are taken out of what the model is offered. One `=` word: the
            // option takes several values, and would swallow the words after it.
            let denied = tools.denied_names(TOOLS);
            if !denied.is_empty() {
                argv.push(format!("--disallowedTools={}", denied.join(",")));
            }
            // Only the servers of --mcp-config (none): no MCP server starts.
            if tools.denied_groups().contains(&ToolGroup::Mcp) {
                argv.push("--strict-mcp-config".to_string());
            }
        }
        let mcp_file = mcp_config(request);
        if mcp_file.is_some() {
            argv.push(format!("--mcp-config={}", in_home(MCP_CONFIG_FILE)));
        }
        // `claude -p` with no prompt operand reads the prompt from stdin: a prompt of any
        // size (an argument takes at most 128 KiB), never taken for an option or for a
        // subcommand (commander dispatches `update`, `mcp`, ... even after `--`). The TUI
        // opens without an initial prompt (SPEC: no PROMPT means interactive).
        let stdin = (!request.interactive).then(|| request.prompt.as_bytes().to_vec());
        let mut env = vec![(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".to_string(),
            "1".to_string(),
        )];
        if mcp_file.is_some() {
            // claude logs each MCP server's traffic, headers included, under its cache dir:
            // kept out of HOME (the state volume), so no MCP secret is left at rest.
            env.push(("XDG_CACHE_HOME".to_string(), MCP_CACHE_DIR.to_string()));
            // claude 2.1.332 (2.1.268 on, as drift found) offers MCP tools behind its
            // ToolSearch tool (the model first searches, then gets the tool): off, they are
            // offered directly, as before. Older versions ignore the variable.
            env.push(("ENABLE_TOOL_SEARCH".to_string(), "false".to_string()));
        }
        if let Some(endpoint) = request.endpoint {
            env.push((
                "ANTHROPIC_BASE_URL".to_string(),
                endpoint_root(endpoint).to_string(),
            ));
        }
        let mut home_files = prompt_files(request);
        home_files.extend(mcp_file);
        if request.interactive {
            // The TUI's first-run screens, which a headless turn never shows: onboarding
            // (its connectivity check fails without a way out to Anthropic), trusting the
            // workspace, and accepting the bypass-permissions mode caw-box runs it in.
            home_files.push(HomeFile {
                path: ".claude.json".to_string(),
                contents: serde_json::to_vec(&serde_json::json!({
                    "hasCompletedOnboarding": true,
                    "projects": { WORKSPACE_DIR: { "hasTrustDialogAccepted": true } },
                }))
                .expect("static JSON"),
                merge_json: true,
            });
            let mut settings = serde_json::json!({ "skipDangerousModePermissionPrompt": true });
            if request.credential_env.iter().any(|n| n == API_KEY_VAR) {
                // The TUI asks before it uses an ANTHROPIC_API_KEY found in its environment
                // (a turn would wait on that question). A key helper is not asked about: the
                // entrypoint hands the key over under another name, which the helper prints.
                settings["apiKeyHelper"] = format!("printenv {HIDDEN_PREFIX}{API_KEY_VAR}").into();
                env.push((HIDE_ENV.to_string(), API_KEY_VAR.to_string()));
            }
            argv.extend(["--settings".to_string(), settings.to_string()]);
        }
        TurnCommand {
            argv,
            env,
            home_files,
            stdin,
        }
    }

    fn support(&self) -> crate::agent_config::Support {
        crate::agent_config::Support {
            replace: true,
            append: true,
            effort: true,
            tool_groups: &ToolGroup::ALL,
            tool_names: true,
        }
    }

    fn tool_names(&self) -> ToolTable {
        TOOLS
    }

    fn latest_key_script(&self) -> String {
        // Conversations live in ~/.claude/projects/<cwd, '/' as '-'>/<session id>.jsonl.
        let project = WORKSPACE_DIR.replace('/', "-");
        format!(
            r#"f=$(ls -t "$HOME"/.claude/projects/{project}/*.jsonl 2>/dev/null | head -n1); [ -n "$f" ] && basename "$f" .jsonl"#
        )
    }

    fn parser(&self, _context: ParseContext) -> Box<dyn StreamParser> {
        Box::new(ClaudeParser::default())
    }

    fn chooses_key_up_front(&self) -> bool {
        true
    }
}

/// The `--mcp-config` file of the turn's MCP servers, if it has any.
fn mcp_config(request: &TurnRequest<'_>) -> Option<HomeFile> {
    let mcp = crate::agent_config::mcp_for_turn(request.mcp, request.tools);
    if mcp.is_empty() {
        return None;
    }
    // claude expands `${VAR}` in it: the secrets stay in its environment.
    let servers = crate::agent_config::mcp_servers_json(mcp, "url", |v| format!("${{{v}}}"));
    Some(HomeFile {
        path: MCP_CONFIG_FILE.to_string(),
        contents: serde_json::json!({ "mcpServers": servers })
            .to_string()
            .into_bytes(),
        merge_json: false,
    })
}

/// Parses one turn of `claude -p --output-format stream-json --verbose`.
#[derive(Debug, Default)]
struct ClaudeParser {
    session_id: Option<String>,
    state: TurnState,
    /// The failure class of the last `system/api_retry` line, a hint for a later failure.
    retry_failure: Option<Status>,
    /// Whether the CLI is failing to reach its model.
    link: Link,
}

impl ClaudeParser {
    /// One stdout line (see [`StreamParser::parse_line`]).
    fn parse(&mut self, line: &str, out: &mut Vec<Event>) {
        let Some(line) = parse_line::<Line<'_>>(line) else {
            return;
        };
        if let Some(id) = line.session_id.as_deref() {
            if self.session_id.as_deref() != Some(id) {
                self.session_id = Some(id.to_string());
            }
        }
        match line.kind {
            LineKind::Assistant => self.assistant(
                line.message,
                line.error,
                line.parent_tool_use_id.is_some(),
                out,
            ),
            LineKind::User => user(line.message, out),
            LineKind::Result => self.result(line, out),
            LineKind::System => {
                if line.subtype.as_deref() == Some("api_retry") {
                    // No HTTP status: the request never got an answer (no name, no route,
                    // refused).
                    match line.error_status {
                        None => self.link.failing(&format!(
                            "API connection error (retry {} of {})",
                            line.attempt.unwrap_or(0),
                            line.max_retries.unwrap_or(0)
                        )),
                        Some(_) => self.link.reached(),
                    }
                    self.retry_failure =
                        line.error_status.and_then(status_for_http).or_else(|| {
                            line.error
                                .as_ref()
                                .and_then(Value::as_str)
                                .and_then(failure_of_error_kind)
                        });
                }
            }
            LineKind::Other => {}
        }
    }
}

impl StreamParser for ClaudeParser {
    fn parse_line(&mut self, line: &str, out: &mut Vec<Event>) {
        let before = out.len();
        self.parse(line, out);
        self.link.saw(&out[before..]);
    }

    fn unreachable(&self) -> Option<&str> {
        self.link.get()
    }

    fn resume_key(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    fn finish(&mut self, exit_code: i64) -> TurnOutcome {
        self.state.outcome(exit_code, None)
    }
}

impl ClaudeParser {
    fn assistant(
        &mut self,
        message: Option<Message>,
        error: Option<Value>,
        from_subagent: bool,
        out: &mut Vec<Event>,
    ) {
        let Some(Message {
            content: Content::Blocks(blocks),
        }) = message
        else {
            return;
        };
        // claude renders a failed API call as an assistant message with an `error` kind; its
        // text is the error, reported again (with is_error) by the result line.
        if let Some(kind) = error.as_ref().and_then(Value::as_str) {
            let text: String = blocks.iter().filter_map(|b| b.text.as_deref()).collect();
            let message = if text.is_empty() {
                kind.to_string()
            } else {
                text
            };
            self.state
                .record_error(message, failure_of_error_kind(kind));
            return;
        }
        for block in blocks {
            match block.kind {
                BlockKind::Text => {
                    // A subagent's text is its report to the main agent, not the answer.
                    if let (Some(text), false) = (block.text, from_subagent) {
                        self.state.answer.message(&text);
                        out.push(Event::Text { text });
                    }
                }
                BlockKind::Thinking => {
                    if let Some(text) = block.thinking.filter(|t| !t.is_empty()) {
                        out.push(Event::Thinking { text });
                    }
                }
                BlockKind::ToolUse => {
                    self.state.answer.boundary();
                    out.push(Event::ToolCall {
                        id: block.id.unwrap_or_default(),
                        name: block.name.unwrap_or_default(),
                        input: block.input.unwrap_or(Value::Null),
                        group: None,
                    });
                }
                BlockKind::ToolResult | BlockKind::Other => {}
            }
        }
    }

    fn result(&mut self, line: Line<'_>, out: &mut Vec<Event>) {
        if let Some(usage) = &line.usage {
            self.state.usage = Usage {
                input_tokens: usage.input_tokens.unwrap_or(0),
                output_tokens: usage.output_tokens.unwrap_or(0),
                cache_read_tokens: usage.cache_read_input_tokens.unwrap_or(0),
                cache_write_tokens: usage.cache_creation_input_tokens.unwrap_or(0),
                cost_usd: line.turn_cost(),
            };
            out.push(Event::Usage {
                usage: self.state.usage,
            });
        }
        let result = match line.result {
            Some(Value::String(text)) => Some(text),
            _ => None,
        };
        // `"subtype":"success"` with `"is_error":true` is a failed turn: trust is_error.
        if line.is_error == Some(true)
            || line
                .subtype
                .as_deref()
                .is_some_and(|s| s.starts_with("error"))
        {
            let message = result
                .filter(|r| !r.trim().is_empty())
                .or_else(|| joined_errors(line.errors.as_ref()))
                .or_else(|| self.state.error.take())
                .unwrap_or_else(|| match line.subtype.as_deref() {
                    Some(subtype) => format!("the turn failed ({subtype})"),
                    None => "the turn failed".to_string(),
                });
            let failure = self.state.failure.or(match classify_failure(&message) {
                Status::Error => self.retry_failure,
                status => Some(status),
            });
            out.push(Event::Error {
                message: message.clone(),
            });
            self.state.record_error(message, failure);
            self.state.verdict = Some(false);
        } else {
            self.state.reported_answer = result;
            self.state.verdict = Some(true);
        }
    }
}

fn user(message: Option<Message>, out: &mut Vec<Event>) {
    let Some(Message {
        content: Content::Blocks(blocks),
    }) = message
    else {
        return;
    };
    for block in blocks {
        if block.kind == BlockKind::ToolResult {
            out.push(Event::ToolResult {
                id: block.tool_use_id.unwrap_or_default(),
                output: block.content.map(Content::into_text).unwrap_or_default(),
                is_error: block.is_error.unwrap_or(false),
            });
        }
    }
}

/// The failure class of claude's error kinds (`authentication_failed`, `rate_limit`, ...).
fn failure_of_error_kind(kind: &str) -> Option<Status> {
    match kind {
        "authentication_failed" | "authentication_error" | "oauth_org_not_allowed" => {
            Some(Status::AuthError)
        }
        "rate_limit" | "rate_limit_error" | "billing_error" => Some(Status::UsageLimit),
        _ => None,
    }
}

/// The `errors` array of error results, one message per line.
fn joined_errors(errors: Option<&Value>) -> Option<String> {
    let joined = errors?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join("\n");
    (!joined.is_empty()).then_some(joined)
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum LineKind {
    System,
    Assistant,
    User,
    Result,
    #[serde(other)]
    Other,
}

/// One stream-json line; fields of all line types, each optional.
#[derive(Deserialize, Debug)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: LineKind,
    #[serde(default, borrow)]
    subtype: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    session_id: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    parent_tool_use_id: Option<IgnoredAny>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    errors: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    error_status: Option<i64>,
    #[serde(default)]
    attempt: Option<u64>,
    #[serde(default)]
    max_retries: Option<u64>,
    #[serde(default)]
    usage: Option<ResultUsage>,
    #[serde(default)]
    total_cost_usd: Option<f64>,
    /// This run's cost per model (claude 2.1.332; its `total_cost_usd` then counts the
    /// resumed conversation's earlier runs too).
    #[serde(default)]
    model_usage_since_last_result: Option<std::collections::BTreeMap<String, ModelCost>>,
}

#[derive(Deserialize, Debug, Default)]
struct ModelCost {
    #[serde(default, rename = "costUSD")]
    cost_usd: Option<f64>,
}

impl Line<'_> {
    /// This turn's cost as claude reports it: the sum over `model_usage_since_last_result`
    /// where claude gives it (its `total_cost_usd` is then the whole resumed conversation's,
    /// as 2.1.332's is), else `total_cost_usd` (one run's, as 2.1.267's is).
    fn turn_cost(&self) -> Option<f64> {
        match &self.model_usage_since_last_result {
            Some(models) if models.values().all(|m| m.cost_usd.is_some()) => {
                Some(models.values().filter_map(|m| m.cost_usd).sum())
            }
            _ => self.total_cost_usd,
        }
    }
}

#[derive(Deserialize, Debug, Default)]
struct ResultUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize, Debug, Default)]
struct Message {
    #[serde(default)]
    content: Content,
}

#[derive(Deserialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum BlockKind {
    Text,
    Thinking,
    ToolUse,
    ToolResult,
    #[default]
    #[serde(other)]
    Other,
}

/// A content block of any kind; which fields are set depends on `kind`.
#[derive(Deserialize, Debug, Default)]
struct Block {
    #[serde(rename = "type", default)]
    kind: BlockKind,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    is_error: Option<bool>,
}

/// Message or tool-result content: a plain string or an array of blocks.
#[derive(Debug, Default)]
enum Content {
    #[default]
    Empty,
    Text(String),
    Blocks(Vec<Block>),
}

impl Content {
    /// The text of the content: the string, or the text blocks joined by newlines.
    fn into_text(self) -> String {
        match self {
            Content::Empty => String::new(),
            Content::Text(text) => text,
            Content::Blocks(blocks) => blocks
                .into_iter()
                .filter_map(|b| b.text)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;

        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content::Text(v.to_owned()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content::Text(v))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Content, E> {
                Ok(Content::Empty)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut blocks = Vec::new();
                while let Some(block) = seq.next_element::<Block>()? {
                    blocks.push(block);
                }
                Ok(Content::Blocks(blocks))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Content, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Empty)
            }
        }

        deserializer.deserialize_any(ContentVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::test_support::{assert_prompt_only_on_stdin, parse_with, request};
    use serde_json::json;

    const SESSION: &str = "0b7e9c52-5a8f-4d8e-9a51-3c2f1e7d9a10";

    fn parse(fixture: &str, exit_code: i64) -> (Vec<Event>, Option<String>, TurnOutcome) {
        parse_with(&ClaudeCode, ParseContext::default(), fixture, exit_code)
    }

    #[test]
    fn first_turn_chooses_the_session_id() {
        let command = ClaudeCode.turn_command(&TurnRequest {
            new_session_key: Some(SESSION),
            ..request("list the files")
        });
        assert_eq!(
            command.argv,
            [
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--session-id",
                SESSION,
                "--dangerously-skip-permissions",
                "--system-prompt-snapshot",
                "off",
            ]
        );
        assert_eq!(
            command.env,
            [(
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".to_string(),
                "1".to_string()
            )]
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"list the files"[..]));
        assert!(command.home_files.is_empty());
        assert!(ClaudeCode.chooses_key_up_front());
    }

    #[test]
    fn resume_uses_the_key_and_never_the_session_id_flag() {
        let command = ClaudeCode.turn_command(&TurnRequest {
            resume_key: Some(SESSION),
            new_session_key: Some("ignored"),
            ..request("and now?")
        });
        assert_eq!(
            command.argv,
            [
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--resume",
                SESSION,
                "--dangerously-skip-permissions",
                "--system-prompt-snapshot",
                "off",
            ]
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"and now?"[..]));
        assert!(!command.argv.iter().any(|a| a == "--session-id"));
    }

    /// The pins' claude (and an image of unknown version) records no system prompt and
    /// offers MCP tools directly; an older one gets no option it may not take.
    #[test]
    fn the_flags_follow_the_images_cli_version() {
        let servers =
            [crate::agent_config::McpServer::parse("caw=node /workspace/s.js", "--mcp").unwrap()];
        let turn = |version| {
            ClaudeCode.turn_command(&TurnRequest {
                cli_version: version,
                resume_key: Some(SESSION),
                system_prompt: Some("You are terse."),
                mcp: &servers,
                ..request("go on")
            })
        };
        let tool_search_off = ("ENABLE_TOOL_SEARCH".to_string(), "false".to_string());
        let snapshot_off = |argv: &[String]| {
            argv.windows(2)
                .any(|w| w == ["--system-prompt-snapshot", "off"])
        };
        for version in [None, Some("2.1.267"), Some("2.1.332")] {
            let command = turn(version);
            assert!(
                snapshot_off(&command.argv),
                "{version:?}: {:?}",
                command.argv
            );
            assert!(command.env.contains(&tool_search_off), "{version:?}");
        }
        let old = turn(Some("2.1.266"));
        assert!(
            !old.argv
                .iter()
                .any(|a| a.starts_with("--system-prompt-snapshot")),
            "{:?}",
            old.argv
        );
        assert!(old.argv.contains(&"--system-prompt-file".to_string()));
        // Ignored by a claude without tool search.
        assert!(old.env.contains(&tool_search_off));
        // No MCP server: no variable.
        let plain = ClaudeCode.turn_command(&request("hi"));
        assert!(!plain.env.iter().any(|(k, _)| k == "ENABLE_TOOL_SEARCH"));
    }

    /// A resumed claude 2.1.332 reports the conversation's cost in `total_cost_usd` and this
    /// run's per model: the turn costs this run's.
    #[test]
    fn a_resumed_turn_costs_this_run_not_the_conversation() {
        let line = json!({
            "type": "result", "subtype": "success", "is_error": false, "result": "otter",
            "session_id": SESSION, "total_cost_usd": 0.099108,
            "usage": {"input_tokens": 12372, "output_tokens": 8},
            "modelUsage": {"claude-opus-5-5": {"inputTokens": 24717, "costUSD": 0.099108}},
            "model_usage_since_last_result": {
                "claude-opus-5-5": {"inputTokens": 12372, "outputTokens": 8, "costUSD": 0.049648}
            }
        });
        let (_, _, outcome) = parse(&line.to_string(), 0);
        assert_eq!(outcome.usage.cost_usd, Some(0.049648));
        assert_eq!(outcome.usage.input_tokens, 12372);
        // Without it (2.1.267): total_cost_usd, one run's.
        let mut line = line;
        line.as_object_mut()
            .unwrap()
            .remove("model_usage_since_last_result");
        let (_, _, outcome) = parse(&line.to_string(), 0);
        assert_eq!(outcome.usage.cost_usd, Some(0.099108));
    }

    #[test]
    fn model_and_endpoint() {
        let command = ClaudeCode.turn_command(&TurnRequest {
            model: Some("claude-sonnet-4-5"),
            endpoint: Some("http://stub:8080/v1/"),
            ..request("hi there")
        });
        let at = command.argv.iter().position(|a| a == "--model").unwrap();
        assert_eq!(command.argv[at + 1], "claude-sonnet-4-5");
        assert!(command.env.contains(&(
            "ANTHROPIC_BASE_URL".to_string(),
            "http://stub:8080".to_string()
        )));
        assert!(command.env.contains(&(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".to_string(),
            "1".to_string()
        )));
    }

    #[test]
    fn the_prompt_is_only_on_stdin() {
        assert_prompt_only_on_stdin(&ClaudeCode);
    }

    #[test]
    fn interactive_forms() {
        let first = ClaudeCode.turn_command(&TurnRequest {
            interactive: true,
            new_session_key: Some(SESSION),
            model: Some("opus"),
            ..request("")
        });
        assert_eq!(
            first.argv[..6],
            [
                "claude",
                "--session-id",
                SESSION,
                "--dangerously-skip-permissions",
                "--model",
                "opus"
            ]
        );
        // The TUI's first-run questions are answered up front; no key helper without a key.
        let settings = |argv: &[String]| -> serde_json::Value {
            assert_eq!(argv[argv.len() - 2], "--settings");
            serde_json::from_str(&argv[argv.len() - 1]).unwrap()
        };
        assert_eq!(
            settings(&first.argv),
            serde_json::json!({"skipDangerousModePermissionPrompt": true})
        );
        let claude_json = &first.home_files[0];
        assert_eq!(claude_json.path, ".claude.json");
        assert!(claude_json.merge_json);
        let claude_json: serde_json::Value = serde_json::from_slice(&claude_json.contents).unwrap();
        assert_eq!(claude_json["hasCompletedOnboarding"], true);
        assert_eq!(
            claude_json["projects"]["/workspace"]["hasTrustDialogAccepted"],
            true
        );
        let names = ["ANTHROPIC_API_KEY".to_string()];
        let resumed = ClaudeCode.turn_command(&TurnRequest {
            interactive: true,
            resume_key: Some(SESSION),
            endpoint: Some("http://stub:8080"),
            credential_env: &names,
            ..request("")
        });
        assert_eq!(
            resumed.argv[..4],
            [
                "claude",
                "--resume",
                SESSION,
                "--dangerously-skip-permissions"
            ]
        );
        // An API key goes through a key helper, which the TUI does not stop to ask about.
        assert_eq!(
            settings(&resumed.argv)["apiKeyHelper"],
            "printenv CAW_BOX_HIDDEN_ANTHROPIC_API_KEY"
        );
        assert!(resumed
            .env
            .contains(&(HIDE_ENV.to_string(), "ANTHROPIC_API_KEY".to_string())));
        // Headless turns need none of it.
        let headless = ClaudeCode.turn_command(&TurnRequest {
            credential_env: &names,
            ..request("hi")
        });
        assert!(headless.home_files.is_empty());
        assert!(!headless.argv.contains(&"--settings".to_string()));
        assert!(!headless.env.iter().any(|(k, _)| k == HIDE_ENV));
        assert!(resumed.env.contains(&(
            "ANTHROPIC_BASE_URL".to_string(),
            "http://stub:8080".to_string()
        )));
        assert_eq!(resumed.stdin, None);
    }

    #[test]
    fn a_turn_with_tool_calls() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/claude_code/hand-turn1.jsonl"),
            0,
        );
        assert_eq!(key.as_deref(), Some(SESSION));
        let usage = Usage {
            input_tokens: 12,
            output_tokens: 85,
            cache_read_tokens: 2400,
            cache_write_tokens: 1200,
            cost_usd: Some(0.0123),
        };
        assert_eq!(
            events,
            [
                Event::Thinking {
                    text: "The user wants the file list.".into()
                },
                Event::Text {
                    text: "I'll list the files.".into()
                },
                Event::ToolCall {
                    id: "toolu_01A".into(),
                    name: "Bash".into(),
                    input: json!({"command": "ls", "description": "List files"}),
                    group: None,
                },
                Event::ToolResult {
                    id: "toolu_01A".into(),
                    output: "README.md\nsrc".into(),
                    is_error: false
                },
                Event::ToolCall {
                    id: "toolu_01B".into(),
                    name: "Read".into(),
                    input: json!({"file_path": "/workspace/missing.txt"}),
                    group: None,
                },
                Event::ToolResult {
                    id: "toolu_01B".into(),
                    output: "<tool_use_error>File does not exist.</tool_use_error>".into(),
                    is_error: true
                },
                Event::Text {
                    text: "The workspace holds README.md and src.".into()
                },
                Event::Usage { usage },
            ]
        );
        assert_eq!(
            outcome,
            TurnOutcome {
                status: Status::Success,
                result: "The workspace holds README.md and src.".into(),
                usage,
                cumulative_usage: None,
            }
        );
    }

    #[test]
    fn is_error_with_subtype_success_is_an_auth_failure() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/claude_code/hand-auth-error.jsonl"),
            1,
        );
        assert_eq!(key.as_deref(), Some("5d1c7a0e-2b44-4c1e-8f7a-9e0d3c2b1a00"));
        assert_eq!(outcome.status, Status::AuthError);
        assert_eq!(outcome.result, "Invalid API key · Please run /login");
        assert!(events.contains(&Event::Error {
            message: "Invalid API key · Please run /login".into()
        }));
        assert!(!events.iter().any(|e| matches!(e, Event::Text { .. })));
        assert_eq!(outcome.usage.cost_usd, Some(0.0));
    }

    #[test]
    fn a_rate_limit_is_a_usage_limit() {
        let (events, _, outcome) = parse(
            include_str!("../../tests/fixtures/claude_code/hand-usage-limit.jsonl"),
            1,
        );
        assert_eq!(outcome.status, Status::UsageLimit);
        assert!(
            outcome.result.starts_with("API Error: 429"),
            "{}",
            outcome.result
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, Event::Error { .. }))
                .count(),
            1
        );
    }

    #[test]
    fn an_api_error_is_a_plain_failure_even_with_subtype_success() {
        let (events, _, outcome) = parse(
            include_str!("../../tests/fixtures/claude_code/hand-api-error.jsonl"),
            0,
        );
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(
            outcome.result,
            "API Error: 500 {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}"
        );
        assert_eq!(
            events.last(),
            Some(&Event::Error {
                message: outcome.result.clone()
            })
        );
        assert_eq!(outcome.usage.input_tokens, 0);
    }

    #[test]
    fn a_cut_off_turn_fails_with_the_exit_code() {
        let fixture = include_str!("../../tests/fixtures/claude_code/hand-turn1.jsonl");
        let partial: String = fixture.lines().take(5).map(|l| format!("{l}\n")).collect();
        let (events, key, outcome) = parse(&partial, 143);
        assert_eq!(key.as_deref(), Some(SESSION));
        assert!(!events.is_empty());
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(outcome.result, "the CLI exited with code 143");
        // claude without a writable temp dir exits 0 with no output at all.
        let (events, key, outcome) = parse("", 0);
        assert!(events.is_empty());
        assert_eq!(key, None);
        assert_eq!(outcome.status, Status::Error);
    }

    #[test]
    fn garbage_never_panics_or_yields_events() {
        let mut parser = ClaudeCode.parser(ParseContext::default());
        let mut events = Vec::new();
        for line in [
            "",
            "not json",
            "{",
            "{\"type\":",
            "[]",
            "null",
            "{\"type\":42}",
            "{\"type\":\"assistant\",\"message\":{\"content\":[1,2]}}",
            "{\"type\":\"assistant\",\"message\":{\"content\":{\"odd\":true}}}",
            "{\"type\":\"user\",\"message\":{\"content\":\"plain prompt echo\"}}",
            "{\"type\":\"result\",\"usage\":\"none\"}",
            "{\"type\":\"mystery\",\"session_id\":7}",
        ] {
            parser.parse_line(line, &mut events);
        }
        assert_eq!(events, []);
        assert_eq!(parser.resume_key(), None);
    }
}
