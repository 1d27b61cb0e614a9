//! Anthropic Messages API (Claude Code): reading `POST /v1/messages` bodies and writing the
//! Messages SSE stream (or one message document when `stream` is false).

use serde_json::{json, Value};

use crate::conversation::{content_text, Conversation, Item, Tool, ToolKind};
use crate::protocol::{chunks, new_id, Protocol, Rendered, Reply, Turn, THINKING};
use crate::sse;

#[derive(Debug, Clone, Copy, Default)]
pub struct Anthropic;

impl Protocol for Anthropic {
    fn conversation(&self, body: &Value) -> Conversation {
        let messages = body.get("messages").and_then(Value::as_array);
        Conversation::from_items(messages.into_iter().flatten().flat_map(message_items))
    }

    fn tools(&self, body: &Value) -> Vec<Tool> {
        let tools = body.get("tools").and_then(Value::as_array);
        tools
            .into_iter()
            .flatten()
            .filter_map(|tool| {
                Some(Tool {
                    name: tool.get("name")?.as_str()?.to_string(),
                    schema: tool.get("input_schema").cloned().unwrap_or(json!({})),
                    kind: ToolKind::Function,
                })
            })
            .collect()
    }

    fn call_id_prefix(&self) -> &'static str {
        "toolu"
    }

    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        body.pointer("/output_format/schema")
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        let kind = match status {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            529 | 503 => "overloaded_error",
            _ => "api_error",
        };
        json!({"type":"error","error":{"type":kind,"message":message}})
    }

    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered {
        let message_id = new_id("msg");
        let blocks = content_blocks(reply);
        let stop_reason = match reply {
            Reply::ToolCall(_) => "tool_use",
            Reply::Text { .. } => "end_turn",
        };
        let usage = json!({
            "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        });
        if !turn.stream {
            return Rendered::json(&json!({
                "id": message_id, "type": "message", "role": "assistant", "model": turn.model,
                "content": blocks, "stop_reason": stop_reason, "stop_sequence": null,
                "usage": usage,
            }));
        }

        let mut out = String::new();
        let mut emit = |name: &str, data: Value| out.push_str(&sse::event(Some(name), &data));
        let mut start_usage = usage.clone();
        start_usage["output_tokens"] = json!(1);
        emit(
            "message_start",
            json!({"type":"message_start","message":{
                "id": message_id, "type": "message", "role": "assistant", "model": turn.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
            }}),
        );
        emit("ping", json!({"type":"ping"}));
        for (index, block) in blocks.iter().enumerate() {
            let (start, deltas) = block_events(block);
            emit(
                "content_block_start",
                json!({"type":"content_block_start","index":index,"content_block":start}),
            );
            for delta in deltas {
                emit(
                    "content_block_delta",
                    json!({"type":"content_block_delta","index":index,"delta":delta}),
                );
            }
            emit(
                "content_block_stop",
                json!({"type":"content_block_stop","index":index}),
            );
        }
        emit(
            "message_delta",
            json!({"type":"message_delta",
                "delta":{"stop_reason":stop_reason,"stop_sequence":null},"usage":usage}),
        );
        emit("message_stop", json!({"type":"message_stop"}));
        Rendered::sse(out)
    }
}

/// The items of one message. Each text block of a user message is its own user text: claude
/// merges consecutive user messages (e.g. a prompt whose turn failed, then the next prompt)
/// into one message of several blocks, and only the last is the latest prompt.
fn message_items(message: &Value) -> Vec<Item> {
    let content = message.get("content").unwrap_or(&Value::Null);
    match message.get("role").and_then(Value::as_str) {
        Some("user") => {
            let Some(blocks) = content.as_array() else {
                return vec![Item::User(content_text(content))];
            };
            let of_type = |kind: &'static str| {
                blocks
                    .iter()
                    .filter(move |b| b.get("type").and_then(Value::as_str) == Some(kind))
            };
            let results: Vec<String> = of_type("tool_result")
                .map(|b| content_text(b.get("content").unwrap_or(&Value::Null)))
                .collect();
            if results.is_empty() {
                of_type("text")
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .map(|text| Item::User(text.to_string()))
                    .collect()
            } else {
                vec![Item::ToolResult(results.join("\n"))]
            }
        }
        Some("assistant") => vec![Item::Assistant],
        _ => Vec::new(),
    }
}

/// The complete content blocks of a reply.
fn content_blocks(reply: &Reply) -> Vec<Value> {
    match reply {
        Reply::Text { text, think } => {
            let thinking = think.then(
                || json!({"type":"thinking","thinking":THINKING,"signature":"stub-signature"}),
            );
            thinking
                .into_iter()
                .chain([json!({"type":"text","text":text})])
                .collect()
        }
        Reply::ToolCall(call) => vec![json!({
            "type":"tool_use","id":call.id,"name":call.name,"input":call.args,
        })],
    }
}

/// The `content_block_start` block and the deltas that fill it.
fn block_events(block: &Value) -> (Value, Vec<Value>) {
    let field = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or_default();
    match field("type") {
        "thinking" => (
            json!({"type":"thinking","thinking":"","signature":""}),
            chunks(field("thinking"))
                .into_iter()
                .map(|c| json!({"type":"thinking_delta","thinking":c}))
                .chain([json!({"type":"signature_delta","signature":field("signature")})])
                .collect(),
        ),
        "tool_use" => (
            json!({"type":"tool_use","id":field("id"),"name":field("name"),"input":{}}),
            vec![json!({"type":"input_json_delta","partial_json":block["input"].to_string()})],
        ),
        _ => (
            json!({"type":"text","text":""}),
            chunks(field("text"))
                .into_iter()
                .map(|c| json!({"type":"text_delta","text":c}))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{pick_shell_tool, shell_args, ToolCall, Usage};

    fn turn2() -> Value {
        json!({
            "model": "claude-sonnet-4-5",
            "stream": true,
            "system": [{"type":"text","text":"You are Claude Code."}],
            "messages": [
                {"role":"user","content":[
                    {"type":"text","text":"<system-reminder>\nAs you answer, use this context: CLAUDE.md says nothing.\n</system-reminder>"},
                    {"type":"text","text":"REMEMBER:walrus"}]},
                {"role":"assistant","content":[{"type":"text","text":"Noted: walrus."}]},
                {"role":"system","content":"compact boundary"},
                {"role":"user","content":[
                    {"type":"text","text":"<system-reminder>todo list is empty</system-reminder>"},
                    {"type":"text","text":"RECALL please","cache_control":{"type":"ephemeral"}}]}
            ],
            "tools": [
                {"name":"Read","input_schema":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}},
                {"name":"Bash","description":"Run a command","input_schema":{"type":"object",
                    "properties":{"command":{"type":"string"},"timeout":{"type":"number"},
                    "description":{"type":"string"},"run_in_background":{"type":"boolean"}},
                    "required":["command"],"additionalProperties":false}}
            ]
        })
    }

    #[test]
    fn extracts_user_texts_around_reminders_and_system_entries() {
        let conversation = Anthropic.conversation(&turn2());
        assert_eq!(conversation.latest_user_text(), "RECALL please");
        assert_eq!(conversation.earlier_user_texts(), ["REMEMBER:walrus"]);
        assert_eq!(conversation.tool_result, None);
    }

    #[test]
    fn merged_user_messages_count_as_separate_texts() {
        let body = json!({"messages":[
            {"role":"user","content":"REMEMBER:walrus"},
            {"role":"assistant","content":[{"type":"text","text":"Noted: walrus."}]},
            {"role":"user","content":[
                {"type":"text","text":"<system-reminder>r</system-reminder>"},
                {"type":"text","text":"FAIL:429"},
                {"type":"text","text":"<system-reminder>r</system-reminder>"},
                {"type":"text","text":"RECALL"}]}
        ]});
        let conversation = Anthropic.conversation(&body);
        assert_eq!(conversation.latest_user_text(), "RECALL");
        assert_eq!(
            conversation.earlier_user_texts(),
            ["REMEMBER:walrus", "FAIL:429"]
        );
    }

    #[test]
    fn a_trailing_tool_result_is_the_last_item() {
        let body = json!({"messages":[
            {"role":"user","content":"RUN:echo hi"},
            {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"echo hi"}}]},
            {"role":"user","content":[
                {"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"hi\n"}],"is_error":false},
                {"type":"text","text":"<system-reminder>x</system-reminder>"}]}
        ]});
        let conversation = Anthropic.conversation(&body);
        assert_eq!(conversation.latest_user_text(), "RUN:echo hi");
        assert_eq!(conversation.tool_result.as_deref(), Some("hi\n"));

        let string_result = json!({"messages":[{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"t1","content":"plain"}]}]});
        assert_eq!(
            Anthropic
                .conversation(&string_result)
                .tool_result
                .as_deref(),
            Some("plain")
        );
    }

    #[test]
    fn picks_bash_and_builds_its_input() {
        let tool = pick_shell_tool(Anthropic.tools(&turn2())).expect("Bash offered");
        assert_eq!(tool.name, "Bash");
        assert_eq!(shell_args(&tool.schema, "ls"), json!({"command":"ls"}));
    }

    fn events(reply: &Reply) -> Vec<(String, Value)> {
        let body = turn2();
        let turn = Turn {
            body: &body,
            model: "claude-x".into(),
            stream: true,
            usage: Usage::estimate(400, "x"),
        };
        let rendered = Anthropic.render(reply, &turn);
        assert_eq!(rendered.content_type, "text/event-stream");
        sse::parse(&rendered.body)
            .into_iter()
            .map(|e| {
                let data = e.json();
                assert_eq!(Some(data["type"].as_str().unwrap()), e.name.as_deref());
                (e.name.unwrap(), data)
            })
            .collect()
    }

    #[test]
    fn streams_thinking_then_text() {
        let reply = Reply::Text {
            text: "Hello from stub-model.".into(),
            think: true,
        };
        let events = events(&reply);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        assert_eq!(events[0].1["message"]["model"], "claude-x");
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 100);

        let starts: Vec<&Value> = events
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| &d["content_block"]["type"])
            .collect();
        assert_eq!(starts, [&json!("thinking"), &json!("text")]);
        let text: String = events
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .map(|(_, d)| {
                assert_eq!(d["index"], 1);
                d["delta"]["text"].as_str().unwrap()
            })
            .collect();
        assert_eq!(text, "Hello from stub-model.");
        assert!(events
            .iter()
            .any(|(_, d)| d["delta"]["type"] == "signature_delta"));
        let stops = names.iter().filter(|n| **n == "content_block_stop").count();
        assert_eq!(stops, 2);
        let delta = &events[events.len() - 2].1;
        assert_eq!(delta["type"], "message_delta");
        assert_eq!(delta["delta"]["stop_reason"], "end_turn");
        assert_eq!(delta["usage"]["output_tokens"], 1);
    }

    #[test]
    fn streams_tool_use_as_input_json_delta() {
        let reply = Reply::ToolCall(ToolCall {
            id: "toolu_1".into(),
            name: "Bash".into(),
            kind: ToolKind::Function,
            args: json!({"command":"ls"}),
        });
        let events = events(&reply);
        let start = events
            .iter()
            .find(|(n, _)| n == "content_block_start")
            .unwrap();
        assert_eq!(
            start.1["content_block"],
            json!({"type":"tool_use","id":"toolu_1","name":"Bash","input":{}})
        );
        let partial = events
            .iter()
            .find(|(_, d)| d["delta"]["type"] == "input_json_delta")
            .unwrap();
        let input: Value =
            serde_json::from_str(partial.1["delta"]["partial_json"].as_str().unwrap()).unwrap();
        assert_eq!(input, json!({"command":"ls"}));
        let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
        assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn renders_a_whole_message_when_not_streaming() {
        let body = json!({});
        let turn = Turn {
            body: &body,
            model: "m".into(),
            stream: false,
            usage: Usage::estimate(8, "hi"),
        };
        let reply = Reply::Text {
            text: "hi".into(),
            think: false,
        };
        let rendered = Anthropic.render(&reply, &turn);
        assert_eq!(rendered.content_type, "application/json");
        let message: Value = serde_json::from_str(&rendered.body).unwrap();
        assert_eq!(message["content"], json!([{"type":"text","text":"hi"}]));
        assert_eq!(message["stop_reason"], "end_turn");
        assert_eq!(message["usage"]["input_tokens"], 2);
    }

    #[test]
    fn errors_use_anthropic_types() {
        let body = Anthropic.error_body(429, "slow down");
        assert_eq!(
            body,
            json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})
        );
        assert_eq!(
            Anthropic.error_body(401, "x")["error"]["type"],
            "authentication_error"
        );
        assert_eq!(
            Anthropic.error_body(529, "x")["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(Anthropic.error_body(500, "x")["error"]["type"], "api_error");
    }
}
