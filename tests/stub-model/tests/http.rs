//! The stub over real HTTP on 127.0.0.1: one exchange per protocol, the key check, FAIL,
//! malformed input, the request log, and the binary itself (PORT, stdout records, SIGTERM).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stub_model::{serve, sse, Config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "sk-stub-test";

async fn start(expect_key: Option<&str>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = Config {
        expect_key: expect_key.map(str::to_string),
        echo: false,
        ..Default::default()
    };
    tokio::spawn(serve(listener, config));
    addr
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }

    fn events(&self) -> Vec<sse::Event> {
        assert_eq!(self.status, 200, "body: {}", self.body);
        assert_eq!(self.header("content-type"), Some("text/event-stream"));
        sse::parse(&self.body)
    }
}

/// Sends one raw HTTP/1.1 request and reads the whole response.
async fn send(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_lowercase(), v.to_string()))
        .collect();
    Reply {
        status: status.parse().unwrap(),
        headers,
        body: body.to_string(),
    }
}

async fn post(addr: SocketAddr, target: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(addr, "POST", target, &all, &body.to_string()).await
}

/// The binary on a free port with `envs`; killed when the child is dropped.
async fn binary(envs: &[(&str, &str)], stdout: Stdio) -> (tokio::process::Child, SocketAddr) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stub-model"))
        .env("PORT", "0")
        .envs(envs.iter().copied())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let banner = stderr.next_line().await.unwrap().unwrap();
    let port: u16 = banner
        .split("0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {banner:?}"));
    // Read on: a closed stderr would fail the stub's last message (on SIGTERM).
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    (child, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn anthropic_body(text: &str) -> Value {
    json!({"model":"claude-sonnet-4-5","stream":true,"max_tokens":1000,
        "messages":[{"role":"user","content":[{"type":"text","text":text}]}],
        "tools":[{"name":"Bash","input_schema":{"type":"object",
            "properties":{"command":{"type":"string"}},"required":["command"]}}]})
}

#[tokio::test]
async fn anthropic_messages_stream_and_probe() {
    let addr = start(Some(KEY)).await;
    let head = send(addr, "HEAD", "/", &[], "").await;
    assert_eq!(head.status, 200);

    let reply = post(
        addr,
        "/v1/messages?beta=true",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        &anthropic_body("THINK hello there"),
    )
    .await;
    let events = reply.events();
    let names: Vec<&str> = events.iter().filter_map(|e| e.name.as_deref()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let text: String = events
        .iter()
        .map(sse::Event::json)
        .filter(|d| d["delta"]["type"] == "text_delta")
        .map(|d| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "Hello from stub-model.");
    assert!(events
        .iter()
        .any(|e| e.json()["delta"]["type"] == "thinking_delta"));

    let count = post(
        addr,
        "/v1/messages/count_tokens?beta=true",
        &[("x-api-key", KEY)],
        &json!({"model":"m","messages":[]}),
    )
    .await;
    assert_eq!(count.status, 200);
    assert!(count.json()["input_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn responses_stream_a_shell_call_then_quote_its_output() {
    let addr = start(Some(KEY)).await;
    let auth = format!("Bearer {KEY}");
    let tools = json!([{"type":"function","name":"shell","parameters":{"type":"object",
        "properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}}]);
    let mut body = json!({"model":"gpt-5.5","stream":true,"tools":tools,"input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context><cwd>/w</cwd></environment_context>"}]},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"RUN:echo hi"}]}]});
    let reply = post(addr, "/v1/responses", &[("authorization", &auth)], &body).await;
    let events: Vec<Value> = reply.events().iter().map(sse::Event::json).collect();
    assert_eq!(events[0]["type"], "response.created");
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_item.done")
        .unwrap();
    assert_eq!(done["item"]["type"], "function_call");
    assert_eq!(done["item"]["name"], "shell");
    let call_id = done["item"]["call_id"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(done["item"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["command"], json!(["bash", "-lc", "echo hi"]));
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert!(
        completed["response"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let input = body["input"].as_array_mut().unwrap();
    input.push(done["item"].clone());
    input.push(json!({"type":"function_call_output","call_id":call_id,"output":"hi\n"}));
    let reply = post(addr, "/v1/responses", &[("authorization", &auth)], &body).await;
    let events: Vec<Value> = reply.events().iter().map(sse::Event::json).collect();
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_item.done")
        .unwrap();
    assert_eq!(done["item"]["content"][0]["text"], "Tool said: hi");
}

/// codex 0.169 offers MCP tools through a client-run `tool_search` (shapes as it sent them):
/// `CALL:` searches, then calls the namespaced tool the search loaded, then quotes its output.
#[tokio::test]
async fn responses_call_searches_for_a_deferred_tool_then_calls_it() {
    let addr = start(Some(KEY)).await;
    let auth = format!("Bearer {KEY}");
    let tools = json!([{"type":"tool_search","execution":"client","description":"Tool discovery",
        "parameters":{"type":"object","properties":{"query":{"type":"string"},
        "limit":{"type":"number"}},"required":["query"],"additionalProperties":false}},
        {"type":"web_search","external_web_access":true}]);
    let mut body = json!({"model":"gpt-5.5","stream":true,"tools":tools,"input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":"CALL:echo EH-1"}]}]});
    let done = |reply: &Reply| {
        let events: Vec<Value> = reply.events().iter().map(sse::Event::json).collect();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        events
            .iter()
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap()["item"]
            .clone()
    };
    let search = done(&post(addr, "/v1/responses", &[("authorization", &auth)], &body).await);
    assert_eq!(search["type"], "tool_search_call");
    assert_eq!(search["execution"], "client");
    assert_eq!(search["arguments"], json!({"query": "echo"}));
    let call_id = search["call_id"].as_str().unwrap().to_string();

    let input = body["input"].as_array_mut().unwrap();
    input.push(search.clone());
    input.push(
        json!({"type":"tool_search_output","call_id":call_id,"execution":"client",
        "status":"completed","tools":[{"type":"namespace","name":"mcp__caw",
        "description":"Tools in the mcp__caw namespace.","tools":[{"type":"function",
        "name":"echo","defer_loading":true,"strict":false,"parameters":{"type":"object",
        "properties":{"text":{"type":"string"}},"required":["text"]}}]}]}),
    );
    let call = done(&post(addr, "/v1/responses", &[("authorization", &auth)], &body).await);
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["namespace"], "mcp__caw");
    assert_eq!(call["name"], "echo");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"text": "EH-1"}));

    let input = body["input"].as_array_mut().unwrap();
    input.push(call.clone());
    input.push(
        json!({"type":"function_call_output","call_id":call["call_id"],
        "output":[{"type":"input_text","text":"ECHO:EH-1"}]}),
    );
    let answer = done(&post(addr, "/v1/responses", &[("authorization", &auth)], &body).await);
    assert_eq!(answer["content"][0]["text"], "Tool said: ECHO:EH-1");

    // A search that found nothing is not repeated.
    let mut empty = json!({"model":"gpt-5.5","stream":true,"tools":tools,"input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":"CALL:nope x"}]},
        {"type":"tool_search_call","call_id":"c1","execution":"client","arguments":{"query":"nope"}},
        {"type":"tool_search_output","call_id":"c1","execution":"client","tools":[]}]});
    let said = done(&post(addr, "/v1/responses", &[("authorization", &auth)], &empty).await);
    assert_eq!(said["content"][0]["text"], "No tool nope offered.");
    // Without a tool search, nothing is searched.
    empty["tools"] = json!([]);
    empty["input"].as_array_mut().unwrap().truncate(1);
    let said = done(&post(addr, "/v1/responses", &[("authorization", &auth)], &empty).await);
    assert_eq!(said["content"][0]["text"], "No tool nope offered.");
}

#[tokio::test]
async fn chat_completions_stream_with_usage_and_done() {
    let addr = start(Some(KEY)).await;
    let auth = format!("Bearer {KEY}");
    let body = json!({"model":"stub","stream":true,"stream_options":{"include_usage":true},
        "messages":[{"role":"system","content":"You are opencode."},
            {"role":"user","content":[{"type":"text","text":"REMEMBER:heron"}]}]});
    let reply = post(
        addr,
        "/v1/chat/completions",
        &[("authorization", &auth)],
        &body,
    )
    .await;
    let events = reply.events();
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events.iter().map(sse::Event::json).collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Noted: heron.");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert!(chunks
        .iter()
        .any(|c| c["usage"]["completion_tokens"].as_u64() == Some(4)));
}

/// Each record holds the usage its response sent (the final one of a stream), and none when
/// the response carried none: tests price what the stub sent, not what a CLI reports.
#[tokio::test]
async fn records_hold_the_usage_each_response_sent() {
    let addr = start(Some(KEY)).await;
    let auth = format!("Bearer {KEY}");
    let chat = |include: bool| {
        json!({"model":"stub","stream":true,"stream_options":{"include_usage":include},
            "messages":[{"role":"user","content":"REMEMBER:heron"}]})
    };
    let mut sent = Vec::new();
    let reply = post(
        addr,
        "/v1/messages",
        &[("x-api-key", KEY)],
        &anthropic_body("hello"),
    )
    .await;
    let delta = reply
        .events()
        .iter()
        .map(sse::Event::json)
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    sent.push(delta["usage"].clone());
    let body = json!({"model":"gpt-5.5","stream":true,"input":[{"role":"user","content":"hi"}]});
    let reply = post(addr, "/v1/responses", &[("authorization", &auth)], &body).await;
    let done = reply
        .events()
        .iter()
        .map(sse::Event::json)
        .find(|e| e["type"] == "response.completed")
        .unwrap();
    sent.push(done["response"]["usage"].clone());
    for include in [true, false] {
        let reply = post(
            addr,
            "/v1/chat/completions",
            &[("authorization", &auth)],
            &chat(include),
        )
        .await;
        let usage = reply
            .events()
            .iter()
            .filter(|e| e.data != "[DONE]")
            .map(sse::Event::json)
            .map(|c| c["usage"].clone())
            .find(Value::is_object)
            .unwrap_or(Value::Null);
        sent.push(usage);
    }
    let body = json!({"contents":[{"role":"user","parts":[{"text":"hi"}]}]});
    let target = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
    let reply = post(addr, target, &[("x-goog-api-key", KEY)], &body).await;
    let last = reply.events().last().unwrap().json();
    sent.push(last["usageMetadata"].clone());
    let failed = post(
        addr,
        "/v1/messages",
        &[("x-api-key", KEY)],
        &anthropic_body("FAIL:500"),
    )
    .await;
    assert_eq!(failed.status, 500);
    sent.push(Value::Null);

    // Chat without `include_usage` and the error carried none.
    let carried: Vec<bool> = sent.iter().map(Value::is_object).collect();
    assert_eq!(carried, [true, true, true, false, true, false], "{sent:?}");
    assert!(sent[1]["input_tokens"].as_u64().unwrap() > 0, "{sent:?}");
    let records = send(addr, "GET", "/_stub/requests", &[], "").await.json();
    let recorded: Vec<Value> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["usage"].clone())
        .collect();
    assert_eq!(recorded, sent);
}

#[tokio::test]
async fn gemini_streams_recall_and_routes_with_json() {
    let addr = start(Some(KEY)).await;
    let body = json!({"contents":[
        {"role":"user","parts":[{"text":"REMEMBER:lynx"}]},
        {"role":"model","parts":[{"text":"Noted: lynx."}]},
        {"role":"user","parts":[{"text":"RECALL"}]}]});
    let target = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse";
    let reply = post(addr, target, &[("x-goog-api-key", KEY)], &body).await;
    let chunks: Vec<Value> = reply.events().iter().map(sse::Event::json).collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "You told me to remember lynx.");
    let last = chunks.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(last["modelVersion"], "gemini-2.5-pro");

    let router = json!({"contents":[{"role":"user","parts":[{"text":"hi"}]}],
        "generationConfig":{"responseMimeType":"application/json","responseJsonSchema":{
            "type":"object","properties":{"complexity_reasoning":{"type":"string"},
            "complexity_score":{"type":"integer"}},"required":["complexity_reasoning","complexity_score"]}}});
    let target = format!("/v1beta/models/gemini-2.5-flash-lite:generateContent?key={KEY}");
    let reply = post(addr, &target, &[], &router).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let text = reply.json()["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let routed: Value = serde_json::from_str(&text).unwrap();
    assert!(routed["complexity_score"].is_number());
    assert!(routed["complexity_reasoning"].is_string());

    let models = send(
        addr,
        "GET",
        "/v1beta/models",
        &[("x-goog-api-key", KEY)],
        "",
    )
    .await;
    assert_eq!(models.status, 200);
    assert!(models.json()["models"].is_array());
}

#[tokio::test]
async fn a_missing_or_wrong_key_gets_401_in_each_vendor_shape() {
    let addr = start(Some(KEY)).await;
    let hello = anthropic_body("hi");
    let anthropic = post(addr, "/v1/messages", &[("x-api-key", "wrong")], &hello).await;
    assert_eq!(anthropic.status, 401);
    assert_eq!(anthropic.json()["error"]["type"], "authentication_error");

    let openai = post(addr, "/v1/responses", &[], &json!({"input":"hi"})).await;
    assert_eq!(openai.status, 401);
    assert_eq!(openai.json()["error"]["code"], "invalid_api_key");

    let chat = post(addr, "/v1/chat/completions", &[], &json!({"messages":[]})).await;
    assert_eq!(chat.status, 401);
    assert_eq!(chat.json()["error"]["code"], "invalid_api_key");

    let target = "/v1beta/models/m:streamGenerateContent?alt=sse";
    let gemini = post(addr, target, &[], &json!({"contents":[]})).await;
    assert_eq!(gemini.status, 401);
    assert_eq!(gemini.json()["error"]["status"], "UNAUTHENTICATED");

    // The probe needs no key.
    assert_eq!(send(addr, "GET", "/", &[], "").await.status, 200);
}

#[tokio::test]
async fn fail_429_uses_the_vendor_error_and_retry_after() {
    let addr = start(None).await;
    let reply = post(addr, "/v1/messages", &[], &anthropic_body("FAIL:429")).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("0"));
    assert_eq!(
        reply.json(),
        json!({"type":"error","error":{"type":"rate_limit_error",
            "message":"stub-model failed this request on purpose (FAIL:429)"}})
    );

    let chat = json!({"messages":[{"role":"user","content":"please FAIL:529 now"}]});
    let reply = post(addr, "/v1/chat/completions", &[], &chat).await;
    assert_eq!(reply.status, 529);
    assert_eq!(reply.json()["error"]["type"], "server_error");
}

#[tokio::test]
async fn sleep_delays_the_response() {
    let addr = start(None).await;
    let started = Instant::now();
    let reply = post(addr, "/v1/messages", &[], &anthropic_body("SLEEP:0.3 hi")).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn hold_answers_once_released_and_says_what_it_holds() {
    let addr = start(None).await;
    let body =
        json!({"model":"m","messages":[{"role":"user","content":"HOLD:turn1 REMEMBER:fig"}]});
    let held = tokio::spawn(async move { post(addr, "/v1/chat/completions", &[], &body).await });
    // The test waits until the request is held (a long poll), not a fixed time.
    let status = send(addr, "GET", "/_stub/holds/turn1?wait=30", &[], "").await;
    assert_eq!(
        status.json(),
        json!({"name":"turn1","waiting":1,"released":false})
    );
    let all = send(addr, "GET", "/_stub/holds", &[], "").await.json();
    assert_eq!(all, json!({"waiting":{"turn1":1},"released":[]}));
    // Recorded while held: the record tells a test the request came.
    let records = send(addr, "GET", "/_stub/requests", &[], "").await.json();
    assert_eq!(records[0]["directive"], "remember:fig+hold:turn1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!held.is_finished(), "answered before its release");

    let released = send(addr, "POST", "/_stub/release/turn1", &[], "").await;
    assert_eq!(released.json(), json!({"released":"turn1","waiting":1}));
    let reply = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("answered once released")
        .unwrap();
    assert_eq!(
        reply.json()["choices"][0]["message"]["content"],
        "Noted: fig."
    );
    let status = send(addr, "GET", "/_stub/holds/turn1", &[], "").await;
    assert_eq!(
        status.json(),
        json!({"name":"turn1","waiting":0,"released":true})
    );
}

#[tokio::test]
async fn a_release_before_the_request_lets_it_through() {
    let addr = start(None).await;
    let released = send(addr, "POST", "/_stub/release/early", &[], "").await;
    assert_eq!(released.json(), json!({"released":"early","waiting":0}));
    let body = anthropic_body("HOLD:early hi");
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        post(addr, "/v1/messages", &[], &body),
    )
    .await
    .expect("not held");
    assert_eq!(reply.status, 200);
    // Not yet there: a bounded wait says how many are held (none).
    let started = Instant::now();
    let none = send(addr, "GET", "/_stub/holds/later?wait=0.2", &[], "").await;
    assert_eq!(none.json()["waiting"], 0);
    assert!(started.elapsed() >= Duration::from_millis(200));
    let odd = send(addr, "GET", "/_stub/holds/later?wait=NaN&min=x", &[], "").await;
    assert_eq!(odd.json()["waiting"], 0);
    assert_eq!(
        send(addr, "GET", "/_stub/release/x", &[], "").await.status,
        404
    );
    assert_eq!(
        send(addr, "POST", "/_stub/release/a%20b", &[], "")
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn a_held_request_whose_client_left_is_no_longer_held() {
    let addr = start(None).await;
    let body = anthropic_body("HOLD:gone hi").to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let status = send(addr, "GET", "/_stub/holds/gone?wait=30", &[], "").await;
    assert_eq!(status.json()["waiting"], 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all = send(addr, "GET", "/_stub/holds", &[], "").await.json();
        if all["waiting"] == json!({}) {
            break;
        }
        assert!(Instant::now() < deadline, "still held: {all}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn malformed_and_unknown_requests_are_answered_and_recorded() {
    let addr = start(Some(KEY)).await;
    let bad = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {KEY}"))],
        "{not json",
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not JSON"));

    let unknown = send(addr, "POST", "/v2/whatever?x=1", &[], "{}").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "not_found");

    let health = send(addr, "GET", "/_stub/health", &[], "").await;
    assert_eq!((health.status, health.body.trim()), (200, "ok"));

    let records = send(addr, "GET", "/_stub/requests", &[], "").await.json();
    let records = records.as_array().unwrap();
    assert_eq!(
        records.len(),
        2,
        "the stub's own endpoints are not recorded"
    );
    assert_eq!(records[0]["stub"], "request");
    assert_eq!(records[0]["path"], "/v1/chat/completions");
    assert_eq!(records[0]["status"], 400);
    assert_eq!(records[0]["directive"], "bad_json");
    assert_eq!(records[0]["body"], "{not json");
    assert_eq!(records[0]["key_header"], "authorization");
    assert_eq!(
        records[0]["headers"]["authorization"],
        format!("Bearer {KEY}")
    );
    assert_eq!(records[1]["path"], "/v2/whatever");
    assert_eq!(records[1]["query"], "x=1");
    assert_eq!(records[1]["status"], 404);
    assert_eq!(records[1]["body"], json!({}));
}

/// The binary: PORT=0 picks a free port (reported on stderr), each request becomes a JSON line
/// on stdout, and SIGTERM ends it.
#[tokio::test]
async fn the_binary_prints_records_and_stops_on_sigterm() {
    let (mut child, addr) = binary(&[("STUB_EXPECT_KEY", KEY)], Stdio::piped()).await;

    let reply = post(
        addr,
        "/v1/messages",
        &[("x-api-key", KEY)],
        &anthropic_body("RUN:ls"),
    )
    .await;
    let events = reply.events();
    assert!(events
        .iter()
        .any(|e| e.json()["content_block"]["type"] == "tool_use"));

    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = stdout.next_line().await.unwrap().unwrap();
    let record: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(record["stub"], "request");
    assert_eq!(record["path"], "/v1/messages");
    assert_eq!(record["key_header"], "x-api-key");
    assert_eq!(record["directive"], "run");
    assert_eq!(record["tool"], "Bash");
    assert_eq!(record["body"]["model"], "claude-sonnet-4-5");

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits on SIGTERM")
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn an_expiry_with_a_hold_gates_login_requests_until_released() {
    let (_child, addr) = binary(&[("STUB_OAUTH", "a0,r0")], Stdio::null()).await;
    let bearer = [("authorization", "Bearer a0")];
    let ok = post(addr, "/v1/messages", &bearer, &anthropic_body("hi")).await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    let expired = send(addr, "POST", "/_stub/oauth/expire?hold=expiry2", &[], "").await;
    assert_eq!(expired.status, 200, "{}", expired.body);
    let bad = send(addr, "POST", "/_stub/oauth/expire?hold=a/b", &[], "").await;
    assert_eq!(bad.status, 404);
    // Two requests with the expired token wait at the gate, then meet it together.
    let gated: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                let body = anthropic_body("hi");
                post(
                    addr,
                    "/v1/messages",
                    &[("authorization", "Bearer a0")],
                    &body,
                )
                .await
            })
        })
        .collect();
    let held = send(addr, "GET", "/_stub/holds/expiry2?min=2&wait=30", &[], "").await;
    assert_eq!(held.json()["waiting"], 2);
    // The token endpoint is not gated: the refresh a broker makes on the first 401.
    let token = post(
        addr,
        "/v1/oauth/token",
        &[],
        &json!({"grant_type":"refresh_token","refresh_token":"r0"}),
    )
    .await;
    assert_eq!(token.status, 200, "{}", token.body);
    send(addr, "POST", "/_stub/release/expiry2", &[], "").await;
    for g in gated {
        assert_eq!(g.await.unwrap().status, 401);
    }
    let fresh = format!("Bearer {}", token.json()["access_token"].as_str().unwrap());
    let again = post(
        addr,
        "/v1/messages",
        &[("authorization", &fresh)],
        &anthropic_body("hi"),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
}

fn responses_body(text: &str) -> Value {
    json!({"model":"gpt-5.5","stream":true,"input":[
        {"type":"message","role":"user","content":[{"type":"input_text","text":text}]}]})
}

async fn inflight(addr: SocketAddr) -> Value {
    send(addr, "GET", "/_stub/inflight", &[], "").await.json()
}

/// `GET /_stub/inflight`: a model request counts from its arrival until its answer is sent,
/// held ones included, on every wire; other requests do not count; a client that leaves
/// mid-hold stops counting.
#[tokio::test]
async fn inflight_counts_model_requests_until_answered_or_abandoned() {
    let addr = start(None).await;
    assert_eq!(inflight(addr).await, json!({"now":0,"max":0}));
    let turns = [
        ("/v1/messages", anthropic_body("HOLD:fly hi")),
        ("/v1/responses", responses_body("HOLD:fly hi")),
        (
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"HOLD:fly hi"}]}),
        ),
        (
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            json!({"contents":[{"role":"user","parts":[{"text":"HOLD:fly hi"}]}]}),
        ),
    ];
    let held: Vec<_> = turns
        .into_iter()
        .map(|(target, body)| tokio::spawn(async move { post(addr, target, &[], &body).await }))
        .collect();
    let status = send(addr, "GET", "/_stub/holds/fly?min=4&wait=30", &[], "").await;
    assert_eq!(status.json()["waiting"], 4);
    assert_eq!(inflight(addr).await, json!({"now":4,"max":4}));
    // Neither a token count nor a probe is a model turn.
    let count = post(
        addr,
        "/v1/messages/count_tokens",
        &[],
        &json!({"model":"m","messages":[]}),
    )
    .await;
    assert_eq!(count.status, 200);
    assert_eq!(send(addr, "HEAD", "/", &[], "").await.status, 200);
    assert_eq!(inflight(addr).await, json!({"now":4,"max":4}));

    send(addr, "POST", "/_stub/release/fly", &[], "").await;
    for h in held {
        let reply = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .expect("answered once released")
            .unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(inflight(addr).await, json!({"now":0,"max":4}));
    // Each record counts the requests in flight at its arrival, itself included.
    let records = send(addr, "GET", "/_stub/requests", &[], "").await.json();
    let mut turns: Vec<u64> = records.as_array().unwrap()[..4]
        .iter()
        .map(|r| r["inflight"].as_u64().unwrap())
        .collect();
    turns.sort_unstable();
    assert_eq!(turns, [1, 2, 3, 4]);
    assert_eq!(records[4]["path"], "/v1/messages/count_tokens");
    assert_eq!(records[4]["inflight"], 4);

    let reset = send(addr, "POST", "/_stub/inflight/reset", &[], "").await;
    assert_eq!(reset.json(), json!({"now":0,"max":0}));

    // A held request whose client goes away.
    let body = anthropic_body("HOLD:gone hi").to_string();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let status = send(addr, "GET", "/_stub/holds/gone?wait=30", &[], "").await;
    assert_eq!(status.json()["waiting"], 1);
    assert_eq!(inflight(addr).await, json!({"now":1,"max":1}));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = inflight(addr).await;
        if now["now"] == 0 {
            assert_eq!(now, json!({"now":0,"max":1}));
            break;
        }
        assert!(Instant::now() < deadline, "still in flight: {now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `STUB_ACCOUNT_REQUESTS=3`: every Anthropic model response, errors too, says what the
/// account has left in Anthropic's headers; not a token count.
#[tokio::test]
async fn account_headers_count_down_on_the_anthropic_wire() {
    let envs = [
        ("STUB_ACCOUNT_REQUESTS", "3"),
        ("STUB_ACCOUNT_WINDOW", "600"),
    ];
    let (_child, addr) = binary(&envs, Stdio::null()).await;
    let count = post(
        addr,
        "/v1/messages/count_tokens",
        &[],
        &json!({"model":"m","messages":[]}),
    )
    .await;
    assert_eq!(count.header("anthropic-ratelimit-requests-limit"), None);
    let before = unix_secs();
    let expected = [
        ("hi", 200, "2", "allowed", "0.3333"),
        ("FAIL:500", 500, "1", "allowed", "0.6667"),
        ("FAIL:429", 429, "0", "rejected", "1.0"),
        ("hi", 200, "0", "rejected", "1.0"),
    ];
    for (prompt, status, remaining, unified, utilization) in expected {
        let reply = post(addr, "/v1/messages", &[], &anthropic_body(prompt)).await;
        assert_eq!(reply.status, status, "{}", reply.body);
        let header = |name| reply.header(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(header("anthropic-ratelimit-requests-limit"), "3");
        assert_eq!(header("anthropic-ratelimit-requests-remaining"), remaining);
        assert_eq!(header("anthropic-ratelimit-unified-status"), unified);
        assert_eq!(
            header("anthropic-ratelimit-unified-5h-utilization"),
            utilization
        );
        let reset: u64 = header("anthropic-ratelimit-unified-reset").parse().unwrap();
        assert!(
            (before + 600..=unix_secs() + 601).contains(&reset),
            "{reset}"
        );
        assert_eq!(
            header("anthropic-ratelimit-unified-5h-reset"),
            reset.to_string()
        );
        assert_eq!(
            header("anthropic-ratelimit-requests-reset"),
            stub_model::account::rfc3339(reset)
        );
    }
    // A `QUOTA:` 429's own headers win over the account's.
    let quota = post(addr, "/v1/messages", &[], &anthropic_body("QUOTA:30")).await;
    assert_eq!(quota.status, 429);
    let reset: u64 = quota
        .header("anthropic-ratelimit-unified-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset <= unix_secs() + 31, "{reset}");
    assert_eq!(
        quota.header("anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
}

/// `STUB_ACCOUNT_REQUESTS=3` on both OpenAI wires: the `x-ratelimit-*` headers and codex's
/// usage headers, errors too; nothing on Gemini's (Google sends none).
#[tokio::test]
async fn account_headers_count_down_on_the_openai_wires() {
    let envs = [
        ("STUB_ACCOUNT_REQUESTS", "3"),
        ("STUB_ACCOUNT_WINDOW", "600"),
    ];
    let (_child, addr) = binary(&envs, Stdio::null()).await;
    let chat = json!({"messages":[{"role":"user","content":"FAIL:503"}]});
    let expected = [
        ("/v1/responses", responses_body("hi"), 200, "2", "33.3333"),
        ("/v1/chat/completions", chat, 503, "1", "66.6667"),
        (
            "/v1/responses",
            responses_body("LIMIT:30"),
            429,
            "0",
            "100.0",
        ),
    ];
    for (target, body, status, remaining, percent) in expected {
        let reply = post(addr, target, &[], &body).await;
        assert_eq!(reply.status, status, "{}", reply.body);
        let header = |name| reply.header(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(header("x-ratelimit-limit-requests"), "3");
        assert_eq!(header("x-ratelimit-remaining-requests"), remaining);
        assert_eq!(header("x-codex-primary-used-percent"), percent);
        assert_eq!(header("x-codex-primary-window-minutes"), "10");
        let after: u64 = header("x-codex-primary-reset-after-seconds")
            .parse()
            .unwrap();
        assert!((590..=600).contains(&after), "{after}");
        let reset = header("x-ratelimit-reset-requests");
        assert!(
            reset == "10m0s" || (reset.starts_with("9m") && reset.ends_with('s')),
            "{reset}"
        );
    }
    let gemini = post(
        addr,
        "/v1beta/models/gemini-2.5-pro:generateContent",
        &[],
        &json!({"contents":[{"role":"user","parts":[{"text":"hi"}]}]}),
    )
    .await;
    assert_eq!(gemini.status, 200);
    assert_no_account_headers(&gemini);
}

fn assert_no_account_headers(reply: &Reply) {
    let named = reply.headers.iter().find(|(name, _)| {
        ["anthropic-ratelimit-", "x-ratelimit-", "x-codex-"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
    });
    assert_eq!(named, None, "{:?}", reply.headers);
}

/// Without `STUB_ACCOUNT_REQUESTS` no response carries account headers.
#[tokio::test]
async fn no_account_headers_without_a_limit() {
    let addr = start(None).await;
    for prompt in ["hi", "FAIL:429"] {
        let reply = post(addr, "/v1/messages", &[], &anthropic_body(prompt)).await;
        assert_no_account_headers(&reply);
        let reply = post(addr, "/v1/responses", &[], &responses_body(prompt)).await;
        assert_no_account_headers(&reply);
    }
}

/// `STUB_ACCOUNT_ENFORCE=1`: past the account's requests, a model request gets the vendor's
/// usage limit (OpenAI's `usage_limit_reached`, Anthropic's `rejected` unified status), its
/// reset at the window's end; a new window answers again.
#[tokio::test]
async fn an_enforced_account_refuses_past_its_limit_until_its_window_ends() {
    let envs = [
        ("STUB_ACCOUNT_REQUESTS", "2"),
        ("STUB_ACCOUNT_WINDOW", "3"),
        ("STUB_ACCOUNT_ENFORCE", "1"),
    ];
    let (_child, addr) = binary(&envs, Stdio::null()).await;
    for _ in 0..2 {
        let reply = post(addr, "/v1/responses", &[], &responses_body("hi")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let refused = post(addr, "/v1/responses", &[], &responses_body("hi")).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["error"]["type"], "usage_limit_reached", "{body}");
    let left = body["error"]["resets_in_seconds"].as_u64().unwrap();
    assert!((1..=3).contains(&left), "{left}");
    let at = body["error"]["resets_at"].as_u64().unwrap();
    assert!(at <= unix_secs() + 4, "{at}");
    let claude = post(addr, "/v1/messages", &[], &anthropic_body("hi")).await;
    assert_eq!(claude.status, 429, "{}", claude.body);
    assert_eq!(
        claude.header("anthropic-ratelimit-unified-status"),
        Some("rejected")
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = post(addr, "/v1/responses", &[], &responses_body("hi")).await;
    assert_eq!(again.status, 200, "{}", again.body);
}
