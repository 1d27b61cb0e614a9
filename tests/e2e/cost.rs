//! Cost per turn from the pricing table, against the real CLIs and the stub model: a turn's
//! token counts are those the stub sent in its responses (its records' `usage`, read here in
//! each vendor's terms, never caw-box's own reading of the CLI's report), and its `cost_usd`
//! is those counts times the table's prices for the model each request named (claude
//! reports its own, which must agree); `show --json` sums a session's turns and `ls --json`
//! sums per session and per group.

use caw_box::ProviderKind;
use serde_json::Value;

use crate::common::*;

/// The table as shipped, read independently of caw-box's own lookup.
fn table_price(vendor: &str, model: &str) -> Value {
    let table: Value = serde_json::from_str(include_str!("../../src/provider/prices.json"))
        .expect("prices.json parses");
    let row = table["vendors"][vendor][model].clone();
    assert!(row.is_object(), "no {vendor}/{model} row in prices.json");
    row
}

/// Token counts in caw-box's terms: uncached input, output, cache reads, cache writes.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Tokens {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
}

impl Tokens {
    fn add(&mut self, other: Tokens) {
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
    }

    /// What caw-box reported for a turn (`usage` of `-o json`).
    fn reported(usage: &Value) -> Tokens {
        let n = |k: &str| {
            usage[k]
                .as_u64()
                .unwrap_or_else(|| panic!("{k} in {usage}"))
        };
        Tokens {
            input: n("input_tokens"),
            output: n("output_tokens"),
            cache_read: n("cache_read_tokens"),
            cache_write: n("cache_write_tokens"),
        }
    }

    fn cost(&self, price: &Value) -> f64 {
        let p = |k: &str| {
            price[k]
                .as_f64()
                .unwrap_or(price["input"].as_f64().unwrap())
        };
        (self.input as f64 * p("input")
            + self.output as f64 * p("output")
            + self.cache_read as f64 * p("cache_read")
            + self.cache_write as f64 * p("cache_write"))
            / 1e6
    }
}

/// The tokens the stub sent in one response, read from the usage object it recorded
/// (tests/stub-model/README.md, Records) in the vendor's own terms: OpenAI's and Google's
/// input counts include cached tokens, Anthropic's do not.
fn sent_tokens(record: &Value) -> Tokens {
    let u = &record["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let path = record["path"].as_str().unwrap_or_default();
    if path.starts_with("/v1/messages") {
        Tokens {
            input: n(&u["input_tokens"]),
            output: n(&u["output_tokens"]),
            cache_read: n(&u["cache_read_input_tokens"]),
            cache_write: n(&u["cache_creation_input_tokens"]),
        }
    } else if path.ends_with("/responses") {
        let cached = n(&u["input_tokens_details"]["cached_tokens"]);
        Tokens {
            input: n(&u["input_tokens"]) - cached,
            output: n(&u["output_tokens"]),
            cache_read: cached,
            cache_write: 0,
        }
    } else if path.ends_with("/chat/completions") {
        let cached = n(&u["prompt_tokens_details"]["cached_tokens"]);
        Tokens {
            input: n(&u["prompt_tokens"]) - cached,
            output: n(&u["completion_tokens"]),
            cache_read: cached,
            cache_write: 0,
        }
    } else if path.contains("GenerateContent") || path.contains("generateContent") {
        let cached = n(&u["cachedContentTokenCount"]);
        Tokens {
            input: n(&u["promptTokenCount"]) - cached,
            output: n(&u["candidatesTokenCount"]) + n(&u["thoughtsTokenCount"]),
            cache_read: cached,
            cache_write: 0,
        }
    } else {
        panic!("usage on a path the test does not know: {record}")
    }
}

/// The model a recorded request asked for (Gemini names it in the path).
fn model_of(record: &Value) -> String {
    if let Some(m) = record["body"]["model"].as_str() {
        return m.to_string();
    }
    let path = record["path"].as_str().unwrap_or_default();
    path.rsplit_once("/models/")
        .and_then(|(_, rest)| rest.split(':').next())
        .unwrap_or_else(|| panic!("no model in {record}"))
        .to_string()
}

/// The stub's records since `seen` of them: one turn's requests.
fn requests_since(rig: &Rig, seen: &mut usize) -> Vec<Value> {
    let all = rig.stub_requests();
    let new = all[*seen..].to_vec();
    *seen = all.len();
    new
}

/// What one turn's model responses sent, summed, and what it cost by the table at the model
/// each request named.
fn sent_for_turn(requests: &[Value], vendor: &str) -> (Tokens, f64) {
    let mut tokens = Tokens::default();
    let mut cost = 0.0;
    for r in requests.iter().filter(|r| r["usage"].is_object()) {
        let sent = sent_tokens(r);
        tokens.add(sent);
        cost += sent.cost(&table_price(vendor, &model_of(r)));
    }
    (tokens, cost)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 + b.abs() * 1e-6
}

/// One turn's cost, checked: caw-box's counts are those the stub sent in the turn's
/// responses (`sent`: the stub's records of the turn), each of them asked for `model`, and
/// its cost is the table's price of them.
fn checked_cost(p: P, turn: &Value, sent: &[Value], vendor: &str, model: &str) -> f64 {
    let usage = &turn["usage"];
    assert!(
        sent.iter().any(|r| r.get("usage").is_some()),
        "the stub's records have no `usage`: an older stub image ({}); build this one \
         (scripts/stub-image.sh)",
        stub_image()
    );
    let models: Vec<String> = sent
        .iter()
        .filter(|r| r["usage"].is_object())
        .map(model_of)
        .collect();
    assert!(
        models.iter().all(|m| m == model),
        "{}: the turn asked for other models than {model}: {models:?}",
        p.name
    );
    let (tokens, expected) = sent_for_turn(sent, vendor);
    assert!(
        tokens.input + tokens.cache_read > 0 && tokens.output > 0,
        "{}: the stub sent no usage this turn: {sent:#?}",
        p.name
    );
    assert_eq!(
        Tokens::reported(usage),
        tokens,
        "{}: caw-box's usage is not what the stub sent: {usage}",
        p.name
    );
    let cost = usage["cost_usd"]
        .as_f64()
        .unwrap_or_else(|| panic!("cost_usd is null for {}: {usage}", p.name));
    assert!(
        close(cost, expected),
        "{}: cost {cost} but the table gives {expected} for the stub's {tokens:?}",
        p.name
    );
    cost
}

fn cost_of_turns(p: P, model: Option<&str>, vendor: &str, priced_model: &str) {
    let rig = Rig::new(&format!("cost-{}", p.name));
    let group = format!("cost-group-{}", p.name);
    let mut extra = vec!["--group", group.as_str()];
    if let Some(m) = model {
        extra.extend(["--model", m]);
    }
    let mut seen = rig.stub_requests().len();
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", p.name, "--network", &rig.network])
        .args(["--endpoint", &rig.endpoint()])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(&extra)
        .arg("REMEMBER:otter");
    let (code, first, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "first turn failed: {first}\n{stderr}");
    let first_sent = requests_since(&rig, &mut seen);
    let id = first["session_id"].as_str().unwrap().to_string();
    let (code, second, stderr) = rig.json_turn(rig.resume_cmd(p, &id, "RECALL", &[]));
    assert_eq!(code, 0, "second turn failed: {second}\n{stderr}");
    let second_sent = requests_since(&rig, &mut seen);

    let costs = [
        checked_cost(p, &first, &first_sent, vendor, priced_model),
        checked_cost(p, &second, &second_sent, vendor, priced_model),
    ];
    let total: f64 = costs.iter().sum();

    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", &id, "--json"]))).unwrap();
    let shown_total = shown["total_cost_usd"].as_f64().expect("show's total");
    assert!(close(shown_total, total), "show: {shown_total} != {total}");
    let text = stdout_of(&rig.caw_run(&["show", &id]));
    assert!(
        text.contains(&format!("total cost ${total:.4}")),
        "show's text: {text}"
    );

    // A second session in the same group: the group's cost is both sessions'.
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", p.name, "--network", &rig.network])
        .args(["--endpoint", &rig.endpoint()])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(&extra)
        .arg("hello");
    let (code, other, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "other session failed: {other}\n{stderr}");
    let other_sent = requests_since(&rig, &mut seen);
    let other_cost = checked_cost(p, &other, &other_sent, vendor, priced_model);
    let listed: Value = serde_json::from_str(&stdout_of(
        &rig.caw_run(&["ls", "--json", "--group", &group]),
    ))
    .unwrap();
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    let row = rows
        .iter()
        .find(|r| r["session_id"] == id.as_str())
        .unwrap();
    assert!(close(row["cost_usd"].as_f64().unwrap(), total), "{row}");
    for r in rows {
        let group_cost = r["group_cost_usd"].as_f64().expect("group_cost_usd");
        assert!(close(group_cost, total + other_cost), "{r}");
    }
}

#[test]
fn cost_claude_code_matches_the_table() {
    // No --model: the pinned CLI's default (claude-opus-5-5 since 2.1.268), which reports
    // its own cost.
    cost_of_turns(CLAUDE, None, "anthropic", "claude-opus-5-5");
}

#[test]
fn cost_codex_from_the_table() {
    cost_of_turns(CODEX, Some("gpt-5.5"), "openai", "gpt-5.5");
}

#[test]
fn cost_opencode_from_the_table() {
    // opencode prices an --endpoint model at 0; the table knows gpt-5.5.
    cost_of_turns(OPENCODE, Some("gpt-5.5"), "openai", "gpt-5.5");
}

#[test]
fn cost_gemini_from_the_table() {
    cost_of_turns(
        GEMINI,
        Some("gemini-2.5-flash"),
        "google",
        "gemini-2.5-flash",
    );
}

/// codex without `--model`: the model its version (the image's) sends, seen by the stub, is the
/// one caw-box knows as that version's default, so its turn is priced as that model, from the
/// table; a default no price list has yet is `priced: false` with a null cost, never a guess,
/// and a `drift warning` (`make drift` lists those under its table without failing).
#[test]
fn cost_codex_default_model_from_the_table() {
    let rig = Rig::new("cost-codex-default");
    let image = std::env::var("CAW_BOX_E2E_IMAGE_REPO").unwrap_or_else(|_| "caw-box".into())
        + "/codex:latest";
    let version = rig
        .rt
        .block_on(rig.docker.inspect_image(&image))
        .ok()
        .and_then(|i| i.config?.labels?.get("io.caw-box.cli-version").cloned())
        .unwrap_or_else(|| panic!("{image} has no io.caw-box.cli-version label"));
    let default = caw_box::provider::pricing::default_model(ProviderKind::Codex, Some(&version))
        .expect("caw-box knows codex's default model");
    let mut seen = rig.stub_requests().len();
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        P {
            model: None,
            ..CODEX
        },
        "cost-default-q1",
        &[],
    ));
    assert_eq!(code, 0, "turn failed: {out}\n{stderr}");
    let sent = requests_since(&rig, &mut seen);
    let models: Vec<String> = sent
        .iter()
        .filter(|r| r["body"].to_string().contains("cost-default-q1"))
        .filter_map(|r| r["body"]["model"].as_str().map(String::from))
        .collect();
    assert!(!models.is_empty(), "no request carried the prompt");
    assert!(
        models.iter().all(|m| m == default),
        "codex {version}'s default model is not {default} (caw-box's pricing::default_model): {models:?}"
    );
    if caw_box::provider::pricing::price(ProviderKind::Codex, default).is_some() {
        checked_cost(CODEX, &out, &sent, "openai", default);
        assert_eq!(out["priced"], true, "{out}");
    } else {
        assert!(out["usage"]["cost_usd"].is_null(), "{out}");
        assert_eq!(out["priced"], false, "{out}");
        check(&format!(
            "drift warning: codex {version}'s default model {default} has no price: its turns are unpriced until the price table (or a [prices] entry) has it"
        ));
    }
}

/// A model the table does not know: `cost_usd` is null, not a guess (codex reports none), and
/// the turn says `priced: false` (`-o json`, `show`); `--max-cost` is refused for it. Once the
/// person prices the model in their config file (`[prices."MODEL"]`), `show` prices the
/// earlier turn, and the next turn is priced and held to `--max-cost`.
#[test]
fn an_unpriced_model_says_so_until_the_person_prices_it() {
    let rig = Rig::new("cost-unknown");
    let unpriced = P {
        model: Some("stub-model-unpriced"),
        ..CODEX
    };
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(unpriced, "REMEMBER:kiwi", &[]));
    assert_eq!(code, 0, "turn failed: {out}\n{stderr}");
    let tokens = &out["usage"];
    assert!(tokens["output_tokens"].as_u64().unwrap() > 0, "{out}");
    assert!(tokens["cost_usd"].is_null(), "{out}");
    assert_eq!(out["priced"], false, "{out}");
    let id = out["session_id"].as_str().unwrap().to_string();
    let show = |json: bool| {
        let mut args = vec!["show", id.as_str()];
        if json {
            args.push("--json");
        }
        let out = rig.caw_run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
        stdout_of(&out)
    };
    let shown: Value = serde_json::from_str(&show(true)).unwrap();
    assert_eq!(shown["priced"], false, "{shown}");
    assert_eq!(shown["unpriced_turns"], serde_json::json!([1]), "{shown}");
    assert!(show(false).contains("unpriced"), "{}", show(false));
    let refused = run(rig.resume_cmd(unpriced, &id, "RECALL", &["--max-cost", "1"]));
    assert_eq!(refused.status.code(), Some(2), "{}", stderr_of(&refused));
    assert!(
        stderr_of(&refused).contains("[prices."),
        "{}",
        stderr_of(&refused)
    );

    check("priced in the user's config file: show prices turn 1; --max-cost holds turn 2");
    // $1000 per million tokens either way: a turn of some thousand tokens crosses $0.01.
    std::fs::write(
        rig.data_dir.path().join("no-user-config.toml"),
        "[prices.\"stub-model-unpriced\"]\ninput = 1000\noutput = 1000\n",
    )
    .unwrap();
    let shown: Value = serde_json::from_str(&show(true)).unwrap();
    assert_eq!(shown["priced"], true, "{shown}");
    let first = &shown["turns"][0]["usage"];
    let expected = (first["input_tokens"].as_u64().unwrap()
        + first["cache_read_tokens"].as_u64().unwrap()
        + first["output_tokens"].as_u64().unwrap()) as f64
        * 1000.0
        / 1e6;
    let priced = first["cost_usd"].as_f64().unwrap();
    assert!(
        (priced - expected).abs() < 1e-9,
        "{priced} vs {expected}: {shown}"
    );
    let mut resume = rig.resume_cmd(unpriced, &id, "RECALL", &["--max-cost", "0.01"]);
    resume.args(["-o", "json"]);
    let out = run(resume);
    let turn: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(out.status.code(), Some(6), "{turn}\n{}", stderr_of(&out));
    assert_eq!(
        (turn["status"].as_str(), turn["priced"].as_bool()),
        (Some("budget"), Some(true)),
        "{turn}"
    );
    assert!(turn["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{turn}");
    // Spent: the next turn is refused before anything starts.
    let next = run(rig.resume_cmd(unpriced, &id, "RECALL", &[]));
    assert_eq!(next.status.code(), Some(6), "{}", stderr_of(&next));
}

/// `--max-cost` on codex, which reports its usage only with its answer: the turn that
/// crosses the limit keeps its answer and ends `budget` (exit 6); the next turn is refused
/// before anything starts (no request reaches the model); `show` says so; a resume with a
/// higher limit goes on with the conversation. Bad limits are refused, creating nothing.
#[test]
fn max_cost_ends_the_crossing_turn_refuses_the_next_and_a_higher_one_resumes() {
    let rig = Rig::new("budget-codex");
    check("bad limits: exit 2, nothing made");
    for bad in ["0", "-1", "nan"] {
        let out = rig.caw_run(&[
            "run",
            "--provider",
            "codex",
            "--max-cost",
            bad,
            "--network",
            &rig.network,
            "hi",
        ]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--max-cost {bad}: {}",
            stderr_of(&out)
        );
    }
    let unpriced = P {
        model: Some("stub-model-unpriced"),
        ..CODEX
    };
    let out = run(rig.run_cmd(unpriced, "hi", &["--max-cost", "1"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("nor your config prices stub-model-unpriced"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(
        rig.caw_volumes(),
        Vec::<String>::new(),
        "a refused run left a volume"
    );
    assert_eq!(
        rig.caw_containers(),
        Vec::<String>::new(),
        "a refused run left a container"
    );

    check("the crossing turn: status budget, exit 6, its answer kept");
    let (code, first, stderr) =
        rig.json_turn(rig.run_cmd(CODEX, "REMEMBER:quince", &["--max-cost", "0.000001"]));
    assert_eq!(code, 6, "{first}\n{stderr}");
    assert_eq!(first["status"], "budget", "{first}");
    assert_eq!(first["exit_code"], 6, "{first}");
    assert!(
        first["result"].as_str().unwrap().contains("quince"),
        "{first}"
    );
    assert!(
        first["usage"]["cost_usd"].as_f64().unwrap() > 0.000001,
        "{first}"
    );
    let id = first["session_id"].as_str().unwrap().to_string();

    check("the next turn is refused before anything starts");
    let before = rig.stub_requests().len();
    let (code, refused, stderr) = rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &[]));
    assert_eq!(code, 6, "{refused}\n{stderr}");
    assert_eq!(refused["error"]["kind"], "budget", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("of its --max-cost $0.0000"),
        "{refused}"
    );
    assert_eq!(
        rig.stub_requests().len(),
        before,
        "the refused turn reached the model"
    );
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", &id, "--json"]))).unwrap();
    assert_eq!(shown["turns"].as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(shown["budget"]["spent"], true, "{shown}");
    assert_eq!(shown["budget"]["max_cost_usd"], 0.000001, "{shown}");

    check("a resume with a higher limit goes on");
    let (code, second, stderr) =
        rig.json_turn(rig.resume_cmd(CODEX, &id, "RECALL", &["--max-cost", "5"]));
    assert_eq!(code, 0, "{second}\n{stderr}");
    assert_eq!(
        second["result"], "You told me to remember quince.",
        "{second}"
    );
    let shown: Value =
        serde_json::from_str(&stdout_of(&rig.caw_run(&["show", &id, "--json"]))).unwrap();
    assert_eq!(shown["budget"]["spent"], false, "{shown}");
    assert_eq!(shown["settings"]["max_cost_usd"], 5.0, "{shown}");
}

/// `--max-cost` on opencode, which reports usage after each step: caw-box stops the turn
/// at the first step's usage, before the model's next answer (each held 3 s by the stub)
/// comes: the result is caw-box's stop, not the CLI's answer to its tool's output, and the
/// step's cost counts.
#[test]
fn max_cost_stops_an_opencode_turn_at_the_step_that_crosses_it() {
    let rig = Rig::new("budget-opencode");
    let priced = P {
        model: Some("gpt-5.5"),
        ..OPENCODE
    };
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        priced,
        "SLEEP:3 RUN:echo budget-step-one",
        &["--max-cost", "0.000001"],
    ));
    assert_eq!(code, 6, "{out}\n{stderr}");
    assert_eq!(out["status"], "budget", "{out}");
    assert_eq!(
        out["result"],
        "the session's spend crossed its --max-cost during the turn: caw-box stopped it",
        "{out}"
    );
    assert!(
        out["usage"]["cost_usd"].as_f64().unwrap() > 0.000001,
        "{out}"
    );
}
