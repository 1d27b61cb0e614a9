//! The interface each wire protocol module implements, and the small pieces they share
//! (the reply to encode, ids, text chunking). No HTTP here: the server drives these.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::conversation::{Conversation, Tool, ToolCall, Usage};

/// What the model says in one turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A text answer, optionally after a thinking block (Anthropic only).
    Text { text: String, think: bool },
    /// A call of the shell tool.
    ToolCall(ToolCall),
}

impl Reply {
    /// The characters the usage estimate counts as output.
    pub fn output_chars(&self) -> String {
        match self {
            Reply::Text { text, .. } => text.clone(),
            Reply::ToolCall(call) => call.args.to_string(),
        }
    }
}

/// Everything a protocol module needs to encode a reply.
#[derive(Debug, Clone)]
pub struct Turn<'a> {
    pub body: &'a Value,
    pub model: String,
    /// SSE when true, one JSON document otherwise.
    pub stream: bool,
    pub usage: Usage,
}

/// An encoded response body.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub content_type: &'static str,
    pub body: String,
}

impl Rendered {
    pub fn sse(body: String) -> Self {
        Rendered {
            content_type: "text/event-stream",
            body,
        }
    }

    pub fn json(value: &Value) -> Self {
        Rendered {
            content_type: "application/json",
            body: value.to_string(),
        }
    }
}

/// One vendor's wire protocol: reading its requests and writing its responses.
pub trait Protocol: Send + Sync + std::fmt::Debug {
    /// The conversation a request carries.
    fn conversation(&self, body: &Value) -> Conversation;
    /// The function tools a request offers.
    fn tools(&self, body: &Value) -> Vec<Tool>;
    /// The model the request names (Gemini names it in the path instead).
    fn model(&self, body: &Value) -> String {
        body.get("model")
            .and_then(Value::as_str)
            .unwrap_or("stub-model")
            .to_string()
    }
    /// The prefix of tool call ids this vendor uses.
    fn call_id_prefix(&self) -> &'static str {
        "call"
    }
    /// Whether the client asked for SSE.
    fn stream(&self, body: &Value) -> bool {
        body.get("stream").and_then(Value::as_bool).unwrap_or(false)
    }
    /// The JSON schema the answer must match, when the request asks for structured output.
    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value>;
    /// The vendor's error document for an HTTP error status.
    fn error_body(&self, status: u16, message: &str) -> Value;
    /// The response to a successful turn.
    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered;
    /// The answer to a token-counting request.
    fn count_tokens(&self, tokens: usize) -> Value {
        json!({ "input_tokens": tokens })
    }
    /// The answer to listing the models. Enough for OpenAI, Anthropic and codex's own
    /// `models` list alike.
    fn model_list(&self) -> Value {
        json!({"object":"list","data":[],"models":[],"has_more":false,
            "first_id":null,"last_id":null})
    }
    /// The answer to looking up one model.
    fn model_info(&self, id: &str) -> Value {
        json!({"id": id, "object": "model", "type": "model", "display_name": id,
            "created": 0, "owned_by": "stub-model"})
    }
}

/// A unique id such as `toolu_stub18c2f3a40001`. Unique across restarts of the stub too, so
/// ids in a resumed history never collide.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let millis = unix_millis();
    format!("{prefix}_stub{millis:x}{n:04}")
}

pub fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

pub fn unix_secs() -> u64 {
    (unix_millis() / 1000) as u64
}

/// Splits text into pieces of at most 16 characters, so clients see several deltas.
pub fn chunks(text: &str) -> Vec<String> {
    const SIZE: usize = 16;
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    chars.chunks(SIZE).map(|c| c.iter().collect()).collect()
}

/// The thinking text of a `THINK` reply.
pub const THINKING: &str = "The stub considers the request before answering.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_the_text_and_char_boundaries() {
        let text = "héllo wörld, this is a longer answer";
        let pieces = chunks(text);
        assert!(pieces.len() > 1);
        assert!(pieces.iter().all(|p| p.chars().count() <= 16));
        assert_eq!(pieces.concat(), text);
        assert_eq!(chunks(""), vec![String::new()]);
    }

    #[test]
    fn ids_are_unique() {
        let a = new_id("toolu");
        let b = new_id("toolu");
        assert_ne!(a, b);
        assert!(a.starts_with("toolu_stub"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    }
}
