//! A session's spend limit (`--max-cost`): the next turn of a spent session is refused
//! before anything starts, and a running turn is stopped once the CLI's own usage events,
//! priced as the turn's cost is (the CLI's cost, else the price table), cross it. Not here:
//! the prices (`provider::pricing`), stopping a turn (`reading.rs`, `headless.rs`).

use crate::error::{Error, ErrorKind, Result};
use crate::event::Usage;
use crate::provider::{pricing, ProviderKind};
use crate::session::store::record::SessionRecord;

/// `$0.0123`: what a spend reads as in messages (cents are too coarse for a stub's turn).
pub fn usd(amount: f64) -> String {
    format!("${amount:.4}")
}

/// Refuses the next turn of `record`'s session when its spend has reached its
/// `--max-cost`, or when its spend cannot be known: a CLI that reports no cost of its own
/// on a model the price table does not know.
pub fn check(record: &SessionRecord) -> Result<()> {
    let Some(max) = record.settings.max_cost_usd else {
        return Ok(());
    };
    let id = record.session_id;
    let spent = record.total_cost_usd().unwrap_or(0.0);
    if spent >= max {
        return Err(Error::new(
            ErrorKind::Budget,
            format!(
                "session {id} has spent {} of its --max-cost {}: no further turn is started",
                usd(spent),
                usd(max)
            ),
        )
        .with_hint(format!(
            "resume it with a higher limit: `caw-box resume {id} --max-cost USD`"
        )));
    }
    if !can_price(
        record.provider,
        record.settings.model.as_deref(),
        record.cli_version.as_deref(),
        &record.settings.prices,
    ) {
        let model = record
            .settings
            .model
            .clone()
            .or_else(|| {
                pricing::default_model(record.provider, record.cli_version.as_deref())
                    .map(|m| format!("its default model {m}"))
            })
            .unwrap_or_else(|| "its default model".to_string());
        return Err(Error::usage(format!(
            "--max-cost cannot be held for session {id}: {} reports no cost, and neither caw-box's price table nor your config prices {model}",
            record.provider.executable()
        ))
        .with_hint("price it in your config file (`[prices.\"MODEL\"]` with input, output, cache_read, cache_write in USD per million tokens), give --model a model of the price table (`caw-box --version --json` names its source), or leave --max-cost out"));
    }
    Ok(())
}

/// A session's spend against its limit, as `show` gives it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Spend {
    pub max_cost_usd: f64,
    pub spent_usd: f64,
    pub left_usd: f64,
    /// The next turn is refused until a resume raises `--max-cost`.
    pub spent: bool,
}

impl Spend {
    /// `None`: the session has no limit.
    pub fn of(record: &SessionRecord) -> Option<Spend> {
        let max = record.settings.max_cost_usd?;
        let spent = record.total_cost_usd().unwrap_or(0.0);
        Some(Spend {
            max_cost_usd: max,
            spent_usd: spent,
            left_usd: (max - spent).max(0.0),
            spent: spent >= max,
        })
    }
}

/// Whether a turn of `provider` on `model` (else the default of `cli_version`, the pin's when
/// unknown) has a cost caw-box can know.
fn can_price(
    provider: ProviderKind,
    model: Option<&str>,
    cli_version: Option<&str>,
    book: &pricing::PriceBook,
) -> bool {
    // Claude Code prices every turn itself (`total_cost_usd`).
    provider == ProviderKind::ClaudeCode
        || model
            .or(pricing::default_model(provider, cli_version))
            .is_some_and(|m| pricing::price_in(book, provider, m).is_some())
}

/// Whether a crossing seen in `provider`'s usage events stops its turn: opencode reports
/// usage after each step, with more to come; claude, codex and gemini report it once, with
/// their answer (the turn is done then: stopping it would only lose the answer).
pub(in crate::session) fn stops_mid_turn(provider: ProviderKind) -> bool {
    provider == ProviderKind::Opencode
}

/// The running spend of one turn against what its session has left.
#[derive(Debug, Clone)]
pub(in crate::session) struct Meter {
    provider: ProviderKind,
    model: Option<String>,
    /// The CLI version of the turn's image (its default model's price).
    cli_version: Option<String>,
    /// The person's prices.
    prices: pricing::PriceBook,
    /// What the session spent before this turn.
    before: f64,
    max: Option<f64>,
    /// This turn's cost so far, from its usage events.
    this_turn: f64,
}

impl Meter {
    pub fn new(record: &SessionRecord) -> Self {
        Meter {
            provider: record.provider,
            model: record.settings.model.clone(),
            cli_version: record.cli_version.clone(),
            prices: record.settings.prices.clone(),
            before: record.total_cost_usd().unwrap_or(0.0),
            max: record.settings.max_cost_usd,
            this_turn: 0.0,
        }
    }

    /// Adds a usage event of the turn (each CLI's events add up to the turn's usage).
    pub fn add(&mut self, usage: &Usage) {
        if self.max.is_none() {
            return;
        }
        let mut usage = *usage;
        pricing::fill_cost(
            self.provider,
            self.model.as_deref(),
            self.cli_version.as_deref(),
            &self.prices,
            &mut usage,
        );
        self.this_turn += usage.cost_usd.unwrap_or(0.0);
    }

    /// This turn's cost so far.
    pub fn this_turn(&self) -> f64 {
        self.this_turn
    }

    /// Whether the session's spend with this turn's so far is over its limit.
    pub fn crossed(&self) -> bool {
        self.over(self.this_turn).is_some()
    }

    /// Why a turn that cost `turn_cost` leaves its session over its limit (`None`: it
    /// does not).
    pub fn over(&self, turn_cost: f64) -> Option<String> {
        let max = self.max?;
        let spent = self.before + turn_cost;
        (spent > max).then(|| {
            format!(
                "the session's spend reached {} (this turn {}), over its --max-cost {}",
                usd(spent),
                usd(turn_cost),
                usd(max)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::store::record::TurnRecord;

    fn record(
        provider: ProviderKind,
        model: &str,
        max: Option<f64>,
        spent: &[f64],
    ) -> SessionRecord {
        let turn = |(i, c): (usize, &f64)| TurnRecord {
            usage: Usage {
                cost_usd: Some(*c),
                ..Default::default()
            },
            ..TurnRecord::succeeded(i as u32 + 1)
        };
        let mut r = crate::session::turn::plan::tests::record("open");
        r.provider = provider;
        r.settings.model = Some(model.to_string());
        r.settings.max_cost_usd = max;
        r.turns = spent.iter().enumerate().map(turn).collect();
        r
    }

    #[test]
    fn a_spent_session_is_refused_with_the_budget_kind_and_how_to_go_on() {
        let r = record(ProviderKind::Codex, "gpt-5.5", Some(0.5), &[0.25, 0.25]);
        let e = check(&r).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Budget);
        assert_eq!(e.kind.exit_code(), 6);
        assert_eq!(
            e.message,
            format!(
                "session {} has spent $0.5000 of its --max-cost $0.5000: no further turn is started",
                r.session_id
            )
        );
        assert!(e.hint.unwrap().contains("--max-cost USD"));
        let under = record(ProviderKind::Codex, "gpt-5.5", Some(0.51), &[0.25, 0.25]);
        assert!(check(&under).is_ok());
        let unlimited = record(ProviderKind::Codex, "gpt-5.5", None, &[9.0]);
        assert!(check(&unlimited).is_ok());
    }

    #[test]
    fn a_limit_that_cannot_be_priced_is_refused_up_front() {
        let mut r = record(ProviderKind::Codex, "no-such-model", Some(1.0), &[]);
        let e = check(&r).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Usage);
        assert!(e.message.contains("prices no-such-model"), "{}", e.message);
        assert!(
            e.hint.unwrap().contains("[prices."),
            "the hint says how to price it"
        );
        // Priced in the person's config: held.
        r.settings.prices.insert(
            "no-such-model".into(),
            pricing::Price {
                input: 1.0,
                output: 2.0,
                cache_read: None,
                cache_write: None,
            },
        );
        assert!(check(&r).is_ok());
        // Claude Code prices its turns itself.
        assert!(check(&record(
            ProviderKind::ClaudeCode,
            "no-such-model",
            Some(1.0),
            &[]
        ))
        .is_ok());
    }

    #[test]
    fn the_meter_adds_priced_usage_events_to_what_was_spent_before() {
        let r = record(ProviderKind::Codex, "gpt-5.5", Some(1.0), &[0.5]);
        let mut meter = Meter::new(&r);
        let price = pricing::price(ProviderKind::Codex, "gpt-5.5").unwrap();
        // Tokens worth a little under and then over the half dollar left.
        let tokens = (0.3 / price.output * 1e6) as u64;
        let step = Usage {
            output_tokens: tokens,
            ..Default::default()
        };
        meter.add(&step);
        assert!(!meter.crossed());
        meter.add(&step);
        assert!(meter.crossed());
        let why = meter.over(price.cost(&step) * 2.0).unwrap();
        assert!(why.ends_with("over its --max-cost $1.0000"), "{why}");
    }
}
