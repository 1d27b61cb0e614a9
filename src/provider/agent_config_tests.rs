//! What each adapter makes of the agent settings (`agent_config`): the prompt files, the
//! effort knob, the tool lists and the MCP servers in each CLI's own terms, and what each
//! CLI can be told. A test module of `provider`'s: the arrow goes from the adapters to the
//! settings, and these tests name both.

use crate::agent_config::{Effort, McpServer, ToolGroup, ToolPolicy, SYSTEM_PROMPT_FILE};
use crate::error::Result;
use crate::provider::{ProviderKind, TurnCommand, TurnRequest};

/// `agent_config::check_support` with `p`'s adapter's answer.
fn check_support(p: ProviderKind, system_prompt: bool, append: bool, effort: bool) -> Result<()> {
    crate::agent_config::check_support(p, p.adapter().support(), [system_prompt, append, effort])
}

/// `agent_config::check_tools` with `p`'s adapter's answer.
fn check_tools(p: ProviderKind, tools: &ToolPolicy) -> Result<()> {
    crate::agent_config::check_tools(p, p.adapter().support(), tools)
}

const TEXT: &str = "REPLACE-TEXT-1234 be brief";
const MORE: &str = "APPEND-TEXT-5678 and polite";

fn command(p: ProviderKind, effort: Option<Effort>, append: bool) -> TurnCommand {
    let support = p.adapter().support();
    // An API key: the endpoint's provider (opencode without one uses its ChatGPT login).
    let keyed = ["OPENAI_API_KEY".to_string()];
    p.adapter().turn_command(&TurnRequest {
        prompt: "hi",
        credential_env: &keyed,
        model: Some("caw/stub-model"),
        endpoint: Some("http://stub:8080"),
        system_prompt: Some(TEXT),
        append_system_prompt: (append && support.append).then_some(MORE),
        effort: effort.filter(|_| support.effort),
        ..Default::default()
    })
}

fn visible(c: &TurnCommand) -> String {
    let env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{:?} {:?}", c.argv, env)
}

/// The texts travel in HOME files the CLI reads, not in argv or env (inspect), except
/// codex's appended text, which codex takes only as a value.
#[test]
fn prompt_texts_go_in_files_the_command_names() {
    for p in ProviderKind::ALL {
        let c = command(p, None, true);
        let shown = visible(&c);
        assert!(!shown.contains(TEXT), "{p}: {shown}");
        assert!(shown.contains(SYSTEM_PROMPT_FILE), "{p}: {shown}");
        let file = c.home_files.iter().find(|f| f.path == SYSTEM_PROMPT_FILE);
        assert_eq!(
            file.map(|f| f.contents.as_slice()),
            Some(TEXT.as_bytes()),
            "{p}"
        );
        if p.adapter().support().append {
            if p == ProviderKind::Codex {
                assert!(
                    c.argv
                        .iter()
                        .any(|a| a == &format!("developer_instructions=\"{MORE}\"")),
                    "{shown}"
                );
            } else {
                // gemini reads it as a context file of its own name in ~/.gemini.
                assert!(!shown.contains(MORE), "{p}: {shown}");
                assert!(
                    c.home_files.iter().any(|f| f.contents == MORE.as_bytes()),
                    "{p}"
                );
            }
        }
    }
}

#[test]
fn effort_maps_to_each_clis_knob() {
    let argv = |p| command(p, Some(Effort::High), false).argv.join(" ");
    assert!(argv(ProviderKind::ClaudeCode).contains("--effort high"));
    assert!(argv(ProviderKind::Codex).contains("-c model_reasoning_effort=\"high\""));
    let opencode = command(ProviderKind::Opencode, Some(Effort::High), false);
    assert!(opencode.argv.contains(&"--variant=high".to_string()));
    let config = &opencode
        .env
        .iter()
        .find(|(k, _)| k == "OPENCODE_CONFIG_CONTENT")
        .unwrap()
        .1;
    let config: serde_json::Value = serde_json::from_str(config).unwrap();
    assert_eq!(
        config["provider"]["caw"]["models"]["stub-model"]["variants"]["high"]["reasoningEffort"],
        "high"
    );
}

#[test]
fn every_pinned_cli_takes_the_prompts_and_effort() {
    for p in ProviderKind::ALL {
        assert!(check_support(p, true, true, true).is_ok(), "{p}");
    }
}

fn policy(groups: &str, allow: &[&str], deny: &[&str]) -> ToolPolicy {
    ToolPolicy {
        groups: ToolPolicy::parse_groups(groups, "--tools").unwrap(),
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

/// A group a CLI cannot take away, or tool names it has no list for: exit 2 naming it.
#[test]
fn a_tool_restriction_a_cli_cannot_make_is_refused_naming_it() {
    for p in ProviderKind::ALL {
        assert!(check_tools(p, &policy("all", &[], &[])).is_ok(), "{p}");
        assert!(
            check_tools(p, &policy("read,edit", &[], &[])).is_ok() || p == ProviderKind::Opencode,
            "{p}"
        );
    }
    let e = check_tools(ProviderKind::Codex, &policy("shell,web,mcp", &[], &[])).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.message.contains("codex CLI"), "{}", e.message);
    assert!(e.message.contains("'read'"), "{}", e.message);
    let e = check_tools(ProviderKind::Codex, &policy("all", &[], &["shell"])).unwrap_err();
    assert!(
        e.message.contains("--deny-tool") && e.message.contains("codex"),
        "{}",
        e.message
    );
    let e = check_tools(
        ProviderKind::Opencode,
        &policy("read,edit,shell,web", &[], &[]),
    )
    .unwrap_err();
    assert!(
        e.message.contains("opencode CLI") && e.message.contains("'mcp'"),
        "{}",
        e.message
    );
    // What each can do.
    assert!(check_tools(ProviderKind::Codex, &policy("read,edit", &[], &[])).is_ok());
    assert!(check_tools(
        ProviderKind::ClaudeCode,
        &policy("none", &["Bash"], &["Read"])
    )
    .is_ok());
    assert!(check_tools(ProviderKind::Gemini, &policy("none", &[], &[])).is_ok());
    assert!(check_tools(ProviderKind::Opencode, &policy("mcp", &["bash"], &[])).is_ok());
}

fn tools_command(p: ProviderKind, tools: &ToolPolicy) -> TurnCommand {
    p.adapter().turn_command(&TurnRequest {
        prompt: "hi",
        model: Some("caw/stub-model"),
        endpoint: Some("http://stub:8080"),
        tools: Some(tools),
        ..Default::default()
    })
}

#[test]
fn tool_restrictions_map_to_each_clis_lists() {
    let p = policy(
        "read,edit",
        &["WebFetch", "webfetch", "web_fetch"],
        &["Grep", "grep", "glob"],
    );
    let claude = tools_command(ProviderKind::ClaudeCode, &p).argv;
    let deny = claude
        .iter()
        .find(|a| a.starts_with("--disallowedTools="))
        .unwrap();
    assert!(
        deny.contains("Bash") && deny.contains("WebSearch") && deny.contains("Grep"),
        "{deny}"
    );
    assert!(
        !deny.contains("WebFetch") && !deny.contains("Read,"),
        "{deny}"
    );
    assert!(claude.contains(&"--strict-mcp-config".to_string()));

    let codex = tools_command(ProviderKind::Codex, &policy("read,edit", &[], &[]))
        .argv
        .join(" ");
    assert!(codex.contains("-c features.shell_tool=false"), "{codex}");
    assert!(codex.contains("-c web_search=\"disabled\""), "{codex}");
    assert!(codex.contains("-c mcp_servers={}"), "{codex}");

    let opencode = tools_command(
        ProviderKind::Opencode,
        &policy("read,edit,mcp", &["webfetch"], &["grep"]),
    );
    let config = &opencode
        .env
        .iter()
        .find(|(k, _)| k == "OPENCODE_CONFIG_CONTENT")
        .unwrap()
        .1;
    let config: serde_json::Value = serde_json::from_str(config).unwrap();
    let permission = &config["permission"];
    assert_eq!(permission["*"], "allow");
    assert_eq!(permission["bash"], "deny");
    assert_eq!(permission["grep"], "deny");
    assert_eq!(permission["websearch"], "deny");
    assert!(permission.get("webfetch").is_none(), "{permission}");
    assert!(permission.get("read").is_none(), "{permission}");

    let gemini = tools_command(ProviderKind::Gemini, &p);
    let settings = gemini
        .home_files
        .iter()
        .find(|f| f.path == ".gemini/settings.json")
        .unwrap();
    let settings: serde_json::Value = serde_json::from_slice(&settings.contents).unwrap();
    let exclude: Vec<&str> = settings["tools"]["exclude"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        exclude.contains(&"run_shell_command") && exclude.contains(&"glob"),
        "{exclude:?}"
    );
    assert!(
        !exclude.contains(&"web_fetch") && !exclude.contains(&"read_file"),
        "{exclude:?}"
    );
    assert_eq!(settings["mcp"]["allowed"], serde_json::json!([]));
    // Every group given again: the earlier lists are written empty or removed.
    let gemini = tools_command(ProviderKind::Gemini, &policy("all", &[], &[]));
    let settings: serde_json::Value =
        serde_json::from_slice(&gemini.home_files[0].contents).unwrap();
    assert_eq!(settings["tools"]["exclude"], serde_json::json!([]));
    assert!(settings["mcp"]["allowed"].is_null() && settings["mcp"].get("allowed").is_some());
}

#[test]
fn tool_calls_get_their_group() {
    use crate::event::Event;
    let call = |name: &str| Event::ToolCall {
        id: "1".into(),
        name: name.into(),
        input: serde_json::Value::Null,
        group: None,
    };
    let mut events = vec![
        call("Bash"),
        call("mcp__srv__echo"),
        call("Task"),
        call("shell"),
    ];
    crate::agent_config::tag_tool_groups(
        ProviderKind::ClaudeCode.adapter().tool_names(),
        &[],
        &mut events,
    );
    let groups: Vec<Option<ToolGroup>> = events
        .iter()
        .map(|e| match e {
            Event::ToolCall { group, .. } => *group,
            _ => None,
        })
        .collect();
    assert_eq!(
        groups,
        [Some(ToolGroup::Shell), Some(ToolGroup::Mcp), None, None]
    );
    let json = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(json["group"], "shell");
    assert_eq!(json["name"], "Bash");
    assert!(serde_json::to_value(&events[2])
        .unwrap()
        .get("group")
        .is_none());
}

const SECRET_VAR_HEADER: &str = "CAW_BOX_MCP_DOCS_X_API_KEY";

fn mcp_command(p: ProviderKind, tools: Option<&ToolPolicy>) -> TurnCommand {
    let mut stdio = McpServer::parse("caw=node /workspace/echo.js", "x").unwrap();
    stdio.env = vec!["ECHO_TOKEN".into()];
    let mut http = McpServer::parse("docs=http://docs:8080/mcp", "x").unwrap();
    http.headers = vec!["X-Api-Key".into()];
    let servers = [stdio, http];
    p.adapter().turn_command(&TurnRequest {
        prompt: "hi",
        model: Some("caw/stub-model"),
        endpoint: Some("http://stub:8080"),
        tools,
        mcp: &servers,
        ..Default::default()
    })
}

/// Every CLI gets both servers in its own config, which names the variables holding the
/// secrets (their values never reach an adapter).
#[test]
fn mcp_servers_map_to_each_clis_config() {
    let claude = mcp_command(ProviderKind::ClaudeCode, None);
    let file = claude
        .home_files
        .iter()
        .find(|f| f.path.ends_with("claude-mcp.json"))
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&file.contents).unwrap();
    assert_eq!(config["mcpServers"]["caw"]["command"], "node");
    assert_eq!(
        config["mcpServers"]["caw"]["env"]["ECHO_TOKEN"],
        "${ECHO_TOKEN}"
    );
    assert_eq!(
        config["mcpServers"]["docs"]["headers"]["X-Api-Key"],
        format!("${{{SECRET_VAR_HEADER}}}")
    );
    assert!(claude
        .argv
        .iter()
        .any(|a| a.starts_with("--mcp-config=/home/agent/")));

    let codex = mcp_command(ProviderKind::Codex, None).argv.join(" ");
    assert!(
        codex.contains("-c mcp_servers.caw.command=\"node\""),
        "{codex}"
    );
    assert!(
        codex.contains("-c mcp_servers.caw.env_vars=[\"ECHO_TOKEN\"]"),
        "{codex}"
    );
    assert!(
        codex.contains(&format!(
            "-c mcp_servers.docs.env_http_headers={{ \"X-Api-Key\" = \"{SECRET_VAR_HEADER}\" }}"
        )),
        "{codex}"
    );

    let opencode = mcp_command(ProviderKind::Opencode, None);
    let config = &opencode
        .env
        .iter()
        .find(|(k, _)| k == "OPENCODE_CONFIG_CONTENT")
        .unwrap()
        .1;
    let config: serde_json::Value = serde_json::from_str(config).unwrap();
    assert_eq!(
        config["mcp"]["caw"]["command"],
        serde_json::json!(["node", "/workspace/echo.js"])
    );
    assert_eq!(
        config["mcp"]["caw"]["environment"]["ECHO_TOKEN"],
        "{env:ECHO_TOKEN}"
    );
    assert_eq!(
        config["mcp"]["docs"]["headers"]["X-Api-Key"],
        format!("{{env:{SECRET_VAR_HEADER}}}")
    );

    let gemini = mcp_command(ProviderKind::Gemini, None);
    let settings: serde_json::Value =
        serde_json::from_slice(&gemini.home_files[0].contents).unwrap();
    assert_eq!(
        settings["mcpServers"]["docs"]["httpUrl"],
        "http://docs:8080/mcp"
    );
    assert_eq!(
        settings["mcpServers"]["docs"]["headers"]["X-Api-Key"],
        format!("${SECRET_VAR_HEADER}")
    );

    // `--tools` without mcp: no server is configured.
    let no_mcp = policy("read,edit,shell,web", &[], &[]);
    let claude = mcp_command(ProviderKind::ClaudeCode, Some(&no_mcp));
    assert!(!claude.argv.iter().any(|a| a.starts_with("--mcp-config")));
    let codex = mcp_command(ProviderKind::Codex, Some(&no_mcp))
        .argv
        .join(" ");
    assert!(!codex.contains("mcp_servers.caw"), "{codex}");
}
