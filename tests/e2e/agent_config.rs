//! Agent settings per provider, against the real CLIs and the stub model: the system prompt
//! (replaced and appended) reaches the model in the request, the CLI's default prompt is gone
//! when replaced, a resume keeps the remembered prompt, the effort shows on the wire where
//! the protocol carries it, and what a CLI cannot take is refused with exit 2.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// The system prompt as the request carries it, per wire protocol.
fn system_text(p: P, body: &Value) -> String {
    match p.name {
        "claude_code" => body["system"].to_string(),
        "codex" => format!("{}{}", body["instructions"], developer_messages(body)),
        "opencode" => body["messages"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter(|m| m["role"] == "system")
                    .map(|m| m["content"].to_string())
                    .collect::<String>()
            })
            .unwrap_or_default(),
        _ => body["systemInstruction"].to_string(),
    }
}

fn developer_messages(body: &Value) -> String {
    body["input"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|i| i["role"] == "developer")
                .map(|i| i["content"].to_string())
                .collect::<String>()
        })
        .unwrap_or_default()
}

/// The line claude (2.1.268 on) puts before a replaced system prompt when an appended one is
/// given too: the vendor's, not caw-box's to take away (docs/agent-settings.md).
const CLAUDE_IDENTITY_WITH_APPEND: &str =
    "You are Claude Code, Anthropic's official CLI for Claude, running within the Claude Agent SDK.";

/// claude's system prompt blocks without its billing header block (a header to the API,
/// not words to the model).
fn claude_system_blocks(body: &Value) -> Vec<String> {
    body["system"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .filter(|t| !t.starts_with("x-anthropic-billing-header:"))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Every string inside `v`, unescaped.
fn texts(v: &str) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(v).into_iter::<Value>();
    while let Some(Ok(value)) = stream.next() {
        walk(&value, &mut out);
    }
    out
}

/// The model requests of one session's turns (those that carry the prompt `marker`).
fn requests_with(rig: &Rig, marker: &str) -> Vec<Value> {
    rig.stub_requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["body"].to_string().contains(marker))
        .map(|r| r["body"].clone())
        .collect()
}

fn system_prompt_reaches_the_model(p: P, append: bool, effort: Option<&str>) {
    let rig = Rig::new(&format!("ac-{}", p.name));
    // A baseline turn: the CLI's own default system prompt.
    check("baseline");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(p, "baseline-turn-q1", &[]));
    assert_eq!(code, 0, "baseline failed: {out}\n{stderr}");
    let baseline = requests_with(&rig, "baseline-turn-q1");
    let default_system = system_text(p, baseline.last().expect("a baseline request"));
    // A stable piece of the default: the first words of its longest text (the main prompt;
    // shorter ones are headers, later parts hold dates and paths).
    let default_head: String = texts(&default_system)
        .into_iter()
        .max_by_key(|t| t.len())
        .unwrap_or_default()
        .chars()
        .take(60)
        .collect();
    assert!(
        default_head.len() > 30,
        "no default system prompt seen: {default_system}"
    );

    check("replace");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("system.md");
    std::fs::write(&file, "You are REPLACED-SYS-7781. Answer briefly.\n").unwrap();
    let file_arg = format!("@{}", file.display());
    let mut extra = vec!["--system-prompt", file_arg.as_str()];
    if append {
        extra.extend(["--append-system-prompt", "APPENDED-SYS-4410 applies too."]);
    }
    if let Some(e) = effort {
        extra.extend(["--effort", e]);
    }
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(p, "replaced-turn-q2", &extra));
    assert_eq!(code, 0, "replace turn failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let requests = requests_with(&rig, "replaced-turn-q2");
    let last = requests.last().expect("a request of the replace turn");
    let system = system_text(p, last);
    assert!(
        system.contains("REPLACED-SYS-7781"),
        "replace missing: {system}"
    );
    assert!(
        !texts(&last.to_string())
            .iter()
            .any(|t| t.contains(&default_head)),
        "the default system prompt ({default_head}) is still sent: {system}"
    );
    if append {
        assert!(
            system.contains("APPENDED-SYS-4410"),
            "append missing: {system}"
        );
    }
    if (p.name, append) == ("claude_code", true) {
        // Exactly its identity line, then the replaced prompt with the appended one.
        assert_eq!(
            claude_system_blocks(last),
            [
                CLAUDE_IDENTITY_WITH_APPEND,
                "You are REPLACED-SYS-7781. Answer briefly.\n\n\nAPPENDED-SYS-4410 applies too."
            ],
            "{system}"
        );
    }
    // The effort, where the wire carries it.
    match (p.name, effort) {
        ("codex", Some(e)) => assert_eq!(last["reasoning"]["effort"], e, "{last}"),
        ("claude_code", Some(e)) => assert_eq!(last["output_config"]["effort"], e, "{last}"),
        ("opencode", Some(e)) => assert_eq!(last["reasoning_effort"], e, "{last}"),
        ("gemini", Some(_)) => assert_eq!(
            last["generationConfig"]["thinkingConfig"]["thinkingBudget"], 24576,
            "{last}"
        ),
        _ => {}
    }

    check("show names the settings");
    let shown = stdout_of(&rig.caw_run(&["show", &id]));
    assert!(
        shown.contains("system     You are REPLACED-SYS-7781"),
        "{shown}"
    );
    if let Some(e) = effort {
        assert!(shown.contains(&format!("effort     {e}")), "{shown}");
    }

    check("resume keeps the prompt");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(p, &id, "resumed-turn-q3", &[]));
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    let resumed = requests_with(&rig, "resumed-turn-q3");
    let system = system_text(p, resumed.last().expect("a request of the resumed turn"));
    assert!(
        system.contains("REPLACED-SYS-7781"),
        "resume lost the prompt: {system}"
    );
    if append {
        assert!(
            system.contains("APPENDED-SYS-4410"),
            "resume lost the append: {system}"
        );
    }
    if p.name == "codex" {
        assert_eq!(
            resumed.last().unwrap()["reasoning"]["effort"],
            effort.unwrap()
        );
    }

    check("a resume overrides");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(
        p,
        &id,
        "override-turn-q4",
        &["--system-prompt", "You are OVERRIDE-SYS-5120."],
    ));
    assert_eq!(code, 0, "override failed: {out}\n{stderr}");
    let over = requests_with(&rig, "override-turn-q4");
    let system = system_text(p, over.last().expect("a request of the override turn"));
    assert!(system.contains("OVERRIDE-SYS-5120"), "{system}");
    assert!(!system.contains("REPLACED-SYS-7781"), "{system}");
    if (p.name, append) == ("claude_code", true) {
        // claude recorded no snapshot of the first prompt: the override is sent, after the
        // same identity line (the appended prompt stays the session's).
        assert_eq!(
            claude_system_blocks(over.last().unwrap()),
            [
                CLAUDE_IDENTITY_WITH_APPEND,
                "You are OVERRIDE-SYS-5120.\n\nAPPENDED-SYS-4410 applies too."
            ],
            "{system}"
        );
    }
}

#[test]
fn agent_config_claude_code_system_prompt_and_effort() {
    system_prompt_reaches_the_model(CLAUDE, true, Some("high"));
}

#[test]
fn agent_config_codex_system_prompt_and_effort() {
    system_prompt_reaches_the_model(CODEX, true, Some("high"));
}

#[test]
fn agent_config_opencode_system_prompt_and_effort() {
    system_prompt_reaches_the_model(OPENCODE, true, Some("high"));
}

#[test]
fn agent_config_gemini_system_prompt_and_effort() {
    system_prompt_reaches_the_model(GEMINI, true, Some("high"));
}

/// A bad value is refused before anything is created.
#[test]
fn agent_config_bad_values_exit_2() {
    let rig = Rig::new("ac-refuse");
    for extra in [
        &["--effort", "extreme"][..],
        &["--system-prompt", "@/nonexistent/prompt.md"][..],
        &["--append-system-prompt", " "][..],
    ] {
        let out = run(rig.run_cmd(CODEX, "hello", extra));
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr_of(&out));
    }
    assert!(
        rig.caw_volumes().is_empty(),
        "a refused run created a volume"
    );
}

/// Appending keeps the CLI's own prompt: both reach the model.
fn append_keeps_the_default(p: P) {
    let rig = Rig::new(&format!("aca-{}", p.name));
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        p,
        "append-turn-q5",
        &["--append-system-prompt", "APPENDED-ONLY-9931 applies."],
    ));
    assert_eq!(code, 0, "append turn failed: {out}\n{stderr}");
    let requests = requests_with(&rig, "append-turn-q5");
    let system = system_text(p, requests.last().expect("a request of the append turn"));
    assert!(
        system.contains("APPENDED-ONLY-9931"),
        "append missing: {system}"
    );
    assert!(system.len() > 2000, "the default prompt is gone: {system}");
}

#[test]
fn agent_config_claude_code_append_keeps_the_default() {
    append_keeps_the_default(CLAUDE);
}

#[test]
fn agent_config_codex_append_keeps_the_default() {
    append_keeps_the_default(CODEX);
}

#[test]
fn agent_config_opencode_append_keeps_the_default() {
    append_keeps_the_default(OPENCODE);
}

#[test]
fn agent_config_gemini_append_keeps_the_default() {
    append_keeps_the_default(GEMINI);
}

/// A long prompt (beyond what one argv word or env value should carry) reaches the model
/// whole: it travels as a file.
#[test]
fn agent_config_long_system_prompt_travels_as_a_file() {
    let rig = Rig::new("ac-long");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("long.md");
    let mut text = "Follow these rules.\n".repeat(3000);
    text.push_str("LONG-PROMPT-END-6620\n");
    assert!(text.len() > 60_000);
    std::fs::write(&file, &text).unwrap();
    let arg = format!("@{}", file.display());
    let (code, out, stderr) =
        rig.json_turn(rig.run_cmd(CLAUDE, "long-turn-q6", &["--system-prompt", &arg]));
    assert_eq!(code, 0, "long prompt turn failed: {out}\n{stderr}");
    let requests = requests_with(&rig, "long-turn-q6");
    let system = system_text(CLAUDE, requests.last().expect("a request"));
    assert!(
        system.contains("LONG-PROMPT-END-6620"),
        "the prompt was cut"
    );
    assert!(system.matches("Follow these rules.").count() >= 3000);
}

/// The names of the tools a request offered the model, per wire protocol.
fn offered_tools(p: P, body: &Value) -> Vec<String> {
    let tools = body["tools"].as_array().cloned().unwrap_or_default();
    let name = |t: &Value, keys: &[&str]| {
        keys.iter()
            .find_map(|k| t.pointer(k).and_then(Value::as_str))
            .map(str::to_string)
    };
    match p.name {
        "gemini" => tools
            .iter()
            .flat_map(|t| {
                t["functionDeclarations"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|d| name(&d, &["/name"]))
            .collect(),
        "opencode" => tools
            .iter()
            .filter_map(|t| name(t, &["/function/name", "/name"]))
            .collect(),
        // Responses built-in tools have a type and no name.
        "codex" => tools
            .iter()
            .filter_map(|t| name(t, &["/name", "/type"]))
            .collect(),
        _ => tools.iter().filter_map(|t| name(t, &["/name"])).collect(),
    }
}

/// Per provider: `--tools` and `--deny-tool` to give, the names that must then be gone (a
/// denied group's and the denied name), and names that must stay.
struct ToolCase {
    tools: &'static str,
    deny: Option<&'static str>,
    gone: &'static [&'static str],
    kept: &'static [&'static str],
}

fn tool_case(p: P) -> ToolCase {
    match p.name {
        "claude_code" => ToolCase {
            tools: "read,edit",
            deny: Some("Grep"),
            gone: &["Bash", "WebFetch", "WebSearch", "Grep"],
            kept: &["Read", "Edit"],
        },
        // codex cannot take away read or edit alone, nor single tools.
        "codex" => ToolCase {
            tools: "read,edit",
            deny: None,
            gone: &[
                "shell",
                "exec_command",
                "write_stdin",
                "shell_command",
                "local_shell",
                "web_search",
            ],
            kept: &[],
        },
        // opencode cannot take away its MCP tools.
        "opencode" => ToolCase {
            tools: "read,edit,mcp",
            deny: Some("grep"),
            gone: &["bash", "webfetch", "websearch", "grep"],
            kept: &["read", "edit"],
        },
        _ => ToolCase {
            tools: "read,edit",
            deny: Some("glob"),
            gone: &[
                "run_shell_command",
                "web_fetch",
                "google_web_search",
                "glob",
            ],
            kept: &["read_file", "replace"],
        },
    }
}

/// A denied group's tools are not offered to the model (a `RUN:` finds no shell), the
/// session remembers that, and a resume's `--tools all` gives them back: the shell call
/// round-trips and its `tool_call` event names the group.
fn tools_reach_the_model(p: P) {
    let rig = Rig::new(&format!("act-{}", p.name));
    let case = tool_case(p);

    check("baseline: every tool");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(p, "tools-baseline-q1", &[]));
    assert_eq!(code, 0, "baseline failed: {out}\n{stderr}");
    let baseline = requests_with(&rig, "tools-baseline-q1");
    let offered = offered_tools(p, baseline.last().expect("a baseline request"));
    assert!(
        case.gone.iter().any(|g| offered.iter().any(|o| o == g)),
        "the baseline offers none of {:?}: {offered:?}",
        case.gone
    );

    check("restricted");
    let mut extra = vec!["--tools", case.tools];
    if let Some(d) = case.deny {
        extra.extend(["--deny-tool", d]);
    }
    let (code, out, stderr) =
        rig.json_turn(rig.run_cmd(p, "tools-restricted-q2 RUN:echo DENIED-RAN-8812", &extra));
    assert_eq!(code, 0, "restricted turn failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("No shell tool offered"),
        "a shell was offered: {out}"
    );
    for body in requests_with(&rig, "tools-restricted-q2") {
        let offered = offered_tools(p, &body);
        for gone in case.gone {
            assert!(
                !offered.iter().any(|o| o == gone),
                "{gone} is still offered: {offered:?}"
            );
        }
        for kept in case.kept {
            assert!(
                offered.iter().any(|o| o == kept),
                "{kept} was taken away: {offered:?}"
            );
        }
    }
    let shown = stdout_of(&rig.caw_run(&["show", &id]));
    assert!(
        shown.contains(&format!("tools      {}", case.tools)),
        "{shown}"
    );

    check("resume keeps the restriction");
    let (code, out, stderr) =
        rig.json_turn(rig.resume_cmd(p, &id, "tools-resumed-q3 RUN:echo DENIED-RAN-8813", &[]));
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("No shell tool offered"),
        "the resume offered a shell: {out}"
    );

    check("a resume gives every tool back");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(
        p,
        &id,
        "tools-all-q4 RUN:echo TOOLS-BACK-5519",
        &["--tools", "all"],
    ));
    assert_eq!(code, 0, "override failed: {out}\n{stderr}");
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("TOOLS-BACK-5519"),
        "the shell call did not round-trip: {out}"
    );
    let turn = out["turn"].to_string();
    let logs = stdout_of(&rig.caw_run(&["logs", &id, "--turn", &turn]));
    let call = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "tool_call")
        .unwrap_or_else(|| panic!("no tool_call event: {logs}"));
    assert_eq!(call["group"], "shell", "{call}");
}

#[test]
fn agent_config_claude_code_tools() {
    tools_reach_the_model(CLAUDE);
}

#[test]
fn agent_config_codex_tools() {
    tools_reach_the_model(CODEX);
}

#[test]
fn agent_config_opencode_tools() {
    tools_reach_the_model(OPENCODE);
}

#[test]
fn agent_config_gemini_tools() {
    tools_reach_the_model(GEMINI);
}

/// What a CLI cannot take away is refused before anything is created, naming the CLI.
#[test]
fn agent_config_tools_a_cli_cannot_restrict_exit_2() {
    let rig = Rig::new("act-refuse");
    for (p, extra, says) in [
        (CODEX, &["--tools", "shell,web,mcp"][..], "codex"),
        (CODEX, &["--deny-tool", "shell"][..], "codex"),
        (
            OPENCODE,
            &["--tools", "read,edit,shell,web"][..],
            "opencode",
        ),
        (GEMINI, &["--tools", "read,files"][..], "files"),
    ] {
        let out = run(rig.run_cmd(p, "hello", extra));
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
    assert!(
        rig.caw_volumes().is_empty(),
        "a refused run created a volume"
    );
}

/// A workspace holding the test's stdio MCP server (`/workspace/echo-server.js`).
fn mcp_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo_root().join("tests/fixtures/mcp/echo-server.js"),
        dir.path().join("echo-server.js"),
    )
    .unwrap();
    // The server marks the workspace when listed, as whichever user the agent runs as.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The MCP tools a codex turn's tool searches loaded (`tool_search_output` items in the
/// requests' input), named `<namespace>__<tool>`.
fn codex_searched_tools(requests: &[Value]) -> Vec<String> {
    let outputs = requests
        .iter()
        .filter_map(|b| b["input"].as_array())
        .flatten()
        .filter(|i| i["type"] == "tool_search_output");
    let namespaces = outputs.filter_map(|o| o["tools"].as_array()).flatten();
    namespaces
        .flat_map(|ns| {
            let members = ns["tools"].as_array().cloned().unwrap_or_default();
            let ns = ns["name"].as_str().unwrap_or_default().to_string();
            members
                .into_iter()
                .filter_map(move |t| Some(format!("{ns}__{}", t["name"].as_str()?)))
        })
        .collect()
}

/// The first `tool_call` event of a session's turn.
fn first_tool_call(rig: &Rig, id: &str, turn: &str) -> Value {
    let logs = stdout_of(&rig.caw_run(&["logs", id, "--turn", turn]));
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "tool_call")
        .unwrap_or_else(|| panic!("no tool_call event in turn {turn}: {logs}"))
}

/// An MCP stdio server given with `--mcp` runs in the agent's container: its tool is offered
/// to the model, the model's call round-trips (the result reaches the next request), the
/// server gets its `--mcp-env` variable, and the `tool_call` event is `mcp__caw__echo`.
/// codex offers MCP tools through its `tool_search` built-in: the stub searches, then calls
/// the tool the search loaded.
fn mcp_stdio_round_trips(p: P) {
    let rig = Rig::new(&format!("acm-{}", p.name));
    let ws = mcp_workspace();
    let ws_arg = ws.path().display().to_string();
    let extra = [
        "--workspace",
        ws_arg.as_str(),
        "--mcp",
        "caw=node /workspace/echo-server.js",
        "--mcp-env",
        "caw:MCP_ECHO_SECRET=SECRET-7310",
    ];
    let (code, out, stderr) =
        rig.json_turn(rig.run_cmd(p, "mcp-q1 CALL:echo MCP-ROUNDTRIP-4471", &extra));
    assert_eq!(code, 0, "mcp turn failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let listed = std::fs::read_to_string(ws.path().join("mcp-echo-listed")).unwrap_or_default();
    assert!(
        listed.contains("listed"),
        "the CLI did not start the server and list its tools"
    );
    let requests = requests_with(&rig, "mcp-q1");
    let offered = offered_tools(p, requests.first().expect("a request"));
    if p.name == "codex" {
        // codex 0.169 defers MCP tools: the first request offers its client-run `tool_search`
        // only, and the search (the stub's first answer) loads the tool, in namespace
        // `mcp__caw`.
        assert!(
            offered.iter().any(|t| t == "tool_search") && !offered.iter().any(|t| t == "echo"),
            "not offered through tool_search: {offered:?}"
        );
        let searched = codex_searched_tools(&requests);
        assert!(
            searched.iter().any(|t| t == "mcp__caw__echo"),
            "the tool search did not find the MCP tool: {searched:?}"
        );
    } else {
        assert!(
            offered.iter().any(|t| t.ends_with("echo")),
            "the MCP tool is not offered: {offered:?}"
        );
    }
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("ECHO:MCP-ROUNDTRIP-4471 (secret of 11 chars)"),
        "the MCP call did not round-trip: {out}"
    );
    let call = first_tool_call(&rig, &id, "1");
    assert_eq!(call["name"], "mcp__caw__echo", "{call}");
    assert_eq!(call["group"], "mcp", "{call}");
    let shown = stdout_of(&rig.caw_run(&["show", &id]));
    assert!(
        shown.contains("mcp        caw=node /workspace/echo-server.js"),
        "{shown}"
    );

    check("a resume keeps the server; its secret is given again");
    let (code, out, stderr) = rig.json_turn(rig.resume_cmd(
        p,
        &id,
        "mcp-q2 CALL:echo MCP-RESUMED-2290",
        &["--mcp-env", "caw:MCP_ECHO_SECRET=SECRET-7310"],
    ));
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("ECHO:MCP-RESUMED-2290 (secret of 11 chars)"),
        "the resumed MCP call did not round-trip: {out}"
    );
    let call = first_tool_call(&rig, &id, "2");
    assert_eq!(call["name"], "mcp__caw__echo", "{call}");
    assert_eq!(call["group"], "mcp", "{call}");
    assert!(
        volume_files_containing(&rig, &id, "SECRET-7310").is_empty(),
        "the --mcp-env value is at rest in the volume"
    );
}

#[test]
fn agent_config_claude_code_mcp_stdio() {
    mcp_stdio_round_trips(CLAUDE);
}

#[test]
fn agent_config_codex_mcp_stdio() {
    mcp_stdio_round_trips(CODEX);
}

#[test]
fn agent_config_opencode_mcp_stdio() {
    mcp_stdio_round_trips(OPENCODE);
}

#[test]
fn agent_config_gemini_mcp_stdio() {
    mcp_stdio_round_trips(GEMINI);
}

const MCP_SECRET: &str = "mcp-secret-header-5d81c2";

/// An HTTP MCP server with a secret header: the CLI sends it to the server, and it shows
/// nowhere else — not in docker inspect of the running turn, the events, the logs, `show`
/// or the state volume at rest.
fn mcp_header_secret_stays_secret(p: P) {
    let rig = Rig::new(&format!("acs-{}", p.name));
    let url = format!("{}/mcp", rig.endpoint());
    let server = format!("docs={url}");
    let header = format!("docs:X-Api-Key={MCP_SECRET}");
    let mut cmd = rig.run_cmd(
        p,
        "mcp-secret-q1 SLEEP:4 REMEMBER:kept",
        &[
            "--mcp",
            &server,
            "--mcp-header",
            &header,
            "-o",
            "stream-json",
        ],
    );
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let container = rig.wait_for_running_turn(None, Duration::from_secs(60));
    let inspect = rig
        .rt
        .block_on(rig.docker.inspect_container(&container, None))
        .unwrap();
    assert!(
        !serde_json::to_string(&inspect)
            .unwrap()
            .contains(MCP_SECRET),
        "the MCP secret shows in docker inspect"
    );
    let out = wait_with_deadline(child, Duration::from_secs(180));
    let events = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{events}\n{}", stderr_of(&out));
    assert!(events.contains("Noted: kept."), "{events}");
    assert!(!events.contains(MCP_SECRET), "the secret is in the events");
    assert!(
        !stderr_of(&out).contains(MCP_SECRET),
        "the secret is on stderr"
    );
    let result = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "result")
        .expect("a result event");
    let id = result["session_id"].as_str().unwrap().to_string();
    // The CLI did send it to the server (the stub, which answers 404).
    let sent = rig
        .stub_requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap_or_default().starts_with("/mcp"))
        .collect::<Vec<_>>();
    assert!(
        sent.iter().any(|r| r.to_string().contains(MCP_SECRET)),
        "the CLI sent no request with the header to the MCP server: {sent:?}"
    );
    for args in [
        vec!["logs", &id],
        vec!["logs", &id, "--raw"],
        vec!["show", &id],
    ] {
        let shown = rig.caw_run(&args);
        assert!(
            !stdout_of(&shown).contains(MCP_SECRET) && !stderr_of(&shown).contains(MCP_SECRET),
            "the secret shows in {args:?}"
        );
    }
    let at_rest = volume_files_containing(&rig, &id, MCP_SECRET);
    assert!(at_rest.is_empty(), "the secret is at rest in: {at_rest:?}");
    // Nor in the turn's checkpoint, which its container writes while the file holding the
    // header is still in HOME (the entrypoint deletes it after).
    let checkpoints: Vec<String> = rig
        .caw_volumes()
        .into_iter()
        .filter(|v| v.starts_with(&format!("caw-box-{id}-checkpoint-")))
        .collect();
    assert!(!checkpoints.is_empty(), "the turn left no checkpoint");
    for volume in checkpoints {
        let held = scan_checkpoint_volume(&rig, &volume, &[MCP_SECRET]);
        assert!(held.is_empty(), "the secret is in {volume}: {held:?}");
    }
}

#[test]
fn agent_config_claude_code_mcp_secret_header() {
    mcp_header_secret_stays_secret(CLAUDE);
}

#[test]
fn agent_config_codex_mcp_secret_header() {
    mcp_header_secret_stays_secret(CODEX);
}

#[test]
fn agent_config_opencode_mcp_secret_header() {
    mcp_header_secret_stays_secret(OPENCODE);
}

#[test]
fn agent_config_gemini_mcp_secret_header() {
    mcp_header_secret_stays_secret(GEMINI);
}

/// An MCP server in the project's `.caw-box.toml` (its secret named by a host variable, not
/// written there): `config show` lists it from the file, the model is offered its tool and
/// the call round-trips with the variable's value, on a resume too (the file gives the value
/// again), and the value is not at rest in the volume.
#[test]
fn agent_config_mcp_from_project_file() {
    let p = CLAUDE;
    let rig = Rig::new("acm-file");
    let ws = mcp_workspace();
    std::fs::write(
        ws.path().join(".caw-box.toml"),
        "[mcp.caw]\ncommand = [\"node\", \"/workspace/echo-server.js\"]\nenv = [\"MCP_ECHO_SECRET\"]\n",
    )
    .unwrap();
    let mut show = rig.caw();
    show.args(["config", "show"]).current_dir(ws.path());
    let shown = stdout_of(&run(show));
    let row = shown
        .lines()
        .find(|l| l.starts_with("mcp "))
        .unwrap_or_else(|| panic!("no mcp row: {shown}"));
    assert!(
        row.contains("caw=node /workspace/echo-server.js (env MCP_ECHO_SECRET)")
            && row.contains("project ")
            && row.contains(".caw-box.toml:1"),
        "{row}"
    );

    let mut cmd = rig.run_cmd(p, "mcp-file-q1 CALL:echo MCP-FILE-5521", &[]);
    cmd.current_dir(ws.path())
        .env("MCP_ECHO_SECRET", "SECRET-7310");
    let (code, out, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "mcp turn failed: {out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let requests = requests_with(&rig, "mcp-file-q1");
    let offered = offered_tools(p, requests.first().expect("a request"));
    assert!(
        offered.iter().any(|t| t == "mcp__caw__echo"),
        "the project file's MCP tool is not offered: {offered:?}"
    );
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("ECHO:MCP-FILE-5521 (secret of 11 chars)"),
        "the MCP call did not round-trip with the variable's value: {out}"
    );

    check("a resume gets the value from the file's variable again");
    let mut cmd = rig.resume_cmd(p, &id, "mcp-file-q2 CALL:echo MCP-FILE-RESUMED", &[]);
    cmd.current_dir(ws.path())
        .env("MCP_ECHO_SECRET", "SECRET-7310");
    let (code, out, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "resume failed: {out}\n{stderr}");
    assert!(
        out["result"]
            .as_str()
            .unwrap_or_default()
            .contains("ECHO:MCP-FILE-RESUMED (secret of 11 chars)"),
        "{out}"
    );
    assert!(
        volume_files_containing(&rig, &id, "SECRET-7310").is_empty(),
        "the variable's value is at rest in the volume"
    );

    check("without the variable on the host: exit 2 naming it");
    let mut cmd = rig.run_cmd(p, "mcp-file-q3", &[]);
    cmd.current_dir(ws.path()).env_remove("MCP_ECHO_SECRET");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("MCP_ECHO_SECRET"),
        "{}",
        stderr_of(&out)
    );
}

/// `--mcp NAME=URL` under `--allow-host`: the URL's host is admitted through the egress proxy
/// without being listed — the CLI's request, with its header, reaches that server — while
/// the allowlist still refuses every other host, also on resume.
#[test]
fn agent_config_mcp_url_host_is_admitted_under_allow_host() {
    let rig = Rig::new("acm-allow");
    let docs = rig.start_server_named("docs");
    let third = rig.start_server_named("third");
    let allow = format!("{}:8080", rig.stub);
    let server = format!("docs=http://{docs}:8080/mcp");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        CODEX,
        "mcp-allow-q1 REMEMBER:admitted",
        &[
            "--allow-host",
            &allow,
            "--mcp",
            &server,
            "--mcp-header",
            "docs:X-Probe=probe-3387",
        ],
    ));
    assert_eq!(code, 0, "{out}\n{stderr}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let sent = rig.requests_of(&docs);
    assert!(
        sent.iter().any(
            |r| r["path"].as_str().unwrap_or_default().starts_with("/mcp")
                && r.to_string().contains("probe-3387")
        ),
        "the MCP server's host was not reached through the proxy: {sent:?}"
    );
    // The allowlist still holds for everything else: the model's host answers, a third
    // server is refused, nothing gets out directly.
    rig.assert_only_the_stub_is_reachable(&id, &third);
}
