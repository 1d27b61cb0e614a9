//! Cost per turn from the pricing table, against the real CLIs and the stub model: a turn's
//! `cost_usd` is its token counts times the table's prices for the model (claude reports
//! its own, which must agree), `show --json` sums a session's turns and `ls --json` sums
//! per session and per group.

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

fn expected_cost(price: &Value, usage: &Value) -> f64 {
    let n = |k: &str| {
        usage[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {usage}")) as f64
    };
    let p = |k: &str| {
        price[k]
            .as_f64()
            .unwrap_or(price["input"].as_f64().unwrap())
    };
    (n("input_tokens") * p("input")
        + n("output_tokens") * p("output")
        + n("cache_read_tokens") * p("cache_read")
        + n("cache_write_tokens") * p("cache_write"))
        / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 + b.abs() * 1e-6
}

fn cost_of_turns(p: P, model: Option<&str>, vendor: &str, priced_model: &str) {
    let rig = Rig::new(&format!("cost-{}", p.name));
    let price = table_price(vendor, priced_model);
    let group = format!("cost-group-{}", p.name);
    let mut extra = vec!["--group", group.as_str()];
    if let Some(m) = model {
        extra.extend(["--model", m]);
    }
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", p.name, "--network", &rig.network])
        .args(["--endpoint", &rig.endpoint()])
        .args(["--env", &format!("{}={TEST_KEY}", p.key_var)])
        .args(&extra)
        .arg("REMEMBER:otter");
    let (code, first, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "first turn failed: {first}\n{stderr}");
    let id = first["session_id"].as_str().unwrap().to_string();
    let (code, second, stderr) = rig.json_turn(rig.resume_cmd(p, &id, "RECALL", &[]));
    assert_eq!(code, 0, "second turn failed: {second}\n{stderr}");

    let mut costs = Vec::new();
    for turn in [&first, &second] {
        let usage = &turn["usage"];
        assert!(
            usage["input_tokens"].as_u64().unwrap() + usage["cache_read_tokens"].as_u64().unwrap()
                > 0,
            "the stub's turn counted no input: {usage}"
        );
        let cost = usage["cost_usd"]
            .as_f64()
            .unwrap_or_else(|| panic!("cost_usd is null for {}: {usage}", p.name));
        let expected = expected_cost(&price, usage);
        assert!(
            close(cost, expected),
            "{}: cost {cost} but the table gives {expected} for {usage}",
            p.name
        );
        costs.push(cost);
    }
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
    let other_cost = other["usage"]["cost_usd"].as_f64().expect("a cost");
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
    // No --model: the pinned CLI's default, which reports its own cost.
    cost_of_turns(CLAUDE, None, "anthropic", "claude-opus-4-8");
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

/// codex without `--model`: the model its pinned version sends (seen by the stub) is the one
/// caw-box prices, so `cost_usd` is the table's, not null.
#[test]
fn cost_codex_default_model_from_the_table() {
    let rig = Rig::new("cost-codex-default");
    let (code, out, stderr) = rig.json_turn(rig.run_cmd(
        P {
            model: None,
            ..CODEX
        },
        "cost-default-q1",
        &[],
    ));
    assert_eq!(code, 0, "turn failed: {out}\n{stderr}");
    let sent: Vec<String> = rig
        .stub_requests()
        .iter()
        .filter(|r| r["body"].to_string().contains("cost-default-q1"))
        .filter_map(|r| r["body"]["model"].as_str().map(String::from))
        .collect();
    assert!(!sent.is_empty(), "no request carried the prompt");
    assert!(
        sent.iter().all(|m| m == "gpt-6.1-sol"),
        "codex's default model changed: {sent:?}"
    );
    let usage = &out["usage"];
    let cost = usage["cost_usd"]
        .as_f64()
        .unwrap_or_else(|| panic!("null cost: {out}"));
    let expected = expected_cost(&table_price("openai", "gpt-6.1-sol"), usage);
    assert!(
        close(cost, expected),
        "cost {cost}, the table gives {expected}: {usage}"
    );
}

/// A model the table does not know: `cost_usd` is null, not a guess (codex reports none).
#[test]
fn cost_unknown_model_is_null() {
    let rig = Rig::new("cost-unknown");
    let mut cmd = rig.caw();
    cmd.args(["run", "--provider", "codex", "--network", &rig.network])
        .args(["--endpoint", &rig.endpoint()])
        .args(["--env", &format!("OPENAI_API_KEY={TEST_KEY}")])
        .args(["--model", "stub-model-unpriced"])
        .arg("hello");
    let (code, out, stderr) = rig.json_turn(cmd);
    assert_eq!(code, 0, "turn failed: {out}\n{stderr}");
    assert!(out["usage"]["output_tokens"].as_u64().unwrap() > 0, "{out}");
    assert!(out["usage"]["cost_usd"].is_null(), "{out}");
}
