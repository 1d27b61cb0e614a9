//! Gemini API (Gemini CLI): reading `models/{model}:streamGenerateContent` and
//! `:generateContent` bodies and writing `GenerateContentResponse` chunks as SSE (or one
//! response for the non-streaming call). The model and streaming come from the path.

use serde_json::{json, Value};

use crate::conversation::{Conversation, Item, Tool, ToolKind};
use crate::protocol::{chunks, new_id, Protocol, Rendered, Reply, Turn};
use crate::sse;

#[derive(Debug, Clone, Copy, Default)]
pub struct Gemini;

impl Protocol for Gemini {
    fn conversation(&self, body: &Value) -> Conversation {
        let contents = body.get("contents").and_then(Value::as_array);
        Conversation::from_items(contents.into_iter().flatten().flat_map(content_items))
    }

    fn tools(&self, body: &Value) -> Vec<Tool> {
        let tools = body.get("tools").and_then(Value::as_array);
        tools
            .into_iter()
            .flatten()
            .filter_map(|tool| {
                tool.get("functionDeclarations")
                    .or_else(|| tool.get("function_declarations"))
                    .and_then(Value::as_array)
            })
            .flatten()
            .filter_map(|declaration| {
                let schema = ["parametersJsonSchema", "parameters"]
                    .iter()
                    .find_map(|k| declaration.get(*k));
                Some(Tool {
                    name: declaration.get("name")?.as_str()?.to_string(),
                    schema: schema.cloned().unwrap_or(json!({})),
                    kind: ToolKind::Function,
                })
            })
            .collect()
    }

    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        let config = body.get("generationConfig")?;
        [
            "responseJsonSchema",
            "responseSchema",
            "response_json_schema",
            "response_schema",
        ]
        .iter()
        .find_map(|k| config.get(*k))
    }

    fn count_tokens(&self, tokens: usize) -> Value {
        json!({ "totalTokens": tokens })
    }

    fn model_list(&self) -> Value {
        json!({ "models": [self.model_info("gemini-2.5-pro")] })
    }

    fn model_info(&self, id: &str) -> Value {
        json!({"name": format!("models/{id}"), "displayName": id, "version": "stub",
            "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536,
            "supportedGenerationMethods":
                ["generateContent", "streamGenerateContent", "countTokens"]})
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        let name = match status {
            400 | 422 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            429 => "RESOURCE_EXHAUSTED",
            503 | 529 => "UNAVAILABLE",
            500..=599 => "INTERNAL",
            _ => "UNKNOWN",
        };
        json!({"error":{"code":status,"message":message,"status":name}})
    }

    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered {
        let response_id = new_id("gen");
        let usage = json!({
            "promptTokenCount": turn.usage.input_tokens,
            "candidatesTokenCount": turn.usage.output_tokens,
            "totalTokenCount": turn.usage.total(),
        });
        let response = |parts: Value, finish: bool| {
            let mut candidate = json!({"content":{"parts":parts,"role":"model"},"index":0});
            let mut response = json!({"candidates":[],"modelVersion":turn.model,
                "responseId":response_id});
            if finish {
                candidate["finishReason"] = json!("STOP");
                response["usageMetadata"] = usage.clone();
            }
            response["candidates"] = json!([candidate]);
            response
        };
        let parts: Vec<Value> = match reply {
            Reply::Text { text, .. } if turn.stream => chunks(text)
                .into_iter()
                .map(|c| json!([{ "text": c }]))
                .collect(),
            Reply::Text { text, .. } => vec![json!([{ "text": text }])],
            Reply::ToolCall(call) => {
                vec![json!([{"functionCall":{"name":call.name,"args":call.args}}])]
            }
        };
        if !turn.stream {
            let all: Vec<Value> = parts.into_iter().flat_map(array_items).collect();
            return Rendered::json(&response(json!(all), true));
        }
        let last = parts.len() - 1;
        let out = parts
            .into_iter()
            .enumerate()
            .map(|(i, parts)| sse::event(None, &response(parts, i == last)))
            .collect();
        Rendered::sse(out)
    }
}

fn array_items(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items,
        other => vec![other],
    }
}

/// The items of one content. Each text part of a user content is its own user text: after
/// an interrupted turn gemini merges that turn's prompt and the next one into one content
/// (`parts: ["SLEEP:120 …", "RECALL"]`), and only the last is the latest prompt.
fn content_items(content: &Value) -> Vec<Item> {
    if content.get("role").and_then(Value::as_str) == Some("model") {
        return vec![Item::Assistant];
    }
    let parts = content.get("parts").and_then(Value::as_array);
    let parts = parts.map(Vec::as_slice).unwrap_or_default();
    let results: Vec<String> = parts
        .iter()
        .filter_map(|p| p.get("functionResponse"))
        .map(|r| function_output(r.get("response").unwrap_or(&Value::Null)))
        .collect();
    if !results.is_empty() {
        return vec![Item::ToolResult(results.join("\n"))];
    }
    parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .map(|t| Item::User(t.to_string()))
        .collect()
}

/// The text of a `functionResponse.response`: its `output`, `content` or `error`, else the JSON.
fn function_output(response: &Value) -> String {
    ["output", "content", "error"]
        .iter()
        .find_map(|k| response.get(*k).and_then(Value::as_str))
        .map_or_else(|| response.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{pick_shell_tool, shell_args, ToolCall, Usage};

    fn turn2() -> Value {
        json!({
            "contents": [
                {"role":"user","parts":[{"text":"This is the Gemini CLI. We are setting up the context for our chat.\nToday's date is Friday."}]},
                {"role":"model","parts":[{"text":"Got it. Thanks for the context!"}]},
                {"role":"user","parts":[{"text":"REMEMBER:lynx"}]},
                {"role":"model","parts":[{"text":"Noted: lynx."}]},
                {"role":"user","parts":[{"text":"RUN:echo hi"}]},
                {"role":"model","parts":[{"functionCall":{"name":"run_shell_command","args":{"command":"echo hi"}}}]},
                {"role":"user","parts":[{"functionResponse":{"id":"run_shell_command-1","name":"run_shell_command",
                    "response":{"output":"Command: echo hi\nOutput: hi\nExit Code: 0"}}}]}
            ],
            "systemInstruction": {"role":"user","parts":[{"text":"You are Gemini CLI."}]},
            "generationConfig": {"temperature":0,"thinkingConfig":{"includeThoughts":true}},
            "tools": [{"functionDeclarations":[
                {"name":"read_file","parametersJsonSchema":{"type":"object","properties":{"absolute_path":{"type":"string"}},"required":["absolute_path"]}},
                {"name":"run_shell_command","description":"Runs a shell command","parametersJsonSchema":{"type":"object",
                    "properties":{"command":{"type":"string"},"description":{"type":"string"},
                    "dir_path":{"type":"string"},"is_background":{"type":"boolean"}},
                    "required":["command","is_background"]}}
            ]}]
        })
    }

    #[test]
    fn a_trailing_function_response_is_a_tool_result() {
        let conversation = Gemini.conversation(&turn2());
        assert_eq!(conversation.latest_user_text(), "RUN:echo hi");
        assert_eq!(conversation.earlier_user_texts(), ["REMEMBER:lynx"]);
        assert_eq!(
            conversation.tool_result.as_deref(),
            Some("Command: echo hi\nOutput: hi\nExit Code: 0")
        );
    }

    #[test]
    fn a_new_user_text_ends_the_tool_result() {
        let mut body = turn2();
        let contents = body["contents"].as_array_mut().unwrap();
        contents.push(json!({"role":"model","parts":[{"text":"Tool said: hi"}]}));
        // An interrupted turn's prompt merged with the next one: the last part is the latest.
        contents.push(json!({"role":"user","parts":[{"text":"SLEEP:120"},{"text":"RECALL now"}]}));
        let conversation = Gemini.conversation(&body);
        assert_eq!(conversation.latest_user_text(), "RECALL now");
        assert!(conversation
            .earlier_user_texts()
            .iter()
            .any(|t| t == "SLEEP:120"));
        assert_eq!(conversation.tool_result, None);
        let error = function_output(&json!({"error":"denied"}));
        assert_eq!(error, "denied");
        assert_eq!(function_output(&json!({"n":1})), "{\"n\":1}");
    }

    #[test]
    fn picks_run_shell_command_with_required_flags() {
        let tool = pick_shell_tool(Gemini.tools(&turn2())).expect("shell offered");
        assert_eq!(tool.name, "run_shell_command");
        assert_eq!(
            shell_args(&tool.schema, "ls"),
            json!({"command":"ls","is_background":false})
        );
        let legacy = json!({"tools":[{"functionDeclarations":[{"name":"run_shell_command",
            "parameters":{"type":"OBJECT","properties":{"command":{"type":"STRING"}},"required":["command"]}}]}]});
        let tool = pick_shell_tool(Gemini.tools(&legacy)).unwrap();
        assert_eq!(shell_args(&tool.schema, "ls"), json!({"command":"ls"}));
    }

    fn render(reply: &Reply, stream: bool) -> Rendered {
        let body = turn2();
        let turn = Turn {
            body: &body,
            model: "gemini-2.5-pro".into(),
            stream,
            usage: Usage::estimate(400, "Hello from stub-model."),
        };
        Gemini.render(reply, &turn)
    }

    #[test]
    fn streams_text_chunks_and_finishes_with_usage() {
        let rendered = render(
            &Reply::Text {
                text: "Hello from stub-model.".into(),
                think: true,
            },
            true,
        );
        assert_eq!(rendered.content_type, "text/event-stream");
        let events: Vec<Value> = sse::parse(&rendered.body)
            .iter()
            .map(sse::Event::json)
            .collect();
        assert!(events.len() > 1);
        let text: String = events
            .iter()
            .map(|e| {
                e["candidates"][0]["content"]["parts"][0]["text"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(text, "Hello from stub-model.");
        let last = events.last().unwrap();
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(last["candidates"][0]["content"]["role"], "model");
        assert_eq!(
            last["usageMetadata"],
            json!({"promptTokenCount":100,"candidatesTokenCount":6,"totalTokenCount":106})
        );
        assert!(events[0]["candidates"][0]["finishReason"].is_null());
    }

    #[test]
    fn streams_a_function_call() {
        let rendered = render(
            &Reply::ToolCall(ToolCall {
                id: "call_1".into(),
                name: "run_shell_command".into(),
                kind: ToolKind::Function,
                args: json!({"command":"ls","is_background":false}),
            }),
            true,
        );
        let events = sse::parse(&rendered.body);
        assert_eq!(events.len(), 1);
        let part = &events[0].json()["candidates"][0]["content"]["parts"][0];
        assert_eq!(
            part["functionCall"],
            json!({"name":"run_shell_command","args":{"command":"ls","is_background":false}})
        );
    }

    #[test]
    fn generate_content_is_one_document() {
        let rendered = render(
            &Reply::Text {
                text: "{\"complexity_score\":1}".into(),
                think: false,
            },
            false,
        );
        assert_eq!(rendered.content_type, "application/json");
        let response: Value = serde_json::from_str(&rendered.body).unwrap();
        assert_eq!(
            response["candidates"][0]["content"]["parts"],
            json!([{"text":"{\"complexity_score\":1}"}])
        );
        assert_eq!(response["usageMetadata"]["totalTokenCount"], 106);
    }

    #[test]
    fn errors_use_google_status_names() {
        assert_eq!(
            Gemini.error_body(429, "quota"),
            json!({"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}})
        );
        assert_eq!(
            Gemini.error_body(401, "x")["error"]["status"],
            "UNAUTHENTICATED"
        );
        assert_eq!(Gemini.error_body(500, "x")["error"]["status"], "INTERNAL");
    }

    #[test]
    fn finds_the_router_schema() {
        let router = json!({"generationConfig":{"responseMimeType":"application/json",
            "responseJsonSchema":{"type":"object","properties":{"complexity_reasoning":{"type":"string"},
            "complexity_score":{"type":"integer"}},"required":["complexity_reasoning","complexity_score"]}}});
        let schema = Gemini.output_schema(&router).unwrap();
        assert_eq!(
            crate::conversation::example_for_schema(schema),
            json!({"complexity_reasoning":"stub","complexity_score":1})
        );
    }
}
