//! Property tests of every parser of untrusted input (issue 13: "untrusted input is fuzzed"):
//! the four vendor stream parsers, the resume-handle decoder, TARGET classification and
//! lookup, the `--env`, `--allow-host`, duration and size parsers, and the credential-file
//! expiry parsers.
//!
//! Inputs are generated with some knowledge of their shape: vendor lines are the recorded
//! lines under `tests/fixtures/<provider>/`, mutated (values replaced by huge numbers,
//! NaN-ish strings, arbitrary unicode, deep nesting; keys dropped or added from the vendor's
//! own vocabulary; `type` tags swapped; text truncated), mixed with arbitrary text. Every
//! parser must return (no panic) within a bounded time (no hang), reject bad input with a
//! value rather than a panic, and keep the round trips it promises.
//!
//! `CAW_BOX_FUZZ_CASES` sets the inputs per parser (default 256, so `make test` stays quick;
//! `make fuzz` runs 1,000,000 in a release build). `CAW_BOX_FUZZ_SEED` replays a run: a
//! failure prints the seed it ran with. `CAW_BOX_FUZZ_REPORT=FILE` appends one line per
//! parser: name, inputs, seconds, slowest input.
//!
//! Not here: anything that needs Docker (TARGET resolution against volumes is e2e).
// The harness reports a hang on stderr just before it aborts: nothing else can.
#![allow(clippy::print_stderr)]

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use caw_box::auth::spec::{self, Expiry, Spec};
use caw_box::auth::Secret;
use caw_box::backend::{BackendKind, Scope};
use caw_box::event::{Event, Status, Usage};
use caw_box::provider::{ParseContext, ProviderKind};
use caw_box::session::names::state_volume;
use caw_box::session::record::SessionSettings;
use caw_box::session::target::{self, SessionView, TargetSpec, VolumeFacts};
use caw_box::settings;
use caw_box::ResumeHandle;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{json, Value};
use uuid::Uuid;

/// Where the handles here live: a Docker daemon's sessions (version-1 handles).
const DOCKER: Scope = Scope {
    kind: BackendKind::Docker,
    namespace: None,
    context: None,
};

// ---------------------------------------------------------------------------------------
// The harness: one proptest runner per parser, with a hang watchdog and a count report.

const DEFAULT_CASES: u32 = 256;
/// One input taking longer than this fails the property ("no hang"). Generous: a debug
/// build on a busy 2-core machine parses the largest generated input in milliseconds.
const SLOW_INPUT: Duration = Duration::from_secs(2);
/// One input still running after this long is a hang: the process aborts, naming the
/// parser and the seed that reproduces it.
const HANG: Duration = Duration::from_secs(60);
const IDLE: u64 = u64::MAX;

fn cases() -> u32 {
    std::env::var("CAW_BOX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn seed() -> u64 {
    if let Some(seed) = std::env::var("CAW_BOX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return seed;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

/// Runs `check` on `cases()` inputs of `strategy`; any panic, failed property or slow input
/// fails the test with the smallest input proptest can shrink it to.
fn fuzz<S: Strategy>(
    parser: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let seed = seed();
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );

    let t0 = Instant::now();
    let case_started = Arc::new(AtomicU64::new(IDLE));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (case_started, done, parser) = (case_started.clone(), done.clone(), parser.to_string());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let started = case_started.load(Ordering::Relaxed);
                if started != IDLE
                    && (t0.elapsed().as_millis() as u64).saturating_sub(started)
                        > HANG.as_millis() as u64
                {
                    eprintln!(
                        "fuzz: {parser}: one input ran for more than {HANG:?}: a hang; \
                         replay with CAW_BOX_FUZZ_SEED={seed}"
                    );
                    std::process::abort();
                }
            }
        })
    };
    let inputs = AtomicU64::new(0);
    let slowest_ns = AtomicU64::new(0);
    let result = runner.run(&strategy, |value| {
        inputs.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        case_started.store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        let outcome = check(value);
        case_started.store(IDLE, Ordering::Relaxed);
        let took = start.elapsed();
        slowest_ns.fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
        if took > SLOW_INPUT {
            return Err(TestCaseError::fail(format!(
                "one input took {took:?} (limit {SLOW_INPUT:?})"
            )));
        }
        outcome
    });
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    report(
        parser,
        inputs.load(Ordering::Relaxed),
        t0.elapsed(),
        Duration::from_nanos(slowest_ns.load(Ordering::Relaxed)),
    );
    if let Err(e) = result {
        panic!("{parser}: {e}\nreplay with CAW_BOX_FUZZ_SEED={seed}");
    }
}

fn report(parser: &str, inputs: u64, elapsed: Duration, slowest: Duration) {
    let Some(path) = std::env::var_os("CAW_BOX_FUZZ_REPORT") else {
        return;
    };
    let line = format!(
        "{parser}\t{inputs}\t{:.1}\t{:.3}\n",
        elapsed.as_secs_f64(),
        slowest.as_secs_f64() * 1000.0
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// Generators.

/// A regex strategy, compiled once (a `&str` strategy compiles its regex for every input).
fn re(pattern: &str) -> BoxedStrategy<String> {
    proptest::string::string_regex(pattern)
        .unwrap_or_else(|e| panic!("{pattern}: {e}"))
        .boxed()
}

/// Strings that break naive parsers: NaN-ish and overflowing numbers as text, controls,
/// bidi and BOM characters, arbitrary unicode, long runs.
fn nasty_string() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec![
            "", " ", "NaN", "nan", "Infinity", "-Infinity", "inf", "1e999", "-1e999", "-0",
            "18446744073709551616", "-9223372036854775809", "0x10", "null", "true", "{", "}",
            "[", "\"", "\\", "\u{0}", "a\u{0}b", "\n", "\r\n", "\u{202e}evil", "\u{feff}",
            "\u{2028}", "ÿ", "💥", "e\u{301}", "\u{10ffff}", "%s%n", "${HOME}", "../../etc",
            "401", "429", "Unauthorized", "rate limit", "usage limit reached", "stop",
            "completed", "error", "failed", "success",
        ])
        .prop_map(str::to_string),
        3 => any::<String>(),
        1 => re("[0-9]{1,40}"),
        // Long runs; the 1 MB lines have a test of their own.
        1 => (any::<char>(), 0usize..4_000).prop_map(|(c, n)| c.to_string().repeat(n)),
    ]
    .boxed()
}

/// JSON values of every type, with the edge numbers.
fn nasty_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        select(vec![
            json!(u64::MAX),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(-1),
            json!(0),
            json!(1),
            json!(1e308),
            json!(-1e308),
            json!(5e-324),
            json!(0.5),
            json!(-0.0),
            json!(null),
            json!(true),
            json!(false),
            json!([]),
            json!({}),
        ]),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        nasty_string().prop_map(Value::String),
        (1usize..100).prop_map(|depth| nested(depth, false)),
        (1usize..100).prop_map(|depth| nested(depth, true)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((re("[a-z_]{0,8}"), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
    .boxed()
}

/// `depth` nested arrays (or objects), empty at the bottom.
fn nested(depth: usize, objects: bool) -> Value {
    let mut v = if objects { json!({}) } else { json!([]) };
    for _ in 0..depth {
        v = if objects {
            json!({ "a": v })
        } else {
            json!([v])
        };
    }
    v
}

/// Text nested `depth` levels deep, past serde_json's recursion limit if asked.
fn deep_text(depth: usize, open: &str, close: &str) -> String {
    format!(
        "{{\"type\":\"result\",\"x\":{}{}}}",
        open.repeat(depth),
        close.repeat(depth)
    )
}

/// Seed values to mutate, and the vocabulary (keys, tag words) mutations draw from.
#[derive(Debug)]
struct Corpus {
    /// Parsed seed lines.
    values: Vec<Value>,
    /// The raw lines of each seed file, in order (a whole turn).
    files: Vec<Vec<String>>,
    keys: Vec<String>,
    words: Vec<String>,
}

impl Corpus {
    fn new(files: Vec<Vec<String>>) -> Corpus {
        let values: Vec<Value> = files
            .iter()
            .flatten()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let mut keys = Vec::new();
        let mut words = Vec::new();
        for v in &values {
            vocabulary(v, &mut keys, &mut words);
        }
        keys.sort();
        keys.dedup();
        words.sort();
        words.dedup();
        assert!(!values.is_empty() && !keys.is_empty() && !words.is_empty());
        Corpus {
            values,
            files,
            keys,
            words,
        }
    }
}

/// Every key, and the short string values (tags like `item.completed`, statuses, ids).
fn vocabulary(v: &Value, keys: &mut Vec<String>, words: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                keys.push(k.clone());
                vocabulary(v, keys, words);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| vocabulary(v, keys, words)),
        Value::String(s) if s.len() <= 40 => words.push(s.clone()),
        _ => {}
    }
}

/// The recorded output of one provider's CLI.
fn provider_corpus(provider: ProviderKind) -> &'static Corpus {
    static CORPORA: OnceLock<Vec<Corpus>> = OnceLock::new();
    let corpora = CORPORA.get_or_init(|| {
        ProviderKind::ALL
            .iter()
            .map(|p| {
                let dir = format!(
                    "{}/tests/fixtures/{}",
                    env!("CARGO_MANIFEST_DIR"),
                    p.as_str()
                );
                let mut paths: Vec<_> = std::fs::read_dir(&dir)
                    .unwrap_or_else(|e| panic!("{dir}: {e}"))
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                    .collect();
                paths.sort();
                let mut files: Vec<Vec<String>> = paths
                    .iter()
                    .map(|p| {
                        std::fs::read_to_string(p)
                            .unwrap()
                            .lines()
                            .map(str::to_string)
                            .collect()
                    })
                    .collect();
                files.push(
                    unrecorded_shapes(*p)
                        .iter()
                        .map(|l| l.to_string())
                        .collect(),
                );
                Corpus::new(files)
            })
            .collect()
    });
    &corpora[ProviderKind::ALL
        .iter()
        .position(|p| *p == provider)
        .unwrap()]
}

/// Shapes each parser handles that no recording shows (older CLI versions, rarer events),
/// written from the parsers' own field names so the mutations reach that code too.
fn unrecorded_shapes(provider: ProviderKind) -> &'static [&'static str] {
    match provider {
        ProviderKind::ClaudeCode => &[
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"errors":["a","b"],"session_id":"s","usage":{"input_tokens":1}}"#,
            r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}],"is_error":true}]}}"#,
            r#"{"type":"assistant","parent_tool_use_id":"p","message":{"content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"sub"}]}}"#,
            r#"{"type":"system","subtype":"api_retry","error_status":429,"error":"rate_limit"}"#,
        ],
        ProviderKind::Codex => &[
            r#"{"type":"item.completed","item":{"id":"i","type":"mcp_tool_call","server":"s","tool":"t","arguments":{"a":1},"result":{"content":[{"text":"x"}],"structured_content":{"k":1}},"error":{"message":"m"},"status":"failed"}}"#,
            r#"{"type":"item.completed","item":{"id":"w","type":"web_search","query":"q"}}"#,
            r#"{"type":"item.started","item":{"id":"c","type":"collab_tool_call","tool":"spawn","prompt":"p"}}"#,
            r#"{"type":"item.completed","item":{"id":"f","type":"file_change","changes":[{"kind":"add","path":"/w/a"}],"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"e","type":"error","message":"oops"}}"#,
            r#"{"type":"error","message":"boom"}"#,
            r#"{"type":"turn.failed","error":{"message":"x"}}"#,
        ],
        ProviderKind::Opencode => &[
            r#"{"type":"error","sessionID":"s","error":{"name":"APIError","data":{"message":"m","statusCode":429}}}"#,
            r#"{"type":"tool_use","sessionID":"s","part":{"tool":"bash","callID":"c","state":{"status":"running","input":{"command":"x"}}}}"#,
            r#"{"type":"tool_use","sessionID":"s","part":{"tool":"bash","callID":"c","state":{"status":"completed","output":"","error":"bad","metadata":{"exit":2}}}}"#,
        ],
        ProviderKind::Gemini => &[
            r#"{"type":"result","status":"success","stats":{"models":{"m":{"tokens":{"prompt":10,"candidates":5,"cached":2,"thoughts":1}},"n":{"tokens":{"input":3,"candidates":1}}}}}"#,
            r#"{"type":"error","severity":"warning","message":"loop"}"#,
            r#"{"type":"tool_result","tool_id":"t","status":"error","error":{"type":"x","message":"m"}}"#,
            r#"{"type":"result","status":"error","error":{"type":"FatalAuthenticationError","message":"no"}}"#,
        ],
    }
}

/// One change to a JSON tree, addressed by pre-order node index.
#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the node with another value.
    Replace(Index, Value),
    /// Remove a key of an object (or an element of an array).
    Remove(Index, Index),
    /// Add a key from the vocabulary (or push onto an array).
    Add(Index, Index, Value),
    /// Set the object's `type` to a word of the vocabulary.
    Retag(Index, Index),
    /// Replace the node with a node of another seed.
    Graft(Index, Index, Index),
    /// Turn a string into a number or a number into a string.
    Retype(Index),
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        4 => (any::<Index>(), nasty_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(i, k)| Mutation::Remove(i, k)),
        2 => (any::<Index>(), any::<Index>(), nasty_value())
            .prop_map(|(i, k, v)| Mutation::Add(i, k, v)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(i, w)| Mutation::Retag(i, w)),
        1 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(i, s, n)| Mutation::Graft(i, s, n)),
        1 => any::<Index>().prop_map(Mutation::Retype),
    ]
    .boxed()
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Object(map) => map.values().map(count_nodes).sum(),
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The `n`th node in pre-order.
fn nth_node(v: &mut Value, n: usize) -> Option<&mut Value> {
    fn walk<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Object(map) => map.values_mut().find_map(|c| walk(c, n)),
            Value::Array(items) => items.iter_mut().find_map(|c| walk(c, n)),
            _ => None,
        }
    }
    let mut n = n;
    walk(v, &mut n)
}

fn nth_node_ref(v: &Value, n: usize) -> Value {
    fn walk<'a>(v: &'a Value, n: &mut usize) -> Option<&'a Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Object(map) => map.values().find_map(|c| walk(c, n)),
            Value::Array(items) => items.iter().find_map(|c| walk(c, n)),
            _ => None,
        }
    }
    let mut n = n;
    walk(v, &mut n).cloned().unwrap_or(Value::Null)
}

fn apply(corpus: &Corpus, mut v: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        let at = |i: &Index, v: &Value| i.index(count_nodes(v));
        match m {
            Mutation::Replace(i, new) => {
                let n = at(i, &v);
                if let Some(node) = nth_node(&mut v, n) {
                    *node = new.clone();
                }
            }
            Mutation::Remove(i, k) => {
                let n = at(i, &v);
                match nth_node(&mut v, n) {
                    Some(Value::Object(map)) if !map.is_empty() => {
                        let key = map.keys().nth(k.index(map.len())).cloned().unwrap();
                        map.remove(&key);
                    }
                    Some(Value::Array(items)) if !items.is_empty() => {
                        items.remove(k.index(items.len()));
                    }
                    _ => {}
                }
            }
            Mutation::Add(i, k, new) => {
                let n = at(i, &v);
                match nth_node(&mut v, n) {
                    Some(Value::Object(map)) => {
                        map.insert(corpus.keys[k.index(corpus.keys.len())].clone(), new.clone());
                    }
                    Some(Value::Array(items)) => items.push(new.clone()),
                    _ => {}
                }
            }
            Mutation::Retag(i, w) => {
                let n = at(i, &v);
                if let Some(Value::Object(map)) = nth_node(&mut v, n) {
                    map.insert(
                        "type".into(),
                        Value::String(corpus.words[w.index(corpus.words.len())].clone()),
                    );
                }
            }
            Mutation::Graft(i, s, g) => {
                let donor = &corpus.values[s.index(corpus.values.len())];
                let graft = nth_node_ref(donor, g.index(count_nodes(donor)));
                let n = at(i, &v);
                if let Some(node) = nth_node(&mut v, n) {
                    *node = graft;
                }
            }
            Mutation::Retype(i) => {
                let n = at(i, &v);
                if let Some(node) = nth_node(&mut v, n) {
                    *node = match node.take() {
                        Value::String(s) => s
                            .parse::<u64>()
                            .map(Value::from)
                            .or_else(|_| s.parse::<f64>().map(Value::from))
                            .unwrap_or(Value::Bool(s.is_empty())),
                        Value::Number(n) => Value::String(n.to_string()),
                        Value::Bool(b) => Value::String(b.to_string()),
                        Value::Null => Value::String("null".into()),
                        other => Value::String(other.to_string()),
                    };
                }
            }
        }
    }
    v
}

/// A change to a line's text, after the JSON-level mutations.
#[derive(Debug, Clone)]
enum TextMutation {
    None,
    Truncate(Index),
    Insert(Index, String),
    /// Replace a digit with a run of digits: numbers past u64 and f64.
    HugeNumber(Index, usize),
    Twice,
    Prefix(&'static str),
}

fn text_mutation() -> BoxedStrategy<TextMutation> {
    prop_oneof![
        6 => Just(TextMutation::None),
        2 => any::<Index>().prop_map(TextMutation::Truncate),
        1 => (any::<Index>(), nasty_string()).prop_map(|(i, s)| TextMutation::Insert(i, s)),
        2 => (any::<Index>(), 20usize..400).prop_map(|(i, n)| TextMutation::HugeNumber(i, n)),
        1 => Just(TextMutation::Twice),
        1 => select(vec!["  ", "\t", "\u{feff}", "\r", "data: ", "\u{1b}[0m"]).prop_map(TextMutation::Prefix),
    ]
    .boxed()
}

fn boundary(s: &str, i: &Index) -> usize {
    let bounds: Vec<usize> = s
        .char_indices()
        .map(|(at, _)| at)
        .chain([s.len()])
        .collect();
    bounds[i.index(bounds.len())]
}

fn apply_text(line: String, m: &TextMutation) -> String {
    match m {
        TextMutation::None => line,
        TextMutation::Truncate(i) => line[..boundary(&line, i)].to_string(),
        TextMutation::Insert(i, s) => {
            let at = boundary(&line, i);
            format!("{}{s}{}", &line[..at], &line[at..])
        }
        TextMutation::HugeNumber(i, n) => {
            let digits: Vec<usize> = line
                .char_indices()
                .filter(|(_, c)| c.is_ascii_digit())
                .map(|(at, _)| at)
                .collect();
            if digits.is_empty() {
                return line;
            }
            let at = digits[i.index(digits.len())];
            format!("{}{}{}", &line[..at], "9".repeat(*n), &line[at + 1..])
        }
        TextMutation::Twice => format!("{line}{line}"),
        TextMutation::Prefix(p) => format!("{p}{line}"),
    }
}

/// A mutated seed value.
fn mutated_value(corpus: &'static Corpus) -> BoxedStrategy<Value> {
    (
        select(corpus.values.clone()),
        prop::collection::vec(mutation(), 1..4),
    )
        .prop_map(move |(v, ms)| apply(corpus, v, &ms))
        .boxed()
}

/// One line of a provider's output: mostly mutated recorded lines, some intact ones (to
/// move the parser's state along), some arbitrary text.
fn vendor_line(corpus: &'static Corpus) -> BoxedStrategy<String> {
    let raw: Vec<String> = corpus.files.iter().flatten().cloned().collect();
    prop_oneof![
        8 => (mutated_value(corpus), text_mutation())
            .prop_map(|(v, t)| apply_text(v.to_string(), &t)),
        3 => select(raw),
        1 => any::<String>(),
        1 => re("\\{.{0,200}"),
        1 => (1usize..400, select(vec![("[", "]"), ("{\"a\":", "}")]))
            .prop_map(|(d, (o, c))| deep_text(d, o, c)),
        1 => prop::collection::vec(any::<u8>(), 0..300)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
    .boxed()
}

/// One turn of output: a recorded turn with a few lines mutated, dropped or repeated, or a
/// free mix of lines; then the CLI's exit code and the previous turn's cumulative usage.
#[derive(Debug, Clone)]
struct Turn {
    lines: Vec<String>,
    exit_code: i64,
    previous: Option<Usage>,
}

fn turn(provider: ProviderKind) -> BoxedStrategy<Turn> {
    let corpus = provider_corpus(provider);
    let recorded = (
        select(corpus.files.clone()),
        prop::collection::vec((any::<Index>(), vendor_line(corpus), 0u8..3), 0..4),
    )
        .prop_map(|(mut lines, edits)| {
            for (i, line, how) in edits {
                let at = i.index(lines.len() + 1);
                match how {
                    0 if at < lines.len() => lines[at] = line,
                    1 if at < lines.len() => {
                        lines.remove(at);
                    }
                    _ => lines.insert(at.min(lines.len()), line),
                }
            }
            lines
        });
    let mixed = prop::collection::vec(vendor_line(corpus), 0..8);
    let usage = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::option::of(any::<f64>()),
    )
        .prop_map(|(i, o, r, w, c)| Usage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: r,
            cache_write_tokens: w,
            cost_usd: c,
        });
    (
        prop_oneof![3 => recorded, 2 => mixed],
        prop_oneof![3 => Just(0i64), 1 => select(vec![1i64, 41, 42, 130, 137, -1]), 1 => any::<i64>()],
        prop::option::of(usage),
    )
        .prop_map(|(lines, exit_code, previous)| Turn {
            lines,
            exit_code,
            previous,
        })
        .boxed()
}

/// Every event a parser yields serializes, and reads back to the same JSON (what
/// `caw-box logs` and `show` do with the recorded events).
fn check_event_round_trip(event: &Event) -> Result<(), TestCaseError> {
    let json = serde_json::to_string(event)
        .map_err(|e| TestCaseError::fail(format!("{event:?} does not serialize: {e}")))?;
    let back: Event = serde_json::from_str(&json)
        .map_err(|e| TestCaseError::fail(format!("{json} does not read back: {e}")))?;
    prop_assert_eq!(serde_json::to_string(&back).unwrap(), json);
    Ok(())
}

fn check_turn(provider: ProviderKind, turn: &Turn) -> Result<(), TestCaseError> {
    let mut parser = provider.adapter().parser(ParseContext {
        previous_cumulative_usage: turn.previous,
    });
    let mut events = Vec::new();
    for line in &turn.lines {
        parser.parse_line(line, &mut events);
        // The same text as a stderr line (where opencode and gemini report retries).
        parser.parse_stderr_line(line);
        let _ = parser.resume_key();
        let _ = parser.unreachable();
    }
    let outcome = parser.finish(turn.exit_code);
    for event in &events {
        check_event_round_trip(event)?;
    }
    // Only the runner decides that a turn timed out, was interrupted or still runs.
    prop_assert!(
        !matches!(
            outcome.status,
            Status::Running | Status::Timeout | Status::Interrupted | Status::Unreachable
        ),
        "{:?}",
        outcome.status
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The four stream parsers.

fn fuzz_stream_parser(provider: ProviderKind) {
    fuzz(
        &format!("stream parser: {provider}"),
        turn(provider),
        |turn| check_turn(provider, &turn),
    );
}

#[test]
fn stream_parser_claude_code() {
    fuzz_stream_parser(ProviderKind::ClaudeCode);
}

#[test]
fn stream_parser_codex() {
    fuzz_stream_parser(ProviderKind::Codex);
}

#[test]
fn stream_parser_opencode() {
    fuzz_stream_parser(ProviderKind::Opencode);
}

#[test]
fn stream_parser_gemini() {
    fuzz_stream_parser(ProviderKind::Gemini);
}

/// A 1 MB line of every recorded shape (its longest string grown to 1 MB), 1 MB lines of
/// nesting and of noise: each parsed in well under a second by the release build (`make
/// fuzz`). A debug build (`make test`) scans text some 30 times slower: there the limit only
/// tells a hang (or a quadratic scan: minutes) from a slow build.
#[test]
fn one_megabyte_lines_parse_in_well_under_a_second() {
    const MB: usize = 1 << 20;
    let limit = if cfg!(debug_assertions) {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(1)
    };
    for provider in ProviderKind::ALL {
        let corpus = provider_corpus(provider);
        let mut lines = Vec::new();
        let mut shapes = std::collections::HashSet::new();
        for file in &corpus.files {
            for line in file {
                let Ok(mut v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                // One line per shape (its type and keys): the debug build is slow enough.
                let shape = match &v {
                    Value::Object(map) => {
                        format!("{:?} {:?}", map.get("type"), map.keys().collect::<Vec<_>>())
                    }
                    _ => String::new(),
                };
                if shapes.insert(shape) && grow_longest_string(&mut v, MB) {
                    lines.push(v.to_string());
                }
            }
        }
        lines.push(format!("{{\"type\":\"{}\"}}", "é".repeat(MB / 2)));
        lines.push("[".repeat(MB));
        lines.push(format!("{{\"type\":\"result\",\"x\":{}", "[".repeat(MB)));
        lines.push("{".repeat(MB));
        lines.push(format!("{{{}", "\\u0000".repeat(MB / 6)));
        for line in &lines {
            let mut parser = provider.adapter().parser(ParseContext::default());
            let mut events = Vec::new();
            let start = Instant::now();
            parser.parse_line(line, &mut events);
            let _ = parser.finish(0);
            let took = start.elapsed();
            assert!(
                took < limit,
                "{provider}: a {} byte line took {took:?}: {}...",
                line.len(),
                &line[..line.char_indices().nth(120).map_or(line.len(), |(i, _)| i)]
            );
        }
    }
}

/// Makes the longest string in `v` `len` bytes long; false when `v` holds no string.
fn grow_longest_string(v: &mut Value, len: usize) -> bool {
    fn longest(v: &mut Value) -> Option<&mut String> {
        match v {
            Value::String(s) => Some(s),
            Value::Object(map) => map.values_mut().filter_map(longest).max_by_key(|s| s.len()),
            Value::Array(items) => items.iter_mut().filter_map(longest).max_by_key(|s| s.len()),
            _ => None,
        }
    }
    match longest(v) {
        Some(s) => {
            let seed = if s.is_empty() {
                "x".to_string()
            } else {
                s.clone()
            };
            *s = seed.repeat(len / seed.len() + 1);
            true
        }
        None => false,
    }
}

// ---------------------------------------------------------------------------------------
// The resume handle.

fn valid_resume_key() -> BoxedStrategy<String> {
    prop_oneof![
        re("[^\\p{Cc}]{1,40}"),
        re("[0-9a-f-]{36}"),
        re("ses_[A-Za-z0-9]{26}"),
        re("[A-Za-z0-9_-]{500,512}"),
    ]
    .boxed()
}

fn any_provider() -> BoxedStrategy<ProviderKind> {
    select(ProviderKind::ALL.to_vec()).boxed()
}

fn valid_handle() -> BoxedStrategy<ResumeHandle> {
    (any_provider(), any::<[u8; 16]>(), valid_resume_key())
        .prop_map(|(p, id, key)| ResumeHandle::in_scope(p, Uuid::from_bytes(id), key, &DOCKER))
        .boxed()
}

fn handle_corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let id = Uuid::parse_str("5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b").unwrap();
        let other = "caw-box-00000000-0000-0000-0000-000000000000";
        let mut lines: Vec<String> = ProviderKind::ALL
            .iter()
            .map(|p| ResumeHandle::in_scope(*p, id, "019a-thread", &DOCKER).to_json())
            .collect();
        // Words the mutations draw from: aliases, ids and volumes of other sessions.
        lines.push(
            json!({"provider": ["claude", "cc", "Claude-Code", " gemini ", "gpt"],
                   "session_id": [id.simple().to_string(), id.urn().to_string(), "5b0c"],
                   "volume": [other, "caw-box-", "caw-box-5B0C3F0E-9A51-4F0B-8D3C-0F3A1E2D4C5B"],
                   "version": [1, 2, 0, "1"]})
            .to_string(),
        );
        Corpus::new(vec![lines])
    })
}

fn handle_input() -> BoxedStrategy<String> {
    let corpus = handle_corpus();
    prop_oneof![
        2 => (valid_handle(), re("[ \t\n]{0,3}"), re("[ \t\n]{0,3}"))
            .prop_map(|(h, a, b)| format!("{a}{}{b}", h.to_json())),
        6 => (mutated_value(corpus), text_mutation())
            .prop_map(|(v, t)| apply_text(v.to_string(), &t)),
        2 => (valid_handle(), text_mutation()).prop_map(|(h, t)| apply_text(h.to_json(), &t)),
        1 => any::<String>(),
        1 => re("\\s*\\{.{0,200}"),
        1 => (1usize..400).prop_map(|d| format!("{{\"version\":{}", "[".repeat(d))),
    ]
    .boxed()
}

fn check_usage_error(e: &caw_box::Error, input: &str) -> Result<(), TestCaseError> {
    let shown = e.to_string();
    prop_assert_eq!(e.exit_code(), 2, "{}", shown);
    prop_assert!(!shown.contains('\n'), "two lines: {}", shown);
    let input = input.trim();
    prop_assert!(
        input.len() < 200 || !shown.contains(input),
        "echoes the whole input back: {}",
        shown
    );
    Ok(())
}

#[test]
fn handle_decoder() {
    fuzz("handle decoder", handle_input(), |input| {
        match ResumeHandle::parse(&input) {
            Ok(h) => {
                prop_assert_eq!(h.version, 1);
                prop_assert_eq!(&h.volume, &state_volume(h.session_id));
                prop_assert!(!h.resume_key.is_empty() && h.resume_key.len() <= 512);
                prop_assert!(!h.resume_key.chars().any(char::is_control));
                // What it decodes, it encodes back to an equal handle.
                prop_assert_eq!(ResumeHandle::parse(&h.to_json()).ok(), Some(h));
            }
            Err(e) => check_usage_error(&e, &input)?,
        }
        Ok(())
    });
}

#[test]
fn handle_round_trips() {
    fuzz("handle round trip", valid_handle(), |h| {
        let json = h.to_json();
        prop_assert_eq!(ResumeHandle::parse(&json).ok(), Some(h.clone()));
        prop_assert_eq!(ResumeHandle::parse(&format!(" \n{json}\t")).ok(), Some(h));
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// TARGET: which string names which session (no Docker: the lookup over listed sessions).

fn session_name() -> BoxedStrategy<String> {
    prop_oneof![
        re("[a-zA-Z][a-zA-Z0-9._-]{0,12}"),
        // Names that look like id prefixes: a name must still win over a prefix.
        re("[a-f][0-9a-f]{3,8}"),
    ]
    .boxed()
}

fn sessions() -> BoxedStrategy<Vec<(Uuid, Option<String>)>> {
    prop::collection::vec(
        (
            any::<[u8; 16]>().prop_map(Uuid::from_bytes),
            prop::option::of(session_name()),
        ),
        0..6,
    )
    .boxed()
}

/// TARGETs for a set of sessions: theirs, and arbitrary ones (`others`, built once).
fn target_for(
    all: &[(Uuid, Option<String>)],
    others: &[BoxedStrategy<String>],
    pad: &BoxedStrategy<String>,
) -> BoxedStrategy<String> {
    let ids: Vec<String> = all.iter().map(|(id, _)| id.to_string()).collect();
    let names: Vec<String> = all.iter().filter_map(|(_, n)| n.clone()).collect();
    let mut options: Vec<BoxedStrategy<String>> = others.to_vec();
    if !ids.is_empty() {
        options.push(
            (select(ids), any::<Index>(), any::<bool>(), pad.clone())
                .prop_map(|(id, len, upper, pad)| {
                    let prefix = &id[..len.index(id.len() + 1)];
                    let prefix = if upper {
                        prefix.to_uppercase()
                    } else {
                        prefix.to_string()
                    };
                    format!("{pad}{prefix}{pad}")
                })
                .boxed(),
        );
    }
    if !names.is_empty() {
        options.push(select(names).boxed());
    }
    proptest::strategy::Union::new(options).boxed()
}

fn view(id: Uuid, name: Option<String>) -> SessionView {
    SessionView {
        facts: VolumeFacts {
            session_id: id,
            provider: ProviderKind::Codex,
            name,
            group: None,
            scope: None,
            created_at: 0,
            settings: SessionSettings::default(),
            workspace_base: None,
        },
        last: None,
    }
}

/// The session TARGET should pick, as SPEC.md words it: an exact id or name, else the one
/// session whose id starts with a prefix of 4+ characters.
fn expected_match(all: &[(Uuid, Option<String>)], target: &str) -> Option<Uuid> {
    let lower = target.to_ascii_lowercase();
    if let Some((id, _)) = all
        .iter()
        .find(|(id, name)| id.to_string() == lower || name.as_deref() == Some(target))
    {
        return Some(*id);
    }
    let by_prefix: Vec<Uuid> = all
        .iter()
        .filter(|(id, _)| target.len() >= 4 && id.to_string().starts_with(&lower))
        .map(|(id, _)| *id)
        .collect();
    (by_prefix.len() == 1).then(|| by_prefix[0])
}

#[test]
fn target_resolution_input() {
    let others = vec![
        any::<String>().boxed(),
        re("\\s*[0-9a-fA-F-]{0,40}\\s*"),
        handle_input(),
    ];
    let pad = re("\\s{0,2}");
    let strategy = sessions().prop_flat_map(move |all| {
        let target = target_for(&all, &others, &pad);
        (Just(all), target)
    });
    fuzz("TARGET resolution", strategy, |(all, input)| {
        let trimmed = input.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
        match target::parse_target(&input, &DOCKER) {
            Err(e) => {
                prop_assert!(
                    trimmed.is_empty() || trimmed.starts_with('{'),
                    "{:?}",
                    input
                );
                check_usage_error(&e, &input)?;
            }
            Ok(TargetSpec::Handle(h)) => {
                prop_assert!(trimmed.starts_with('{'), "{:?}", input);
                prop_assert_eq!(ResumeHandle::parse(trimmed).ok(), Some(h));
            }
            Ok(TargetSpec::Lookup(t)) => {
                prop_assert_eq!(t, trimmed);
                prop_assert!(!t.is_empty() && !t.starts_with('{'), "{:?}", t);
                let views = all.iter().map(|(id, n)| view(*id, n.clone())).collect();
                match target::find_in(views, t) {
                    Ok(found) => {
                        prop_assert_eq!(Some(found.facts.session_id), expected_match(&all, t))
                    }
                    Err(e) => {
                        prop_assert_eq!(None, expected_match(&all, t));
                        prop_assert_eq!(e.exit_code(), 2);
                        prop_assert!(!e.to_string().contains('\n'));
                    }
                }
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Flag values: --env, --allow-host, durations, sizes.

/// Secret-looking values, in the shapes real keys have (some of which are valid variable
/// names, some end in base64 padding).
fn secret() -> BoxedStrategy<String> {
    prop_oneof![
        re("sk-fuzz-[A-Za-z0-9_-]{16,40}"),
        re("ghp_fuzz[A-Za-z0-9]{28}"),
        re("fuzz[A-Za-z0-9+/]{16,40}={1,2}"),
    ]
    .boxed()
}

fn env_name() -> BoxedStrategy<String> {
    prop_oneof![re("[A-Za-z_][A-Za-z0-9_]{0,20}"), Just("PATH".to_string())].boxed()
}

/// One `--env` argument, and the secret it holds if any.
fn env_arg() -> BoxedStrategy<(String, Option<String>)> {
    prop_oneof![
        4 => (env_name(), secret()).prop_map(|(k, v)| (format!("{k}={v}"), Some(v))),
        2 => (re("[0-9][A-Z]{0,5}|[A-Z]{1,5}[ .$/-][A-Z]{0,5}|"), secret())
            .prop_map(|(k, v)| (format!("{k}={v}"), Some(v))),
        // `--env $API_KEY`: the value where the name should be.
        3 => secret().prop_map(|s| (s.clone(), Some(s))),
        1 => re("CAW_BOX_FUZZ_UNSET_[A-Z]{1,8}").prop_map(|n| (n, None)),
        1 => any::<String>().prop_map(|s| (s, None)),
        1 => re("=.{0,10}").prop_map(|s| (s, None)),
    ]
    .boxed()
}

fn is_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn env_parser() {
    fuzz(
        "--env parser",
        prop::collection::vec(env_arg(), 1..4),
        |args| {
            let values: Vec<String> = args.iter().map(|(a, _)| a.clone()).collect();
            match settings::resolve_env(&values) {
                Ok(pairs) => {
                    prop_assert_eq!(pairs.len(), values.len());
                    for ((k, v), arg) in pairs.iter().zip(&values) {
                        prop_assert!(is_env_name(k), "{}", k);
                        match arg.split_once('=') {
                            Some((ak, av)) => prop_assert_eq!((ak, av), (k.as_str(), v.as_str())),
                            None => prop_assert_eq!(Some(v.clone()), std::env::var(k).ok()),
                        }
                    }
                }
                Err(e) => {
                    let shown = e.to_string();
                    prop_assert_eq!(e.exit_code(), 2);
                    prop_assert!(!shown.contains('\n'));
                    // An `--env` may hold a secret: no error shows any 8 characters of one.
                    for s in args.iter().filter_map(|(_, s)| s.as_deref()) {
                        let chars: Vec<char> = s.chars().collect();
                        for w in chars.windows(8) {
                            let w: String = w.iter().collect();
                            prop_assert!(!shown.contains(&w), "'{}' shows in: {}", w, shown);
                        }
                    }
                }
            }
            Ok(())
        },
    );
}

fn port_text() -> BoxedStrategy<String> {
    prop_oneof![
        any::<u16>().prop_map(|p| p.to_string()),
        any::<u32>().prop_map(|p| p.to_string()),
        re("[+-][0-9]{1,5}"),
        re("0[0-9]{1,5}"),
        re("[0-9]{6,20}"),
        re(" [0-9]{1,4}"),
        Just(String::new()),
    ]
    .boxed()
}

fn allow_host_input() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (
            any::<bool>(),
            prop::collection::vec(re("[a-zA-Z0-9-]{0,12}"), 1..5),
            prop::option::of(port_text()),
        )
            .prop_map(|(wild, labels, port)| {
                let mut h = format!("{}{}", if wild { "*." } else { "" }, labels.join("."));
                if let Some(p) = port {
                    h = format!("{h}:{p}");
                }
                h
            }),
        2 => select(vec![
            "@provider", "@Provider", "@", "@nobody", "*.", "*", "*.*.com", "**.a", ":443",
            "host:", "host:0", "host:65536", "host:+80", "host: 80", "[::1]:443", "::1",
            "a..b", ".", "-", "a.", ".a", "bücher.de", "host:443:443", "http://host",
            "host/path", "user@host", "ho st", "127.0.0.1:8080",
        ])
        .prop_map(str::to_string),
        2 => any::<String>(),
        1 => re("[a-z.]{240,270}(:[0-9]{1,5})?"),
    ]
    .boxed()
}

/// How the egress proxy (images/base/caw-box-proxy.js) reads one CAW_BOX_ALLOW entry.
fn proxy_reading(entry: &str) -> (String, Option<u32>) {
    let s = entry.trim().to_lowercase();
    match s.rfind(':') {
        Some(i)
            if i > 0
                && !s[i + 1..].is_empty()
                && s[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            (s[..i].to_string(), s[i + 1..].parse().ok())
        }
        _ => (s, None),
    }
}

#[test]
fn allow_host_parser() {
    fuzz("--allow-host parser", allow_host_input(), |host| {
        match settings::validate_allow_host(&host, "--allow-host") {
            Ok(()) if host == "@provider" => {}
            Ok(()) => {
                // Accepted: `[*.]label(.label)*[:port]`, read the same way by the proxy.
                let (name, port) = match host.rsplit_once(':') {
                    Some((n, p)) => (n, Some(p)),
                    None => (host.as_str(), None),
                };
                let labels = name.strip_prefix("*.").unwrap_or(name);
                prop_assert!(name.len() <= 253);
                prop_assert!(
                    labels.split('.').all(|l| !l.is_empty()
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')),
                    "not a host name: {:?}",
                    host
                );
                let port: Option<u32> = port.map(|p| p.parse().unwrap());
                prop_assert!(port.is_none_or(|p| (1..=65535).contains(&p)));
                prop_assert_eq!(
                    proxy_reading(&host),
                    (name.to_lowercase(), port),
                    "the proxy reads {:?} differently",
                    host
                );
            }
            Err(e) => {
                prop_assert_eq!(e.exit_code(), 2);
                prop_assert!(!e.to_string().contains('\n'));
            }
        }
        Ok(())
    });
}

fn number_text() -> BoxedStrategy<String> {
    prop_oneof![
        any::<u32>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        re("[0-9]{1,30}"),
        re("[0-9]{0,3}\\.[0-9]{0,3}"),
        re("-[0-9]{1,5}"),
        re("[0-9]e[+-]?[0-9]{1,3}"),
        select(vec![
            "", "inf", "Infinity", "NaN", "nan", "-inf", "+5", "1_000", "0x10", "٣", "½", "1e-400",
            "1e400", "0", "-0", ".", "e",
        ])
        .prop_map(str::to_string),
    ]
    .boxed()
}

fn duration_input() -> BoxedStrategy<String> {
    let unit = select(vec![
        "ns", "us", "µs", "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins",
        "minute", "h", "hr", "hrs", "hour", "hours", "d", "day", "days", "w", "week", "weeks", "M",
        "month", "months", "y", "year", "years", "", "x", " s", "S",
    ]);
    prop_oneof![
        4 => prop::collection::vec((number_text(), unit), 1..4).prop_map(|parts| {
            parts
                .iter()
                .map(|(n, u)| format!("{n}{u}"))
                .collect::<Vec<_>>()
                .join(" ")
        }),
        1 => re("[0-9]{10,25}(y|d|h|s|ms|ns)"),
        1 => any::<String>(),
    ]
    .boxed()
}

#[test]
fn duration_parser() {
    fuzz("duration parser", duration_input(), |input| {
        match settings::parse_duration(&input, "--timeout") {
            Ok(d) => {
                prop_assert!(!d.is_zero());
                // The turn runner's deadline is now + the timeout: it must exist.
                prop_assert!(
                    Instant::now().checked_add(d).is_some(),
                    "{:?} accepted but now + {:?} overflows",
                    input,
                    d
                );
                let _ = humantime::format_duration(d).to_string();
            }
            Err(e) => {
                prop_assert_eq!(e.exit_code(), 2);
                prop_assert!(!e.to_string().contains('\n'));
            }
        }
        Ok(())
    });
}

fn size_input() -> BoxedStrategy<String> {
    let suffix = select(vec![
        "", "b", "B", "k", "kb", "K", "KB", "m", "mb", "M", "MB", "g", "gb", "G", "GB", "t", "tb",
        "x", "mm", "bb", "gib", "ǵ",
    ]);
    prop_oneof![
        4 => (re("\\s{0,2}"), number_text(), suffix, re("\\s{0,2}"))
            .prop_map(|(a, n, s, b)| format!("{a}{n}{s}{b}")),
        1 => any::<String>(),
    ]
    .boxed()
}

#[test]
fn size_parser() {
    fuzz("size parser", size_input(), |input| {
        match settings::parse_memory(&input, "--memory") {
            Ok(bytes) => {
                prop_assert!(bytes >= 6 << 20);
                prop_assert!(
                    bytes < i64::MAX,
                    "{:?} accepted as the saturated {}",
                    input,
                    bytes
                );
                prop_assert!(
                    input.chars().any(|c| c.is_ascii_digit()),
                    "{:?} accepted without a digit",
                    input
                );
            }
            Err(e) => {
                prop_assert_eq!(e.exit_code(), 2);
                prop_assert!(!e.to_string().contains('\n'));
            }
        }
        Ok(())
    });
}

#[test]
fn sizes_round_trip() {
    let strategy = (
        6u64..=1 << 20,
        select(vec![("m", 20u32), ("MB", 20), ("g", 30), ("Gb", 30)]),
    );
    fuzz("size round trip", strategy, |(n, (suffix, shift))| {
        let expected = i64::try_from(n << shift).unwrap();
        prop_assert_eq!(
            settings::parse_memory(&format!("{n}{suffix}"), "--memory").ok(),
            Some(expected)
        );
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Credential files: the expiry fields `auth collect` and `auth status` read.

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT whose payload states `exp`, and variations a token may come in.
fn jwt(exp: Value, secret: &str, shape: u8) -> String {
    let header = b64(br#"{"alg":"RS256","typ":"JWT"}"#);
    let payload = json!({ "exp": exp, "sub": secret, "email": "a@b.c" }).to_string();
    match shape {
        0 => format!(
            "{header}.{}.{}",
            b64(payload.as_bytes()),
            b64(secret.as_bytes())
        ),
        1 => format!("{header}.{}==.", b64(payload.as_bytes())),
        2 => {
            use base64::Engine;
            let standard = base64::engine::general_purpose::STANDARD.encode(payload.as_bytes());
            format!("{header}.{standard}.x")
        }
        3 => format!("{header}.{secret}"),
        4 => format!("{}..", b64(payload.as_bytes())),
        _ => format!("{header}.{}", b64(&payload.as_bytes()[..payload.len() / 2])),
    }
}

/// The credential files of each vendor, in their real shapes, with an expiry field that
/// is sometimes sane (its expected value returned) and sometimes anything.
#[derive(Debug, Clone)]
struct CredentialFile {
    contents: Vec<u8>,
    secrets: Vec<String>,
    /// The Unix seconds the expiry rule must read, for the untouched shapes.
    expected: Option<u64>,
}

fn expiry_field() -> BoxedStrategy<(Value, Option<u64>)> {
    prop_oneof![
        2 => (0u64..10_000_000_000_000).prop_map(|ms| (json!(ms), Some(ms / 1000))),
        3 => nasty_value().prop_map(|v| (v, None)),
    ]
    .boxed()
}

fn credential_file() -> BoxedStrategy<CredentialFile> {
    let shapes = (
        0u8..4,
        expiry_field(),
        secret(),
        secret(),
        0u8..8,
        prop::option::of(0u64..10_000_000_000),
    )
        .prop_map(
            |(vendor, (exp, expected_ms), access, refresh, jwt_shape, jwt_exp)| {
                let (value, expected) = match vendor {
                    0 => (
                        json!({"claudeAiOauth": {"accessToken": access, "refreshToken": refresh,
                        "expiresAt": exp, "scopes": ["user:inference"]}}),
                        expected_ms,
                    ),
                    1 => (
                        json!({"access_token": access, "refresh_token": refresh,
                        "expiry_date": exp, "token_type": "Bearer"}),
                        expected_ms,
                    ),
                    2 => (
                        json!({"anthropic": {"type": "oauth", "refresh": refresh, "access": access,
                        "expires": exp}, "openai": {"type": "api", "key": refresh}}),
                        expected_ms,
                    ),
                    _ => {
                        let claim = jwt_exp.map_or(exp, Value::from);
                        let token = jwt(claim, &access, jwt_shape);
                        (
                            json!({"OPENAI_API_KEY": null, "tokens": {"id_token": token,
                            "access_token": token, "refresh_token": refresh}}),
                            jwt_exp.filter(|_| jwt_shape <= 2),
                        )
                    }
                };
                CredentialFile {
                    contents: value.to_string().into_bytes(),
                    secrets: vec![access, refresh],
                    expected,
                }
            },
        );
    let corpus = credential_corpus();
    prop_oneof![
        4 => shapes.clone(),
        3 => (shapes, text_mutation()).prop_map(|(mut f, t)| {
            let text = String::from_utf8_lossy(&f.contents).into_owned();
            f.contents = apply_text(text, &t).into_bytes();
            f.expected = None;
            f
        }),
        3 => mutated_value(corpus).prop_map(|v| CredentialFile {
            contents: v.to_string().into_bytes(),
            secrets: Vec::new(),
            expected: None,
        }),
        1 => prop::collection::vec(any::<u8>(), 0..400).prop_map(|b| CredentialFile {
            contents: b,
            secrets: Vec::new(),
            expected: None,
        }),
        1 => (1usize..400).prop_map(|d| CredentialFile {
            contents: format!("{{\"claudeAiOauth\":{{\"expiresAt\":{}", "[".repeat(d)).into_bytes(),
            secrets: Vec::new(),
            expected: None,
        }),
    ]
    .boxed()
}

fn credential_corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let token = jwt(json!(1_800_000_000u64), "s", 0);
        Corpus::new(vec![vec![
            json!({"claudeAiOauth": {"accessToken": "a", "refreshToken": "r",
                "expiresAt": 1_700_000_000_000u64, "scopes": []}})
            .to_string(),
            json!({"access_token": "a", "refresh_token": "r", "expiry_date": 1_700_000_000_000u64})
                .to_string(),
            json!({"anthropic": {"type": "oauth", "refresh": "r", "access": "a",
                "expires": 1_750_000_000_000u64}})
            .to_string(),
            json!({"tokens": {"id_token": token, "access_token": token, "refresh_token": "r"}})
                .to_string(),
        ]])
    })
}

/// Every expiry rule of the built-in credential specs.
fn expiry_rules() -> Vec<Expiry> {
    ProviderKind::ALL
        .iter()
        .flat_map(|p| {
            let s = Spec::of(*p);
            s.files
                .iter()
                .filter_map(|f| f.expiry.clone())
                .chain(s.keyring.iter().filter_map(|k| k.expiry.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn credential_expiry_parsers() {
    let rules = expiry_rules();
    assert!(rules.len() >= 4, "{rules:?}");
    fuzz("credential expiry", credential_file(), |file| {
        let mut read = Vec::new();
        for rule in &rules {
            let secs = spec::expiry_secs(rule, &file.contents);
            // What `auth status` shows of it.
            let (text, _) = caw_box::expiry_text(secs);
            for s in &file.secrets {
                prop_assert!(!text.contains(s.as_str()));
            }
            read.extend(secs);
        }
        if let Some(expected) = file.expected {
            prop_assert!(
                read.contains(&expected),
                "no rule read {} from {}",
                expected,
                String::from_utf8_lossy(&file.contents)
            );
        }
        // The contents themselves, held as a secret, never print.
        let held = Secret::new(file.contents.clone());
        for shown in [format!("{held}"), format!("{held:?}")] {
            for s in &file.secrets {
                prop_assert!(!shown.contains(s.as_str()));
            }
        }
        Ok(())
    });
}

#[test]
fn credential_paths_expand() {
    let input = prop_oneof![
        any::<String>(),
        re("(\\$\\{[A-Z_]{0,6}(:-[~/a-z]{0,6})?\\}?|~|/|[a-z]{1,3}|\\$|\\{|\\})*"),
    ];
    fuzz("credential path expansion", input, |path| {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            "A" => Some("${A}".to_string()),
            _ => None,
        };
        if let Some(out) = spec::expand(&path, &env) {
            prop_assert!(!out.starts_with("~/"), "{:?} -> {:?}", path, out);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------
// Regressions: every failure the properties above found, as the exact input.

/// Feeds `lines` to a fresh parser of `provider` and returns the outcome's usage.
fn parse_turn(
    provider: ProviderKind,
    lines: &[&str],
) -> (Vec<Event>, caw_box::provider::TurnOutcome) {
    let mut parser = provider.adapter().parser(ParseContext::default());
    let mut events = Vec::new();
    for line in lines {
        parser.parse_line(line, &mut events);
    }
    let outcome = parser.finish(0);
    (events, outcome)
}

#[test]
fn regression_opencode_usage_past_u64_saturates() {
    let step = r#"{"type":"step_finish","sessionID":"ses_1","part":{"reason":"stop","tokens":{"input":18446744073709551615,"output":1,"cache":{"write":0,"read":0}},"cost":0}}"#;
    let (_, outcome) = parse_turn(ProviderKind::Opencode, &[step, step]);
    assert_eq!(outcome.usage.input_tokens, u64::MAX);
    assert_eq!(outcome.usage.output_tokens, 2);
}

#[test]
fn regression_gemini_usage_past_u64_saturates() {
    let result = r#"{"type":"result","status":"success","stats":{"models":{"a":{"tokens":{"prompt":5,"candidates":18446744073709551615,"thoughts":1,"cached":0}},"b":{"tokens":{"input":18446744073709551615,"candidates":1}}}}}"#;
    let (_, outcome) = parse_turn(ProviderKind::Gemini, &[result]);
    assert_eq!(outcome.usage.output_tokens, u64::MAX);
    assert_eq!(outcome.usage.input_tokens, u64::MAX);
}

#[test]
fn regression_allow_host_port_is_plain_digits_and_labels_are_not_empty() {
    // The egress proxy reads `0:+1` as the host `0:+1` with no port: caw-box must not
    // accept what the proxy reads differently, nor `*.` (it would match any `name.`).
    for bad in [
        "0:+1",
        "host:+443",
        "host: 80",
        "*.",
        "*.:443",
        "a..b",
        ".",
        "a.",
        "*.*.com",
    ] {
        let err = settings::validate_allow_host(bad, "--allow-host").unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
    }
    for ok in [
        "a",
        "*.example.com",
        "api.example.com:0443",
        "127.0.0.1:8080",
        "@provider",
    ] {
        assert!(
            settings::validate_allow_host(ok, "--allow-host").is_ok(),
            "{ok}"
        );
    }
}

#[test]
fn regression_env_errors_never_show_the_argument() {
    for arg in [
        "sk-fuzz-_A_-A__0A-a-00A-",
        "ghp_fuzzAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "fuzzAbc+/xyz0123456789==",
        "1A=sk-fuzz-0123456789abcdef",
    ] {
        let err = settings::resolve_env(&["OK=1".to_string(), arg.to_string()]).unwrap_err();
        let shown = err.to_string();
        assert_eq!(err.exit_code(), 2);
        assert!(shown.contains("--env #2 (of 2)"), "{shown}");
        assert!(!shown.contains("fuzz") && !shown.contains("sk-"), "{shown}");
    }
}

#[test]
fn regression_sizes_beyond_i64_or_not_finite_are_refused() {
    for bad in [
        "9007199254740992k",
        "1e300g",
        "inf",
        "infm",
        "Infinity",
        "nan",
        "NaNg",
    ] {
        assert_eq!(
            settings::parse_memory(bad, "--memory")
                .unwrap_err()
                .exit_code(),
            2,
            "{bad}"
        );
    }
    assert_eq!(
        settings::parse_memory("1e3m", "--memory").unwrap(),
        1000 << 20
    );
}

#[test]
fn regression_durations_past_a_deadline_are_refused() {
    // Accepted once, then `Instant::now() + timeout` panicked in the turn runner.
    for bad in ["9223372036854774710s", "300000000000y", "101y"] {
        let err = settings::parse_duration(bad, "--timeout").unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
    }
    let d = settings::parse_duration("100y", "--timeout").unwrap();
    assert!(Instant::now().checked_add(d).is_some());
}

#[test]
fn regression_handle_errors_do_not_quote_the_handle_back() {
    let input = r#""{\"0000000provider\":\"claude_code\",\"resume_key\":\"019a-thread\",\"session_id\":\"5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b\",\"version\":1,\"volume\":\"caw-box-5b0c3f0e-9a51-4f0b-8d3c-0f3a1e2d4c5b\"}""#;
    let err = ResumeHandle::parse(input).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(!err.to_string().contains("resume_key"), "{err}");
    let err = ResumeHandle::parse(r#"{"version":"one"}"#).unwrap_err();
    assert!(err.to_string().contains("wrong type"), "{err}");
}

#[test]
fn regression_a_handle_after_a_byte_order_mark_is_a_handle() {
    let h = ResumeHandle::in_scope(ProviderKind::ClaudeCode, Uuid::nil(), "k", &DOCKER);
    match target::parse_target(&format!("\u{feff}{}\n", h.to_json()), &DOCKER).unwrap() {
        TargetSpec::Handle(parsed) => assert_eq!(parsed, h),
        other => panic!("{other:?}"),
    }
}

#[test]
fn regression_tool_inputs_keep_their_numbers_exactly() {
    // serde_json's default float parsing was off by one unit in the last place for these:
    // the tool call caw-box printed was not the one the CLI made.
    for number in [
        "1.868233e136",
        "-6.0605010109621774e-30",
        "-2.0322486108297e-141",
        "-1.8932766855170746e-308",
    ] {
        let line = format!(
            r#"{{"type":"tool_use","tool_name":"t","tool_id":"1","parameters":{{"x":{number}}}}}"#
        );
        let (events, _) = parse_turn(ProviderKind::Gemini, &[&line]);
        let exact: f64 = number.parse().unwrap();
        let Event::ToolCall { input, .. } = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(input["x"].as_f64(), Some(exact), "{number}");
        let json = serde_json::to_string(&events[0]).unwrap();
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back, events[0], "{json}");
    }
}
