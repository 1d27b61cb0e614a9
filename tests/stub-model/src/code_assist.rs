//! Google's Code Assist API (`cloudcode-pa.googleapis.com/v1internal`), which Gemini CLI
//! talks to with a Google login instead of the Gemini API: the same `GenerateContent`
//! request inside `{"model", "project", "user_prompt_id", "request": {...}}`, each answer
//! (or SSE chunk) inside `{"response": {...}}`, and the account calls a CLI makes first
//! (`loadCodeAssist` names the user's tier and project; the rest answer an empty object).
//! Checked against gemini 0.61.0's `CodeAssistServer` (see tests/fixtures/README.md).

use serde_json::{json, Value};

use crate::conversation::{Conversation, Tool};
use crate::gemini::Gemini;
use crate::protocol::{Protocol, Rendered, Reply, Turn};
use crate::sse;

/// The project the stub's account is onboarded to.
pub const PROJECT: &str = "stub-code-assist-project";

#[derive(Debug, Clone, Copy, Default)]
pub struct CodeAssist;

fn inner(body: &Value) -> &Value {
    body.get("request").unwrap_or(&Value::Null)
}

impl Protocol for CodeAssist {
    fn conversation(&self, body: &Value) -> Conversation {
        Gemini.conversation(inner(body))
    }

    fn tools(&self, body: &Value) -> Vec<Tool> {
        Gemini.tools(inner(body))
    }

    fn model(&self, body: &Value) -> String {
        body.get("model")
            .and_then(Value::as_str)
            .unwrap_or("gemini-2.5-pro")
            .to_string()
    }

    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        Gemini.output_schema(inner(body))
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        Gemini.error_body(status, message)
    }

    fn count_tokens(&self, tokens: usize) -> Value {
        Gemini.count_tokens(tokens)
    }

    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered {
        let rendered = Gemini.render(
            reply,
            &Turn {
                body: inner(turn.body),
                ..turn.clone()
            },
        );
        let wrap = |response: Value| json!({ "response": response, "traceId": "stub-trace" });
        if !turn.stream {
            let response = serde_json::from_str(&rendered.body).unwrap_or(Value::Null);
            return Rendered::json(&wrap(response));
        }
        let body = sse::parse(&rendered.body)
            .iter()
            .map(|e| sse::event(None, &wrap(e.json())))
            .collect();
        Rendered::sse(body)
    }
}

/// The answer to an account call (`loadCodeAssist`, `listExperiments`, ...): a user on the
/// free tier, onboarded to [`PROJECT`]; the other calls have nothing to report.
pub fn account_call(method: &str) -> Value {
    match method {
        "loadCodeAssist" => json!({
            "currentTier": {"id": "free-tier", "name": "Gemini Code Assist for individuals",
                            "hasOnboardedPreviously": true},
            "allowedTiers": [{"id": "free-tier", "isDefault": true}],
            "cloudaicompanionProject": PROJECT,
        }),
        "onboardUser" => json!({
            "done": true,
            "response": {"cloudaicompanionProject": {"id": PROJECT}},
        }),
        _ => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Usage;

    fn wrapped() -> Value {
        json!({"model": "gemini-2.5-pro", "project": PROJECT, "user_prompt_id": "p1",
               "request": {"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]}})
    }

    #[test]
    fn reads_the_request_inside_the_envelope() {
        let body = wrapped();
        assert_eq!(CodeAssist.model(&body), "gemini-2.5-pro");
        assert_eq!(
            CodeAssist.conversation(&body).latest_user_text(),
            "hello there"
        );
    }

    #[test]
    fn wraps_each_chunk_and_the_whole_answer() {
        let body = wrapped();
        let turn = |stream| Turn {
            body: &body,
            model: "gemini-2.5-pro".into(),
            stream,
            usage: Usage::estimate(10, "x"),
        };
        let reply = Reply::Text {
            text: "a reply longer than one chunk".into(),
            think: false,
        };
        let streamed = CodeAssist.render(&reply, &turn(true));
        let events = sse::parse(&streamed.body);
        assert!(events.len() > 1);
        for e in &events {
            assert!(e.json()["response"]["candidates"].is_array(), "{}", e.data);
        }
        let whole = CodeAssist.render(&reply, &turn(false));
        let v: Value = serde_json::from_str(&whole.body).unwrap();
        assert_eq!(
            v["response"]["candidates"][0]["content"]["parts"][0]["text"],
            "a reply longer than one chunk"
        );
    }

    #[test]
    fn the_account_is_onboarded() {
        let load = account_call("loadCodeAssist");
        assert_eq!(load["cloudaicompanionProject"], PROJECT);
        assert!(load["currentTier"]["id"].is_string());
        assert_eq!(account_call("listExperiments"), json!({}));
    }
}
