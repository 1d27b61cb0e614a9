//! The opencode adapter: `opencode run --format json` with the prompt on stdin for headless
//! turns, the TUI for interactive ones, the config that `--endpoint` and unattended tool use
//! need (as `OPENCODE_CONFIG_CONTENT`), and a parser from its JSON events to unified events.
//! It neither runs `opencode` nor reads its database.
//!
//! Usage: opencode reports tokens and cost per step (`step_finish`); the parser emits one
//! `usage` event per step and the turn's usage is their sum. opencode's `input` already
//! excludes cache reads and writes; `output_tokens` is its `output` (its separate
//! `reasoning` count is not added, as OpenAI-style APIs count reasoning within output).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{json, Value};

use super::common::{
    endpoint_v1, is_connection_failure, parse_line, status_for_http, Link, TurnState,
};
use super::*;

#[derive(Debug)]
pub struct Opencode;

/// The provider id `--endpoint` defines in opencode's config.
const ENDPOINT_PROVIDER: &str = "caw";
/// The variable of an OpenAI API key (the endpoint provider's `apiKey`).
const API_KEY_VAR: &str = "OPENAI_API_KEY";
/// opencode's provider of a ChatGPT login (its built-in codex plugin's).
const LOGIN_PROVIDER: &str = "openai";
/// opencode's own session title limit (it truncates prompts to this for titles).
const TITLE_CHARS: usize = 50;

use crate::agent_config::ToolGroup;

/// opencode's built-in tools per group.
const TOOLS: ToolTable = &[
    (ToolGroup::Read, &["read", "glob", "grep", "list"]),
    (
        ToolGroup::Edit,
        &["edit", "write", "patch", "multiedit", "apply_patch"],
    ),
    (ToolGroup::Shell, &["bash"]),
    (ToolGroup::Web, &["webfetch", "websearch", "codesearch"]),
];

impl Provider for Opencode {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Opencode
    }

    fn turn_command(&self, request: &TurnRequest<'_>) -> TurnCommand {
        let mut argv = vec!["opencode".to_string()];
        if !request.interactive {
            argv.extend(["run", "--format", "json"].map(String::from));
            // Its errors on stderr: the only place a headless run says that it cannot reach
            // its model (it retries silently otherwise).
            argv.extend(["--print-logs", "--log-level", "ERROR"].map(String::from));
        }
        match request.resume_key {
            Some(key) => argv.extend(["--session".to_string(), key.to_string()]),
            // An earlier turn stopped before opencode named its session (it does so once its
            // model answers, or in the error it logs): that session is the last one in this
            // HOME's database, and `--continue` takes it (or makes one when there is none).
            None if request.continue_last => argv.push("--continue".to_string()),
            // A title spares opencode an extra model request to invent one. The `=` form
            // keeps a title starting with '-' a value.
            None if !request.interactive => {
                argv.push(format!("--title={}", title(request.prompt)));
            }
            None => {}
        }
        // With no API key, the CLI's own ChatGPT login (auth.json) is what it uses: its
        // built-in plugin sends the `openai` provider's requests to chatgpt.com whatever the
        // configured base URL, so no endpoint provider is defined (with a brokered login,
        // chatgpt.com resolves to the broker inside the turn's container).
        let login = !request.credential_env.iter().any(|n| n == API_KEY_VAR);
        let endpoint = request.endpoint.filter(|_| !login);
        let model = match login {
            true => login_model(request.model),
            false => opencode_model(request.model, endpoint.is_some()),
        };
        if let Some(model) = &model {
            argv.extend(["--model".to_string(), model.clone()]);
        }
        if let Some(effort) = request.effort {
            argv.push(format!("--variant={}", effort.as_str()));
        }
        // opencode joins argv words and wraps those with spaces in quotes: the prompt goes on
        // stdin, untouched. The TUI opens without an initial prompt.
        let stdin = (!request.interactive).then(|| request.prompt.as_bytes().to_vec());
        let mut env: Vec<(String, String)> = [
            ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
            ("OPENCODE_DISABLE_FFF", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        let mut config = config(endpoint, model.as_deref());
        if let (Some(effort), Some(id)) = (request.effort, &model) {
            // `--variant` picks one of the model's variants; the endpoint's provider (ours)
            // has none unless defined here.
            let id = id
                .strip_prefix(ENDPOINT_PROVIDER)
                .and_then(|r| r.strip_prefix('/'));
            if let Some(m) =
                id.and_then(|id| config["provider"][ENDPOINT_PROVIDER]["models"].get_mut(id))
            {
                let level = effort.as_str();
                m["variants"] = json!({ level: { "reasoningEffort": level } });
            }
        }
        // The texts by file reference (a long one would not fit the environment): the build
        // agent's prompt replaces opencode's own; `instructions` files are added to it.
        if request.system_prompt.is_some() {
            let file = in_home(crate::agent_config::SYSTEM_PROMPT_FILE);
            config["agent"] = json!({ "build": { "prompt": format!("{{file:{file}}}") } });
        }
        if request.append_system_prompt.is_some() {
            config["instructions"] =
                json!([in_home(crate::agent_config::APPEND_SYSTEM_PROMPT_FILE)]);
        }
        if let Some(tools) = request.tools {
            // A tool whose permission is `deny` is not offered to the model (its `tools` key
            // is deprecated and no longer does that); the rest stays allowed.
            let mut permission = serde_json::Map::new();
            permission.insert("*".to_string(), json!("allow"));
            for name in tools.denied_names(TOOLS) {
                permission.insert(name, json!("deny"));
            }
            if permission.len() > 1 {
                config["permission"] = serde_json::Value::Object(permission);
            }
        }
        let mcp = crate::agent_config::mcp_for_turn(request.mcp, request.tools);
        if !mcp.is_empty() {
            // opencode reads `{env:VAR}` in its config: the secrets stay in its environment.
            let mut servers = serde_json::Map::new();
            for m in mcp {
                let entry = match &m.transport {
                    crate::agent_config::McpTransport::Stdio { command } => {
                        let env: serde_json::Map<String, serde_json::Value> = m
                            .env
                            .iter()
                            .map(|k| (k.clone(), json!(format!("{{env:{k}}}"))))
                            .collect();
                        json!({ "type": "local", "command": command, "environment": env })
                    }
                    crate::agent_config::McpTransport::Http { url } => {
                        let headers: serde_json::Map<String, serde_json::Value> = m
                            .headers
                            .iter()
                            .map(|h| {
                                let var = crate::agent_config::mcp_header_var(&m.name, h);
                                (h.clone(), json!(format!("{{env:{var}}}")))
                            })
                            .collect();
                        json!({ "type": "remote", "url": url, "headers": headers })
                    }
                };
                servers.insert(m.name.clone(), entry);
            }
            config["mcp"] = serde_json::Value::Object(servers);
        }
        env.push(("OPENCODE_CONFIG_CONTENT".to_string(), config.to_string()));
        TurnCommand {
            argv,
            env,
            home_files: prompt_files(request),
            stdin,
        }
    }

    fn parser(&self, _context: ParseContext) -> Box<dyn StreamParser> {
        Box::new(OpencodeParser::default())
    }

    fn support(&self) -> crate::agent_config::Support {
        crate::agent_config::Support {
            replace: true,
            append: true,
            effort: true,
            // Its MCP tools are named after servers it may have from the user's config.
            tool_groups: &[
                ToolGroup::Read,
                ToolGroup::Edit,
                ToolGroup::Shell,
                ToolGroup::Web,
            ],
            tool_names: true,
        }
    }

    fn tool_names(&self) -> ToolTable {
        TOOLS
    }

    fn latest_key_script(&self) -> String {
        // Sessions live in a SQLite database: ask opencode itself for the latest.
        r#"opencode session list --format json -n 1 --pure 2>/dev/null | grep -o '"ses_[^"]*"' | head -n1 | tr -d '"'"#.to_string()
    }
}

/// The `--model` value with a ChatGPT login: a model of the `openai` provider (a bare id, or
/// one of the endpoint's provider, becomes `openai/<id>`); another provider's as given.
fn login_model(model: Option<&str>) -> Option<String> {
    let model = model?;
    let id = model
        .strip_prefix(ENDPOINT_PROVIDER)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(model);
    if id.contains('/') {
        return Some(id.to_string());
    }
    Some(format!("{LOGIN_PROVIDER}/{id}"))
}

/// The `--model` value: `provider/model` as given, or with `--endpoint` always a model of the
/// endpoint's provider (`caw/<model>`), since the endpoint is where all traffic goes.
fn opencode_model(model: Option<&str>, endpoint: bool) -> Option<String> {
    let model = model?;
    if !endpoint {
        return Some(model.to_string());
    }
    let id = model
        .strip_prefix(ENDPOINT_PROVIDER)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(model);
    Some(format!("{ENDPOINT_PROVIDER}/{id}"))
}

/// The non-secret config passed as `OPENCODE_CONFIG_CONTENT`: allow every tool (the container
/// is the sandbox; without it opencode auto-rejects anything outside the project and ends
/// with no answer), and with `--endpoint` an OpenAI-compatible provider for it.
fn config(endpoint: Option<&str>, model: Option<&str>) -> Value {
    let mut config = json!({ "permission": "allow" });
    if let Some(endpoint) = endpoint {
        let mut models = serde_json::Map::new();
        let model_id = model.and_then(|m| m.strip_prefix(ENDPOINT_PROVIDER)?.strip_prefix('/'));
        if let Some(id) = model_id {
            models.insert(id.to_string(), json!({ "name": id }));
        }
        config["provider"] = json!({
            ENDPOINT_PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": ENDPOINT_PROVIDER,
                "options": {
                    "baseURL": endpoint_v1(endpoint),
                    "apiKey": "{env:OPENAI_API_KEY}",
                },
                "models": models,
            }
        });
        if let Some(model) = model {
            config["model"] = json!(model);
        }
    }
    config
}

/// A session title from the prompt: its first non-blank line, whitespace collapsed, cut to
/// opencode's own title length.
fn title(prompt: &str) -> String {
    let line = prompt
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let words = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if words.is_empty() {
        return "caw-box".to_string();
    }
    match words.char_indices().nth(TITLE_CHARS) {
        Some((at, _)) => format!("{}...", &words[..at]),
        None => words,
    }
}

/// Parses one turn of `opencode run --format json`.
#[derive(Debug, Default)]
struct OpencodeParser {
    session_id: Option<String>,
    state: TurnState,
    /// Whether the last step ended with the model stopping (not to call tools).
    stopped: bool,
    /// The output of the last failed tool call, to explain a turn that ends without answer.
    last_tool_error: Option<String>,
    /// Tool calls announced while still running, whose result is still to come.
    running_calls: Vec<String>,
    /// Whether the CLI is failing to reach its model.
    link: Link,
}

impl OpencodeParser {
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
        match line.kind.as_ref() {
            "text" => {
                if let Some(text) = line.part.and_then(|p| p.text).filter(|t| !t.is_empty()) {
                    self.state.answer.message(&text);
                    out.push(Event::Text { text });
                }
            }
            "reasoning" => {
                if let Some(text) = line.part.and_then(|p| p.text).filter(|t| !t.is_empty()) {
                    out.push(Event::Thinking { text });
                }
            }
            "tool_use" => {
                if let Some(part) = line.part {
                    self.tool_use(part, out);
                }
            }
            "step_start" => self.stopped = false,
            "step_finish" => {
                if let Some(part) = line.part {
                    self.step_finish(part, out);
                }
            }
            "error" => {
                let error = line.error.unwrap_or_default();
                let data = error.data.unwrap_or_default();
                let message = data
                    .message
                    .or_else(|| error.name.clone())
                    .unwrap_or_else(|| "unknown error".to_string());
                let auth = error.name.as_deref() == Some("ProviderAuthError");
                let failure = data
                    .status_code
                    .and_then(status_for_http)
                    .or(auth.then_some(Status::AuthError));
                out.push(Event::Error {
                    message: message.clone(),
                });
                self.state.record_error(message, failure);
                self.state.verdict = Some(false);
            }
            _ => {}
        }
    }
}

impl StreamParser for OpencodeParser {
    fn parse_line(&mut self, line: &str, out: &mut Vec<Event>) {
        let before = out.len();
        self.parse(line, out);
        self.link.saw(&out[before..]);
    }

    fn parse_stderr_line(&mut self, line: &str) {
        // Its logs name the session: the key to resume a turn that printed nothing on
        // stdout (its model never answered).
        if self.session_id.is_none() {
            if let Some((_, rest)) = line.split_once(" session.id=") {
                let id = rest.split_whitespace().next().unwrap_or("");
                if id.starts_with("ses_") {
                    self.session_id = Some(id.to_string());
                }
            }
        }
        // `--print-logs --log-level ERROR`: `... message="stream error" ...
        // error.error="AI_APICallError: Cannot connect to API: ..."` while it retries.
        if let Some((_, error)) = line.split_once("error.error=") {
            let error = error.trim().trim_matches('"');
            if is_connection_failure(error) {
                self.link.failing(error);
            }
        }
    }

    fn unreachable(&self) -> Option<&str> {
        self.link.get()
    }

    fn resume_key(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    fn finish(&mut self, exit_code: i64) -> TurnOutcome {
        // opencode has no end-of-turn event: a clean exit after a final answer is success.
        if self.state.verdict.is_none() && exit_code == 0 {
            if self.stopped || !self.state.answer.is_empty() {
                self.state.verdict = Some(true);
            } else {
                let message = match self.last_tool_error.take() {
                    Some(error) => {
                        format!("the turn ended without an answer; last tool error: {error}")
                    }
                    None => "the turn ended without an answer".to_string(),
                };
                self.state.record_error(message, None);
            }
        }
        self.state.outcome(exit_code, None)
    }
}

impl OpencodeParser {
    fn tool_use(&mut self, part: Part, out: &mut Vec<Event>) {
        self.state.answer.boundary();
        let id = part.call_id.unwrap_or_default();
        let state = part.state.unwrap_or_default();
        let finished = matches!(state.status.as_deref(), Some("completed" | "error"));
        match self.running_calls.iter().position(|running| *running == id) {
            Some(at) if finished => {
                self.running_calls.swap_remove(at);
            }
            Some(_) => return,
            None => {
                out.push(Event::ToolCall {
                    id: id.clone(),
                    name: part.tool.unwrap_or_default(),
                    input: state.input.unwrap_or(Value::Null),
                    group: None,
                });
                if !finished {
                    // opencode emits tools once finished; should a running one show up, its
                    // result comes later.
                    self.running_calls.push(id);
                    return;
                }
            }
        }
        let failed = state.status.as_deref() == Some("error")
            || state
                .metadata
                .and_then(|m| m.exit)
                .is_some_and(|exit| exit != 0);
        let output = match (state.output, state.error) {
            (Some(output), _) if !failed || !is_blank(&output) => text_of(output),
            (_, Some(error)) => text_of(error),
            (output, None) => output.map(text_of).unwrap_or_default(),
        };
        if failed {
            self.last_tool_error = Some(output.clone());
        }
        out.push(Event::ToolResult {
            id,
            output,
            is_error: failed,
        });
    }

    fn step_finish(&mut self, part: Part, out: &mut Vec<Event>) {
        self.stopped = part.reason.as_deref() == Some("stop");
        let tokens = part.tokens.unwrap_or_default();
        let cache = tokens.cache.unwrap_or_default();
        let usage = Usage {
            input_tokens: tokens.input.unwrap_or(0),
            output_tokens: tokens.output.unwrap_or(0),
            cache_read_tokens: cache.read.unwrap_or(0),
            cache_write_tokens: cache.write.unwrap_or(0),
            cost_usd: part.cost,
        };
        self.state.usage.add(&usage);
        out.push(Event::Usage { usage });
    }
}

fn is_blank(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        _ => false,
    }
}

fn text_of(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One `opencode run --format json` line; fields of all event types, each optional.
#[derive(Deserialize, Debug)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(rename = "sessionID", default, borrow)]
    session_id: Option<Cow<'a, str>>,
    #[serde(default)]
    part: Option<Part>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

/// A message part of any type; which fields are set depends on the event.
#[derive(Deserialize, Debug, Default)]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(rename = "callID", default)]
    call_id: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    state: Option<ToolState>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    tokens: Option<Tokens>,
    #[serde(default)]
    cost: Option<f64>,
}

#[derive(Deserialize, Debug, Default)]
struct ToolState {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    metadata: Option<ToolMetadata>,
}

#[derive(Deserialize, Debug, Default)]
struct ToolMetadata {
    #[serde(default)]
    exit: Option<i64>,
}

#[derive(Deserialize, Debug, Default)]
struct Tokens {
    #[serde(default)]
    input: Option<u64>,
    #[serde(default)]
    output: Option<u64>,
    #[serde(default)]
    cache: Option<CacheTokens>,
}

#[derive(Deserialize, Debug, Default)]
struct CacheTokens {
    #[serde(default)]
    read: Option<u64>,
    #[serde(default)]
    write: Option<u64>,
}

#[derive(Deserialize, Debug, Default)]
struct ErrorBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    data: Option<ErrorData>,
}

#[derive(Deserialize, Debug, Default)]
struct ErrorData {
    #[serde(default)]
    message: Option<String>,
    #[serde(rename = "statusCode", default)]
    status_code: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::test_support::{assert_prompt_only_on_stdin, parse_with};

    /// A turn whose CLI has an API key (as every test here but the login's).
    static KEYED: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| vec![API_KEY_VAR.to_string()]);

    fn request(prompt: &str) -> TurnRequest<'_> {
        TurnRequest {
            credential_env: &KEYED,
            ..crate::provider::test_support::request(prompt)
        }
    }

    #[test]
    fn a_login_uses_the_openai_provider_whatever_the_endpoint() {
        for (model, expected) in [
            ("gpt-5.5", "openai/gpt-5.5"),
            ("caw/gpt-5.5", "openai/gpt-5.5"),
            ("openai/gpt-5.5", "openai/gpt-5.5"),
        ] {
            let command = Opencode.turn_command(&TurnRequest {
                endpoint: Some("http://caw-box-broker-x:8080"),
                model: Some(model),
                credential_env: &[],
                ..request("hi")
            });
            let at = command.argv.iter().position(|a| a == "--model").unwrap();
            assert_eq!(command.argv[at + 1], expected);
            // No endpoint provider: the login's traffic goes to chatgpt.com (the broker
            // inside the turn's container).
            assert_eq!(config_of(&command), json!({"permission": "allow"}));
        }
        let other = Opencode.turn_command(&TurnRequest {
            model: Some("anthropic/claude-sonnet-4-5"),
            credential_env: &[],
            ..request("hi")
        });
        assert!(other
            .argv
            .contains(&"anthropic/claude-sonnet-4-5".to_string()));
    }

    #[test]
    fn an_api_key_keeps_the_endpoint_provider() {
        let command = Opencode.turn_command(&TurnRequest {
            endpoint: Some("http://caw-box-broker-x:8080"),
            model: Some("gpt-5.5"),
            ..request("hi")
        });
        assert!(command.argv.contains(&"caw/gpt-5.5".to_string()));
        assert_eq!(
            config_of(&command)["provider"]["caw"]["options"]["baseURL"],
            "http://caw-box-broker-x:8080/v1"
        );
    }

    const SESSION: &str = "ses_5f2a9c1e3ffeXk2QmZ8rT4bN1a";

    fn env<'a>(command: &'a TurnCommand, key: &str) -> Option<&'a str> {
        command
            .env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn config_of(command: &TurnCommand) -> Value {
        serde_json::from_str(env(command, "OPENCODE_CONFIG_CONTENT").unwrap()).unwrap()
    }

    fn parse(fixture: &str, exit_code: i64) -> (Vec<Event>, Option<String>, TurnOutcome) {
        parse_with(&Opencode, ParseContext::default(), fixture, exit_code)
    }

    #[test]
    fn first_turn_sends_the_prompt_on_stdin() {
        let prompt = "list the files\nthen  explain \"why\"";
        let command = Opencode.turn_command(&request(prompt));
        assert_eq!(
            command.argv,
            [
                "opencode",
                "run",
                "--format",
                "json",
                "--print-logs",
                "--log-level",
                "ERROR",
                "--title=list the files"
            ]
        );
        assert_eq!(command.stdin.as_deref(), Some(prompt.as_bytes()));
        assert_eq!(env(&command, "OPENCODE_DISABLE_MODELS_FETCH"), Some("1"));
        assert_eq!(env(&command, "OPENCODE_DISABLE_AUTOUPDATE"), Some("1"));
        assert_eq!(env(&command, "OPENCODE_DISABLE_FFF"), Some("1"));
        assert_eq!(config_of(&command), json!({"permission": "allow"}));
        assert!(!Opencode.chooses_key_up_front());
    }

    #[test]
    fn resume_names_the_session_instead_of_a_title() {
        let command = Opencode.turn_command(&TurnRequest {
            resume_key: Some(SESSION),
            model: Some("anthropic/claude-sonnet-4-5"),
            ..request("and now?")
        });
        assert_eq!(
            command.argv,
            [
                "opencode",
                "run",
                "--format",
                "json",
                "--print-logs",
                "--log-level",
                "ERROR",
                "--session",
                SESSION,
                "--model",
                "anthropic/claude-sonnet-4-5"
            ]
        );
        assert_eq!(command.stdin.as_deref(), Some(&b"and now?"[..]));
    }

    #[test]
    fn the_prompt_is_only_on_stdin() {
        assert_prompt_only_on_stdin(&Opencode);
    }

    #[test]
    fn titles_are_short_single_lines() {
        assert_eq!(title("  \n  fix   the\tbug  \nmore"), "fix the bug");
        assert_eq!(title("-v is broken"), "-v is broken");
        assert_eq!(title(""), "caw-box");
        let long = "é".repeat(60);
        assert_eq!(title(&long), format!("{}...", "é".repeat(50)));
        let command = Opencode.turn_command(&request("--help is wrong"));
        assert!(command
            .argv
            .contains(&"--title=--help is wrong".to_string()));
        assert_eq!(command.stdin.as_deref(), Some(&b"--help is wrong"[..]));
    }

    #[test]
    fn endpoint_defines_an_openai_compatible_provider() {
        for (endpoint, model) in [
            ("http://stub:8080", "stub-model"),
            ("http://stub:8080/v1/", "caw/stub-model"),
        ] {
            let command = Opencode.turn_command(&TurnRequest {
                endpoint: Some(endpoint),
                model: Some(model),
                ..request("hi")
            });
            let at = command.argv.iter().position(|a| a == "--model").unwrap();
            assert_eq!(command.argv[at + 1], "caw/stub-model");
            assert_eq!(
                config_of(&command),
                json!({
                    "permission": "allow",
                    "model": "caw/stub-model",
                    "provider": {"caw": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "caw",
                        "options": {
                            "baseURL": "http://stub:8080/v1",
                            "apiKey": "{env:OPENAI_API_KEY}"
                        },
                        "models": {"stub-model": {"name": "stub-model"}}
                    }}
                })
            );
            // The key is only referenced, never embedded.
            assert!(!env(&command, "OPENCODE_CONFIG_CONTENT")
                .unwrap()
                .contains("sk-"));
        }
        let gateway = Opencode.turn_command(&TurnRequest {
            endpoint: Some("https://gw/openai"),
            model: Some("openai/gpt-5"),
            ..request("hi")
        });
        assert!(gateway.argv.contains(&"caw/openai/gpt-5".to_string()));
        assert_eq!(
            config_of(&gateway)["provider"]["caw"]["models"],
            json!({"openai/gpt-5": {"name": "openai/gpt-5"}})
        );
    }

    #[test]
    fn a_turn_after_turns_that_named_no_session_continues_the_last() {
        let command = Opencode.turn_command(&TurnRequest {
            continue_last: true,
            ..request("RECALL")
        });
        assert!(
            command.argv.iter().any(|a| a == "--continue"),
            "{:?}",
            command.argv
        );
        assert!(
            !command.argv.iter().any(|a| a.starts_with("--title")),
            "{:?}",
            command.argv
        );
        // A key, where there is one, wins.
        let keyed = Opencode.turn_command(&TurnRequest {
            continue_last: true,
            resume_key: Some(SESSION),
            ..request("RECALL")
        });
        assert!(
            !keyed.argv.iter().any(|a| a == "--continue"),
            "{:?}",
            keyed.argv
        );
        assert!(keyed.argv.windows(2).any(|w| w == ["--session", SESSION]));
    }

    #[test]
    fn interactive_forms() {
        let first = Opencode.turn_command(&TurnRequest {
            interactive: true,
            ..request("")
        });
        assert_eq!(first.argv, ["opencode"]);
        assert_eq!(first.stdin, None);
        let resumed = Opencode.turn_command(&TurnRequest {
            interactive: true,
            resume_key: Some(SESSION),
            model: Some("stub-model"),
            endpoint: Some("http://stub:8080"),
            ..request("")
        });
        assert_eq!(
            resumed.argv,
            [
                "opencode",
                "--session",
                SESSION,
                "--model",
                "caw/stub-model"
            ]
        );
        assert_eq!(config_of(&resumed)["model"], "caw/stub-model");
        assert_eq!(resumed.stdin, None);
    }

    #[test]
    fn a_turn_with_tool_calls_sums_usage_over_steps() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/opencode/hand-turn1.jsonl"),
            0,
        );
        assert_eq!(key.as_deref(), Some(SESSION));
        let step1 = Usage {
            input_tokens: 1200,
            output_tokens: 40,
            cache_read_tokens: 0,
            cache_write_tokens: 1000,
            cost_usd: Some(0.0012),
        };
        let step2 = Usage {
            input_tokens: 300,
            output_tokens: 12,
            cache_read_tokens: 1000,
            cache_write_tokens: 0,
            cost_usd: Some(0.0008),
        };
        assert_eq!(
            events,
            [
                Event::Thinking {
                    text: "I should list the files.".into()
                },
                Event::Text {
                    text: "I'll list the files.".into()
                },
                Event::ToolCall {
                    id: "call_0a1b".into(),
                    name: "bash".into(),
                    input: json!({"command": "ls", "description": "List files"}),
                    group: None
                },
                Event::ToolResult {
                    id: "call_0a1b".into(),
                    output: "README.md\nsrc\n".into(),
                    is_error: false
                },
                Event::ToolCall {
                    id: "call_0a1c".into(),
                    name: "read".into(),
                    input: json!({"filePath": "/workspace/missing.txt"}),
                    group: None
                },
                Event::ToolResult {
                    id: "call_0a1c".into(),
                    output: "Error: File not found: /workspace/missing.txt".into(),
                    is_error: true
                },
                Event::ToolCall {
                    id: "call_0a1d".into(),
                    name: "bash".into(),
                    input: json!({"command": "false", "description": "Fail"}),
                    group: None
                },
                Event::ToolResult {
                    id: "call_0a1d".into(),
                    output: "".into(),
                    is_error: true
                },
                Event::Usage { usage: step1 },
                Event::Text {
                    text: "The workspace holds README.md and src.".into()
                },
                Event::Usage { usage: step2 },
            ]
        );
        assert_eq!(outcome.status, Status::Success);
        assert_eq!(outcome.result, "The workspace holds README.md and src.");
        assert_eq!(outcome.usage.input_tokens, 1500);
        assert_eq!(outcome.usage.output_tokens, 52);
        assert_eq!(outcome.usage.cache_read_tokens, 1000);
        assert_eq!(outcome.usage.cache_write_tokens, 1000);
        assert!((outcome.usage.cost_usd.unwrap() - 0.002).abs() < 1e-12);
        assert_eq!(outcome.cumulative_usage, None);
    }

    #[test]
    fn an_unauthorized_api_error_is_an_auth_failure() {
        let (events, key, outcome) = parse(
            include_str!("../../tests/fixtures/opencode/hand-auth-error.jsonl"),
            0,
        );
        assert_eq!(key.as_deref(), Some("ses_6a3bad2f4aaeYl3RnA9sU5cO2b"));
        assert_eq!(outcome.status, Status::AuthError);
        assert_eq!(outcome.result, "Unauthorized: Incorrect API key provided");
        assert_eq!(
            events,
            [Event::Error {
                message: "Unauthorized: Incorrect API key provided".into()
            }]
        );
    }

    #[test]
    fn a_429_is_a_usage_limit() {
        let (_, _, outcome) = parse(
            include_str!("../../tests/fixtures/opencode/hand-usage-limit.jsonl"),
            1,
        );
        assert_eq!(outcome.status, Status::UsageLimit);
        assert_eq!(outcome.result, "Too Many Requests");
    }

    #[test]
    fn exit_zero_without_an_answer_is_a_failure() {
        let (events, _, outcome) = parse(
            include_str!("../../tests/fixtures/opencode/hand-no-answer.jsonl"),
            0,
        );
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::ToolResult { is_error: true, .. })));
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(
            outcome.result,
            "the turn ended without an answer; last tool error: The user rejected permission to use this specific tool call."
        );
        assert_eq!(outcome.usage.input_tokens, 900);
        let (_, _, outcome) = parse("", 0);
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(outcome.result, "the turn ended without an answer");
        let (_, _, outcome) = parse("", 9);
        assert_eq!(outcome.result, "the CLI exited with code 9");
    }

    #[test]
    fn a_clean_exit_after_text_is_success_but_a_crash_is_not() {
        let fixture = include_str!("../../tests/fixtures/opencode/hand-turn1.jsonl");
        let (_, _, outcome) = parse(fixture, 1);
        assert_eq!(outcome.status, Status::Error);
        assert_eq!(outcome.result, "the CLI exited with code 1");
    }

    #[test]
    fn garbage_never_panics_or_yields_events() {
        let mut parser = Opencode.parser(ParseContext::default());
        let mut events = Vec::new();
        for line in [
            "",
            "\u{1b}[0m\u{1b}[1mopencode\u{1b}[0m starting",
            "{\"type\":\"text\"}",
            "{\"type\":\"text\",\"part\":{\"text\":7}}",
            "{\"type\":\"tool_use\",\"part\":{\"callID\":\"c\",\"tool\":\"bash\",\"state\":{\"status\":\"running\"}}}",
            "{\"type\":\"step_finish\",\"part\":{\"tokens\":{\"input\":-1}}}",
            "{\"type\":\"step_start\",\"sessionID\":42}",
            "{\"type\":",
        ] {
            parser.parse_line(line, &mut events);
        }
        // The running tool call is announced; nothing else comes out.
        assert_eq!(
            events,
            [Event::ToolCall {
                id: "c".into(),
                name: "bash".into(),
                input: Value::Null,
                group: None
            }]
        );
        assert_eq!(parser.resume_key(), None);
    }
}
