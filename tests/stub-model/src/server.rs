//! The HTTP side: routing, the credential check, recording, and driving a protocol module
//! through one turn. What to answer lives in `conversation`; how to encode it in the
//! protocol modules.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;

use crate::anthropic::Anthropic;
use crate::chat::Chat;
use crate::code_assist::{account_call, CodeAssist};
use crate::conversation::{
    call_args, example_for_schema, pick_named_tool, pick_shell_tool, pick_tool_search, shell_args,
    Decision, Directives, Outcome, ToolCall, Usage, NO_SHELL_TOOL,
};
use crate::gemini::Gemini;
use crate::hold::{valid_name, Holds, MAX_HOLD};
use crate::inflight::{CountedBody, InFlight};
use crate::protocol::{new_id, Protocol, Rendered, Reply, Turn};
use crate::record::{Record, Recorder};
use crate::responses::{openai_error, Responses};

/// Request bodies larger than this are refused.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// How the server behaves.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// When set, every model request must carry this key (`STUB_EXPECT_KEY`).
    pub expect_key: Option<String>,
    /// Print each record to stdout as a JSON line.
    pub echo: bool,
    /// What `GET /v1/models` lists (`STUB_MODELS`, comma-separated); empty: nothing.
    pub models: Vec<String>,
    /// The account's request limit (`STUB_ACCOUNT_REQUESTS`, `STUB_ACCOUNT_WINDOW`): model
    /// responses then carry the vendor's rate-limit headers (see `account`).
    pub account: Option<crate::account::AccountLimit>,
}

#[derive(Debug)]
struct State {
    config: Config,
    recorder: Recorder,
    /// The OAuth login of `STUB_OAUTH`, if set (see `oauth`).
    oauth: Option<crate::oauth::OAuth>,
    /// When each `LIMIT:` prompt was first seen.
    limited_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// The `HOLD:` names released and the requests held.
    holds: Holds,
    /// OpenAI's device-code login (see `device`).
    device: crate::device::DeviceAuth,
    /// Anthropic's and Google's paste-code logins (see `paste_auth`).
    claude: crate::paste_auth::PasteAuth,
    google: crate::paste_auth::PasteAuth,
    /// The model requests being answered (see `inflight`).
    inflight: Arc<InFlight>,
    /// The requests of `Config::account`'s window.
    account: Option<crate::account::Account>,
    /// The burst of refusals running, if any (see `burst`).
    burst: crate::burst::Burst,
}

/// Serves connections from `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, config: Config) {
    serve_tls(listener, None, config).await
}

/// [`serve`], and with `tls` a second listener whose connections speak TLS (the stub under
/// a vendor's host name, with a certificate of the test's CA): the same state behind both.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Option<(TcpListener, tokio_rustls::TlsAcceptor)>,
    config: Config,
) {
    let state = Arc::new(State {
        recorder: Recorder::new(config.echo),
        oauth: crate::oauth::OAuth::from_env(),
        account: config.account.map(crate::account::Account::new),
        burst: crate::burst::Burst::default(),
        config,
        limited_since: Default::default(),
        holds: Holds::default(),
        device: Default::default(),
        claude: crate::paste_auth::PasteAuth::new(crate::paste_auth::Vendor::Anthropic),
        google: crate::paste_auth::PasteAuth::new(crate::paste_auth::Vendor::Google),
        inflight: Arc::default(),
    });
    if let Some((tls_listener, acceptor)) = tls {
        let state = Arc::clone(&state);
        tokio::spawn(accept_loop(tls_listener, Some(acceptor), state));
    }
    accept_loop(listener, None, state).await
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                eprintln!("stub-model: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&state), request));
            let served = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(err) => {
                        eprintln!("stub-model: TLS handshake failed: {err}");
                        return;
                    }
                },
                None => {
                    http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(err) = served {
                eprintln!("stub-model: connection error: {err}");
            }
        });
    }
}

/// A response, plus what goes into the record.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
    retry_after: bool,
    directive: String,
    tool: Option<String>,
    /// `HOLD:` and `SLEEP:`: what the answer waits for first.
    wait: Option<Box<Wait>>,
    /// Headers beyond the usual ones (a vendor's rate-limit headers).
    headers: Option<Box<ExtraHeaders>>,
}

/// What an answer waits for, boxed: most answers wait for nothing.
#[derive(Debug, PartialEq)]
struct Wait {
    /// `HOLD:<name>`: until the test releases `<name>`.
    hold: Option<String>,
    /// `SLEEP:<seconds>`: then this long.
    sleep: Option<Duration>,
}

impl Wait {
    fn of(decision: &Decision) -> Option<Box<Wait>> {
        let wait = Wait {
            hold: decision.hold.clone(),
            sleep: decision.sleep,
        };
        (wait.hold.is_some() || wait.sleep.is_some()).then(|| Box::new(wait))
    }
}

/// Headers beyond the usual ones, boxed: most answers have none.
#[derive(Debug)]
struct ExtraHeaders(Vec<(&'static str, String)>);

impl Answer {
    fn json(status: u16, body: &Value, directive: &str) -> Self {
        Answer::rendered(status, Rendered::json(body), directive)
    }

    fn rendered(status: u16, rendered: Rendered, directive: &str) -> Self {
        Answer {
            status,
            content_type: rendered.content_type,
            body: rendered.body,
            retry_after: status == 429,
            directive: directive.to_string(),
            tool: None,
            wait: None,
            headers: None,
        }
    }
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<CountedBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    // A model turn counts in flight from now until its body is sent or dropped, and against
    // the account's window.
    let wire = turn_wire(&resolve(&parts.method, &path), &path);
    let counted = wire.map(|_| state.inflight.enter());
    let inflight = counted
        .as_ref()
        .map_or_else(|| state.inflight.now(), |c| c.at_arrival);
    let standing = wire.and(state.account.as_ref()).map(|a| a.count());
    let body = Limited::new(body, MAX_BODY_BYTES).collect().await;

    let (answer, recorded_body, key_header) = match body {
        Ok(collected) => {
            let bytes = collected.to_bytes();
            let key = presented_key(&parts, state.config.expect_key.as_deref());
            let answer = if path.starts_with("/_stub/") {
                stub_endpoint(&state, &parts.method, &path, parts.uri.query()).await
            } else {
                match standing.and_then(|s| s.refused_for(std::time::Instant::now())) {
                    Some(left) => exhausted(&parts, &path, left),
                    None => route(&state, &parts, &bytes, key).await,
                }
            };
            (answer, recorded_body(&bytes), key.map(|k| k.0))
        }
        Err(err) => {
            let message = format!("could not read the request body: {err}");
            let answer = Answer::json(413, &openai_error(413, &message), "bad_body");
            (answer, Value::Null, None)
        }
    };

    if !path.starts_with("/_stub/") {
        state.recorder.record(&Record {
            method: parts.method.to_string(),
            path,
            query: parts.uri.query().map(str::to_string),
            headers: header_map(&parts),
            body: recorded_body,
            status: answer.status,
            key_header,
            directive: answer.directive.clone(),
            tool: answer.tool.clone(),
            usage: crate::record::sent_usage(&answer.body),
            inflight,
        });
    }
    // Recorded first: the record tells a test the request came, while it is held.
    if let Some(wait) = &answer.wait {
        if let Some(name) = &wait.hold {
            state.holds.hold(name, MAX_HOLD).await;
        }
        if let Some(sleep) = wait.sleep {
            tokio::time::sleep(sleep).await;
        }
    }
    let mut response = into_response(answer);
    if let (Some(standing), Some(wire)) = (standing, wire) {
        account_headers(&mut response, &standing, wire);
    }
    Ok(response.map(|body| CountedBody::new(body, counted)))
}

/// The account's rate-limit headers on a model response, success or error alike (see
/// `account`). Headers the answer set itself (a `QUOTA:` 429's) win.
fn account_headers(
    response: &mut Response<Full<Bytes>>,
    standing: &crate::account::Standing,
    wire: &str,
) {
    let headers = response.headers_mut();
    for (name, value) in standing.headers(wire, std::time::Instant::now()) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers
                .entry(HeaderName::from_static(name))
                .or_insert(value);
        }
    }
}

fn into_response(answer: Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() =
        StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    if answer.content_type == "text/event-stream" {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if answer.retry_after {
        headers.insert("retry-after", HeaderValue::from_static("0"));
    }
    for (name, value) in answer.headers.map(|h| h.0).unwrap_or_default() {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    response
}

/// The stub's own endpoints (`/_stub/...`), not recorded.
async fn stub_endpoint(state: &State, method: &Method, path: &str, query: Option<&str>) -> Answer {
    if let Some(name) = path.strip_prefix("/_stub/release/") {
        return match (method, valid_name(name)) {
            (&Method::POST, true) => {
                let waiting = state.holds.release(name);
                Answer::json(
                    200,
                    &json!({"released": name, "waiting": waiting}),
                    "release",
                )
            }
            _ => not_found(method, path),
        };
    }
    if let Some(name) = path.strip_prefix("/_stub/holds/") {
        return match (method, valid_name(name)) {
            (&Method::GET, true) => {
                let param = |key: &str| {
                    query?
                        .split('&')
                        .filter_map(|pair| pair.split_once('='))
                        .find_map(|(k, v)| (k == key).then_some(v))
                };
                let at_least = param("min").and_then(|v| v.parse().ok()).unwrap_or(1);
                let wait = param("wait")
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|s| !s.is_nan())
                    .map_or(Duration::ZERO, |s| {
                        Duration::from_secs_f64(s.clamp(0.0, MAX_HOLD.as_secs_f64()))
                    });
                state.holds.until_waiting(name, at_least, wait).await;
                Answer::json(200, &state.holds.status_of(name), "holds")
            }
            _ => not_found(method, path),
        };
    }
    let paste = [
        ("/_stub/claude/", &state.claude),
        ("/_stub/google/", &state.google),
    ];
    if let Some((action, auth)) = paste
        .iter()
        .find_map(|(prefix, auth)| Some((path.strip_prefix(prefix)?, auth)))
    {
        let url = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("url="))
            .map(crate::oauth::decode)
            .unwrap_or_default();
        return match (method, auth.control(action, &url)) {
            (&Method::POST, Some(body)) => Answer::json(200, &body, "paste_authorize"),
            _ => not_found(method, path),
        };
    }
    if let Some(action) = path.strip_prefix("/_stub/device/") {
        let code = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("code="));
        return match (method, state.device.control(action, code)) {
            (&Method::POST, Some(body)) => Answer::json(200, &body, "device"),
            _ => not_found(method, path),
        };
    }
    match (method, path) {
        (&Method::GET, "/_stub/device") => Answer::json(200, &state.device.status(), "device"),
        (&Method::GET, "/_stub/claude") => Answer::json(200, &state.claude.status(), "claude"),
        (&Method::GET, "/_stub/google") => Answer::json(200, &state.google.status(), "google"),
        (&Method::GET, "/_stub/health") => Answer {
            content_type: "text/plain; charset=utf-8",
            body: "ok\n".into(),
            ..Answer::json(200, &Value::Null, "health")
        },
        (&Method::GET, "/_stub/requests") => {
            Answer::json(200, &Value::Array(state.recorder.all()), "requests")
        }
        (&Method::GET, "/_stub/holds") => Answer::json(200, &state.holds.status(), "holds"),
        (&Method::GET, "/_stub/burst") => Answer::json(200, &state.burst.status(), "burst"),
        (&Method::POST, "/_stub/burst") => match state.burst.start(query) {
            Ok(status) => Answer::json(200, &status, "burst"),
            Err(e) => Answer::json(400, &json!({"error": e}), "burst"),
        },
        (&Method::GET, "/_stub/inflight") => {
            Answer::json(200, &state.inflight.status(), "inflight")
        }
        (&Method::POST, "/_stub/inflight/reset") => {
            Answer::json(200, &state.inflight.reset(), "inflight_reset")
        }
        (&Method::GET, "/_stub/oauth") => match &state.oauth {
            Some(o) => Answer::json(200, &o.status(), "oauth"),
            None => not_found(method, path),
        },
        (&Method::POST, "/_stub/oauth/expire") => {
            let hold = query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|pair| pair.strip_prefix("hold="));
            match (&state.oauth, hold) {
                (Some(_), Some(name)) if !valid_name(name) => not_found(method, path),
                (Some(o), hold) => {
                    o.expire(hold);
                    Answer::json(200, &o.status(), "oauth_expire")
                }
                (None, _) => not_found(method, path),
            }
        }
        _ => not_found(method, path),
    }
}

/// OpenAI's device-code login (`device`) or Anthropic's or Google's paste-code login
/// (`paste_auth`), if `parts` asks for a step of one.
fn device_route(state: &State, parts: &Parts, bytes: &Bytes) -> Option<Answer> {
    if parts.method == Method::GET {
        let (body, what) = match parts.uri.path() {
            "/api/oauth/profile" => (crate::paste_auth::PasteAuth::profile(), "claude_profile"),
            "/api/oauth/claude_cli/roles" => {
                (crate::paste_auth::PasteAuth::roles(), "claude_roles")
            }
            "/oauth2/v2/userinfo" => (crate::paste_auth::PasteAuth::userinfo(), "google_userinfo"),
            _ => return None,
        };
        let bearer = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !state.oauth.as_ref().is_some_and(|o| o.accepts(bearer)) {
            let body = json!({"type": "error", "error": {"type": "authentication_error",
                              "message": "stub-model: not the access token valid now"}});
            return Some(Answer::json(401, &body, what));
        }
        return Some(Answer::json(200, &body, what));
    }
    if parts.method != Method::POST {
        return None;
    }
    let (status, body, what) = match parts.uri.path() {
        "/api/accounts/deviceauth/usercode" => {
            let (s, b) = state.device.user_code();
            (s, b, "device_usercode")
        }
        "/api/accounts/deviceauth/token" => {
            let (s, b) = state.device.poll(bytes);
            (s, b, "device_poll")
        }
        "/v1/oauth/token" if crate::device::is_code_grant(bytes) => {
            let (s, b) = match &state.oauth {
                Some(o) => state.claude.exchange(bytes, || login_tokens(o)),
                None => (400, json!({"error": "invalid_grant"})),
            };
            (s, b, "claude_exchange")
        }
        "/token" if crate::device::is_code_grant(bytes) => {
            let (s, b) = match &state.oauth {
                Some(o) => state.google.exchange(bytes, || login_tokens(o)),
                None => (400, json!({"error": "invalid_grant"})),
            };
            (s, b, "google_exchange")
        }
        "/oauth/token" if crate::device::is_code_grant(bytes) => {
            let (s, b) = match &state.oauth {
                Some(o) => state.device.exchange(bytes, || o.login_tokens()),
                None => (400, json!({"error": "invalid_grant"})),
            };
            (s, b, "device_exchange")
        }
        _ => return None,
    };
    Some(Answer::json(status, &body, what))
}

/// The login an approved paste code is traded for: access and refresh token, seconds left.
fn login_tokens(o: &crate::oauth::OAuth) -> (String, String, u64) {
    let t = o.login_tokens();
    let text = |k: &str| t[k].as_str().unwrap_or_default().to_string();
    let left = t["expires_in"].as_u64().unwrap_or_default();
    (text("access_token"), text("refresh_token"), left)
}

fn not_found(method: &Method, path: &str) -> Answer {
    let message = format!("stub-model has no route for {method} {path}");
    let body = json!({"error":{"message":message,"type":"not_found_error","code":"not_found"}});
    Answer::json(404, &body, "not_found")
}

/// What a request path asks for.
#[derive(Debug)]
enum Route {
    Probe,
    Turn {
        protocol: &'static dyn Protocol,
        /// Gemini names the model and the streaming mode in the path.
        model: Option<String>,
        stream: Option<bool>,
    },
    CountTokens(&'static dyn Protocol),
    ListModels(&'static dyn Protocol),
    Model(&'static dyn Protocol, String),
    /// A Code Assist account call (`/v1internal:loadCodeAssist`, ...).
    Account(String),
    NotFound,
}

impl Route {
    fn protocol(&self) -> Option<&'static dyn Protocol> {
        match self {
            Route::Turn { protocol, .. }
            | Route::CountTokens(protocol)
            | Route::ListModels(protocol)
            | Route::Model(protocol, _) => Some(*protocol),
            Route::Account(_) => Some(&CodeAssist),
            Route::Probe | Route::NotFound => None,
        }
    }
}

fn resolve(method: &Method, path: &str) -> Route {
    let gemini_prefix = ["/v1beta/models/", "/v1alpha/models/", "/v1/models/"]
        .iter()
        .find_map(|prefix| path.strip_prefix(prefix));
    if let Some(call) = path.strip_prefix("/v1internal:") {
        return match (method, call) {
            (&Method::POST, "streamGenerateContent") => code_assist_turn(true),
            (&Method::POST, "generateContent") => code_assist_turn(false),
            (&Method::POST, "countTokens") => Route::CountTokens(&CodeAssist),
            (&Method::POST | &Method::GET, name) if !name.is_empty() && !name.contains('/') => {
                Route::Account(name.to_string())
            }
            _ => Route::NotFound,
        };
    }
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/") => Route::Probe,
        (&Method::POST, "/v1/messages") => turn(&Anthropic),
        (&Method::POST, "/v1/messages/count_tokens") => Route::CountTokens(&Anthropic),
        (&Method::POST, "/v1/responses") => turn(&Responses),
        // A ChatGPT login's Responses API (opencode's built-in codex plugin posts here).
        (&Method::POST, "/backend-api/codex/responses") => turn(&Responses),
        (&Method::POST, "/v1/chat/completions") => turn(&Chat),
        (&Method::GET, "/v1/models") => Route::ListModels(&Responses),
        (&Method::GET, "/v1beta/models" | "/v1alpha/models") => Route::ListModels(&Gemini),
        (&Method::POST, _) => match gemini_prefix.and_then(|rest| rest.rsplit_once(':')) {
            Some((model, "streamGenerateContent")) => gemini_turn(model, true),
            Some((model, "generateContent")) => gemini_turn(model, false),
            Some((_, "countTokens")) => Route::CountTokens(&Gemini),
            _ => Route::NotFound,
        },
        (&Method::GET, _) => match gemini_prefix {
            Some(id) if !id.is_empty() && !id.contains('/') => {
                let protocol: &'static dyn Protocol = if path.starts_with("/v1/") {
                    &Responses
                } else {
                    &Gemini
                };
                Route::Model(protocol, id.to_string())
            }
            _ => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

/// The wire a model turn speaks (`google`, `anthropic` or `openai`), `None` for any other
/// request.
fn turn_wire(route: &Route, path: &str) -> Option<&'static str> {
    let Route::Turn { model, .. } = route else {
        return None;
    };
    // Gemini names the model in the path.
    Some(if model.is_some() || path.starts_with("/v1internal:") {
        "google"
    } else if path.ends_with("/messages") {
        "anthropic"
    } else {
        "openai"
    })
}

fn turn(protocol: &'static dyn Protocol) -> Route {
    Route::Turn {
        protocol,
        model: None,
        stream: None,
    }
}

fn code_assist_turn(stream: bool) -> Route {
    Route::Turn {
        protocol: &CodeAssist,
        model: None,
        stream: Some(stream),
    }
}

fn gemini_turn(model: &str, stream: bool) -> Route {
    Route::Turn {
        protocol: &Gemini,
        model: Some(model.to_string()),
        stream: Some(stream),
    }
}

/// The credential a request presented: where it came from, and whether it is the expected one
/// (always true when no key is expected).
type PresentedKey = (&'static str, bool);

fn presented_key(parts: &Parts, expected: Option<&str>) -> Option<PresentedKey> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let bearer = header("authorization").map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
    let query_key = parts.uri.query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find_map(|(k, v)| (k == "key").then_some(v))
    });
    let candidates = [
        ("x-api-key", header("x-api-key")),
        ("authorization", bearer),
        ("x-goog-api-key", header("x-goog-api-key")),
        ("query:key", query_key),
    ];
    let presented = candidates
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)));
    let mut first = None;
    for (name, value) in presented {
        let matches = expected.is_none_or(|e| e == value);
        if matches {
            return Some((name, true));
        }
        first.get_or_insert((name, false));
    }
    first
}

async fn route(state: &State, parts: &Parts, bytes: &Bytes, key: Option<PresentedKey>) -> Answer {
    if let Some(answer) = device_route(state, parts, bytes) {
        return answer;
    }
    if let (Some(o), &Method::POST, "/v1/oauth/token" | "/oauth/token") =
        (&state.oauth, &parts.method, parts.uri.path())
    {
        let (status, body) = o.token(bytes);
        return Answer::json(status, &body, "oauth_token");
    }
    let route = resolve(&parts.method, parts.uri.path());
    let Some(protocol) = route.protocol() else {
        return match route {
            Route::Probe => Answer::json(200, &json!({"status":"ok"}), "probe"),
            _ => not_found(&parts.method, parts.uri.path()),
        };
    };
    let bearer = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
    // With an OAuth login, its access token is the credential (not `STUB_EXPECT_KEY`);
    // a request with a key of the vendor's own header and no bearer token is a key's.
    let by_login = state.oauth.is_some() && (bearer.is_some() || key.is_none());
    if let Some(o) = state.oauth.as_ref().filter(|_| by_login) {
        if let Some(gate) = o.gate() {
            state.holds.hold(&gate, MAX_HOLD).await;
        }
        if !o.accepts(bearer) {
            let message = "stub-model: the OAuth access token is not the one valid now";
            return Answer::json(401, &protocol.error_body(401, message), "unauthorized");
        }
    }
    if !by_login && state.config.expect_key.is_some() && !key.is_some_and(|(_, ok)| ok) {
        let message = match key {
            Some((name, _)) => format!("stub-model: the key in {name} is not the expected one"),
            None => "stub-model: no API key in x-api-key, authorization, x-goog-api-key or ?key="
                .to_string(),
        };
        return Answer::json(401, &protocol.error_body(401, &message), "unauthorized");
    }
    let wire = turn_wire(&route, parts.uri.path()).unwrap_or("openai");
    match route {
        Route::ListModels(_)
            if !state.config.models.is_empty() && parts.uri.path() == "/v1/models" =>
        {
            let data: Vec<Value> = state
                .config
                .models
                .iter()
                .map(|id| protocol.model_info(id))
                .collect();
            Answer::json(200, &json!({"object": "list", "data": data}), "models")
        }
        Route::ListModels(_) => Answer::json(200, &protocol.model_list(), "models"),
        Route::Model(_, id) => Answer::json(200, &protocol.model_info(&id), "model"),
        Route::Account(method) => Answer::json(200, &account_call(&method), "code_assist"),
        Route::CountTokens(_) => match parse_body(protocol, bytes) {
            Ok(_) => Answer::json(200, &protocol.count_tokens(bytes.len() / 4), "count_tokens"),
            Err(answer) => answer,
        },
        Route::Turn { model, stream, .. } => match parse_body(protocol, bytes) {
            Ok(body) => {
                // Gemini names the model in the path.
                let model = model.unwrap_or_else(|| protocol.model(&body));
                let stream = stream.unwrap_or_else(|| protocol.stream(&body));
                if let Some((status, retry_after)) = state.burst.refuse() {
                    return burst_refusal(protocol, status, retry_after);
                }
                limited(state, protocol, &body, wire)
                    .unwrap_or_else(|| model_turn(protocol, &body, bytes.len(), model, stream))
            }
            Err(answer) => answer,
        },
        Route::Probe | Route::NotFound => not_found(&parts.method, parts.uri.path()),
    }
}

/// A `LIMIT:<seconds>` or `QUOTA:<seconds>` prompt within its window: a 429 naming its
/// reset. `LIMIT:` in the API's own words (OpenAI's `Please try again in 5s.`, Google's
/// `Please retry in 5s.`); `QUOTA:` as the vendor's subscription usage limit (see [`quota`]).
fn limited(state: &State, protocol: &dyn Protocol, body: &Value, wire: &str) -> Option<Answer> {
    let conversation = protocol.conversation(body);
    let text = conversation.latest_user_text().to_string();
    let directives = Directives::parse(&text);
    let on_wire = |d: &Option<(Duration, Option<String>)>| {
        d.clone()
            .filter(|(_, only)| only.as_deref().is_none_or(|w| w == wire))
    };
    let (window, subscription) = match (on_wire(&directives.limit), on_wire(&directives.quota)) {
        (Some((w, _)), _) => (w, false),
        (None, Some((w, _))) => (w, true),
        (None, None) => return None,
    };
    let now = std::time::Instant::now();
    let since = *state
        .limited_since
        .lock()
        .expect("not poisoned")
        .entry(text)
        .or_insert(now);
    let left = window.checked_sub(now.duration_since(since))?;
    if left.is_zero() {
        return None;
    }
    let secs = left.as_secs_f64().ceil() as u64;
    if subscription {
        return Some(quota(protocol, wire, left));
    }
    let message = if wire == "google" {
        format!("Quota exceeded for quota metric 'Generate Content API requests per minute'. Please retry in {secs}s.")
    } else {
        format!("Rate limit reached for requests per min (RPM). Please try again in {secs}s.")
    };
    // `retry-after: 0` as on any 429 of the stub: every CLI waits out a longer
    // `retry-after` on its own (each did, for 6 s), and a vendor's usage limit is hours.
    Some(Answer::json(
        429,
        &protocol.error_body(429, &message),
        "limit",
    ))
}

/// A model request refused by a burst (`burst`): the vendor's rate-limit (429) or overload
/// (529) error, with the burst's `retry-after`.
fn burst_refusal(protocol: &dyn Protocol, status: u16, retry_after: u64) -> Answer {
    let message = match status {
        529 => "Overloaded".to_string(),
        _ => "Rate limit exceeded: too many requests at once. Please retry shortly.".to_string(),
    };
    Answer {
        retry_after: false,
        headers: Some(Box::new(ExtraHeaders(vec![(
            "retry-after",
            retry_after.to_string(),
        )]))),
        ..Answer::json(status, &protocol.error_body(status, &message), "burst")
    }
}

/// A model request past the account's enforced limit (`STUB_ACCOUNT_ENFORCE`): the vendor's
/// usage limit, resetting at the window's end, `left` from now.
fn exhausted(parts: &Parts, path: &str, left: Duration) -> Answer {
    let route = resolve(&parts.method, path);
    match (route.protocol(), turn_wire(&route, path)) {
        (Some(protocol), Some(wire)) => quota(protocol, wire, left),
        _ => not_found(&parts.method, path),
    }
}

/// A subscription usage limit that resets in `left`, as each vendor answers it:
/// - Anthropic: `anthropic-ratelimit-unified-status: rejected` with the reset as a Unix time
///   in `anthropic-ratelimit-unified-reset` and the window in `-representative-claim`
///   (the headers claude 2.1.197 reads into "You've hit your session limit · resets …").
/// - OpenAI: an `usage_limit_reached` error with `plan_type`, `resets_at` (Unix time) and
///   `resets_in_seconds` (the fields codex 0.169.0 reads into "… Try again at …").
/// - Google: `RESOURCE_EXHAUSTED` with a `QuotaFailure` and a `RetryInfo` `retryDelay`
///   (what gemini 0.61.0 classifies into a retryable or terminal quota error).
fn quota(protocol: &dyn Protocol, wire: &str, left: Duration) -> Answer {
    let secs = left.as_secs_f64().ceil() as u64;
    let reset_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(left)
        .as_secs_f64()
        .ceil() as u64;
    match wire {
        "anthropic" => {
            let body = protocol.error_body(
                429,
                "This request would exceed your account's rate limit. Please try again later.",
            );
            let mut answer = Answer::json(429, &body, "quota");
            answer.headers = Some(Box::new(ExtraHeaders(vec![
                ("anthropic-ratelimit-unified-status", "rejected".into()),
                ("anthropic-ratelimit-unified-reset", reset_at.to_string()),
                (
                    "anthropic-ratelimit-unified-representative-claim",
                    "five_hour".into(),
                ),
                ("anthropic-ratelimit-unified-5h-status", "rejected".into()),
                ("anthropic-ratelimit-unified-5h-reset", reset_at.to_string()),
                ("anthropic-ratelimit-unified-5h-utilization", "1.0".into()),
            ])));
            answer
        }
        "google" => {
            let body = json!({"error":{
            "code": 429,
            "message": format!("You exceeded your current quota, please check your plan and billing details. Please retry in {secs}s."),
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                    "quotaDimensions": {"location": "global", "model": "gemini-2.5-pro"},
                    "quotaValue": "2"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": format!("{secs}s")}
            ]}});
            Answer::json(429, &body, "quota")
        }
        _ => {
            let body = json!({"error":{
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                "plan_type": "plus",
                "resets_at": reset_at,
                "resets_in_seconds": secs}});
            Answer::json(429, &body, "quota")
        }
    }
}

fn parse_body(protocol: &dyn Protocol, bytes: &Bytes) -> Result<Value, Answer> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(body @ Value::Object(_)) => Ok(body),
        Ok(_) => Err(bad_request(
            protocol,
            "the request body is not a JSON object",
        )),
        Err(err) => Err(bad_request(
            protocol,
            &format!("the request body is not JSON: {err}"),
        )),
    }
}

fn bad_request(protocol: &dyn Protocol, message: &str) -> Answer {
    Answer::json(400, &protocol.error_body(400, message), "bad_json")
}

/// One conversation turn: decide, pick the reply, encode it.
fn model_turn(
    protocol: &dyn Protocol,
    body: &Value,
    body_len: usize,
    model: String,
    stream: bool,
) -> Answer {
    let conversation = protocol.conversation(body);
    let mut decision = Decision::decide(&conversation);
    let mut tool = None;
    let reply = match &decision.outcome {
        Outcome::Fail(status) => {
            let message = format!("stub-model failed this request on purpose (FAIL:{status})");
            let mut answer = Answer::json(
                *status,
                &protocol.error_body(*status, &message),
                &decision.label(),
            );
            answer.wait = Wait::of(&decision);
            return answer;
        }
        _ if protocol.output_schema(body).is_some() => {
            let schema = protocol.output_schema(body).unwrap_or(&Value::Null);
            let text = example_for_schema(schema).to_string();
            decision.outcome = Outcome::Text {
                text: text.clone(),
                label: "structured".into(),
            };
            Reply::Text { text, think: false }
        }
        Outcome::Text { text, .. } => Reply::Text {
            text: text.clone(),
            think: decision.think,
        },
        Outcome::Call { tool: wanted, text } => {
            let tools = protocol.tools(body);
            // A tool not offered yet may be found by the client's tool search (codex offers
            // its MCP tools so): search for it once, then call what the search loaded.
            let search = pick_tool_search(tools.clone()).filter(|_| !conversation.searched);
            match (pick_named_tool(tools, wanted), search) {
                (Some(called), _) => {
                    tool = Some(called.name.clone());
                    Reply::ToolCall(ToolCall {
                        id: new_id(protocol.call_id_prefix()),
                        args: call_args(&called.schema, text),
                        name: called.name,
                        kind: called.kind,
                    })
                }
                (None, Some(search)) => {
                    tool = Some(search.name.clone());
                    Reply::ToolCall(ToolCall {
                        id: new_id(protocol.call_id_prefix()),
                        args: json!({ "query": wanted }),
                        name: search.name,
                        kind: search.kind,
                    })
                }
                (None, None) => {
                    let said = format!("No tool {wanted} offered.");
                    decision.outcome = Outcome::Text {
                        text: said.clone(),
                        label: "no_such_tool".into(),
                    };
                    Reply::Text {
                        text: said,
                        think: decision.think,
                    }
                }
            }
        }
        Outcome::Run(command) => match pick_shell_tool(protocol.tools(body)) {
            Some(shell) => {
                tool = Some(shell.name.clone());
                Reply::ToolCall(ToolCall {
                    id: new_id(protocol.call_id_prefix()),
                    args: shell_args(&shell.schema, command),
                    name: shell.name,
                    kind: shell.kind,
                })
            }
            None => {
                decision.outcome = Outcome::Text {
                    text: NO_SHELL_TOOL.into(),
                    label: "no_shell_tool".into(),
                };
                Reply::Text {
                    text: NO_SHELL_TOOL.into(),
                    think: decision.think,
                }
            }
        },
    };
    let turn = Turn {
        body,
        model,
        stream,
        usage: Usage::estimate(body_len, &reply.output_chars()),
    };
    let mut answer = Answer::rendered(200, protocol.render(&reply, &turn), &decision.label());
    answer.tool = tool;
    answer.wait = Wait::of(&decision);
    answer
}

fn recorded_body(bytes: &Bytes) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn header_map(parts: &Parts) -> Map<String, Value> {
    let mut headers = Map::new();
    for name in parts.headers.keys() {
        let values: Vec<String> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        headers.insert(name.as_str().to_string(), json!(values.join(", ")));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_every_protocol() {
        let post = Method::POST;
        let is_turn = |path: &str| matches!(resolve(&post, path), Route::Turn { .. });
        assert!(is_turn("/v1/messages"));
        assert!(is_turn("/v1/responses"));
        assert!(is_turn("/backend-api/codex/responses"));
        assert!(matches!(
            resolve(&post, "/backend-api/codex/responses"),
            Route::Turn { protocol, .. } if format!("{protocol:?}") == format!("{Responses:?}")
        ));
        assert!(is_turn("/v1/chat/completions"));
        match resolve(&post, "/v1beta/models/gemini-2.5-pro:streamGenerateContent") {
            Route::Turn { model, stream, .. } => {
                assert_eq!(model.as_deref(), Some("gemini-2.5-pro"));
                assert_eq!(stream, Some(true));
            }
            other => panic!("unexpected {other:?}"),
        }
        match resolve(&post, "/v1beta/models/flash-lite:generateContent") {
            Route::Turn { stream, .. } => assert_eq!(stream, Some(false)),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            resolve(&post, "/v1/messages/count_tokens"),
            Route::CountTokens(_)
        ));
        assert!(matches!(resolve(&Method::HEAD, "/"), Route::Probe));
        match resolve(&post, "/v1internal:streamGenerateContent") {
            Route::Turn { stream, model, .. } => assert_eq!((stream, model), (Some(true), None)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve(&post, "/v1internal:loadCodeAssist"),
            Route::Account(m) if m == "loadCodeAssist"
        ));
        assert!(matches!(resolve(&post, "/v1internal:x/y"), Route::NotFound));
        assert!(matches!(
            resolve(&Method::GET, "/v1beta/models"),
            Route::ListModels(_)
        ));
        assert!(matches!(
            resolve(&Method::GET, "/v1beta/models/gemini-2.5-pro"),
            Route::Model(..)
        ));
        assert!(matches!(resolve(&post, "/v2/other"), Route::NotFound));
        assert!(matches!(
            resolve(&Method::GET, "/v1/messages"),
            Route::NotFound
        ));
        assert!(matches!(
            resolve(&post, "/v1beta/models/x:embedContent"),
            Route::NotFound
        ));
    }

    fn parts(headers: &[(&str, &str)], uri: &str) -> Parts {
        let mut builder = Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn finds_the_key_in_any_vendor_header() {
        let expect = Some("k1");
        let cases = [
            (parts(&[("x-api-key", "k1")], "/"), "x-api-key"),
            (
                parts(&[("authorization", "Bearer k1")], "/"),
                "authorization",
            ),
            (parts(&[("x-goog-api-key", "k1")], "/"), "x-goog-api-key"),
            (parts(&[], "/v1beta/models/m:x?alt=sse&key=k1"), "query:key"),
        ];
        for (parts, name) in cases {
            assert_eq!(presented_key(&parts, expect), Some((name, true)));
        }
        let wrong = parts(
            &[("x-api-key", "nope"), ("authorization", "Bearer k1")],
            "/",
        );
        assert_eq!(presented_key(&wrong, expect), Some(("authorization", true)));
        let only_wrong = parts(&[("x-api-key", "nope")], "/");
        assert_eq!(
            presented_key(&only_wrong, expect),
            Some(("x-api-key", false))
        );
        assert_eq!(presented_key(&parts(&[], "/"), expect), None);
        assert_eq!(presented_key(&only_wrong, None), Some(("x-api-key", true)));
    }

    #[test]
    fn a_turn_without_a_shell_tool_says_so() {
        let body = json!({"messages":[{"role":"user","content":"RUN:ls"}]});
        let answer = model_turn(&Chat, &body, 10, "m".into(), false);
        assert_eq!(answer.status, 200);
        assert_eq!(answer.directive, "no_shell_tool");
        let completion: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(
            completion["choices"][0]["message"]["content"],
            NO_SHELL_TOOL
        );
    }

    #[test]
    fn a_structured_request_gets_json_matching_its_schema() {
        let body = json!({
            "contents":[{"role":"user","parts":[{"text":"RUN:ls"}]}],
            "generationConfig":{"responseJsonSchema":{"type":"object","properties":{
                "complexity_reasoning":{"type":"string"},"complexity_score":{"type":"integer"}}}}});
        let answer = model_turn(&Gemini, &body, 10, "m".into(), false);
        assert_eq!(answer.directive, "structured");
        let response: Value = serde_json::from_str(&answer.body).unwrap();
        let text = response["candidates"][0]["content"]["parts"][0]["text"]
            .as_str()
            .unwrap();
        let routed: Value = serde_json::from_str(text).unwrap();
        assert_eq!(routed["complexity_score"], 1);
        assert_eq!(routed["complexity_reasoning"], "stub");
    }

    #[test]
    fn a_run_calls_the_tool_and_names_it() {
        let body = json!({"messages":[{"role":"user","content":"RUN:ls SLEEP:0.5"}],
            "tools":[{"name":"Bash","input_schema":{"type":"object",
            "properties":{"command":{"type":"string"}},"required":["command"]}}]});
        let answer = model_turn(&Anthropic, &body, 10, "m".into(), false);
        assert_eq!(answer.tool.as_deref(), Some("Bash"));
        assert_eq!(answer.directive, "run+sleep:0.5");
        let wait = answer.wait.as_deref();
        assert_eq!(wait.and_then(|w| w.sleep), Some(Duration::from_millis(500)));
        assert_eq!(wait.and_then(|w| w.hold.as_deref()), None);
        let message: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(message["content"][0]["type"], "tool_use");
        assert_eq!(message["content"][0]["input"]["command"], "ls SLEEP:0.5");
        assert!(message["content"][0]["id"]
            .as_str()
            .unwrap()
            .starts_with("toolu_"));
    }
}
