//! OpenAI chat completions (opencode): reading `POST /v1/chat/completions` bodies and writing
//! `chat.completion.chunk` SSE (or one `chat.completion` when `stream` is false).

use serde_json::{json, Value};

use crate::conversation::{content_text, Conversation, Item, Tool, ToolKind};
use crate::protocol::{chunks, new_id, unix_secs, Protocol, Rendered, Reply, Turn};
use crate::responses::openai_error;
use crate::sse;

#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

impl Protocol for Chat {
    fn conversation(&self, body: &Value) -> Conversation {
        let messages = body.get("messages").and_then(Value::as_array);
        Conversation::from_items(messages.into_iter().flatten().filter_map(|message| {
            let content = || content_text(message.get("content").unwrap_or(&Value::Null));
            match message.get("role")?.as_str()? {
                "user" => Some(Item::User(content())),
                "tool" => Some(Item::ToolResult(content())),
                "assistant" => Some(Item::Assistant),
                _ => None,
            }
        }))
    }

    fn tools(&self, body: &Value) -> Vec<Tool> {
        let tools = body.get("tools").and_then(Value::as_array);
        tools
            .into_iter()
            .flatten()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                Some(Tool {
                    name: function.get("name")?.as_str()?.to_string(),
                    schema: function.get("parameters").cloned().unwrap_or(json!({})),
                    kind: ToolKind::Function,
                })
            })
            .collect()
    }

    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        let format = body.get("response_format")?;
        (format.get("type")? == "json_schema").then_some(format.pointer("/json_schema/schema")?)
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        openai_error(status, message)
    }

    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered {
        let id = new_id("chatcmpl");
        let created = unix_secs();
        let usage = json!({
            "prompt_tokens": turn.usage.input_tokens,
            "completion_tokens": turn.usage.output_tokens,
            "total_tokens": turn.usage.total(),
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        });
        let finish_reason = match reply {
            Reply::Text { .. } => "stop",
            Reply::ToolCall(_) => "tool_calls",
        };
        if !turn.stream {
            let message = match reply {
                Reply::Text { text, .. } => json!({"role":"assistant","content":text}),
                Reply::ToolCall(call) => json!({"role":"assistant","content":null,"tool_calls":[{
                    "id":call.id,"type":"function",
                    "function":{"name":call.name,"arguments":call.args.to_string()}}]}),
            };
            return Rendered::json(&json!({
                "id": id, "object": "chat.completion", "created": created, "model": turn.model,
                "choices": [{"index":0,"message":message,"finish_reason":finish_reason}],
                "usage": usage,
            }));
        }

        let chunk = |choices: Value| {
            json!({"id":id,"object":"chat.completion.chunk","created":created,
                "model":turn.model,"choices":choices})
        };
        let delta = |delta: Value, finish: Value| {
            chunk(json!([{"index":0,"delta":delta,"finish_reason":finish}]))
        };
        let mut deltas = Vec::new();
        match reply {
            Reply::Text { text, .. } => {
                deltas.push(json!({"role":"assistant","content":""}));
                deltas.extend(chunks(text).into_iter().map(|c| json!({"content":c})));
            }
            Reply::ToolCall(call) => {
                deltas.push(
                    json!({"role":"assistant","tool_calls":[{"index":0,"id":call.id,
                    "type":"function","function":{"name":call.name,"arguments":""}}]}),
                );
                deltas.push(json!({"tool_calls":[{"index":0,
                    "function":{"arguments":call.args.to_string()}}]}));
            }
        }
        let mut out: String = deltas
            .into_iter()
            .map(|d| sse::event(None, &delta(d, Value::Null)))
            .collect();
        out.push_str(&sse::event(None, &delta(json!({}), json!(finish_reason))));
        let include_usage = turn
            .body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if include_usage {
            let mut last = chunk(json!([]));
            last["usage"] = usage;
            out.push_str(&sse::event(None, &last));
        }
        out.push_str("data: [DONE]\n\n");
        Rendered::sse(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{pick_shell_tool, shell_args, ToolCall, Usage};

    fn turn2() -> Value {
        json!({
            "model": "stub",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role":"system","content":"You are opencode."},
                {"role":"user","content":[{"type":"text","text":"REMEMBER:heron"}]},
                {"role":"assistant","content":"Noted: heron."},
                {"role":"user","content":"RUN:echo hi"},
                {"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",
                    "function":{"name":"bash","arguments":"{\"command\":\"echo hi\"}"}}]},
                {"role":"tool","tool_call_id":"call_1","content":"hi\n"}
            ],
            "tools": [
                {"type":"function","function":{"name":"read","parameters":{"type":"object",
                    "properties":{"filePath":{"type":"string"}},"required":["filePath"]}}},
                {"type":"function","function":{"name":"bash","description":"Runs a command",
                    "parameters":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
                    "properties":{"command":{"type":"string"},"timeout":{"type":"number"},
                    "workdir":{"type":"string"},"description":{"type":"string"}},
                    "required":["command","description"],"additionalProperties":false}}}
            ]
        })
    }

    #[test]
    fn a_trailing_tool_message_is_a_tool_result() {
        let conversation = Chat.conversation(&turn2());
        assert_eq!(conversation.latest_user_text(), "RUN:echo hi");
        assert_eq!(conversation.earlier_user_texts(), ["REMEMBER:heron"]);
        assert_eq!(conversation.tool_result.as_deref(), Some("hi\n"));
    }

    #[test]
    fn a_new_user_message_ends_the_tool_result() {
        let mut body = turn2();
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(json!({"role":"assistant","content":"Tool said: hi"}));
        messages.push(json!({"role":"user","content":[{"type":"text","text":"RECALL"}]}));
        let conversation = Chat.conversation(&body);
        assert_eq!(conversation.latest_user_text(), "RECALL");
        assert_eq!(
            conversation.earlier_user_texts(),
            ["REMEMBER:heron", "RUN:echo hi"]
        );
        assert_eq!(conversation.tool_result, None);
    }

    #[test]
    fn picks_bash_and_fills_the_required_description() {
        let tool = pick_shell_tool(Chat.tools(&turn2())).expect("bash offered");
        assert_eq!(tool.name, "bash");
        assert_eq!(
            shell_args(&tool.schema, "ls"),
            json!({"command":"ls","description":"stub tool call"})
        );
    }

    fn chunks_of(reply: &Reply, body: &Value) -> Vec<sse::Event> {
        let turn = Turn {
            body,
            model: "stub".into(),
            stream: true,
            usage: Usage::estimate(400, "Hello from stub-model."),
        };
        let rendered = Chat.render(reply, &turn);
        assert_eq!(rendered.content_type, "text/event-stream");
        let events = sse::parse(&rendered.body);
        assert!(events.iter().all(|e| e.name.is_none()));
        assert_eq!(events.last().unwrap().data, "[DONE]");
        events
    }

    #[test]
    fn streams_content_then_finish_then_usage() {
        let reply = Reply::Text {
            text: "Hello from stub-model.".into(),
            think: false,
        };
        let events = chunks_of(&reply, &turn2());
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(sse::Event::json)
            .collect();
        assert!(chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello from stub-model.");
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 100);
        assert_eq!(usage["usage"]["completion_tokens"], 6);
        assert_eq!(usage["usage"]["total_tokens"], 106);

        let without_usage = chunks_of(&reply, &json!({}));
        assert!(without_usage.iter().all(|e| e.json()["usage"].is_null()));
    }

    #[test]
    fn streams_tool_calls() {
        let reply = Reply::ToolCall(ToolCall {
            id: "call_9".into(),
            name: "bash".into(),
            kind: ToolKind::Function,
            args: json!({"command":"ls","description":"stub tool call"}),
        });
        let events = chunks_of(&reply, &turn2());
        let calls: Vec<Value> = events
            .iter()
            .filter_map(|e| {
                let calls = e.json()["choices"][0]["delta"]["tool_calls"].clone();
                (!calls.is_null()).then_some(calls)
            })
            .collect();
        assert_eq!(calls[0][0]["id"], "call_9");
        assert_eq!(calls[0][0]["function"]["name"], "bash");
        let arguments: String = calls
            .iter()
            .map(|c| c[0]["function"]["arguments"].as_str().unwrap())
            .collect();
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(args["command"], "ls");
        let finish = events.iter().find_map(|e| {
            e.json()["choices"][0]["finish_reason"]
                .as_str()
                .map(String::from)
        });
        assert_eq!(finish.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn renders_one_completion_when_not_streaming() {
        let body = json!({});
        let turn = Turn {
            body: &body,
            model: "stub".into(),
            stream: false,
            usage: Usage::estimate(40, "hi"),
        };
        let reply = Reply::Text {
            text: "hi".into(),
            think: false,
        };
        let rendered = Chat.render(&reply, &turn);
        let completion: Value = serde_json::from_str(&rendered.body).unwrap();
        assert_eq!(completion["object"], "chat.completion");
        assert_eq!(completion["choices"][0]["message"]["content"], "hi");
        assert_eq!(completion["usage"]["prompt_tokens"], 10);
    }
}
