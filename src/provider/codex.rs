//! The Codex adapter: `codex exec --json` (and `codex exec … resume <thread>`) for headless
//! turns, the TUI for interactive ones, and a parser from its JSONL events to unified events.
//! It neither runs `codex` nor reads `~/.codex`.
//!
//! Usage: codex reports token counts only in `turn.completed`, cumulatively over the whole
//! thread. The parser subtracts [`ParseContext::previous_cumulative_usage`] and emits one
//! `usage` event per `turn.completed` with the figures since the previous report. codex's
//! `input_tokens` include `cached_input_tokens`; here `input_tokens` are the uncached part
//! and `cache_read_tokens` the cached part. `output_tokens` already include reasoning.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::common::{endpoint_v1, is_connection_failure, parse_line, Link, TurnState};
use super::*;

#[derive(Debug)]
pub struct Codex;

/// The model provider id `--endpoint` defines in codex's config.
const ENDPOINT_PROVIDER: &str = "caw";

use crate::agent_config::ToolGroup;

/// codex's tools per group, under the names its `tool_call` events carry.
const TOOLS: ToolTable = &[
    (ToolGroup::Edit, &["apply_patch"]),
    (ToolGroup::Shell, &["shell"]),
    (ToolGroup::Web, &["web_search"]),
];

impl Provider for Codex {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Codex
    }

    /// `codex app-server` with its stdin at end of file: it opens codex's databases
    /// (`state_5`, `logs_2`, `goals_1`, `memories_1`, `queue_1`), writes its bundled skills
    /// and its installation id, and exits, having started no thread. A first `codex exec` in
    /// a HOME without them spent about 0.3 s making them (measured: 0.7-1.0 s against
    /// 0.4-0.5 s). Bounded by `timeout`: a box is never held by it.
    fn prime_argv(&self) -> Option<Vec<String>> {
        Some(
            [
                "timeout",
                "20",
                "codex",
                "app-server",
                "-c",
                "analytics.enabled=false",
            ]
            .map(String::from)
            .to_vec(),
        )
    }

    /// `codex app-server` listening on a socket in the box (`codex_ahead`).
    fn prestart_argv(&self) -> Option<Vec<String>> {
        Some(super::codex_ahead::prestart_argv())
    }

    /// A headless first turn goes to the server started ahead (`codex_ahead`).
    fn prestarted_turn(&self, argv: &[String]) -> Option<Vec<String>> {
        super::codex_ahead::prestarted_turn(argv)
    }

    fn turn_command(&self, request: &TurnRequest<'_>) -> TurnCommand {
        let mut argv = vec!["codex".to_string()];
        if request.interactive {
            if request.resume_key.is_some() {
                argv.push("resume".to_string());
            }
        } else {
            argv.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
        }
        argv.push("--dangerously-bypass-approvals-and-sandbox".to_string());
        // Background calls to github.com and chatgpt.com, which a sandbox would only stall on.
        argv.extend(["--disable", "plugins", "-c", "analytics.enabled=false"].map(String::from));
        if let Some(model) = request.model {
            argv.extend(["-m".to_string(), model.to_string()]);
        }
        let mut settings = Vec::new();
        if let Some(endpoint) = request.endpoint {
            settings.extend(endpoint_settings(endpoint, request.credential_env));
        }
        // The replacing text goes in a file codex reads (a long one would not fit argv); codex
        // takes the appended text (its developer message) only as a value.
        if request.system_prompt.is_some() {
            let file = in_home(crate::agent_config::SYSTEM_PROMPT_FILE);
            settings.push(format!("model_instructions_file={}", toml_string(&file)));
        }
        if let Some(text) = request.append_system_prompt {
            settings.push(format!("developer_instructions={}", toml_string(text)));
        }
        if let Some(tools) = request.tools {
            settings.extend(denied_tool_settings(tools));
        }
        for m in crate::agent_config::mcp_for_turn(request.mcp, request.tools) {
            settings.extend(mcp_settings(m));
        }
        if let Some(effort) = request.effort {
            settings.push(format!(
                "model_reasoning_effort={}",
                toml_string(effort.as_str())
            ));
        }
        for setting in settings {
            argv.extend(["-c".to_string(), setting]);
        }
        let stdin = push_prompt(&mut argv, request);
        let home_files = match request.system_prompt {
            Some(_) => prompt_files(&TurnRequest {
                append_system_prompt: None,
                ..request.clone()
            }),
            None => Vec::new(),
        };
        TurnCommand {
            argv,
            env: Vec::new(),
            home_files,
            stdin,
        }
    }

    fn parser(&self, context: ParseContext) -> Box<dyn StreamParser> {
        Box::new(CodexParser {
            previous: context.previous_cumulative_usage,
            last_reported: context.previous_cumulative_usage.unwrap_or_default(),
            ..CodexParser::default()
        })
    }

    fn support(&self) -> crate::agent_config::Support {
        crate::agent_config::Support {
            replace: true,
            append: true,
            effort: true,
            // Its read and edit tools cannot be taken away alone (reading is a shell
            // command; `apply_patch` comes with the model), nor single tools by name.
            tool_groups: &[ToolGroup::Shell, ToolGroup::Web, ToolGroup::Mcp],
            tool_names: false,
        }
    }

    fn tool_names(&self) -> ToolTable {
        TOOLS
    }

    fn latest_key_script(&self) -> String {
        // Threads live in ~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl.
        r#"find "$HOME/.codex/sessions" -name 'rollout-*.jsonl' -printf '%T@ %f\n' 2>/dev/null | sort -n | tail -n1 | sed -nE 's/.*-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$/\1/p'"#.to_string()
    }
}

/// The `-c` settings that define `--endpoint` as codex's model provider.
fn endpoint_settings(endpoint: &str, credential_env: &[String]) -> Vec<String> {
    let base_url = endpoint_v1(endpoint);
    let p = ENDPOINT_PROVIDER;
    let mut settings: Vec<String> = [
        ("model_provider".to_string(), p),
        (format!("model_providers.{p}.name"), p),
        (format!("model_providers.{p}.base_url"), base_url.as_str()),
        (format!("model_providers.{p}.wire_api"), "responses"),
    ]
    .into_iter()
    .map(|(key, value)| format!("{key}={}", toml_string(value)))
    .collect();
    // With no API key, codex's own login (`auth.json`, a ChatGPT login: its access
    // token as `Bearer`, and `chatgpt-account-id`) is what the provider uses.
    let keyed = credential_env
        .iter()
        .any(|n| n == "OPENAI_API_KEY" || n == "CODEX_API_KEY");
    settings.push(if keyed {
        format!(
            "model_providers.{p}.env_key={}",
            toml_string("OPENAI_API_KEY")
        )
    } else {
        format!("model_providers.{p}.requires_openai_auth=true")
    });
    // One silent request retry instead of four (~30 s of backoff before codex says
    // anything): a dead endpoint shows as "Reconnecting... waiting for network" after
    // ~10 s, and codex's reconnect loop still retries after that.
    settings.push(format!("model_providers.{p}.request_max_retries=1"));
    settings
}

/// The `-c` settings that take away the tool groups a policy denies.
fn denied_tool_settings(tools: &crate::agent_config::ToolPolicy) -> Vec<String> {
    let mut out = Vec::new();
    for group in tools.denied_groups() {
        let settings: &[&str] = match group {
            // Both of its ways to run commands.
            ToolGroup::Shell => &["features.shell_tool=false", "features.unified_exec=false"],
            ToolGroup::Web => &["web_search=\"disabled\""],
            // No MCP server: an empty table replaces the config's own.
            ToolGroup::Mcp => &["mcp_servers={}", "features.apps=false"],
            // Refused up front (`support`): codex reads and edits through its shell.
            ToolGroup::Read | ToolGroup::Edit => &[],
        };
        out.extend(settings.iter().map(|s| s.to_string()));
    }
    out
}

/// An MCP server's `-c` settings; a secret is named by its variable (`env_vars` passes
/// one on to a command, `env_http_headers` reads a header from one).
fn mcp_settings(m: &crate::agent_config::McpServer) -> Vec<String> {
    let key = format!("mcp_servers.{}", m.name);
    let strings = |v: &[String]| {
        format!(
            "[{}]",
            v.iter()
                .map(|s| toml_string(s))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut settings = Vec::new();
    match &m.transport {
        crate::agent_config::McpTransport::Stdio { command } => {
            settings.push(format!("{key}.command={}", toml_string(&command[0])));
            settings.push(format!("{key}.args={}", strings(&command[1..])));
            if !m.env.is_empty() {
                settings.push(format!("{key}.env_vars={}", strings(&m.env)));
            }
        }
        crate::agent_config::McpTransport::Http { url } => {
            settings.push(format!("{key}.url={}", toml_string(url)));
            if !m.headers.is_empty() {
                let headers: Vec<String> = m
                    .headers
                    .iter()
                    .map(|h| {
                        format!(
                            "{} = {}",
                            toml_string(h),
                            toml_string(&crate::agent_config::mcp_header_var(&m.name, h))
                        )
                    })
                    .collect();
                settings.push(format!(
                    "{key}.env_http_headers={{ {} }}",
                    headers.join(", ")
                ));
            }
        }
    }
    settings
}

/// Ends argv with the session to resume and `-` (the prompt on stdin); returns what codex
/// reads on stdin.
fn push_prompt(argv: &mut Vec<String>, request: &TurnRequest<'_>) -> Option<Vec<u8>> {
    if request.interactive {
        // The TUI opens without an initial prompt (SPEC: no PROMPT means interactive).
        if let Some(key) = request.resume_key {
            argv.push(key.to_string());
        }
        return None;
    }
    if let Some(key) = request.resume_key {
        argv.extend(["resume".to_string(), key.to_string()]);
    }
    // `-`: codex reads the prompt from stdin, whole (an argument takes at most 128 KiB),
    // never taken for an option or for the `resume`/`review` subcommand.
    argv.push("-".to_string());
    Some(request.prompt.as_bytes().to_vec())
}

/// `value` as a TOML basic string (the `-c key=value` overrides are parsed as TOML).
fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses one turn of `codex exec --json`.
#[derive(Debug, Default)]
struct CodexParser {
    thread_id: Option<String>,
    state: TurnState,
    /// The thread's cumulative usage before this turn.
    previous: Option<Usage>,
    /// The cumulative usage at the last report (this turn's or, before any, `previous`).
    last_reported: Usage,
    /// The cumulative usage of this turn's last `turn.completed`.
    cumulative: Option<Usage>,
    /// Tool items whose call was already emitted at `item.started`.
    open_calls: Vec<String>,
    /// The message of the last top-level `error` event emitted.
    reported_error: Option<String>,
    /// Whether the CLI is failing to reach its model.
    link: Link,
}

impl CodexParser {
    /// One stdout line (see [`StreamParser::parse_line`]).
    fn parse(&mut self, line: &str, out: &mut Vec<Event>) {
        let Some(line) = parse_line::<Line<'_>>(line) else {
            return;
        };
        match line.kind.as_ref() {
            "thread.started" => {
                if let Some(id) = line.thread_id {
                    self.thread_id = Some(id);
                }
            }
            "item.started" => {
                if let Some(item) = line.item {
                    if let Some(call) = tool_call(&item) {
                        self.state.answer.boundary();
                        self.open_calls.push(item.id);
                        out.push(call);
                    }
                }
            }
            "item.completed" => {
                if let Some(item) = line.item {
                    self.item_completed(item, out);
                }
            }
            "turn.completed" => {
                if let Some(usage) = line.usage {
                    self.turn_completed(usage, out);
                }
                self.state.verdict = Some(true);
            }
            "turn.failed" => {
                let message = line
                    .error
                    .and_then(|e| e.message)
                    .unwrap_or_else(|| "the turn failed".to_string());
                // codex usually sends the same message as an `error` line just before.
                if self.reported_error.as_deref() != Some(message.as_str()) {
                    out.push(Event::Error {
                        message: message.clone(),
                    });
                }
                self.state.record_error(message, None);
                self.state.verdict = Some(false);
            }
            "error" => {
                let Some(message) = line.message else {
                    return;
                };
                // "Reconnecting... 2/5 (…)" is codex retrying: kept as the likely cause if
                // the turn fails later, but not reported as an error of its own.
                if message.starts_with("Reconnecting") {
                    // "Reconnecting... waiting for network (Connection failed: error sending
                    // request)": no answer at all; a broken stream was an answer.
                    if is_connection_failure(&message) {
                        self.link.failing(&message);
                    } else {
                        self.link.reached();
                    }
                } else {
                    out.push(Event::Error {
                        message: message.clone(),
                    });
                    self.reported_error = Some(message.clone());
                }
                self.state.record_error(message, None);
            }
            _ => {}
        }
    }
}

impl StreamParser for CodexParser {
    fn parse_line(&mut self, line: &str, out: &mut Vec<Event>) {
        let before = out.len();
        self.parse(line, out);
        self.link.saw(&out[before..]);
    }

    fn unreachable(&self) -> Option<&str> {
        self.link.get()
    }

    fn resume_key(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    fn finish(&mut self, exit_code: i64) -> TurnOutcome {
        let cumulative = self.cumulative.or(self.previous);
        self.state.outcome(exit_code, cumulative)
    }
}

impl CodexParser {
    fn item_completed(&mut self, item: Item, out: &mut Vec<Event>) {
        match item.kind {
            ItemKind::AgentMessage => {
                if let Some(text) = item.text {
                    self.state.answer.message(&text);
                    out.push(Event::Text { text });
                }
            }
            ItemKind::Reasoning => {
                if let Some(text) = item.text.filter(|t| !t.is_empty()) {
                    out.push(Event::Thinking { text });
                }
            }
            ItemKind::Error => {
                // A non-fatal notice (e.g. missing model metadata); turn.failed decides.
                if let Some(message) = item.message {
                    out.push(Event::Error {
                        message: message.clone(),
                    });
                    self.state.record_error(message, None);
                }
            }
            ItemKind::CommandExecution
            | ItemKind::FileChange
            | ItemKind::McpToolCall
            | ItemKind::WebSearch
            | ItemKind::CollabToolCall => {
                self.state.answer.boundary();
                if let Some(at) = self.open_calls.iter().position(|id| *id == item.id) {
                    self.open_calls.swap_remove(at);
                } else if let Some(call) = tool_call(&item) {
                    out.push(call);
                }
                out.push(tool_result(item));
            }
            ItemKind::TodoList | ItemKind::Plan | ItemKind::Other => {}
        }
    }

    fn turn_completed(&mut self, usage: ThreadUsage, out: &mut Vec<Event>) {
        let input = usage.input_tokens.unwrap_or(0);
        let cached = usage.cached_input_tokens.unwrap_or(0);
        let cumulative = Usage {
            input_tokens: input.saturating_sub(cached),
            output_tokens: usage.output_tokens.unwrap_or(0),
            cache_read_tokens: cached,
            cache_write_tokens: 0,
            cost_usd: None,
        };
        out.push(Event::Usage {
            usage: cumulative.since(&self.last_reported),
        });
        self.last_reported = cumulative;
        self.cumulative = Some(cumulative);
        self.state.usage = cumulative.since(&self.previous.unwrap_or_default());
    }
}

/// The unified call of a tool item, for item types that are tool calls.
fn tool_call(item: &Item) -> Option<Event> {
    let (name, input) = match item.kind {
        ItemKind::CommandExecution => (
            "shell".to_string(),
            json!({ "command": item.command.clone().unwrap_or(Value::Null) }),
        ),
        ItemKind::FileChange => (
            "apply_patch".to_string(),
            json!({ "changes": item.changes.clone().unwrap_or(Value::Null) }),
        ),
        ItemKind::McpToolCall => (
            format!(
                "mcp__{}__{}",
                item.server.as_deref().unwrap_or_default(),
                item.tool
                    .as_ref()
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
            item.arguments.clone().unwrap_or(Value::Null),
        ),
        ItemKind::WebSearch => (
            "web_search".to_string(),
            json!({ "query": item.query.clone().unwrap_or_default() }),
        ),
        ItemKind::CollabToolCall => (
            item.tool
                .as_ref()
                .and_then(Value::as_str)
                .unwrap_or("collab")
                .to_string(),
            json!({ "prompt": item.prompt.clone() }),
        ),
        _ => return None,
    };
    Some(Event::ToolCall {
        id: item.id.clone(),
        name,
        input,
        group: None,
    })
}

/// The unified result of a completed tool item.
fn tool_result(item: Item) -> Event {
    let failed_status = matches!(item.status.as_deref(), Some("failed" | "declined"));
    let (output, is_error) = match item.kind {
        ItemKind::CommandExecution => (
            item.aggregated_output.unwrap_or_default(),
            match item.exit_code {
                Some(code) => code != 0,
                None => failed_status,
            },
        ),
        ItemKind::FileChange => (changes_summary(item.changes.as_ref()), failed_status),
        ItemKind::McpToolCall => match error_message(item.error.as_ref()) {
            Some(message) => (message, true),
            None => (mcp_output(item.result.as_ref()), failed_status),
        },
        _ => (String::new(), failed_status),
    };
    Event::ToolResult {
        id: item.id,
        output,
        is_error,
    }
}

/// "add /workspace/a.md" per changed file, one per line.
fn changes_summary(changes: Option<&Value>) -> String {
    let Some(changes) = changes.and_then(Value::as_array) else {
        return String::new();
    };
    changes
        .iter()
        .map(|change| {
            let kind = change
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("update");
            let path = change
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or_default();
            format!("{kind} {path}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text blocks of an MCP result, or its structured content as JSON.
fn mcp_output(result: Option<&Value>) -> String {
    let Some(result) = result else {
        return String::new();
    };
    let texts: Vec<&str> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b.get("text")?.as_str())
                .collect()
        })
        .unwrap_or_default();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    match result.get("structured_content") {
        Some(Value::Null) | None => String::new(),
        Some(structured) => structured.to_string(),
    }
}

fn error_message(error: Option<&Value>) -> Option<String> {
    match error? {
        Value::Null => None,
        Value::String(message) => Some(message.clone()),
        error => Some(
            error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string),
        ),
    }
}

/// One `codex exec --json` line; fields of all event types, each optional.
#[derive(Deserialize, Debug)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    item: Option<Item>,
    #[serde(default)]
    usage: Option<ThreadUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize, Debug)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize, Debug)]
struct ThreadUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cached_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Deserialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ItemKind {
    AgentMessage,
    Reasoning,
    CommandExecution,
    FileChange,
    McpToolCall,
    WebSearch,
    CollabToolCall,
    TodoList,
    Plan,
    Error,
    #[default]
    #[serde(other)]
    Other,
}

/// A thread item of any type; which fields are set depends on `kind`.
#[derive(Deserialize, Debug, Default)]
struct Item {
    #[serde(default)]
    id: String,
    #[serde(rename = "type", default)]
    kind: ItemKind,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    command: Option<Value>,
    #[serde(default)]
    aggregated_output: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    changes: Option<Value>,
    #[serde(default)]
    server: Option<String>,
    #[serde(default)]
    tool: Option<Value>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::test_support::{assert_prompt_only_on_stdin, parse_with, request};

    const THREAD: &str = "0199a213-81c0-7800-8aa1-bbab2a035a53";
    const FLAGS: [&str; 5] = [
        "--dangerously-bypass-approvals-and-sandbox",
        "--disable",
        "plugins",
        "-c",
        "analytics.enabled=false",
    ];

    fn argv(parts: &[&[&str]]) -> Vec<String> {
        parts.concat().into_iter().map(String::from).collect()
    }

    fn parse(
        fixture: &str,
        previous: Option<Usage>,
        exit_code: i64,
    ) -> (Vec<Event>, Option<String>, TurnOutcome) {
        let context = ParseContext {
            previous_cumulative_usage: previous,
        };
        parse_with(&Codex, context, fixture, exit_code)
    }

    #[test]
    fn first_turn() {
        let command = Codex.turn_command(&TurnRequest {
            new_session_key: Some("not used by codex"),
            ..request("list the files")
        });
        assert_eq!(
            command.argv,
            argv(&[
                &["codex", "exec", "--json", "--skip-git-repo-check"],
                &FLAGS,
                &["-"]
            ])
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"list the files"[..]));
        assert!(command.env.is_empty());
        assert!(!Codex.chooses_key_up_front());
    }

    #[test]
    fn resume_puts_options_before_the_subcommand() {
        let command = Codex.turn_command(&TurnRequest {
            resume_key: Some(THREAD),
            model: Some("gpt-5.5"),
            ..request("and now?")
        });
        assert_eq!(
            command.argv,
            argv(&[
                &["codex", "exec", "--json", "--skip-git-repo-check"],
                &FLAGS,
                &["-m", "gpt-5.5", "resume", THREAD, "-"]
            ])
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"and now?"[..]));
    }

    #[test]
    fn endpoint_becomes_a_custom_model_provider() {
        let keyed = vec!["OPENAI_API_KEY".to_string()];
        // With no API key, the provider uses codex's own (ChatGPT) login.
        let login = Codex.turn_command(&TurnRequest {
            endpoint: Some("http://stub:8080"),
            ..request("hi")
        });
        assert!(login
            .argv
            .contains(&"model_providers.caw.requires_openai_auth=true".to_string()));
        assert!(!login.argv.iter().any(|a| a.contains("env_key")));
        for endpoint in [
            "http://stub:8080",
            "http://stub:8080/",
            "http://stub:8080/v1",
        ] {
            let command = Codex.turn_command(&TurnRequest {
                endpoint: Some(endpoint),
                model: Some("gpt-5.5"),
                credential_env: &keyed,
                ..request("hi")
            });
            let overrides: Vec<&str> = command
                .argv
                .windows(2)
                .filter(|w| w[0] == "-c")
                .map(|w| w[1].as_str())
                .collect();
            assert_eq!(
                overrides,
                [
                    "analytics.enabled=false",
                    "model_provider=\"caw\"",
                    "model_providers.caw.name=\"caw\"",
                    "model_providers.caw.base_url=\"http://stub:8080/v1\"",
                    "model_providers.caw.wire_api=\"responses\"",
                    "model_providers.caw.env_key=\"OPENAI_API_KEY\"",
                    "model_providers.caw.request_max_retries=1",
                ],
                "{endpoint}"
            );
            assert_eq!(command.argv.last().map(String::as_str), Some("-"));
        }
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string("http://a/v1"), "\"http://a/v1\"");
        assert_eq!(
            toml_string("a\"b\\c\nd\u{7f}"),
            "\"a\\\"b\\\\c\\nd\\u007F\""
        );
    }

    #[test]
    fn the_prompt_is_only_on_stdin() {
        assert_prompt_only_on_stdin(&Codex);
    }

    #[test]
    fn interactive_forms() {
        let first = Codex.turn_command(&TurnRequest {
            interactive: true,
            model: Some("gpt-5.5"),
            ..request("")
        });
        assert_eq!(first.argv, argv(&[&["codex"], &FLAGS, &["-m", "gpt-5.5"]]));
        let resumed = Codex.turn_command(&TurnRequest {
            interactive: true,
            resume_key: Some(THREAD),
            endpoint: Some("http://stub:8080/v1"),
            ..request("")
        });
        assert_eq!(resumed.argv[..2], ["codex", "resume"]);
        assert_eq!(resumed.argv.last().map(String::as_str), Some(THREAD));
        assert!(resumed
            .argv
            .contains(&"model_providers.caw.base_url=\"http://stub:8080/v1\"".to_string()));
        assert!(!resumed.argv.iter().any(|a| a == "exec" || a == "--json"));
        assert_eq!(resumed.stdin, None);
    }

    #[test]
    fn a_turn_with_tool_calls() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/codex/hand-turn1.jsonl"),
            None,
            0,
        );
        assert_eq!(key.as_deref(), Some(THREAD));
        let usage = Usage {
            input_tokens: 315,
            output_tokens: 122,
            cache_read_tokens: 24448,
            cache_write_tokens: 0,
            cost_usd: None,
        };
        assert_eq!(
            events,
            [
                Event::Error {
                    message: "Model metadata for `stub-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.".into()
                },
                Event::Thinking {
                    text: "**Listing files**\n\nI should run ls.".into()
                },
                Event::ToolCall {
                    id: "item_1".into(),
                    name: "shell".into(),
                    input: json!({"command": "bash -lc ls"}),
                    group: None
                },
                Event::ToolResult {
                    id: "item_1".into(),
                    output: "README.md\nsrc\n".into(),
                    is_error: false
                },
                Event::ToolCall {
                    id: "item_2".into(),
                    name: "shell".into(),
                    input: json!({"command": "bash -lc 'cat missing.txt'"}),
                    group: None
                },
                Event::ToolResult {
                    id: "item_2".into(),
                    output: "cat: missing.txt: No such file or directory\n".into(),
                    is_error: true
                },
                Event::ToolCall {
                    id: "item_3".into(),
                    name: "apply_patch".into(),
                    input: json!({"changes": [{"path": "/workspace/notes.md", "kind": "add"}]}),
                    group: None
                },
                Event::ToolResult {
                    id: "item_3".into(),
                    output: "add /workspace/notes.md".into(),
                    is_error: false
                },
                Event::Text {
                    text: "Let me check the docs too.".into()
                },
                Event::ToolCall {
                    id: "item_5".into(),
                    name: "mcp__docs__search".into(),
                    input: json!({"q": "caw"}),
                    group: None
                },
                Event::ToolResult {
                    id: "item_5".into(),
                    output: "caw: a handle format".into(),
                    is_error: false
                },
                Event::Text {
                    text: "The workspace holds README.md and src; I added notes.md.".into()
                },
                Event::Usage { usage },
            ]
        );
        assert_eq!(
            outcome,
            TurnOutcome {
                status: Status::Success,
                result: "The workspace holds README.md and src; I added notes.md.".into(),
                usage,
                cumulative_usage: Some(usage),
            }
        );
    }

    /// Recorded: an MCP call codex made after its `tool_search` loaded the tool (the search
    /// itself leaves no line in `--json` output).
    #[test]
    fn a_recorded_mcp_call() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/codex/mcp-call.jsonl"),
            None,
            0,
        );
        assert_eq!(key.as_deref(), Some("01a20e0c-31cf-7c11-9881-b578c2b57c4c"));
        let answer = "Tool said: Wall time: 0.0030 seconds\nOutput:\nECHO:MCP-ROUNDTRIP-4471 (secret of 11 chars)";
        assert_eq!(
            events[..3],
            [
                Event::ToolCall {
                    id: "item_0".into(),
                    name: "mcp__caw__echo".into(),
                    input: json!({"text": "MCP-ROUNDTRIP-4471"}),
                    group: None
                },
                Event::ToolResult {
                    id: "item_0".into(),
                    output: "ECHO:MCP-ROUNDTRIP-4471 (secret of 11 chars)".into(),
                    is_error: false
                },
                Event::Text {
                    text: answer.into()
                },
            ]
        );
        assert_eq!(outcome.status, Status::Success);
        assert_eq!(outcome.result, answer);
    }

    #[test]
    fn cumulative_usage_over_two_turns() {
        let (_, _, first) = parse(
            include_str!("../../tests/fixtures/codex/hand-turn1.jsonl"),
            None,
            0,
        );
        let (events, key, second) = parse(
            include_str!("../../tests/fixtures/codex/hand-resume.jsonl"),
            first.cumulative_usage,
            0,
        );
        assert_eq!(key.as_deref(), Some(THREAD));
        let turn2 = Usage {
            input_tokens: 1685,
            output_tokens: 28,
            cache_read_tokens: 23552,
            cache_write_tokens: 0,
            cost_usd: None,
        };
        assert_eq!(second.usage, turn2);
        assert_eq!(events.last(), Some(&Event::Usage { usage: turn2 }));
        assert_eq!(
            second.cumulative_usage,
            Some(Usage {
                input_tokens: 2000,
                output_tokens: 150,
                cache_read_tokens: 48000,
                cache_write_tokens: 0,
                cost_usd: None,
            })
        );
        // The transient "Reconnecting..." neither fails the turn nor shows as an error event.
        assert_eq!(second.status, Status::Success);
        assert_eq!(second.result, "You asked me to remember 42.");
        assert!(!events.iter().any(|e| matches!(e, Event::Error { .. })));
    }

    #[test]
    fn a_failed_turn_keeps_the_previous_cumulative_usage() {
        let previous = Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_tokens: 100,
            cache_write_tokens: 0,
            cost_usd: None,
        };
        let (_, _, outcome) = parse(
            include_str!("../../tests/fixtures/codex/hand-auth-error.jsonl"),
            Some(previous),
            1,
        );
        assert_eq!(outcome.cumulative_usage, Some(previous));
        assert!(outcome.usage.is_zero());
    }

    #[test]
    fn unauthorized_is_an_auth_failure() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/codex/hand-auth-error.jsonl"),
            None,
            1,
        );
        assert_eq!(key.as_deref(), Some("0199b5e0-1c2d-7a3b-9f00-4d5e6f708192"));
        assert_eq!(outcome.status, Status::AuthError);
        assert!(outcome
            .result
            .starts_with("unexpected status 401 Unauthorized"));
        // The `error` line and `turn.failed` carry the same message: reported once.
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, Event::Error { .. }))
                .count(),
            1
        );
    }

    #[test]
    fn a_usage_limit() {
        let (_, _, outcome) = parse(
            include_str!("../../tests/fixtures/codex/hand-usage-limit.jsonl"),
            None,
            1,
        );
        assert_eq!(outcome.status, Status::UsageLimit);
        assert_eq!(
            outcome.result,
            "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) or try again in 2 days 3 hours."
        );
    }

    #[test]
    fn reconnects_that_never_succeed_fail_with_their_message() {
        let fixture = include_str!("../../tests/fixtures/codex/hand-resume.jsonl");
        let partial: String = fixture.lines().take(3).map(|l| format!("{l}\n")).collect();
        let (events, _, outcome) = parse(&partial, None, 1);
        assert!(events.is_empty());
        assert_eq!(outcome.status, Status::Error);
        assert!(
            outcome.result.starts_with("Reconnecting... 1/5"),
            "{}",
            outcome.result
        );
        let (_, _, outcome) = parse("", None, 2);
        assert_eq!(outcome.result, "the CLI exited with code 2");
    }

    #[test]
    fn garbage_never_panics_or_yields_events() {
        let mut parser = Codex.parser(ParseContext::default());
        let mut events = Vec::new();
        for line in [
            "",
            "2026-11-21T23:10:00.123Z  WARN codex_core::config: ignoring unknown key",
            "{\"type\":\"item.completed\"",
            "{\"type\":\"item.completed\",\"item\":{\"type\":\"mystery\",\"id\":\"x\"}}",
            "{\"type\":\"item.completed\",\"item\":\"oops\"}",
            "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":\"many\"}}",
            "{\"type\":\"thread.started\",\"thread_id\":null}",
            "{\"type\":\"error\"}",
            "{\"no_type\":true}",
        ] {
            parser.parse_line(line, &mut events);
        }
        assert_eq!(events, []);
        assert_eq!(parser.resume_key(), None);
    }
}
