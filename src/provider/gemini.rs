//! The Gemini CLI adapter: `gemini --output-format stream-json` with the prompt on stdin for
//! headless turns, the TUI for interactive ones, the settings file headless API-key auth
//! needs, and a parser from its stream-json events to unified events. It neither runs
//! `gemini` nor reads `~/.gemini`.
//!
//! The session id is chosen up front (`--session-id`, accepted on a first turn since 0.61).
//!
//! Usage: one `usage` event per turn, from the `result` line's `stats` (per process, so per
//! turn: a headless `--resume` does not restore earlier counters). gemini's `input_tokens`
//! include cached tokens; here `input_tokens` are the uncached part (`stats.input`) and
//! `cache_read_tokens` the cached part. Cost is not reported.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use super::common::{
    classify_failure, endpoint_root, is_connection_failure, parse_line, Link, TurnState,
};
use super::*;

#[derive(Debug)]
pub struct Gemini;

/// Headless auth fails (rc 41) unless settings select it (an API key, else the Google
/// login); usage statistics are off so the CLI makes no background calls.
const SETTINGS: &str = r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false}}"#;
const LOGIN_AUTH: &str = "oauth-personal";
/// The variables of an API key; and the one a brokered Google login's placeholder access
/// token comes in (gemini then skips its login file and Google's token check, and sends
/// the token to `CODE_ASSIST_ENDPOINT`: the broker).
const KEY_VARS: [&str; 2] = ["GEMINI_API_KEY", "GOOGLE_API_KEY"];
const LOGIN_TOKEN_VAR: &str = "GOOGLE_CLOUD_ACCESS_TOKEN";
/// gemini's exit code for a fatal authentication error.
const EXIT_AUTH: i64 = 41;

impl Provider for Gemini {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Gemini
    }

    fn turn_command(&self, request: &TurnRequest<'_>) -> TurnCommand {
        let mut argv = vec!["gemini".to_string()];
        if let Some(model) = request.model {
            argv.extend(["-m".to_string(), model.to_string()]);
        }
        match (request.resume_key, request.new_session_key) {
            (Some(key), _) => argv.extend(["--resume".to_string(), key.to_string()]),
            (None, Some(key)) => argv.extend(["--session-id".to_string(), key.to_string()]),
            (None, None) => {}
        }
        argv.push("--skip-trust".to_string());
        if !request.interactive {
            argv.extend(["--output-format", "stream-json"].map(String::from));
        }
        argv.push("--yolo".to_string());
        // With no API key (a variable, or one its `.env` file defines), gemini's own Google
        // login (Code Assist API): its file, or, brokered, its placeholder token in a
        // variable. `--endpoint` (the broker) is then where the Code Assist calls go.
        let has = |var: &str| request.credential_env.iter().any(|v| v == var);
        let login = uses_login(request);
        let mut env = Vec::new();
        if let Some(endpoint) = request.endpoint {
            let var = if login {
                "CODE_ASSIST_ENDPOINT"
            } else {
                "GOOGLE_GEMINI_BASE_URL"
            };
            env.push((var.to_string(), endpoint_root(endpoint).to_string()));
        }
        if login && has(LOGIN_TOKEN_VAR) {
            env.push(("GOOGLE_GENAI_USE_GCA".to_string(), "true".to_string()));
        }
        // gemini reads a replacing system prompt from the file this variable names.
        if request.system_prompt.is_some() {
            env.push((
                "GEMINI_SYSTEM_MD".to_string(),
                in_home(crate::agent_config::SYSTEM_PROMPT_FILE),
            ));
        }
        // The agent settings go into the user settings, merged (system settings files must
        // belong to root, which the volume's are not).
        let mut settings: serde_json::Value = serde_json::from_str(SETTINGS).expect("static JSON");
        if login {
            settings["security"]["auth"]["selectedType"] = LOGIN_AUTH.into();
        }
        let settings = match agent_settings(request) {
            Some(agent) => {
                super::merge_json(&mut settings, &agent);
                // Kept as `null` for the merge into HOME's file, where it removes the key.
                if agent["mcp"]["allowed"].is_null() && agent.get("mcp").is_some() {
                    settings["mcp"] = serde_json::json!({ "allowed": null });
                }
                settings.to_string().into_bytes()
            }
            None => settings.to_string().into_bytes(),
        };
        let mut home_files = vec![HomeFile {
            path: ".gemini/settings.json".to_string(),
            contents: settings,
            merge_json: true,
        }];
        home_files.extend(prompt_files(&TurnRequest {
            append_system_prompt: None,
            ..request.clone()
        }));
        if let Some(text) = request.append_system_prompt {
            home_files.push(HomeFile {
                path: format!(".gemini/{APPEND_CONTEXT_FILE}"),
                contents: text.as_bytes().to_vec(),
                merge_json: false,
            });
        }
        // Headless with no `-p`, gemini takes what it reads on stdin (not a terminal) as the
        // prompt: whole (an argument takes at most 128 KiB), never taken for an option. The
        // TUI opens without an initial prompt (SPEC: no PROMPT means interactive).
        let stdin = (!request.interactive).then(|| request.prompt.as_bytes().to_vec());
        TurnCommand {
            argv,
            env,
            home_files,
            stdin,
        }
    }

    fn parser(&self, _context: ParseContext) -> Box<dyn StreamParser> {
        Box::new(GeminiParser::default())
    }

    fn latest_key_script(&self) -> String {
        // Chats live in ~/.gemini/tmp/<project>/chats/session-*.jsonl; the first line holds
        // the session id.
        r#"f=$(ls -t "$HOME"/.gemini/tmp/*/chats/session-*.jsonl 2>/dev/null | head -n1); [ -n "$f" ] && head -n1 "$f" | grep -o '"sessionId":"[^"]*"' | cut -d'"' -f4"#.to_string()
    }

    fn chooses_key_up_front(&self) -> bool {
        true
    }

    /// The image's settings select the API key; a Google login is selected by merging.
    fn merges_unlike_its_image(&self, request: &TurnRequest<'_>) -> bool {
        uses_login(request)
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
}

use crate::agent_config::ToolGroup;

/// Whether the turn uses gemini's Google login: it has no API key.
fn uses_login(request: &TurnRequest<'_>) -> bool {
    !request
        .credential_env
        .iter()
        .any(|v| KEY_VARS.contains(&v.as_str()))
}

/// Gemini CLI's built-in tools per group.
const TOOLS: ToolTable = &[
    (
        ToolGroup::Read,
        &[
            "read_file",
            "read_many_files",
            "glob",
            "grep_search",
            "search_file_content",
            "list_directory",
        ],
    ),
    (ToolGroup::Edit, &["replace", "write_file"]),
    (ToolGroup::Shell, &["run_shell_command"]),
    (ToolGroup::Web, &["web_fetch", "google_web_search"]),
    (ToolGroup::Mcp, &["list_mcp_resources", "read_mcp_resource"]),
];

/// `--append-system-prompt`: an extra context file name. gemini adds the global context files
/// it finds in `~/.gemini/` (GEMINI.md and the names `context.fileName` lists) to its system
/// prompt, after its own.
const APPEND_CONTEXT_FILE: &str = "CAW-BOX-APPEND.md";

/// The thinking budget (tokens) of each `--effort`, within every 2.5 model's range
/// (flash and flash-lite: up to 24576).
fn thinking_budget(effort: crate::agent_config::Effort) -> u32 {
    match effort {
        crate::agent_config::Effort::Low => 1024,
        crate::agent_config::Effort::Medium => 8192,
        crate::agent_config::Effort::High => 24576,
    }
}

fn agent_settings(request: &TurnRequest<'_>) -> Option<serde_json::Value> {
    let mut settings = serde_json::json!({});
    if request.append_system_prompt.is_some() {
        settings["context"] = serde_json::json!({ "fileName": ["GEMINI.md", APPEND_CONTEXT_FILE] });
    }
    if let Some(effort) = request.effort {
        // Scope `core`: the main agent's requests (not those of its helper models).
        settings["modelConfigs"] = serde_json::json!({ "customOverrides": [{
            "match": { "overrideScope": "core" },
            "modelConfig": { "generateContentConfig": {
                "thinkingConfig": { "thinkingBudget": thinking_budget(effort) }
            } }
        }] });
    }
    if let Some(tools) = request.tools {
        // Written in full every turn it is set, so that a resume's new policy replaces the
        // old one in the merged file (`null` removes a key).
        let denied = tools.denied_names(TOOLS);
        settings["tools"] = serde_json::json!({ "exclude": denied });
        settings["mcp"] = if tools.denied_groups().contains(&ToolGroup::Mcp) {
            // An allow-list that names no server: none starts.
            serde_json::json!({ "allowed": [] })
        } else {
            serde_json::json!({ "allowed": null })
        };
    }
    let mcp = crate::agent_config::mcp_for_turn(request.mcp, request.tools);
    if !mcp.is_empty() {
        // gemini expands `$VAR` in its settings: the secrets stay in its environment.
        let mut servers =
            crate::agent_config::mcp_servers_json(mcp, "httpUrl", |v| format!("${v}"));
        for entry in servers
            .as_object_mut()
            .into_iter()
            .flat_map(|o| o.values_mut())
        {
            if let Some(e) = entry.as_object_mut() {
                e.remove("type");
            }
        }
        settings["mcpServers"] = servers;
    }
    (settings != serde_json::json!({})).then_some(settings)
}

/// Parses one turn of `gemini --output-format stream-json`.
#[derive(Debug, Default)]
struct GeminiParser {
    session_id: Option<String>,
    state: TurnState,
    /// Whether the CLI is failing to reach its model.
    link: Link,
}

impl GeminiParser {
    /// One stdout line (see [`StreamParser::parse_line`]).
    fn parse(&mut self, line: &str, out: &mut Vec<Event>) {
        let Some(line) = parse_line::<Line<'_>>(line) else {
            return;
        };
        match line.kind.as_ref() {
            "init" => {
                if let Some(id) = line.session_id {
                    self.session_id = Some(id);
                }
            }
            "message" => {
                // User messages echo the prompt.
                if line.role.as_deref() != Some("assistant") {
                    return;
                }
                let Some(text) = line.content.filter(|t| !t.is_empty()) else {
                    return;
                };
                if line.delta == Some(true) {
                    self.state.answer.push(&text);
                } else {
                    self.state.answer.message(&text);
                    self.state.answer.boundary();
                }
                out.push(Event::Text { text });
            }
            "tool_use" => {
                self.state.answer.boundary();
                out.push(Event::ToolCall {
                    id: line.tool_id.unwrap_or_default(),
                    name: line.tool_name.unwrap_or_default(),
                    input: line.parameters.unwrap_or(Value::Null),
                    group: None,
                });
            }
            "tool_result" => {
                self.state.answer.boundary();
                let is_error = line.status.as_deref() == Some("error");
                let output = match line.output {
                    Some(Value::String(output)) if !output.is_empty() || !is_error => output,
                    Some(Value::Null) | None | Some(Value::String(_)) => {
                        error_text(line.error.as_ref()).unwrap_or_default()
                    }
                    Some(other) => other.to_string(),
                };
                out.push(Event::ToolResult {
                    id: line.tool_id.unwrap_or_default(),
                    output,
                    is_error,
                });
            }
            "error" => {
                // Warnings (e.g. a loop detected and broken) do not end the turn.
                if line.severity.as_deref() == Some("warning") {
                    return;
                }
                if let Some(message) = line.message.or_else(|| error_text(line.error.as_ref())) {
                    out.push(Event::Error {
                        message: message.clone(),
                    });
                    self.state.record_error(message, None);
                }
            }
            "result" => self.result(line, out),
            _ => {}
        }
    }
}

impl StreamParser for GeminiParser {
    fn parse_line(&mut self, line: &str, out: &mut Vec<Event>) {
        let before = out.len();
        self.parse(line, out);
        self.link.saw(&out[before..]);
    }

    fn parse_stderr_line(&mut self, line: &str) {
        // "Attempt 2 failed. Retrying with backoff... Error: exception TypeError: fetch
        // failed sending request" (then a stack trace) while it retries.
        if line.starts_with("Attempt ") && is_connection_failure(line) {
            self.link.failing(line);
        }
    }

    fn unreachable(&self) -> Option<&str> {
        self.link.get()
    }

    fn resume_key(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    fn finish(&mut self, exit_code: i64) -> TurnOutcome {
        if self.state.verdict.is_none() && exit_code == EXIT_AUTH {
            self.state.failure = Some(Status::AuthError);
        }
        self.state.outcome(exit_code, None)
    }
}

impl GeminiParser {
    fn result(&mut self, line: Line<'_>, out: &mut Vec<Event>) {
        if let Some(stats) = line.stats.as_ref() {
            self.state.usage = stats_usage(stats);
            out.push(Event::Usage {
                usage: self.state.usage,
            });
        }
        if line.status.as_deref() == Some("success") {
            self.state.verdict = Some(true);
            return;
        }
        let kind = line
            .error
            .as_ref()
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str);
        let failure = match kind {
            Some(kind) if kind.contains("Auth") => Some(Status::AuthError),
            _ => None,
        };
        let previous = self.state.error.take();
        let message = error_text(line.error.as_ref())
            .or_else(|| previous.clone())
            .unwrap_or_else(|| "the turn failed".to_string());
        let failure = failure.or(match classify_failure(&message) {
            Status::Error => None,
            status => Some(status),
        });
        // gemini usually sends the same message as an `error` line just before.
        if previous.as_deref() != Some(message.as_str()) {
            out.push(Event::Error {
                message: message.clone(),
            });
        }
        self.state.record_error(message, failure);
        self.state.verdict = Some(false);
    }
}

/// The message of an `error` object (`{"type","message"}`), or the error as text.
fn error_text(error: Option<&Value>) -> Option<String> {
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

/// This turn's usage from a `result` line's `stats`, in either shape gemini has used: the
/// flat stream stats (`input_tokens`, `output_tokens`, `cached`, `input`) or per-model session
/// metrics (`models.<name>.tokens.{prompt,candidates,cached,thoughts,input}`).
fn stats_usage(stats: &Value) -> Usage {
    let count = |value: &Value, key: &str| -> u64 {
        value
            .get(key)
            .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)))
            .unwrap_or(0)
    };
    let mut usage = Usage::default();
    // gemini 0.61 (recorded) has flat per-model counters beside flat totals; only the
    // older session-metrics shape nests them under `tokens`.
    let nested = stats
        .get("models")
        .and_then(Value::as_object)
        .filter(|models| models.values().any(|m| m.get("tokens").is_some()));
    if let Some(models) = nested {
        for tokens in models.values().filter_map(|m| m.get("tokens")) {
            let cached = count(tokens, "cached");
            let input = match tokens.get("input") {
                Some(_) => count(tokens, "input"),
                None => count(tokens, "prompt").saturating_sub(cached),
            };
            usage.add(&Usage {
                input_tokens: input,
                output_tokens: count(tokens, "candidates")
                    .saturating_add(count(tokens, "thoughts")),
                cache_read_tokens: cached,
                cache_write_tokens: 0,
                cost_usd: None,
            });
        }
        return usage;
    }
    let cached = count(stats, "cached");
    usage.input_tokens = match stats.get("input") {
        Some(_) => count(stats, "input"),
        None => count(stats, "input_tokens").saturating_sub(cached),
    };
    usage.output_tokens = count(stats, "output_tokens");
    usage.cache_read_tokens = cached;
    usage
}

/// One stream-json line; fields of all event types, each optional.
#[derive(Deserialize, Debug)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default, borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    delta: Option<bool>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_id: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default, borrow)]
    severity: Option<Cow<'a, str>>,
    #[serde(default)]
    stats: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::test_support::{assert_prompt_only_on_stdin, parse_with, request};
    use serde_json::json;

    const SESSION: &str = "3f9c2a71-8b4d-4e6f-a1c2-d3e4f5a6b7c8";

    fn parse(fixture: &str, exit_code: i64) -> (Vec<Event>, Option<String>, TurnOutcome) {
        parse_with(&Gemini, ParseContext::default(), fixture, exit_code)
    }

    fn keyed() -> Vec<String> {
        vec!["GEMINI_API_KEY".to_string()]
    }

    #[test]
    fn first_turn_chooses_the_session_id() {
        let keys = keyed();
        let command = Gemini.turn_command(&TurnRequest {
            new_session_key: Some(SESSION),
            model: Some("gemini-2.5-flash"),
            credential_env: &keys,
            ..request("list the files")
        });
        assert_eq!(
            command.argv,
            [
                "gemini",
                "-m",
                "gemini-2.5-flash",
                "--session-id",
                SESSION,
                "--skip-trust",
                "--output-format",
                "stream-json",
                "--yolo"
            ]
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"list the files"[..]));
        assert!(command.env.is_empty());
        assert_eq!(command.home_files.len(), 1);
        let file = &command.home_files[0];
        assert_eq!(
            (file.path.as_str(), file.merge_json),
            (".gemini/settings.json", true)
        );
        let settings: Value = serde_json::from_slice(&file.contents).unwrap();
        assert_eq!(settings, serde_json::from_str::<Value>(SETTINGS).unwrap());
        assert_eq!(
            settings["security"]["auth"]["selectedType"],
            "gemini-api-key"
        );
        assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
        assert!(Gemini.chooses_key_up_front());
    }

    #[test]
    fn resume() {
        let command = Gemini.turn_command(&TurnRequest {
            resume_key: Some(SESSION),
            new_session_key: Some("ignored"),
            ..request("and now?")
        });
        assert_eq!(
            command.argv,
            [
                "gemini",
                "--resume",
                SESSION,
                "--skip-trust",
                "--output-format",
                "stream-json",
                "--yolo"
            ]
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"and now?"[..]));
    }

    #[test]
    fn endpoint_is_a_base_url_without_path() {
        for endpoint in [
            "http://stub:8080",
            "http://stub:8080/v1",
            "http://stub:8080/",
        ] {
            let keys = keyed();
            let command = Gemini.turn_command(&TurnRequest {
                endpoint: Some(endpoint),
                credential_env: &keys,
                ..request("hi")
            });
            assert_eq!(
                command.env,
                [(
                    "GOOGLE_GEMINI_BASE_URL".to_string(),
                    "http://stub:8080".to_string()
                )]
            );
        }
    }

    /// With no API key, the Google login: its file (injected), or its placeholder token in
    /// `GOOGLE_CLOUD_ACCESS_TOKEN` with the broker as the Code Assist endpoint (brokered).
    #[test]
    fn without_a_key_the_google_login_is_selected() {
        let auth = |c: &TurnCommand| {
            let settings: Value = serde_json::from_slice(&c.home_files[0].contents).unwrap();
            settings["security"]["auth"]["selectedType"].clone()
        };
        let injected = Gemini.turn_command(&request("hi"));
        assert_eq!(auth(&injected), LOGIN_AUTH);
        assert!(injected.env.is_empty());

        let token = vec![LOGIN_TOKEN_VAR.to_string()];
        let brokered = Gemini.turn_command(&TurnRequest {
            endpoint: Some("http://caw-box-broker-1:8080"),
            credential_env: &token,
            ..request("hi")
        });
        assert_eq!(auth(&brokered), LOGIN_AUTH);
        assert_eq!(
            brokered.env,
            [
                (
                    "CODE_ASSIST_ENDPOINT".to_string(),
                    "http://caw-box-broker-1:8080".to_string()
                ),
                ("GOOGLE_GENAI_USE_GCA".to_string(), "true".to_string()),
            ]
        );
        // A key wins over a login.
        let both = vec![LOGIN_TOKEN_VAR.to_string(), "GOOGLE_API_KEY".to_string()];
        let keyed = Gemini.turn_command(&TurnRequest {
            credential_env: &both,
            ..request("hi")
        });
        assert_eq!(auth(&keyed), "gemini-api-key");
        assert!(keyed.env.is_empty());
    }

    #[test]
    fn the_prompt_is_only_on_stdin() {
        assert_prompt_only_on_stdin(&Gemini);
    }

    #[test]
    fn interactive_forms() {
        let first = Gemini.turn_command(&TurnRequest {
            interactive: true,
            new_session_key: Some(SESSION),
            ..request("")
        });
        assert_eq!(
            first.argv,
            ["gemini", "--session-id", SESSION, "--skip-trust", "--yolo"]
        );
        let resumed = Gemini.turn_command(&TurnRequest {
            interactive: true,
            resume_key: Some(SESSION),
            model: Some("gemini-2.5-pro"),
            endpoint: Some("http://stub:8080"),
            ..request("")
        });
        assert_eq!(
            resumed.argv,
            [
                "gemini",
                "-m",
                "gemini-2.5-pro",
                "--resume",
                SESSION,
                "--skip-trust",
                "--yolo"
            ]
        );
        assert_eq!(resumed.env.len(), 1);
        assert_eq!(resumed.home_files.len(), 1);
    }

    #[test]
    fn deltas_concatenate_into_the_answer() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/gemini/hand-turn1.jsonl"),
            0,
        );
        assert_eq!(key.as_deref(), Some(SESSION));
        let usage = Usage {
            input_tokens: 1850,
            output_tokens: 64,
            cache_read_tokens: 4000,
            cache_write_tokens: 0,
            cost_usd: None,
        };
        assert_eq!(
            events,
            [
                Event::Text {
                    text: "I'll list ".into()
                },
                Event::Text {
                    text: "the files.".into()
                },
                Event::ToolCall {
                    id: "run_shell_command-1763766400123-a1b2c3".into(),
                    name: "run_shell_command".into(),
                    input: json!({"command": "ls", "description": "List files"}),
                    group: None
                },
                Event::ToolResult {
                    id: "run_shell_command-1763766400123-a1b2c3".into(),
                    output: "README.md\nsrc".into(),
                    is_error: false
                },
                Event::ToolCall {
                    id: "read_file-1763766400456-d4e5f6".into(),
                    name: "read_file".into(),
                    input: json!({"absolute_path": "/workspace/missing.txt"}),
                    group: None
                },
                Event::ToolResult {
                    id: "read_file-1763766400456-d4e5f6".into(),
                    output: "File not found: /workspace/missing.txt".into(),
                    is_error: true
                },
                Event::Text {
                    text: "The workspace ".into()
                },
                Event::Text {
                    text: "holds README.md ".into()
                },
                Event::Text {
                    text: "and src.".into()
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
                cumulative_usage: None
            }
        );
    }

    #[test]
    fn session_metrics_shaped_stats_are_understood() {
        let stats = json!({"models": {
            "gemini-2.5-flash": {"tokens": {"prompt": 1000, "candidates": 50, "cached": 400, "thoughts": 20, "total": 1070}},
            "gemini-2.5-flash-lite": {"tokens": {"prompt": 100, "candidates": 5, "cached": 0, "input": 100, "total": 105}}
        }});
        assert_eq!(
            stats_usage(&stats),
            Usage {
                input_tokens: 700,
                output_tokens: 75,
                cache_read_tokens: 400,
                cache_write_tokens: 0,
                cost_usd: None
            }
        );
        let flat =
            json!({"total_tokens": 130, "input_tokens": 100, "output_tokens": 30, "cached": 40});
        assert_eq!(stats_usage(&flat).input_tokens, 60);
        assert_eq!(stats_usage(&flat).cache_read_tokens, 40);
        assert!(stats_usage(&json!("odd")).is_zero());
    }

    #[test]
    fn an_invalid_key_is_an_auth_failure() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/gemini/hand-auth-error.jsonl"),
            1,
        );
        assert_eq!(key.as_deref(), Some("4a0d3b82-9c5e-4f70-b2d3-e4f5a6b7c8d9"));
        assert_eq!(outcome.status, Status::AuthError);
        assert!(
            outcome.result.starts_with("[API Error: API key not valid."),
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
        // Exit 41 without any output is gemini's fatal authentication error.
        let (_, _, outcome) = parse("", 41);
        assert_eq!(outcome.status, Status::AuthError);
        assert_eq!(outcome.result, "the CLI exited with code 41");
    }

    #[test]
    fn quota_exhaustion_is_a_usage_limit() {
        let (_, _, outcome) = parse(
            include_str!("../../tests/fixtures/gemini/hand-usage-limit.jsonl"),
            1,
        );
        assert_eq!(outcome.status, Status::UsageLimit);
        assert!(
            outcome.result.contains("Resource has been exhausted"),
            "{}",
            outcome.result
        );
        assert_eq!(outcome.usage.input_tokens, 120);
    }

    #[test]
    fn a_cut_off_turn_fails_with_the_exit_code() {
        let fixture = include_str!("../../tests/fixtures/gemini/hand-turn1.jsonl");
        let partial: String = fixture.lines().take(4).map(|l| format!("{l}\n")).collect();
        let (events, key, outcome) = parse(&partial, 130);
        assert_eq!(key.as_deref(), Some(SESSION));
        assert_eq!(events.len(), 2);
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(outcome.result, "the CLI exited with code 130");
    }

    #[test]
    fn garbage_never_panics_or_yields_events() {
        let mut parser = Gemini.parser(ParseContext::default());
        let mut events = Vec::new();
        for line in [
            "",
            "Loaded cached credentials.",
            "[WARN] Skipping unreadable directory: /workspace/.cache",
            "{\"type\":\"message\",\"role\":\"user\",\"content\":\"list the files\"}",
            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":42}",
            "{\"type\":\"error\",\"severity\":\"warning\",\"message\":\"Loop detected\"}",
            "{\"type\":\"init\",\"session_id\":[1]}",
            "{\"type\":\"result\"",
            "{}",
        ] {
            parser.parse_line(line, &mut events);
        }
        assert_eq!(events, []);
        assert_eq!(parser.resume_key(), None);
    }
}
