//! OpenAI Responses API (codex): reading `POST /v1/responses` bodies and writing the
//! Responses SSE stream. Also home of the OpenAI error shape, which chat completions share.

use serde_json::{json, Value};

use crate::conversation::{content_text, Conversation, Item, Tool, ToolKind};
use crate::protocol::{chunks, new_id, unix_secs, Protocol, Rendered, Reply, Turn};
use crate::sse;

#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

impl Protocol for Responses {
    fn conversation(&self, body: &Value) -> Conversation {
        match body.get("input") {
            Some(Value::String(text)) => Conversation::from_items([Item::User(text.clone())]),
            Some(Value::Array(items)) => {
                Conversation::from_items(items.iter().filter_map(input_item))
            }
            _ => Conversation::default(),
        }
    }

    fn tools(&self, body: &Value) -> Vec<Tool> {
        let tools = body.get("tools").and_then(Value::as_array);
        let top_level =
            tools
                .into_iter()
                .flatten()
                .filter_map(|tool| match tool.get("type")?.as_str()? {
                    "function" => function_tool(tool),
                    "local_shell" => Some(Tool {
                        name: "local_shell".into(),
                        schema: json!({"properties":{"command":{"type":"array"}}}),
                        kind: ToolKind::LocalShell,
                    }),
                    "tool_search" if tool.get("execution")? == "client" => Some(Tool {
                        name: "tool_search".into(),
                        schema: tool.get("parameters").cloned().unwrap_or(json!({})),
                        kind: ToolKind::ToolSearch,
                    }),
                    _ => None,
                });
        let loaded = loaded_functions(body).filter_map(|(namespace, tool)| {
            let mut found = function_tool(tool)?;
            if let Some(namespace) = namespace {
                found.name = namespaced_name(namespace, &found.name);
            }
            Some(found)
        });
        top_level.chain(loaded).collect()
    }

    fn output_schema<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        let format = body.pointer("/text/format")?;
        (format.get("type")? == "json_schema").then_some(format.get("schema")?)
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        openai_error(status, message)
    }

    fn render(&self, reply: &Reply, turn: &Turn) -> Rendered {
        let item = output_item(reply, turn.body);
        let usage = json!({
            "input_tokens": turn.usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": turn.usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.usage.total(),
        });
        let response = |status: &str, output: Value, usage: Value| {
            json!({
                "id": new_id("resp"), "object": "response", "created_at": unix_secs(),
                "status": status, "model": turn.model, "output": output, "usage": usage,
            })
        };
        if !turn.stream {
            return Rendered::json(&response("completed", json!([item]), usage));
        }

        let mut out = String::new();
        let mut sequence = 0;
        let mut emit = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(sequence);
            sequence += 1;
            out.push_str(&sse::event(Some(kind), &data));
        };
        let started = response("in_progress", json!([]), Value::Null);
        emit("response.created", json!({"response": started}));
        emit("response.in_progress", json!({"response": started}));
        emit(
            "response.output_item.added",
            json!({"output_index":0,"item":in_progress(&item)}),
        );
        let item_id = item["id"].clone();
        match item["type"].as_str() {
            Some("message") => {
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                for delta in chunks(text) {
                    emit(
                        "response.output_text.delta",
                        json!({"item_id":item_id,"output_index":0,"content_index":0,"delta":delta}),
                    );
                }
                emit(
                    "response.output_text.done",
                    json!({"item_id":item_id,"output_index":0,"content_index":0,"text":text}),
                );
            }
            Some("function_call") => {
                let arguments = item["arguments"].clone();
                emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id":item_id,"output_index":0,"delta":arguments}),
                );
                emit(
                    "response.function_call_arguments.done",
                    json!({"item_id":item_id,"output_index":0,"arguments":arguments}),
                );
            }
            _ => {}
        }
        emit(
            "response.output_item.done",
            json!({"output_index":0,"item":item}),
        );
        let mut completed = response("completed", json!([item]), usage);
        completed["id"] = started["id"].clone();
        emit("response.completed", json!({ "response": completed }));
        Rendered::sse(out)
    }
}

/// A `{"type":"function"}` tool.
fn function_tool(tool: &Value) -> Option<Tool> {
    (tool.get("type")? == "function").then_some(())?;
    Some(Tool {
        name: tool.get("name")?.as_str()?.to_string(),
        schema: tool.get("parameters").cloned().unwrap_or(json!({})),
        kind: ToolKind::Function,
    })
}

/// Function tools beyond the top-level ones, with their namespace when they have one: the
/// functions of offered namespaces, and the tools a tool search loaded (`tool_search_output`
/// items in the input: namespaces or plain functions).
fn loaded_functions(body: &Value) -> impl Iterator<Item = (Option<&str>, &Value)> {
    let offered = body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let input = body
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let searched = input
        .filter(|item| item.get("type").and_then(Value::as_str) == Some("tool_search_output"))
        .filter_map(|item| item.get("tools").and_then(Value::as_array))
        .flatten();
    let offered_namespaces =
        offered.filter(|t| t.get("type").and_then(Value::as_str) == Some("namespace"));
    offered_namespaces.chain(searched).flat_map(|tool| {
        match tool.get("type").and_then(Value::as_str) {
            Some("namespace") => {
                let namespace = tool.get("name").and_then(Value::as_str);
                let members = tool.get("tools").and_then(Value::as_array);
                members
                    .into_iter()
                    .flatten()
                    .map(|member| (namespace, member))
                    .collect()
            }
            Some("function") => vec![(None, tool)],
            _ => Vec::new(),
        }
    })
}

/// The name the stub knows a namespaced function by: `mcp__srv` + `echo` → `mcp__srv__echo`
/// (the MCP convention, so `CALL:echo` finds it).
fn namespaced_name(namespace: &str, name: &str) -> String {
    if namespace.ends_with('_') {
        format!("{namespace}{name}")
    } else {
        format!("{namespace}__{name}")
    }
}

/// The namespace and plain name of a called function, when the request offers it inside a
/// namespace.
fn split_namespaced<'a>(body: &'a Value, called: &str) -> Option<(&'a str, &'a str)> {
    loaded_functions(body).find_map(|(namespace, tool)| {
        let namespace = namespace?;
        let name = tool.get("name")?.as_str()?;
        (namespaced_name(namespace, name) == called).then_some((namespace, name))
    })
}

/// The OpenAI error document (Responses and chat completions alike).
pub fn openai_error(status: u16, message: &str) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", "invalid_api_key"),
        403 => ("invalid_request_error", "permission_denied"),
        404 => ("invalid_request_error", "not_found"),
        429 => ("requests", "rate_limit_exceeded"),
        503 | 529 => ("server_error", "server_is_overloaded"),
        500..=599 => ("server_error", "server_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    json!({"error":{"message":message,"type":kind,"param":null,"code":code}})
}

fn input_item(item: &Value) -> Option<Item> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => match item.get("role")?.as_str()? {
            "user" => Some(Item::User(content_text(
                item.get("content").unwrap_or(&Value::Null),
            ))),
            "assistant" => Some(Item::Assistant),
            _ => None,
        },
        "function_call" | "custom_tool_call" | "local_shell_call" | "web_search_call"
        | "tool_search_call" => Some(Item::Assistant),
        "tool_search_output" => Some(Item::ToolSearchResult),
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => Some(
            Item::ToolResult(output_text(item.get("output").unwrap_or(&Value::Null))),
        ),
        _ => None,
    }
}

/// A tool output: a string, content items, or an object holding one of those.
fn output_text(output: &Value) -> String {
    match output {
        Value::String(text) => text.clone(),
        Value::Array(_) => content_text(output),
        Value::Object(fields) => fields
            .get("content")
            .or_else(|| fields.get("output"))
            .map_or_else(|| output.to_string(), output_text),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The finished output item of a reply.
fn output_item(reply: &Reply, body: &Value) -> Value {
    match reply {
        Reply::Text { text, .. } => json!({
            "type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
            "content": [{"type":"output_text","text":text,"annotations":[]}],
        }),
        Reply::ToolCall(call) if call.kind == ToolKind::LocalShell => json!({
            "type": "local_shell_call", "id": new_id("lsh"), "call_id": call.id,
            "status": "completed",
            "action": {"type":"exec","command":call.args["command"],"timeout_ms":null,
                "working_directory":null,"env":null,"user":null},
        }),
        Reply::ToolCall(call) if call.kind == ToolKind::ToolSearch => json!({
            "type": "tool_search_call", "id": new_id("tsc"), "call_id": call.id,
            "status": "completed", "execution": "client", "arguments": call.args,
        }),
        Reply::ToolCall(call) => {
            let mut item = json!({
                "type": "function_call", "id": new_id("fc"), "status": "completed",
                "call_id": call.id, "name": call.name, "arguments": call.args.to_string(),
            });
            if let Some((namespace, name)) = split_namespaced(body, &call.name) {
                item["namespace"] = json!(namespace);
                item["name"] = json!(name);
            }
            item
        }
    }
}

/// The item as `response.output_item.added` shows it, before its content streams.
fn in_progress(item: &Value) -> Value {
    let mut item = item.clone();
    item["status"] = json!("in_progress");
    match item["type"].as_str() {
        Some("message") => item["content"] = json!([]),
        Some("function_call") => item["arguments"] = json!(""),
        _ => {}
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{pick_shell_tool, shell_args, ToolCall, Usage};

    fn turn2() -> Value {
        json!({
            "model": "gpt-5.5",
            "instructions": "You are Codex.",
            "stream": true,
            "store": false,
            "input": [
                {"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions instructions>sandbox</permissions instructions>"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"# AGENTS.md instructions for /workspace\n\nbe nice"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>\n  <cwd>/workspace</cwd>\n  <shell>bash</shell>\n</environment_context>"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"REMEMBER:otter"}]},
                {"type":"reasoning","summary":[],"encrypted_content":null},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Noted: otter."}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>\n  <cwd>/workspace</cwd>\n</environment_context>"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"RECALL"}]}
            ],
            "tools": [
                {"type":"function","name":"exec_command","description":"Runs a command","strict":false,
                 "parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"},
                 "yield_time_ms":{"type":"number"}},"required":["cmd"],"additionalProperties":false}},
                {"type":"custom","name":"apply_patch","format":{"type":"grammar"}},
                {"type":"function","name":"update_plan","parameters":{"type":"object","properties":{}}}
            ],
            "parallel_tool_calls": false
        })
    }

    #[test]
    fn extracts_user_texts_past_codex_context_messages() {
        let conversation = Responses.conversation(&turn2());
        assert_eq!(conversation.latest_user_text(), "RECALL");
        assert_eq!(conversation.earlier_user_texts(), ["REMEMBER:otter"]);
        assert_eq!(conversation.tool_result, None);
    }

    #[test]
    fn a_function_call_output_after_the_last_user_message_is_a_tool_result() {
        let mut body = turn2();
        let input = body["input"].as_array_mut().unwrap();
        input.push(json!({"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"ls\"}"}));
        input.push(json!({"type":"function_call_output","call_id":"c1","output":"Process exited with code 0\nOutput:\nfile.txt"}));
        let conversation = Responses.conversation(&body);
        assert_eq!(conversation.latest_user_text(), "RECALL");
        assert!(conversation.tool_result.unwrap().ends_with("file.txt"));

        let custom = json!({"input":[
            {"role":"user","content":"RUN:x"},
            {"type":"custom_tool_call","call_id":"c2","name":"apply_patch","input":"..."},
            {"type":"custom_tool_call_output","call_id":"c2","output":{"content":[{"type":"input_text","text":"patched"}]}}]});
        assert_eq!(
            Responses.conversation(&custom).tool_result.as_deref(),
            Some("patched")
        );
        let plain = json!({"input":"just text"});
        assert_eq!(
            Responses.conversation(&plain).latest_user_text(),
            "just text"
        );
    }

    #[test]
    fn picks_exec_command_or_local_shell() {
        let tool = pick_shell_tool(Responses.tools(&turn2())).expect("shell offered");
        assert_eq!(tool.name, "exec_command");
        assert_eq!(shell_args(&tool.schema, "ls"), json!({"cmd":"ls"}));

        let local = json!({"tools":[{"type":"local_shell"}]});
        let tool = pick_shell_tool(Responses.tools(&local)).expect("local_shell offered");
        assert_eq!(tool.kind, ToolKind::LocalShell);
        assert_eq!(
            shell_args(&tool.schema, "ls"),
            json!({"command":["bash","-lc","ls"]})
        );
    }

    fn events(reply: &Reply) -> Vec<Value> {
        let body = turn2();
        let turn = Turn {
            body: &body,
            model: "gpt-5.5".into(),
            stream: true,
            usage: Usage::estimate(400, "Hello from stub-model."),
        };
        let rendered = Responses.render(reply, &turn);
        assert_eq!(rendered.content_type, "text/event-stream");
        sse::parse(&rendered.body)
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let data = e.json();
                assert_eq!(Some(data["type"].as_str().unwrap()), e.name.as_deref());
                assert_eq!(data["sequence_number"], i);
                data
            })
            .collect()
    }

    fn kinds(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn streams_a_message_and_completes_with_usage() {
        let events = events(&Reply::Text {
            text: "Hello from stub-model.".into(),
            think: true,
        });
        let kinds = kinds(&events);
        assert_eq!(kinds[0], "response.created");
        assert_eq!(kinds[kinds.len() - 1], "response.completed");
        let done = events
            .iter()
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap();
        assert_eq!(done["item"]["type"], "message");
        assert_eq!(
            done["item"]["content"][0],
            json!({"type":"output_text","text":"Hello from stub-model.","annotations":[]})
        );
        let streamed: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, "Hello from stub-model.");
        let completed = &events[events.len() - 1]["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["id"], events[0]["response"]["id"]);
        assert_eq!(
            completed["usage"],
            json!({"input_tokens":100,"input_tokens_details":{"cached_tokens":0},
                "output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":106})
        );
    }

    #[test]
    fn streams_a_function_call_with_string_arguments() {
        let events = events(&Reply::ToolCall(ToolCall {
            id: "call_1".into(),
            name: "shell".into(),
            kind: ToolKind::Function,
            args: json!({"command":["bash","-lc","ls"]}),
        }));
        let done = events
            .iter()
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap();
        let item = &done["item"];
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["call_id"], "call_1");
        assert_eq!(item["name"], "shell");
        let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"command":["bash","-lc","ls"]}));
        assert!(kinds(&events).contains(&"response.function_call_arguments.delta"));
        assert_eq!(events.last().unwrap()["type"], "response.completed");
    }

    #[test]
    fn local_shell_calls_carry_an_exec_action() {
        let item = output_item(
            &Reply::ToolCall(ToolCall {
                id: "call_2".into(),
                name: "local_shell".into(),
                kind: ToolKind::LocalShell,
                args: json!({"command":["bash","-lc","ls"]}),
            }),
            &Value::Null,
        );
        assert_eq!(item["type"], "local_shell_call");
        assert_eq!(item["action"]["command"], json!(["bash", "-lc", "ls"]));
    }

    #[test]
    fn offers_client_tool_search_and_namespaced_functions() {
        let ns = |name: &str| {
            json!({"type":"namespace","name":name,"description":"d","tools":[
                {"type":"function","name":"echo","parameters":{"type":"object"}}]})
        };
        let body = json!({
            "tools": [{"type":"tool_search","execution":"client","parameters":{"type":"object"}},
                {"type":"tool_search"}, ns("crm")],
            "input": [{"type":"tool_search_output","call_id":"c","execution":"client",
                "tools":[ns("mcp__caw__"),
                    {"type":"function","name":"plain","parameters":{"type":"object"}}]}]
        });
        let tools = Responses.tools(&body);
        let names: Vec<_> = tools.iter().map(|t| (t.name.as_str(), t.kind)).collect();
        assert_eq!(
            names,
            [
                ("tool_search", ToolKind::ToolSearch),
                ("crm__echo", ToolKind::Function),
                ("mcp__caw__echo", ToolKind::Function),
                ("plain", ToolKind::Function),
            ]
        );
        let call = |name: &str| {
            output_item(
                &Reply::ToolCall(ToolCall {
                    id: "call_3".into(),
                    name: name.into(),
                    kind: ToolKind::Function,
                    args: json!({"text":"x"}),
                }),
                &body,
            )
        };
        let item = call("mcp__caw__echo");
        assert_eq!(
            (&item["namespace"], &item["name"]),
            (&json!("mcp__caw__"), &json!("echo"))
        );
        let item = call("plain");
        assert_eq!(
            (item.get("namespace"), &item["name"]),
            (None, &json!("plain"))
        );
    }

    #[test]
    fn a_tool_search_call_carries_its_arguments_as_an_object() {
        let item = output_item(
            &Reply::ToolCall(ToolCall {
                id: "call_4".into(),
                name: "tool_search".into(),
                kind: ToolKind::ToolSearch,
                args: json!({"query":"echo"}),
            }),
            &Value::Null,
        );
        assert_eq!(item["type"], "tool_search_call");
        assert_eq!(item["call_id"], "call_4");
        assert_eq!(item["execution"], "client");
        assert_eq!(item["arguments"], json!({"query":"echo"}));
        let body = json!({"input":[{"role":"user","content":"CALL:echo x"}, item,
            {"type":"tool_search_output","call_id":"call_4","tools":[]}]});
        let conversation = Responses.conversation(&body);
        assert!(conversation.searched);
        assert_eq!(conversation.tool_result, None);
    }

    #[test]
    fn errors_use_the_openai_shape() {
        let body = openai_error(429, "slow down");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["message"], "slow down");
        assert_eq!(openai_error(401, "x")["error"]["code"], "invalid_api_key");
        assert_eq!(openai_error(500, "x")["error"]["type"], "server_error");
    }

    #[test]
    fn reads_a_json_schema_output_format() {
        let body =
            json!({"text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object"}}}});
        assert_eq!(
            Responses.output_schema(&body),
            Some(&json!({"type":"object"}))
        );
        assert_eq!(Responses.output_schema(&turn2()), None);
    }
}
