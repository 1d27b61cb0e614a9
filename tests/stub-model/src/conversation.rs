//! What the stub answers, decided from the conversation alone and shared by all four protocols:
//! the directives found in user text, the vendor-neutral view of a conversation, the choice of
//! the shell tool and the arguments built from its JSON schema. No wire formats here.

use std::time::Duration;

use serde_json::{json, Map, Value};

/// The answer when no directive applies.
pub const HELLO: &str = "Hello from stub-model.";
/// The answer to `RUN:` when the request offers no shell tool.
pub const NO_SHELL_TOOL: &str = "No shell tool offered.";
/// The answer to `RECALL` when no earlier user message said `REMEMBER:`.
pub const NO_MEMORY: &str = "I have no memory of that.";
/// How much of a tool's output the answer quotes.
const TOOL_OUTPUT_CHARS: usize = 300;
/// An upper bound for `SLEEP:`, so a typo cannot hang a test run.
const MAX_SLEEP_SECS: f64 = 600.0;

/// Tool names the stub treats as a shell, most preferred first (compared case-insensitively).
const SHELL_TOOL_NAMES: &[&str] = &[
    "bash",
    "shell",
    "exec_command",
    "shell_command",
    "run_shell_command",
    "local_shell",
];

/// Directives found in one user text. Each is a token anywhere in the text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Directives {
    /// `RUN:<command>`: the rest of that line.
    pub run: Option<String>,
    /// `REMEMBER:<word>`.
    pub remember: Option<String>,
    /// `RECALL`.
    pub recall: bool,
    /// `SLEEP:<seconds>` (fractions allowed, capped at ten minutes).
    pub sleep: Option<Duration>,
    /// `HOLD:<name>` (`[A-Za-z0-9_-]+`): no answer until the test releases `<name>`.
    pub hold: Option<String>,
    /// `FAIL:<http status>` (any 4xx or 5xx).
    pub fail: Option<u16>,
    /// `THINK`.
    pub think: bool,
    /// `CALL:<tool> <text>`: the tool's name (an offered tool named so, or ending in
    /// `_<tool>`: MCP tools carry their server's name first) and the rest of the line.
    pub call: Option<(String, String)>,
    /// `LIMIT:<seconds>[@anthropic|@openai|@google]`: a 429 naming its reset until that
    /// long after the stub first saw this prompt (on that vendor's wire only, when named),
    /// then the answer the rest of the prompt asks for.
    pub limit: Option<(Duration, Option<String>)>,
    /// `QUOTA:<seconds>[@anthropic|@openai|@google]`: like `LIMIT:`, but the 429 is the
    /// vendor's subscription usage limit in its own format (headers and body), naming its
    /// reset as that vendor does.
    pub quota: Option<(Duration, Option<String>)>,
}

impl Directives {
    pub fn parse(text: &str) -> Self {
        let mut found = Directives::default();
        for (start, _) in text.match_indices("RUN:") {
            if at_word_start(text, start) {
                found.run = found.run.or_else(|| run_command(text, start));
            }
        }
        found.remember = tokens_with_value(text, "REMEMBER:")
            .map(|v| word(v).to_string())
            .find(|w| !w.is_empty());
        found.recall = has_word(text, "RECALL");
        found.think = has_word(text, "THINK");
        found.sleep = tokens_with_value(text, "SLEEP:").find_map(|v| {
            let number: String = v
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let secs: f64 = number.parse().ok()?;
            Some(Duration::from_secs_f64(secs.clamp(0.0, MAX_SLEEP_SECS)))
        });
        found.hold = tokens_with_value(text, "HOLD:")
            .map(|v| word(v).to_string())
            .find(|w| !w.is_empty());
        found.call = tokens_with_value(text, "CALL:").find_map(|v| {
            let line = v.lines().next().unwrap_or("");
            let tool = word(line);
            let rest = line[tool.len()..].trim();
            let rest = rest.trim_end_matches(['"', '\'']).trim_end();
            (!tool.is_empty()).then(|| (tool.to_string(), rest.to_string()))
        });
        found.limit = tokens_with_value(text, "LIMIT:").find_map(window_and_wire);
        found.quota = tokens_with_value(text, "QUOTA:").find_map(window_and_wire);
        found.fail = tokens_with_value(text, "FAIL:").find_map(|v| {
            let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok().filter(|s| (400..=599).contains(s))
        });
        found
    }
}

/// `<seconds>[@wire]`, the value of `LIMIT:` and `QUOTA:`.
fn window_and_wire(v: &str) -> Option<(Duration, Option<String>)> {
    let number: String = v.chars().take_while(char::is_ascii_digit).collect();
    let secs: u64 = number.parse().ok()?;
    let wire = v[number.len()..]
        .strip_prefix('@')
        .map(|w| word(w).to_string());
    Some((Duration::from_secs(secs.min(MAX_SLEEP_SECS as u64)), wire))
}

/// The text after each word-initial occurrence of `token`.
fn tokens_with_value<'a>(text: &'a str, token: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(token)
        .filter(move |(start, _)| at_word_start(text, *start))
        .map(move |(start, _)| &text[start + token.len()..])
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn at_word_start(text: &str, start: usize) -> bool {
    !text[..start].chars().next_back().is_some_and(is_word_char)
}

fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(start, _)| {
        at_word_start(text, start)
            && !text[start + word.len()..]
                .chars()
                .next()
                .is_some_and(is_word_char)
    })
}

fn word(text: &str) -> &str {
    let end = text
        .find(|c: char| !(is_word_char(c) || c == '-'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The command of a `RUN:` at `start`: the rest of the line. When the directive sits right
/// after a quote and the line ends with the same quote (opencode quotes an argv word that
/// contains spaces), that closing quote is not part of the command.
fn run_command(text: &str, start: usize) -> Option<String> {
    let rest = &text[start + "RUN:".len()..];
    let line = rest.lines().next().unwrap_or("").trim();
    let opening = text[..start].chars().next_back();
    let line = match opening {
        Some(q @ ('"' | '\'')) => line.strip_suffix(q).unwrap_or(line).trim_end(),
        _ => line,
    };
    (!line.is_empty()).then(|| line.to_string())
}

/// One item of a conversation, as the protocol modules see it.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// Text a user message carried (wrappers included; the conversation filters).
    User(String),
    /// The output of a tool call, sent back by the CLI.
    ToolResult(String),
    /// Anything the model said or called.
    Assistant,
    /// The tools a tool search found, sent back by the CLI (codex's `tool_search_output`).
    ToolSearchResult,
}

/// The vendor-neutral view of a request's conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    /// Genuine user texts, oldest first: no tool results and no context the CLI injected.
    pub user_texts: Vec<String>,
    /// The tool output, when the conversation's last item is a tool result.
    pub tool_result: Option<String>,
    /// Whether a tool search's result came back after the latest genuine user message.
    pub searched: bool,
}

impl Conversation {
    pub fn from_items(items: impl IntoIterator<Item = Item>) -> Self {
        let mut conversation = Conversation::default();
        for item in items {
            match item {
                Item::User(text) => {
                    let text = strip_system_reminders(&text);
                    if !is_injected_context(&text) {
                        conversation.user_texts.push(text.trim().to_string());
                        conversation.tool_result = None;
                        conversation.searched = false;
                    }
                }
                Item::ToolResult(output) => conversation.tool_result = Some(output),
                Item::Assistant => conversation.tool_result = None,
                Item::ToolSearchResult => {
                    conversation.tool_result = None;
                    conversation.searched = true;
                }
            }
        }
        conversation
    }

    /// The text of the last genuine user message ("" when there is none).
    pub fn latest_user_text(&self) -> &str {
        self.user_texts.last().map_or("", String::as_str)
    }

    /// The genuine user texts before the latest one.
    pub fn earlier_user_texts(&self) -> &[String] {
        let n = self.user_texts.len().saturating_sub(1);
        &self.user_texts[..n]
    }
}

/// Removes claude's `<system-reminder>` blocks (an unclosed one runs to the end).
pub fn strip_system_reminders(text: &str) -> String {
    const OPEN: &str = "<system-reminder>";
    const CLOSE: &str = "</system-reminder>";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find(CLOSE) {
            Some(end) => &rest[start + end + CLOSE.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// Whether a user message is context the CLI added rather than something the user typed:
/// empty, a single `<tag>…</tag>` element (codex's `<environment_context>`,
/// `<user_instructions>`…), or one of the known preambles.
fn is_injected_context(text: &str) -> bool {
    const PREAMBLES: &[&str] = &[
        "# AGENTS.md instructions",
        "This is the Gemini CLI. We are setting up the context",
    ];
    let text = text.trim();
    if text.is_empty() || PREAMBLES.iter().any(|p| text.starts_with(p)) {
        return true;
    }
    let Some(tag) = text
        .strip_prefix('<')
        .and_then(|t| t.split(['>', ' ']).next())
        .filter(|t| !t.is_empty() && t.chars().all(|c| is_word_char(c) || c == '-'))
    else {
        return false;
    };
    text.ends_with(&format!("</{tag}>")) && text.matches(&format!("<{tag}")).count() == 1
}

/// What the stub decided to do with a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    pub sleep: Option<Duration>,
    /// `HOLD:<name>`: answer once `<name>` is released.
    pub hold: Option<String>,
    pub think: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Answer with this HTTP error status, in the vendor's error shape.
    Fail(u16),
    /// Answer with text; `label` names the rule for the request log.
    Text { text: String, label: String },
    /// Call the shell tool with this command.
    Run(String),
    /// Call the offered tool of this name with `{"text": …}`.
    Call { tool: String, text: String },
}

impl Decision {
    pub fn decide(conversation: &Conversation) -> Self {
        let latest = Directives::parse(conversation.latest_user_text());
        let text = |text: String, label: String| Outcome::Text { text, label };
        let outcome = if let Some(status) = latest.fail {
            Outcome::Fail(status)
        } else if let Some(output) = &conversation.tool_result {
            let quoted: String = output.trim().chars().take(TOOL_OUTPUT_CHARS).collect();
            text(format!("Tool said: {quoted}"), "tool_result".into())
        } else if let Some(command) = latest.run {
            Outcome::Run(command)
        } else if let Some((tool, text)) = latest.call {
            Outcome::Call { tool, text }
        } else if let Some(word) = latest.remember {
            text(format!("Noted: {word}."), format!("remember:{word}"))
        } else if latest.recall {
            let remembered = conversation
                .earlier_user_texts()
                .iter()
                .rev()
                .find_map(|t| Directives::parse(t).remember);
            match remembered {
                Some(word) => text(
                    format!("You told me to remember {word}."),
                    format!("recall:{word}"),
                ),
                None => text(NO_MEMORY.into(), "recall:none".into()),
            }
        } else {
            text(HELLO.into(), "hello".into())
        };
        Decision {
            outcome,
            sleep: latest.sleep,
            hold: latest.hold,
            think: latest.think,
        }
    }

    /// A short description for the request log, e.g. `run+sleep:1.5`.
    pub fn label(&self) -> String {
        let mut label = match &self.outcome {
            Outcome::Fail(status) => format!("fail:{status}"),
            Outcome::Text { label, .. } => label.clone(),
            Outcome::Run(_) => "run".into(),
            Outcome::Call { tool, .. } => format!("call:{tool}"),
        };
        if let Some(name) = &self.hold {
            label.push_str(&format!("+hold:{name}"));
        }
        if let Some(sleep) = self.sleep {
            label.push_str(&format!("+sleep:{}", sleep.as_secs_f64()));
        }
        if self.think {
            label.push_str("+think");
        }
        label
    }
}

/// How a tool is called on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// A function tool: a name plus JSON arguments.
    Function,
    /// The Responses API's built-in `local_shell` tool.
    LocalShell,
    /// A tool search the client runs (codex's `tool_search`, `execution: "client"`): called
    /// with `{"query": …}`, it answers with the tools it found, which the next request offers.
    ToolSearch,
}

/// A tool the request offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (`{}` when none was given).
    pub schema: Value,
    pub kind: ToolKind,
}

/// The offered tool the stub uses as a shell, by [`SHELL_TOOL_NAMES`] preference.
pub fn pick_shell_tool(tools: Vec<Tool>) -> Option<Tool> {
    let rank = |tool: &Tool| {
        SHELL_TOOL_NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(&tool.name))
    };
    tools
        .into_iter()
        .filter_map(|tool| rank(&tool).map(|r| (r, tool)))
        .min_by_key(|(r, _)| *r)
        .map(|(_, tool)| tool)
}

/// The offered tool a `CALL:<tool>` means: named so, or ending in `_<tool>` (an MCP tool
/// named after its server: `mcp__srv__echo`, `srv_echo`).
pub fn pick_named_tool(tools: Vec<Tool>, wanted: &str) -> Option<Tool> {
    let suffix = format!("_{wanted}");
    tools
        .into_iter()
        .find(|t| t.kind == ToolKind::Function && (t.name == wanted || t.name.ends_with(&suffix)))
}

/// The offered tool search, used when `CALL:<tool>` names a tool not offered yet.
pub fn pick_tool_search(tools: Vec<Tool>) -> Option<Tool> {
    tools.into_iter().find(|t| t.kind == ToolKind::ToolSearch)
}

/// Arguments for a called tool: `text` (or, when the text is a JSON object, its fields), plus
/// placeholders for its other required properties.
pub fn call_args(schema: &Value, text: &str) -> Value {
    let mut args = match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Object(fields)) => fields,
        _ => {
            let mut args = Map::new();
            args.insert("text".to_string(), json!(text));
            args
        }
    };
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !args.contains_key(name) {
            let prop = properties.get(name).unwrap_or(&Value::Null);
            args.insert(name.to_string(), placeholder(prop));
        }
    }
    Value::Object(args)
}

/// A call of the shell tool, ready for a protocol module to encode.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub kind: ToolKind,
    pub args: Value,
}

/// Arguments that run `command` through a tool with this JSON schema: `command` (array:
/// `["bash","-lc",cmd]`, else the string) or `cmd`, plus placeholders for the other required
/// properties.
pub fn shell_args(schema: &Value, command: &str) -> Value {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let as_type = |prop: &str| match properties.get(prop).map(schema_type).as_deref() {
        Some("array") => json!(["bash", "-lc", command]),
        _ => json!(command),
    };
    let mut args = Map::new();
    let key = if properties.contains_key("command") || !properties.contains_key("cmd") {
        "command"
    } else {
        "cmd"
    };
    args.insert(key.to_string(), as_type(key));
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !args.contains_key(name) {
            let prop = properties.get(name).unwrap_or(&Value::Null);
            args.insert(name.to_string(), placeholder(prop));
        }
    }
    Value::Object(args)
}

/// A short value that satisfies a property's schema.
fn placeholder(prop: &Value) -> Value {
    if let Some(first) = prop
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    match schema_type(prop).as_str() {
        "array" => json!([]),
        "object" => json!({}),
        "integer" | "number" => json!(0),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!("stub tool call"),
    }
}

/// The (first non-null) type of a schema, lowercased (Gemini writes `STRING`); "string" when
/// none is given.
pub fn schema_type(schema: &Value) -> String {
    let from_type = match schema.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| !t.eq_ignore_ascii_case("null"))
            .map(str::to_string),
        _ => None,
    };
    let from_union = || {
        ["anyOf", "oneOf"]
            .iter()
            .filter_map(|k| schema.get(k).and_then(Value::as_array))
            .flatten()
            .map(schema_type)
            .find(|t| t != "null")
    };
    from_type
        .or_else(from_union)
        .unwrap_or_else(|| "string".into())
        .to_ascii_lowercase()
}

/// A value of every property of an object schema, e.g. for a structured-output request.
pub fn example_for_schema(schema: &Value) -> Value {
    if let Some(first) = schema
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    match schema_type(schema).as_str() {
        "object" => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let fields = properties.into_iter().flatten();
            Value::Object(
                fields
                    .map(|(k, v)| (k.clone(), example_for_schema(v)))
                    .collect(),
            )
        }
        "array" => json!([]),
        "integer" | "number" => {
            let min = schema.get("minimum").and_then(Value::as_f64).unwrap_or(1.0);
            json!(min.max(1.0) as i64)
        }
        "boolean" => json!(false),
        _ => json!("stub"),
    }
}

/// Deterministic, plausible token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// Input: a quarter of the request body's bytes; output: a quarter of the answer's
    /// characters, plus one.
    pub fn estimate(request_bytes: usize, answer: &str) -> Self {
        Usage {
            input_tokens: request_bytes as u64 / 4,
            output_tokens: answer.chars().count() as u64 / 4 + 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// Text of a content value that is a string or an array of parts with `text` fields
/// (Anthropic blocks, chat parts, Responses parts).
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_directives_anywhere_in_wrapped_text() {
        let d = Directives::parse("please\nnow RUN:echo hi && ls\nand then THINK. SLEEP:1.5");
        assert_eq!(d.run.as_deref(), Some("echo hi && ls"));
        assert!(d.think);
        assert_eq!(d.sleep, Some(Duration::from_millis(1500)));
        assert_eq!(d.fail, None);
        assert!(!d.recall);
    }

    #[test]
    fn parses_remember_word_and_recall() {
        let d = Directives::parse("ok, REMEMBER:blue-fox_42. RECALL");
        assert_eq!(d.remember.as_deref(), Some("blue-fox_42"));
        assert!(d.recall);
        assert_eq!(Directives::parse("REMEMBER: x").remember, None);
    }

    #[test]
    fn directives_need_word_boundaries() {
        let d = Directives::parse("PRERUN:x RECALLED THINKING XFAIL:500 SLEEPY");
        assert_eq!(d, Directives::default());
    }

    #[test]
    fn limit_takes_seconds_and_an_optional_wire() {
        let d = |s| Duration::from_secs(s);
        assert_eq!(Directives::parse("LIMIT:6 hi").limit, Some((d(6), None)));
        assert_eq!(
            Directives::parse("x LIMIT:600@openai REMEMBER:kite").limit,
            Some((d(600), Some("openai".into())))
        );
        assert_eq!(Directives::parse("LIMIT:soon").limit, None);
        assert_eq!(
            Directives::parse("QUOTA:5@google hi").quota,
            Some((d(5), Some("google".into())))
        );
        assert_eq!(Directives::parse("QUOTA:5 hi").limit, None);
    }

    #[test]
    fn fail_accepts_only_error_statuses() {
        assert_eq!(Directives::parse("FAIL:429").fail, Some(429));
        assert_eq!(Directives::parse("x FAIL:529 y").fail, Some(529));
        assert_eq!(Directives::parse("FAIL:200").fail, None);
        assert_eq!(Directives::parse("FAIL:abc").fail, None);
    }

    #[test]
    fn hold_takes_a_name_and_shows_in_the_label() {
        let d = Directives::parse("HOLD:scan-codex_1, then REMEMBER:fig");
        assert_eq!(d.hold.as_deref(), Some("scan-codex_1"));
        assert_eq!(d.remember.as_deref(), Some("fig"));
        assert_eq!(Directives::parse("HOLD: x").hold, None);
        assert_eq!(Directives::parse("XHOLD:x").hold, None);
        let held = decide(vec![Item::User("HOLD:h1 SLEEP:1 REMEMBER:owl".into())]);
        assert_eq!(text_of(&held), "Noted: owl.");
        assert_eq!(held.hold.as_deref(), Some("h1"));
        assert_eq!(held.label(), "remember:owl+hold:h1+sleep:1");
    }

    #[test]
    fn sleep_is_capped() {
        let d = Directives::parse("SLEEP:100000");
        assert_eq!(d.sleep, Some(Duration::from_secs(600)));
    }

    #[test]
    fn run_drops_the_closing_quote_of_a_quoted_prompt() {
        let d = Directives::parse("\"RUN:echo a b\"");
        assert_eq!(d.run.as_deref(), Some("echo a b"));
        assert_eq!(
            Directives::parse("RUN:echo \"q\"").run.as_deref(),
            Some("echo \"q\"")
        );
        assert_eq!(Directives::parse("RUN:   ").run, None);
    }

    #[test]
    fn conversation_skips_reminders_and_injected_context() {
        let conversation = Conversation::from_items([
            Item::User("<environment_context>\n  <cwd>/w</cwd>\n</environment_context>".into()),
            Item::User("REMEMBER:kiwi".into()),
            Item::Assistant,
            Item::User("<system-reminder>ctx</system-reminder>\nRECALL".into()),
            Item::User("<system-reminder>only a reminder</system-reminder>".into()),
        ]);
        assert_eq!(conversation.user_texts, vec!["REMEMBER:kiwi", "RECALL"]);
        assert_eq!(conversation.latest_user_text(), "RECALL");
        assert_eq!(conversation.earlier_user_texts(), ["REMEMBER:kiwi"]);
        assert_eq!(conversation.tool_result, None);
    }

    #[test]
    fn a_prompt_in_tags_that_differ_is_kept() {
        let conversation = Conversation::from_items([Item::User("<b>x</b> and <i>y</i>".into())]);
        assert_eq!(conversation.latest_user_text(), "<b>x</b> and <i>y</i>");
    }

    #[test]
    fn tool_result_counts_only_when_last() {
        let items = vec![
            Item::User("RUN:ls".into()),
            Item::Assistant,
            Item::ToolResult("a.txt".into()),
        ];
        let conversation = Conversation::from_items(items.clone());
        assert_eq!(conversation.tool_result.as_deref(), Some("a.txt"));
        let mut later = items;
        later.push(Item::User("again".into()));
        assert_eq!(Conversation::from_items(later).tool_result, None);
    }

    fn decide(items: Vec<Item>) -> Decision {
        Decision::decide(&Conversation::from_items(items))
    }

    fn text_of(decision: &Decision) -> &str {
        match &decision.outcome {
            Outcome::Text { text, .. } => text,
            other => panic!("expected text, got {other:?}"),
        }
    }

    #[test]
    fn decides_by_rule_order() {
        let hello = decide(vec![Item::User("hi".into())]);
        assert_eq!(text_of(&hello), HELLO);
        assert_eq!(hello.label(), "hello");

        let run = decide(vec![Item::User("RUN:ls -la SLEEP:0.25 REMEMBER:x".into())]);
        assert_eq!(
            run.outcome,
            Outcome::Run("ls -la SLEEP:0.25 REMEMBER:x".into())
        );

        let fail = decide(vec![Item::User("RUN:ls FAIL:429 SLEEP:2".into())]);
        assert_eq!(fail.outcome, Outcome::Fail(429));
        assert_eq!(fail.label(), "fail:429+sleep:2");

        let tool = decide(vec![
            Item::User("RUN:echo hi".into()),
            Item::Assistant,
            Item::ToolResult(format!("  hi{}\n", "x".repeat(400))),
        ]);
        let said = text_of(&tool);
        assert!(said.starts_with("Tool said: hixxx"));
        assert_eq!(said.chars().count(), "Tool said: ".len() + 300);

        let think = decide(vec![Item::User("THINK REMEMBER:owl".into())]);
        assert_eq!(text_of(&think), "Noted: owl.");
        assert_eq!(think.label(), "remember:owl+think");
    }

    #[test]
    fn recall_uses_the_most_recent_earlier_remember_only() {
        let found = decide(vec![
            Item::User("REMEMBER:first".into()),
            Item::User("REMEMBER:second".into()),
            Item::User("RECALL".into()),
        ]);
        assert_eq!(text_of(&found), "You told me to remember second.");
        assert_eq!(found.label(), "recall:second");

        let latest_only = decide(vec![Item::User("REMEMBER:now RECALL".into())]);
        assert_eq!(text_of(&latest_only), "Noted: now.");
        let none = decide(vec![Item::User("hi".into()), Item::User("RECALL".into())]);
        assert_eq!(text_of(&none), NO_MEMORY);
    }

    fn tool(name: &str) -> Tool {
        Tool {
            name: name.into(),
            schema: json!({}),
            kind: ToolKind::Function,
        }
    }

    #[test]
    fn picks_the_preferred_shell_tool() {
        let picked = pick_shell_tool(vec![tool("Read"), tool("exec_command"), tool("Bash")]);
        assert_eq!(picked.map(|t| t.name).as_deref(), Some("Bash"));
        assert_eq!(pick_shell_tool(vec![tool("Read"), tool("Write")]), None);
    }

    #[test]
    fn builds_args_from_array_and_string_schemas() {
        let codex_shell = json!({"type":"object","properties":{
            "command":{"type":"array","items":{"type":"string"}},
            "workdir":{"type":"string"},"timeout_ms":{"type":"number"}},"required":["command"]});
        assert_eq!(
            shell_args(&codex_shell, "ls"),
            json!({"command":["bash","-lc","ls"]})
        );

        let opencode_bash = json!({"type":"object","properties":{
            "command":{"type":"string"},"timeout":{"type":"number"},
            "description":{"type":"string"}},"required":["command","description"]});
        assert_eq!(
            shell_args(&opencode_bash, "ls"),
            json!({"command":"ls","description":"stub tool call"})
        );

        let exec_command = json!({"type":"object","properties":{
            "cmd":{"type":"string"},"yield_time_ms":{"type":"number"}},"required":["cmd"]});
        assert_eq!(shell_args(&exec_command, "ls"), json!({"cmd":"ls"}));

        let gemini = json!({"type":"OBJECT","properties":{
            "command":{"type":"STRING"},"is_background":{"type":"BOOLEAN"},
            "dir":{"type":["string","null"]},"n":{"type":"integer"},
            "tags":{"type":"array"},"env":{"type":"object"},
            "mode":{"type":"string","enum":["fg","bg"]}},
            "required":["command","is_background","n","tags","env","mode"]});
        assert_eq!(
            shell_args(&gemini, "ls"),
            json!({"command":"ls","is_background":false,"n":0,"tags":[],"env":{},"mode":"fg"})
        );
        assert_eq!(shell_args(&Value::Null, "ls"), json!({"command":"ls"}));
    }

    #[test]
    fn example_for_schema_fills_every_property() {
        let router = json!({"type":"object","properties":{
            "complexity_reasoning":{"type":"string"},
            "complexity_score":{"type":"integer","minimum":1,"maximum":100},
            "next_speaker":{"type":"string","enum":["user","model"]}}});
        assert_eq!(
            example_for_schema(&router),
            json!({"complexity_reasoning":"stub","complexity_score":1,"next_speaker":"user"})
        );
    }

    #[test]
    fn usage_is_deterministic() {
        let usage = Usage::estimate(400, "Hello from stub-model.");
        assert_eq!(
            usage,
            Usage {
                input_tokens: 100,
                output_tokens: 6
            }
        );
        assert_eq!(usage.total(), 106);
    }

    #[test]
    fn call_names_a_tool_and_its_text() {
        let d = Directives::parse("please CALL:echo hello there\nmore");
        assert_eq!(d.call, Some(("echo".into(), "hello there".into())));
        let tools = vec![tool("Read"), tool("mcp__caw__echo")];
        assert_eq!(
            pick_named_tool(tools, "echo").unwrap().name,
            "mcp__caw__echo"
        );
        assert_eq!(pick_named_tool(vec![tool("necho")], "echo"), None);
        assert_eq!(call_args(&json!({}), "hi"), json!({"text": "hi"}));
        // A JSON object is the arguments themselves (a tool with arguments of its own).
        let schema =
            json!({"required": ["session", "force"], "properties": {"force": {"type": "boolean"}}});
        assert_eq!(
            call_args(&schema, r#"{"session": "s1"}"#),
            json!({"session": "s1", "force": false})
        );
    }

    #[test]
    fn a_tool_search_result_is_no_tool_result_and_counts_until_the_next_user_message() {
        let items = vec![
            Item::User("CALL:echo hi".into()),
            Item::Assistant,
            Item::ToolSearchResult,
        ];
        let conversation = Conversation::from_items(items.clone());
        assert!(conversation.searched);
        assert_eq!(conversation.tool_result, None);
        assert_eq!(
            decide(items.clone()).outcome,
            Outcome::Call {
                tool: "echo".into(),
                text: "hi".into()
            }
        );
        let mut later = items;
        later.push(Item::User("CALL:echo again".into()));
        assert!(!Conversation::from_items(later).searched);

        let search = Tool {
            name: "tool_search".into(),
            schema: json!({}),
            kind: ToolKind::ToolSearch,
        };
        assert_eq!(pick_named_tool(vec![search.clone()], "tool_search"), None);
        assert_eq!(
            pick_tool_search(vec![tool("Read"), search.clone()]),
            Some(search)
        );
        assert_eq!(pick_tool_search(vec![tool("Read")]), None);
    }
}
