//! Money and prices: exact integer pico-dollars (1 USD = 10^12 pico-USD), so that budgets and
//! cost counters never drift the way floating-point sums do.

use std::collections::BTreeMap;

/// Pico-dollars in one US dollar.
pub const PICO_PER_USD: u128 = 1_000_000_000_000;

/// Price of one token of each kind, in pico-USD. A price quoted per million tokens with at most
/// six decimal places is an exact integer here (USD 0.000001 per Mtok = 1 pico-USD per token).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    pub input: u64,
    pub output: u64,
    pub cache_write: u64,
    pub cache_read: u64,
}

/// The price of `target` (`provider:model`): its own `[[prices]]` entry, else the most
/// specific `*` pattern matching it (a dated snapshot priced by its family's entry).
pub fn price_for(
    prices: &std::collections::BTreeMap<String, Price>,
    target: &str,
) -> Option<Price> {
    if let Some(p) = prices.get(target) {
        return Some(*p);
    }
    let entries = prices.iter().map(|(k, p)| (k.as_str(), *p));
    crate::names::best(entries, target).map(|(_, p)| p)
}

/// Parses an exact decimal "USD per million tokens" string (`"3"`, `"0.30"`, `"3.75"`) into
/// pico-USD per token. Refuses signs, exponents, and more than six decimal places, since those
/// cannot be represented exactly.
pub fn parse_usd_per_mtok(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, f),
        None => (s, ""),
    };
    let digits_ok = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && frac.is_empty() || !digits_ok(whole) || !digits_ok(frac) {
        return Err(format!(
            "`{s}` is not a plain decimal number of USD per million tokens (like \"3.75\")"
        ));
    }
    if frac.len() > 6 {
        return Err(format!(
            "`{s}` has more than 6 decimal places; prices are exact to 0.000001 USD per million tokens"
        ));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| format!("`{s}` is too large for a price"))?
    };
    let mut frac_val: u64 = 0;
    for b in frac.bytes().chain(std::iter::repeat(b'0')).take(6) {
        frac_val = frac_val * 10 + u64::from(b - b'0');
    }
    whole
        .checked_mul(1_000_000)
        .and_then(|w| w.checked_add(frac_val))
        .ok_or_else(|| format!("`{s}` is too large for a price"))
}

/// Parses an exact decimal USD amount (`"25"`, `"0.50"`) into pico-USD; at most 12 decimals.
pub fn parse_usd(s: &str) -> Result<u128, String> {
    let s = s.trim();
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits_ok = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && frac.is_empty() || !digits_ok(whole) || !digits_ok(frac) {
        return Err(format!(
            "`{s}` is not a plain decimal USD amount (like \"25.50\")"
        ));
    }
    if frac.len() > 12 {
        return Err(format!("`{s}` is more precise than one pico-dollar"));
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| format!("`{s}` is too large"))?
    };
    let mut frac_val: u128 = 0;
    for b in frac.bytes().chain(std::iter::repeat(b'0')).take(12) {
        frac_val = frac_val * 10 + u128::from(b - b'0');
    }
    whole
        .checked_mul(PICO_PER_USD)
        .and_then(|w| w.checked_add(frac_val))
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Formats pico-USD as an exact decimal USD string (`"0.000123"`), trailing zeros trimmed.
pub fn format_usd(pico: u128) -> String {
    let whole = pico / PICO_PER_USD;
    let frac = pico % PICO_PER_USD;
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:012}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// Formats pico-USD per token back as USD per million tokens (inverse of `parse_usd_per_mtok`).
pub fn format_usd_per_mtok(pico_per_token: u64) -> String {
    let whole = pico_per_token / 1_000_000;
    let frac = pico_per_token % 1_000_000;
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// The most tokens of one kind one answer is counted for: 2^24, above the largest context
/// windows offered (10 million tokens) and far above any output limit.
pub const MAX_REPORTED_TOKENS: u64 = 1 << 24;

/// Token usage of one answer, normalised across APIs (SPEC §6): the four kinds never
/// overlap. `input` is uncached input only, `cache_read` and `cache_write` are the cached
/// parts, `output` is everything generated (reasoning included). Each dialect reads its
/// API's usage into this shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Usage {
    /// The usage of an OpenAI answer, whose prompt count includes its cached parts (`cached`
    /// read, `written` to the cache): each part at most what the prompt count leaves, so a
    /// report of more cached tokens than were sent bills no more than the prompt.
    pub fn of_prompt(prompt: u64, (cached, written): (u64, u64), output: u64) -> Usage {
        let cache_read = cached.min(prompt);
        let cache_write = written.min(prompt - cache_read);
        Usage {
            input: prompt - cache_read - cache_write,
            output,
            cache_read,
            cache_write,
        }
    }

    /// Cost in pico-USD, all four kinds priced.
    pub fn cost_pico(&self, price: &Price) -> u128 {
        [
            (self.input, price.input),
            (self.output, price.output),
            (self.cache_read, price.cache_read),
            (self.cache_write, price.cache_write),
        ]
        .iter()
        .map(|&(tokens, per_token)| u128::from(tokens) * u128::from(per_token))
        .fold(0u128, u128::saturating_add)
    }

    /// The usage as legate accounts it: each count at most [`MAX_REPORTED_TOKENS`], and the
    /// output at most `max_output`, what the request's `max_tokens` allows when it named one
    /// (no provider writes more than it was asked for; `proxy::answer::output_bound`). A provider that reports more (2^64 − 1,
    /// say, from a bug or a hostile stand-in) would otherwise drive a tenant's token bucket
    /// and daily budget so far below zero that it stayed locked out until a restart (2^24
    /// output tokens alone cost more than many a daily budget), and add a fortune to the cost
    /// counters; such a report is logged.
    pub fn bounded(self, upstream: &str, max_output: Option<u64>) -> Usage {
        let most_output = max_output.map_or(MAX_REPORTED_TOKENS, |m| m.min(MAX_REPORTED_TOKENS));
        let inputs = [self.input, self.cache_read, self.cache_write];
        if inputs.iter().all(|&n| n <= MAX_REPORTED_TOKENS) && self.output <= most_output {
            return self;
        }
        tracing::warn!(
            upstream,
            input = self.input,
            output = self.output,
            cache_read = self.cache_read,
            cache_write = self.cache_write,
            max = MAX_REPORTED_TOKENS,
            max_output = most_output,
            "upstream reported more tokens than any model takes, or more output than was asked for; counted as the maximum"
        );
        let cap = |n: u64| n.min(MAX_REPORTED_TOKENS);
        Usage {
            input: cap(self.input),
            output: self.output.min(most_output),
            cache_read: cap(self.cache_read),
            cache_write: cap(self.cache_write),
        }
    }

    /// All tokens of the four kinds (what a tokens-per-minute bucket is charged for).
    /// Both usages together, kind by kind.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input: self.input.saturating_add(other.input),
            output: self.output.saturating_add(other.output),
            cache_read: self.cache_read.saturating_add(other.cache_read),
            cache_write: self.cache_write.saturating_add(other.cache_write),
        }
    }

    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }
}

/// Running totals per tenant and `provider:model`, served by `/admin/usage`. Exact integers.
///
/// Callers choose model names, so the entries are bounded (SPEC §14): beyond
/// `MAX_LEDGER_ENTRIES` the least recently used one is folded into its tenant's
/// `provider:other` entry, so the totals stay exact while the document stays small. Models
/// the config names are kept apart from names it does not know: a caller sending a thousand
/// made-up model names folds only those, never a configured model's priced spend (which it
/// did, across tenants, when both shared one list).
pub struct Ledger {
    entries: parking_lot::Mutex<Entries>,
}

/// `(tenant, provider:model)` entries in use order, those of configured models and those of
/// other names apart, and the folded `provider:other` totals (bounded by the configured
/// tenants and providers).
struct Entries {
    configured: crate::lru::Lru<(String, String), LedgerEntry>,
    unknown: crate::lru::Lru<(String, String), LedgerEntry>,
    folded: BTreeMap<(String, String), LedgerEntry>,
}

/// Distinct `(tenant, provider:model)` entries kept apart, of configured models and of other
/// names each. Configured ones are bounded by the config (tenants × providers × models, and
/// those of earlier configs since a reload): this is a bound a config reaches only by
/// thousands of model names.
const MAX_LEDGER_ENTRIES: usize = 1024;

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            entries: parking_lot::Mutex::new(Entries {
                configured: crate::lru::Lru::new(MAX_LEDGER_ENTRIES),
                unknown: crate::lru::Lru::new(MAX_LEDGER_ENTRIES),
                folded: Default::default(),
            }),
        }
    }
}

/// Whether a ledger entry's model is one the config names (kept apart from other names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Configured,
    Unknown,
}

impl LedgerEntry {
    fn add(&mut self, other: &LedgerEntry) {
        self.requests += other.requests;
        self.usage.input += other.usage.input;
        self.usage.output += other.usage.output;
        self.usage.cache_read += other.usage.cache_read;
        self.usage.cache_write += other.usage.cache_write;
        self.cost_pico += other.cost_pico;
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerEntry {
    pub requests: u64,
    pub usage: Usage,
    pub cost_pico: u128,
}

impl Ledger {
    /// One request served, its usage and cost.
    pub fn record(&self, tenant: &str, (target, named): (&str, Named), usage: Usage, cost: u128) {
        self.add(tenant, (target, named), 1, usage, cost);
    }

    /// Usage of an attempt that served nothing (it failed before its commit point) but that
    /// the provider reported, and may bill: tokens and cost, no request.
    pub fn record_unserved(
        &self,
        tenant: &str,
        (target, named): (&str, Named),
        usage: Usage,
        cost: u128,
    ) {
        self.add(tenant, (target, named), 0, usage, cost);
    }

    fn add(
        &self,
        tenant: &str,
        (target, named): (&str, Named),
        requests: u64,
        usage: Usage,
        cost_pico: u128,
    ) {
        let this = LedgerEntry {
            requests,
            usage,
            cost_pico,
        };
        let mut guard = self.entries.lock();
        let map = &mut *guard;
        let list = match named {
            Named::Configured => &mut map.configured,
            Named::Unknown => &mut map.unknown,
        };
        // The usual case, a pair seen before, copies neither string.
        let pair: &dyn crate::lru::StrPair = &(tenant, target);
        if let Some(e) = list.touch(pair) {
            e.add(&this);
            return;
        }
        let key = (tenant.to_string(), target.to_string());
        let (e, evicted) = list.entry(&key, LedgerEntry::default);
        e.add(&this);
        if let Some(((tenant, target), old)) = evicted {
            let provider = target.split_once(':').map_or(target.as_str(), |(p, _)| p);
            map.folded
                .entry((tenant, format!("{provider}:other")))
                .or_default()
                .add(&old);
        }
    }

    pub fn snapshot(&self) -> Vec<(String, String, LedgerEntry)> {
        let map = self.entries.lock();
        let mut out: BTreeMap<(String, String), LedgerEntry> = map.folded.clone();
        for (k, e) in map.configured.iter().chain(map.unknown.iter()) {
            out.entry(k.clone()).or_default().add(e);
        }
        out.into_iter().map(|((t, m), e)| (t, m, e)).collect()
    }

    /// The `/admin/usage` document: per tenant, per `provider:model`, the four token counts and
    /// cost as exact integer pico-dollars (a string, since JSON numbers lose precision past
    /// 2^53) plus a decimal USD rendering.
    pub fn to_json(&self) -> serde_json::Value {
        let mut tenants = serde_json::Map::new();
        for (tenant, target, e) in self.snapshot() {
            let slot = tenants
                .entry(tenant)
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let serde_json::Value::Object(models) = slot {
                models.insert(
                    target,
                    serde_json::json!({
                        "requests": e.requests,
                        "input_tokens": e.usage.input,
                        "output_tokens": e.usage.output,
                        "cache_read_tokens": e.usage.cache_read,
                        "cache_write_tokens": e.usage.cache_write,
                        "cost_pico_usd": e.cost_pico.to_string(),
                        "cost_usd": format_usd(e.cost_pico),
                    }),
                );
            }
        }
        serde_json::json!({ "tenants": tenants })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OpenAI prompt count includes its cached parts: they are split out of it, each at
    /// most what it leaves (a report of more cached tokens than the prompt bills the prompt).
    #[test]
    fn cached_parts_are_split_out_of_the_prompt_and_bounded_by_it() {
        let u = |p, c, w| {
            let u = Usage::of_prompt(p, (c, w), 7);
            (u.input, u.cache_read, u.cache_write, u.output)
        };
        assert_eq!(u(100, 30, 20), (50, 30, 20, 7));
        assert_eq!(u(100, 1 << 40, 0), (0, 100, 0, 7));
        assert_eq!(u(100, 80, 50), (0, 80, 20, 7));
        assert_eq!(u(0, 5, 5), (0, 0, 0, 7));
    }

    /// Output is counted at most as asked for; every kind at most 2^24; a sane report as is.
    #[test]
    fn reported_usage_is_bounded_by_what_was_asked_for() {
        let huge = Usage {
            input: u64::MAX,
            output: u64::MAX,
            cache_read: 5,
            cache_write: 0,
        };
        let asked = huge.bounded("p", Some(100));
        assert_eq!((asked.input, asked.output), (MAX_REPORTED_TOKENS, 100));
        assert_eq!(huge.bounded("p", None).output, MAX_REPORTED_TOKENS);
        let sane = Usage {
            input: 10,
            output: 90,
            ..Usage::default()
        };
        assert_eq!(sane.bounded("p", Some(100)), sane);
    }

    #[test]
    fn prices_parse_exactly() {
        assert_eq!(parse_usd_per_mtok("3"), Ok(3_000_000));
        assert_eq!(parse_usd_per_mtok("3.75"), Ok(3_750_000));
        assert_eq!(parse_usd_per_mtok("0.30"), Ok(300_000));
        assert_eq!(parse_usd_per_mtok(".5"), Ok(500_000));
        assert_eq!(parse_usd_per_mtok("0.000001"), Ok(1));
        assert!(parse_usd_per_mtok("0.0000001").is_err());
        assert!(parse_usd_per_mtok("-1").is_err());
        assert!(parse_usd_per_mtok("1e3").is_err());
        assert!(parse_usd_per_mtok("").is_err());
        assert!(parse_usd_per_mtok(".").is_err());
    }

    #[test]
    fn usd_amounts_round_trip() {
        assert_eq!(parse_usd("25"), Ok(25 * PICO_PER_USD));
        assert_eq!(parse_usd("0.000000000001"), Ok(1));
        assert_eq!(format_usd(1), "0.000000000001");
        assert_eq!(format_usd(25 * PICO_PER_USD), "25");
        assert_eq!(format_usd(parse_usd("1.5").unwrap_or(0)), "1.5");
        assert_eq!(format_usd_per_mtok(3_750_000), "3.75");
    }

    #[test]
    fn cost_prices_all_four_kinds() {
        let price = Price {
            input: 3_000_000,
            output: 15_000_000,
            cache_write: 3_750_000,
            cache_read: 300_000,
        };
        let u = Usage {
            input: 10,
            output: 2,
            cache_read: 100,
            cache_write: 4,
        };
        assert_eq!(
            u.cost_pico(&price),
            30_000_000 + 30_000_000 + 30_000_000 + 15_000_000
        );
        let max = Usage {
            input: u64::MAX,
            output: u64::MAX,
            cache_read: u64::MAX,
            cache_write: u64::MAX,
        };
        let max_price = Price {
            input: u64::MAX,
            output: u64::MAX,
            cache_write: u64::MAX,
            cache_read: u64::MAX,
        };
        assert_eq!(max.cost_pico(&max_price), u128::MAX);
        assert_eq!(u.total(), 116);
    }
}
