//! Which model to ask an `--endpoint` for when the user named none: the endpoint's own list
//! (`GET /v1/models`), read from where the agent will run (a short container on the
//! session's network, with the turn's key), before anything of the session exists.
//!
//! Only opencode needs this: claude, codex and gemini send a model of their own that any
//! gateway can map, while opencode with an OpenAI-compatible provider and no model fails
//! with an opaque "Unexpected server error".

use std::collections::HashMap;

use serde::Deserialize;

use crate::backend::{Backend, HelperSpec, NetworkPolicy};
use crate::dirs;
use crate::error::{Error, Result};
use crate::provider::ProviderKind;
use crate::session::store::record::{labels, roles, SessionSettings};

/// The model id used when the endpoint answers but keeps no list (no `/v1/models`): such
/// servers serve whatever they were started with, whatever the name.
pub const DEFAULT_ENDPOINT_MODEL: &str = "gpt-4o";

/// Whether a new session of `provider` with `settings` needs [`discover`] first.
pub fn needs_discovery(provider: ProviderKind, settings: &SessionSettings) -> bool {
    provider == ProviderKind::Opencode && settings.endpoint.is_some() && settings.model.is_none()
}

/// Fetches `<endpoint>/v1/models` inside the session's network and prints what came back:
/// `{"status":N,"body":"..."}`, or `{"error":"CODE"}` when no answer came.
const FETCH_SCRIPT: &str = r#"
const url = process.argv[1];
const key = process.env.OPENAI_API_KEY;
const headers = key ? { authorization: "Bearer " + key } : {};
const say = (v) => process.stdout.write(JSON.stringify(v));
fetch(url, { headers, signal: AbortSignal.timeout(15000) })
  .then(async (r) => say({ status: r.status, body: (await r.text()).slice(0, 1000000) }))
  .catch((e) => say({ error: String((e.cause && (e.cause.code || e.cause.message)) || e.name || e) }));
"#;

#[derive(Debug, Deserialize)]
struct Fetched {
    status: Option<u16>,
    #[serde(default)]
    body: String,
    error: Option<String>,
}

/// The model for a new session on `settings.endpoint`, and how it was chosen: the first the
/// endpoint lists, or [`DEFAULT_ENDPOINT_MODEL`] when it keeps no list. Exit 2 (nothing
/// created) when it cannot be asked or lists nothing, saying to pass `--model`.
pub async fn discover(
    backend: &impl Backend,
    provider: ProviderKind,
    settings: &SessionSettings,
    env: &[(String, String)],
) -> Result<(String, &'static str)> {
    let endpoint = settings.endpoint.as_deref().unwrap_or_default();
    let url = format!(
        "{}/v1/models",
        endpoint.trim_end_matches('/').trim_end_matches("/v1")
    );
    let fetched = fetch(backend, provider, settings, env, &url).await?;
    let model = choose(&fetched, &url)?;
    let how = if model == DEFAULT_ENDPOINT_MODEL && fetched.status != Some(200) {
        "the endpoint keeps no model list"
    } else {
        "the first model the endpoint lists"
    };
    Ok((model, how))
}

fn choose(fetched: &Fetched, url: &str) -> Result<String> {
    let pass_model = |why: String| {
        Error::usage(format!("no --model given, and {why}"))
            .with_hint("pass --model with a model the endpoint serves")
    };
    if let Some(error) = &fetched.error {
        return Err(pass_model(format!(
            "{url} could not be asked for its models ({error})"
        )));
    }
    match fetched.status {
        Some(200) => {}
        Some(404 | 405) => return Ok(DEFAULT_ENDPOINT_MODEL.to_string()),
        Some(status) => {
            return Err(pass_model(format!(
                "{url} refused to list its models (HTTP {status})"
            )))
        }
        None => return Err(pass_model(format!("{url} gave no answer"))),
    }
    #[derive(Deserialize)]
    struct Listed {
        id: String,
    }
    #[derive(Deserialize)]
    struct List {
        #[serde(default)]
        data: Vec<Listed>,
    }
    match serde_json::from_str::<List>(&fetched.body) {
        Ok(list) => list
            .data
            .into_iter()
            .map(|m| m.id)
            .find(|id| !id.trim().is_empty())
            .ok_or_else(|| pass_model(format!("{url} lists no models"))),
        // Something that is not an OpenAI-style list: a server without one.
        Err(_) => Ok(DEFAULT_ENDPOINT_MODEL.to_string()),
    }
}

/// Runs the fetch in a short hardened container on the session's network. The key reaches
/// it the way it reaches a turn: through the entrypoint's env file, never container config.
async fn fetch(
    backend: &impl Backend,
    provider: ProviderKind,
    settings: &SessionSettings,
    env: &[(String, String)],
    url: &str,
) -> Result<Fetched> {
    if settings.egress() != crate::session::record::EgressPolicy::Open {
        let allowed = crate::session::walls::admitted::admitted(provider, settings, true);
        let host = crate::endpoint::endpoint_host(url).unwrap_or_default();
        if !allowed
            .iter()
            .any(|a| crate::session::walls::admitted::host_covered(&host, a))
        {
            return Ok(Fetched {
                status: None,
                body: String::new(),
                error: Some(format!(
                    "{host} is refused by the session's egress (--egress {}; --allow-host {host} would allow it)",
                    settings.egress()
                )),
            });
        }
    }
    let result = async {
        let credentials = crate::auth::inject::prepare(provider, env)?;
        // A helper of its own, on a tmpfs HOME: it touches none of a session's files.
        let mut runtime = crate::session::turn::runtime::Runtime::new(dirs::agent_ids());
        for (path, contents) in &credentials.files {
            runtime.write(path, contents);
        }
        let mut env_file = Vec::new();
        for (k, v) in env {
            env_file.extend_from_slice(format!("{k}={v}").as_bytes());
            env_file.push(0);
        }
        runtime.write("env", &env_file);
        let (uid, gid) = runtime.owner();
        let spec = HelperSpec {
            image: settings.image.clone(),
            argv: vec![
                "node".into(),
                "-e".into(),
                FETCH_SCRIPT.into(),
                url.to_string(),
            ],
            // HOME on the tmpfs: the entrypoint places (and removes) credential files there.
            env: vec![
                "HOME=/tmp/home".into(),
                format!("CAW_BOX_RUN_DIR={}", crate::session::turn::runtime::RUN_DIR),
            ],
            user: Some(format!("{uid}:{gid}")),
            labels: crate::session::store::record::with_extra_labels(HashMap::from([
                (labels::MANAGED.to_string(), "true".to_string()),
                (labels::ROLE.to_string(), roles::PROBE.to_string()),
            ])),
            scratch: Some(runtime.into_scratch()),
            network: NetworkPolicy::from_setting(&settings.network),
            read_only_root: true,
            drop_all_capabilities: true,
            no_new_privileges: true,
            pids_limit: Some(64),
            tmp: Some("rw,nosuid,nodev,size=16m".to_string()),
            ..Default::default()
        };
        let name = format!("caw-box-probe-models-{}", uuid::Uuid::new_v4().simple());
        let (code, out, err) = backend.run_to_completion(&name, &spec).await.map_err(|e| {
            crate::session::turn::runner::image_hint_for(e, &settings.image, provider)
        })?;
        serde_json::from_str::<Fetched>(out.trim()).map_err(|_| {
            Error::environment(format!(
                "asking {url} for its models failed (exit {code}): {}",
                err.lines().last().unwrap_or("").trim()
            ))
        })
    }
    .await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, body: &str) -> Fetched {
        Fetched {
            status: Some(status),
            body: body.to_string(),
            error: None,
        }
    }

    #[test]
    fn the_first_listed_model_is_chosen() {
        let list = r#"{"object":"list","data":[{"id":"llama-3"},{"id":"qwen"}]}"#;
        assert_eq!(choose(&answered(200, list), "u").unwrap(), "llama-3");
    }

    #[test]
    fn a_server_without_a_list_gets_the_default() {
        for fetched in [answered(404, "nope"), answered(200, "<html>")] {
            assert_eq!(choose(&fetched, "u").unwrap(), DEFAULT_ENDPOINT_MODEL);
        }
    }

    #[test]
    fn no_answer_an_empty_list_or_a_refusal_asks_for_model() {
        let failures = [
            Fetched {
                status: None,
                body: String::new(),
                error: Some("ENOTFOUND".into()),
            },
            answered(200, r#"{"data":[]}"#),
            answered(401, "{}"),
            answered(500, "{}"),
        ];
        for fetched in failures {
            let e = choose(&fetched, "http://gw:8080/v1/models").unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().contains("--model"), "{e}");
            assert!(e.to_string().contains("http://gw:8080/v1/models"), "{e}");
        }
    }
}
