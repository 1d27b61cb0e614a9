//! What a turn cost when the CLI does not say: a pricing table as data (`prices.json`,
//! embedded; its `source` names the package, version, file and date it was taken from) and
//! the arithmetic over a turn's [`Usage`]. Not a billing record: list prices only, the base
//! tier only (no long-context surcharge, no batch or subscription discount).
//!
//! The table is keyed by model vendor (`anthropic`, `openai`, `google`) and model id. A
//! provider maps to its vendor; opencode, which speaks to any vendor, names its models
//! `vendor/model` (`anthropic/claude-sonnet-4-5`), or a bare id on an `--endpoint`, which is
//! looked up under every vendor. A model the table does not know has no cost (`null`) and its
//! turn says `priced: false`, unless the person priced it in their config file
//! (`[prices."MODEL"]`): such prices come as a [`PriceBook`] of the session's settings and go
//! before the table's.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use super::ProviderKind;
use crate::event::Usage;

/// One model's list prices, USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// `None`: no separate price; cached input is charged as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// `None`: no separate price; cache writes are charged as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

/// Prices a person gave (a config file's `[prices."MODEL"]`), by model id as the CLI names
/// it: they go before the table's, for any provider.
pub type PriceBook = BTreeMap<String, Price>;

impl Price {
    /// The cost of `usage` at these prices (`usage.input_tokens` are the uncached part, as
    /// every adapter reports them).
    pub fn cost(&self, usage: &Usage) -> f64 {
        let per_token = |tokens: u64, per_million: f64| tokens as f64 * per_million / 1e6;
        per_token(usage.input_tokens, self.input)
            + per_token(usage.output_tokens, self.output)
            + per_token(
                usage.cache_read_tokens,
                self.cache_read.unwrap_or(self.input),
            )
            + per_token(
                usage.cache_write_tokens,
                self.cache_write.unwrap_or(self.input),
            )
    }
}

#[derive(Debug, Deserialize)]
struct Table {
    vendors: BTreeMap<String, BTreeMap<String, Price>>,
}

const PRICES_JSON: &str = include_str!("prices.json");

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| serde_json::from_str(PRICES_JSON).expect("prices.json is valid"))
}

/// The model a provider's CLI uses when none is given, as seen on the wire against the stub
/// model, for the CLI version of the turn's image (`None`: unknown, taken to be the pinned
/// one); `None` where caw-box does not know it.
pub fn default_model(provider: ProviderKind, cli_version: Option<&str>) -> Option<&'static str> {
    let since = |v| super::cli_version_at_least(cli_version, v);
    match provider {
        // e2e `cost_claude_code_matches_the_table` checks the wire: claude-opus-5 up to
        // 2.1.267, claude-opus-5-5 from 2.1.268 (2.1.332 seen).
        ProviderKind::ClaudeCode if since("2.1.268") => Some("claude-opus-5-5"),
        ProviderKind::ClaudeCode => Some("claude-opus-5"),
        ProviderKind::Gemini => Some("gemini-2.5-flash"),
        // codex with an API key: its bundled model catalog's default (e2e
        // `cost_codex_default_model_from_the_table` checks the wire): gpt-6.1-sol in
        // 0.169.0, gpt-6.2-sol in 0.171.0, which no price list has yet (so its turns cost
        // null, not a guess).
        ProviderKind::Codex if since("0.171.0") => Some("gpt-6.2-sol"),
        ProviderKind::Codex => Some("gpt-6.1-sol"),
        // opencode's default is whatever its own config and providers pick: not known here.
        ProviderKind::Opencode => None,
    }
}

fn vendor_of(provider: ProviderKind) -> Option<&'static str> {
    match provider {
        ProviderKind::ClaudeCode => Some("anthropic"),
        ProviderKind::Codex => Some("openai"),
        ProviderKind::Gemini => Some("google"),
        ProviderKind::Opencode => None,
    }
}

/// `model` without what does not change its price: claude's `[1m]` context suffix, Gemini's
/// `models/` prefix.
fn bare(model: &str) -> &str {
    let model = model.trim();
    let model = model.strip_suffix("[1m]").unwrap_or(model);
    model.strip_prefix("models/").unwrap_or(model)
}

/// The price of `model` as `provider` names it: the person's (`book`), else the table's.
pub fn price_in(book: &PriceBook, provider: ProviderKind, model: &str) -> Option<Price> {
    book.get(model)
        .or_else(|| book.get(bare(model)))
        .copied()
        .or_else(|| price(provider, model))
}

/// The list price of `model` as `provider` names it, if the table has it.
pub fn price(provider: ProviderKind, model: &str) -> Option<Price> {
    let vendors = &table().vendors;
    let model = bare(model);
    let in_vendor = |vendor: &str, id: &str| vendors.get(vendor).and_then(|m| m.get(id)).copied();
    if let Some(vendor) = vendor_of(provider) {
        return in_vendor(vendor, model);
    }
    // opencode: `vendor/model` (opencode's own provider ids), or a bare id.
    match model.split_once('/') {
        Some((vendor, id)) => {
            let vendor = match vendor {
                "google" | "gemini" | "google-vertex" => "google",
                other => other,
            };
            in_vendor(vendor, id)
        }
        None => vendors.values().find_map(|m| m.get(model)).copied(),
    }
}

/// Whether `usage` has a cost: the CLI's or a price's, or nothing to price.
pub fn is_priced(usage: &Usage) -> bool {
    usage.cost_usd.is_some() || !counted(usage)
}

fn counted(usage: &Usage) -> bool {
    usage.input_tokens + usage.output_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        > 0
}

/// Fills `usage.cost_usd` from the person's prices (`book`), else the table, when the CLI
/// reported no cost (or a zero cost for tokens it did count: opencode does so for a model it
/// has no price for). A model neither knows leaves it as the CLI said.
pub fn fill_cost(
    provider: ProviderKind,
    model: Option<&str>,
    cli_version: Option<&str>,
    book: &PriceBook,
    usage: &mut Usage,
) {
    let reported = match usage.cost_usd {
        Some(c) => c > 0.0 || !counted(usage),
        None => false,
    };
    if reported {
        return;
    }
    let Some(model) = model.or(default_model(provider, cli_version)) else {
        return;
    };
    if let Some(price) = price_in(book, provider, model) {
        usage.cost_usd = Some(price.cost(usage));
    }
}

/// Where the table came from, as `prices.json` says it.
pub fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let v: serde_json::Value = serde_json::from_str(PRICES_JSON).expect("valid");
        let s = &v["source"];
        format!(
            "{} {} ({}), taken {}",
            s["package"].as_str().unwrap_or("?"),
            s["version"].as_str().unwrap_or("?"),
            s["file"].as_str().unwrap_or("?"),
            s["taken_on"].as_str().unwrap_or("?")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, read: u64, write: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: read,
            cache_write_tokens: write,
            cost_usd: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn every_row_parses_and_is_positive() {
        let vendors = &table().vendors;
        assert_eq!(
            vendors.keys().collect::<Vec<_>>(),
            ["anthropic", "google", "openai"]
        );
        for (vendor, models) in vendors {
            assert!(!models.is_empty(), "{vendor} has no rows");
            for (model, p) in models {
                assert!(
                    p.input > 0.0 && p.output > p.input,
                    "{vendor}/{model}: {p:?}"
                );
                assert!(p.cache_read.is_none_or(|c| c < p.input), "{vendor}/{model}");
            }
        }
        assert!(source().starts_with("litellm 1.110.2"), "{}", source());
    }

    #[test]
    fn cost_is_tokens_times_price_per_million() {
        // claude-opus-4-8: $5 in, $25 out, $0.50 cache read, $6.25 cache write.
        let p = price(ProviderKind::ClaudeCode, "claude-opus-4-8").unwrap();
        assert!(close(p.cost(&usage(1_000_000, 0, 0, 0)), 5.0));
        assert!(close(p.cost(&usage(0, 1_000_000, 0, 0)), 25.0));
        assert!(close(p.cost(&usage(0, 0, 1_000_000, 0)), 0.5));
        assert!(close(p.cost(&usage(0, 0, 0, 1_000_000)), 6.25));
        // The recorded claude turn (tests/fixtures/claude_code/turn1.jsonl): claude itself
        // reported $0.09546 for 19072 in, 4 out.
        assert!(close(p.cost(&usage(19072, 4, 0, 0)), 0.09546));
        assert!(close(
            p.cost(&usage(1000, 100, 2000, 300)),
            (1000.0 * 5.0 + 100.0 * 25.0 + 2000.0 * 0.5 + 300.0 * 6.25) / 1e6
        ));
    }

    #[test]
    fn a_missing_cache_price_charges_input() {
        // gpt-5.5 lists no cache-write price.
        let p = price(ProviderKind::Codex, "gpt-5.5").unwrap();
        assert_eq!(p.cache_write, None);
        assert!(close(
            p.cost(&usage(0, 0, 0, 1000)),
            p.cost(&usage(1000, 0, 0, 0))
        ));
    }

    #[test]
    fn models_are_found_by_provider() {
        assert!(price(ProviderKind::Codex, "gpt-5.5").is_some());
        assert!(price(ProviderKind::Gemini, "gemini-2.5-flash").is_some());
        assert!(price(ProviderKind::Gemini, "models/gemini-2.5-pro").is_some());
        assert!(price(ProviderKind::ClaudeCode, "claude-opus-4-8[1m]").is_some());
        // A provider only prices its own vendor's models.
        assert!(price(ProviderKind::ClaudeCode, "gpt-5.5").is_none());
        assert_eq!(
            price(ProviderKind::Opencode, "anthropic/claude-sonnet-4-5"),
            price(ProviderKind::ClaudeCode, "claude-sonnet-4-5")
        );
        assert_eq!(
            price(ProviderKind::Opencode, "google/gemini-2.5-pro"),
            price(ProviderKind::Gemini, "gemini-2.5-pro")
        );
        assert_eq!(
            price(ProviderKind::Opencode, "gpt-5.5"),
            price(ProviderKind::Codex, "gpt-5.5")
        );
        assert!(price(ProviderKind::Opencode, "stub-model").is_none());
        assert!(price(ProviderKind::Codex, "no-such-model").is_none());
    }

    #[test]
    fn fill_cost_keeps_what_the_cli_reported() {
        let mut u = usage(100, 10, 0, 0);
        u.cost_usd = Some(0.5);
        fill_cost(
            ProviderKind::ClaudeCode,
            Some("claude-opus-4-8"),
            None,
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(u.cost_usd, Some(0.5));
        // No tokens and a zero cost: a true zero.
        let mut u = usage(0, 0, 0, 0);
        u.cost_usd = Some(0.0);
        fill_cost(
            ProviderKind::Opencode,
            Some("gpt-5.5"),
            None,
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(u.cost_usd, Some(0.0));
    }

    #[test]
    fn fill_cost_prices_an_unreported_or_zero_cost() {
        let mut u = usage(2000, 50, 1000, 0);
        fill_cost(
            ProviderKind::Codex,
            Some("gpt-5.5"),
            None,
            &PriceBook::new(),
            &mut u,
        );
        let expected = (2000.0 * 5.0 + 50.0 * 30.0 + 1000.0 * 0.5) / 1e6;
        assert!(close(u.cost_usd.unwrap(), expected), "{:?}", u.cost_usd);
        let mut u = usage(2000, 50, 1000, 0);
        u.cost_usd = Some(0.0);
        fill_cost(
            ProviderKind::Opencode,
            Some("gpt-5.5"),
            None,
            &PriceBook::new(),
            &mut u,
        );
        assert!(close(u.cost_usd.unwrap(), expected));
        // No model named: the CLI's default.
        let mut u = usage(1_000_000, 0, 0, 0);
        fill_cost(ProviderKind::Gemini, None, None, &PriceBook::new(), &mut u);
        assert!(close(u.cost_usd.unwrap(), 0.3));
    }

    #[test]
    fn an_unknown_model_stays_null() {
        let mut u = usage(100, 10, 0, 0);
        fill_cost(
            ProviderKind::Opencode,
            Some("stub-model"),
            None,
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(u.cost_usd, None);
        // opencode's default model is its own config's: not known, so not guessed.
        fill_cost(
            ProviderKind::Opencode,
            None,
            None,
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(u.cost_usd, None);
    }

    #[test]
    fn codex_without_a_model_is_priced_at_its_default() {
        let mut u = usage(100, 10, 0, 0);
        fill_cost(
            ProviderKind::Codex,
            None,
            Some("0.169.0"),
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(
            u.cost_usd,
            Some(
                price(ProviderKind::Codex, "gpt-6.1-sol")
                    .unwrap()
                    .cost(&usage(100, 10, 0, 0))
            )
        );
        // 0.171.0's default has no list price yet: no cost, not 0.169.0's model's.
        let mut u = usage(100, 10, 0, 0);
        fill_cost(
            ProviderKind::Codex,
            None,
            Some("0.171.0"),
            &PriceBook::new(),
            &mut u,
        );
        assert_eq!(u.cost_usd, None);
    }

    #[test]
    fn a_persons_price_counts_before_the_tables() {
        let mut book = PriceBook::new();
        book.insert(
            "gpt-6.2-sol".into(),
            Price {
                input: 2.0,
                output: 8.0,
                cache_read: None,
                cache_write: None,
            },
        );
        let mut u = usage(1_000_000, 1_000_000, 0, 0);
        fill_cost(ProviderKind::Codex, None, Some("0.171.0"), &book, &mut u);
        assert!(close(u.cost_usd.unwrap(), 10.0), "{:?}", u.cost_usd);
        assert!(is_priced(&u));
        // Over the table's own row too.
        book.insert(
            "gpt-5.5".into(),
            Price {
                input: 1.0,
                output: 1.0,
                cache_read: None,
                cache_write: None,
            },
        );
        let mut u = usage(1_000_000, 0, 0, 0);
        fill_cost(ProviderKind::Codex, Some("gpt-5.5"), None, &book, &mut u);
        assert!(close(u.cost_usd.unwrap(), 1.0));
        let mut unpriced = usage(5, 5, 0, 0);
        fill_cost(
            ProviderKind::Codex,
            Some("no-such"),
            None,
            &book,
            &mut unpriced,
        );
        assert!(!is_priced(&unpriced));
        assert!(is_priced(&usage(0, 0, 0, 0)));
    }

    /// The pinned CLIs' default models no price list has yet: their turns are `priced: false`
    /// until the table (or the person's `[prices]`) has them. A pin does not wait for a price.
    const UNPRICED_DEFAULTS: [&str; 1] = ["gpt-6.2-sol"];

    /// Each pinned CLI's default model (where known) has a price, or is one of the few known
    /// to have none yet.
    #[test]
    fn the_pinned_default_models_are_in_the_table() {
        for p in ProviderKind::ALL {
            let pinned = Some(p.default_cli_version());
            if let Some(model) = default_model(p, pinned) {
                assert!(
                    price(p, model).is_some() || UNPRICED_DEFAULTS.contains(&model),
                    "{p} {model}"
                );
            }
        }
        for model in UNPRICED_DEFAULTS {
            assert!(
                price(ProviderKind::Codex, model).is_none(),
                "{model} is priced now"
            );
        }
        assert_eq!(
            default_model(ProviderKind::ClaudeCode, Some("2.1.267")),
            Some("claude-opus-5")
        );
        assert_eq!(
            default_model(ProviderKind::ClaudeCode, Some("2.1.332")),
            Some("claude-opus-5-5")
        );
    }
}
