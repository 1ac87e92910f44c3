//! Turning measurements into the published result: percentiles, the Markdown table (metric,
//! direct mock, via legate, added, target, met?) and the line naming the machine and date.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One row of the results table, already formatted: one cell per side, then one "added"
/// cell per side other than the mock.
pub(crate) struct Row {
    pub metric: String,
    pub cells: Vec<String>,
    pub added: Vec<String>,
    pub target: String,
    pub met: String,
}

impl Row {
    /// A row with no target.
    pub(crate) fn plain(metric: String, cells: Vec<String>, added: Vec<String>) -> Row {
        Row {
            metric,
            cells,
            added,
            target: "—".to_owned(),
            met: "—".to_owned(),
        }
    }

    /// A row judged against `target`: `met` is `None` when the run cannot judge it.
    pub(crate) fn judged(mut self, target: &str, met: Option<bool>) -> Row {
        self.target = target.to_owned();
        self.met = match met {
            Some(true) => "yes".to_owned(),
            Some(false) => "**no**".to_owned(),
            None => "not judged".to_owned(),
        };
        self
    }
}

/// Renders the rows as a GitHub-flavoured Markdown table with one column per side (`names`,
/// the mock first) and one "added" column per proxy.
pub(crate) fn table(rows: &[Row], names: &[&str]) -> String {
    let mut out = String::from("| metric |");
    let mut rule = String::from("|---|");
    for name in names {
        let _ = write!(out, " {name} |");
        rule.push_str("---:|");
    }
    for name in names.iter().skip(1) {
        let _ = write!(out, " added {} |", name.trim_start_matches("via "));
        rule.push_str("---:|");
    }
    out.push_str(" target | met? |\n");
    rule.push_str("---|---|\n");
    out.push_str(&rule);
    for r in rows {
        // Writing to a String cannot fail.
        let _ = write!(out, "| {} |", r.metric);
        for cell in r.cells.iter().chain(&r.added) {
            let _ = write!(out, " {cell} |");
        }
        let _ = writeln!(out, " {} | {} |", r.target, r.met);
    }
    out
}

/// Nearest-rank percentile (`p` in 0..=100) of already sorted samples.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Mebibytes (2^20 bytes), the unit the memory target is stated in.
pub(crate) fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// A count with thousands separators: `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The 1-minute load average from /proc/loadavg, `?` when unreadable.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// `Machine: <cpu model>, nproc N; <UTC date and time>; <what kind of run>; load average;
/// which legate binary (`legate`: `binary::Legate::origin`) and the proxies' workers`.
/// The load average is there because other work on a 2-core machine moves every number.
pub(crate) fn machine_line(run: &str, load_before: &str, legate: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown CPU", |(_, name)| name.trim());
    let nproc = std::thread::available_parallelism().map_or(0, usize::from);
    let floor = if std::env::var("BENCH_FLOOR").is_ok_and(|v| v == "1") {
        "; the legate columns are examples/hyper_floor (BENCH_FLOOR=1), one thread"
    } else {
        ""
    };
    let sdk = if crate::client::sdk_headers() {
        "; requests carry an SDK's headers (BENCH_SDK_HEADERS=1)"
    } else {
        ""
    };
    let cpus = match crate::children::legate_cpus() {
        Some(list) => format!("; legate on CPUs {list} only (BENCH_LEGATE_CPUS)"),
        None => String::new(),
    };
    format!(
        "Machine: {model}, nproc {nproc}; {} UTC; {run}; 1-min load average {load_before} at \
         start; legate ({legate}) worker_threads {}, nginx worker_processes {}{cpus}{floor}{sdk}",
        utc_now(),
        crate::children::legate_workers(),
        crate::nginx::WORKERS,
    )
}

/// A warning to print under the table when other work kept the machine busy: on two cores a
/// load average near one already puts scheduling delays into every tail latency.
pub(crate) fn busy_note(load_before: &str) -> Option<String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    // Only the reading taken before the run: the run itself raises the load average.
    let load: f64 = load_before.parse().ok()?;
    (load > cores / 2.0).then(|| {
        format!(
            "Note: the machine was busy with other work (1-min load average {load:.2} at start on \
             {cores} cores); p99 and max include time spent waiting for a CPU."
        )
    })
}

/// The current UTC date and time as `YYYY-MM-DD HH:MM`, without a date library: days since
/// the epoch converted to the proleptic Gregorian calendar by whole 400-year eras.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_date(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// Calendar date of a day count since 1970-01-01. Works on eras of 400 years (146,097 days)
/// starting on 1 March, so the leap day falls at the end of each shifted year.
fn civil_date(days_since_epoch: u64) -> (u64, u64, u64) {
    // Day 0 of the shifted calendar is 0000-03-01, 719,468 days before the Unix epoch.
    let shifted = days_since_epoch + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months counted from March, each run of five months spanning 153 days.
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

/// Checks of the pure helpers, run by the benchmark itself at start-up (a `harness = false`
/// target has no test runner): a wrong table is worse than none.
pub(crate) fn self_check() -> Result<(), String> {
    let cases = [
        (0, (1970, 1, 1)),
        (59, (1970, 3, 1)),
        (11_016, (2000, 2, 29)),
        (20_422, (2025, 11, 30)),
    ];
    for (days, expected) in cases {
        let got = civil_date(days);
        if got != expected {
            return Err(format!(
                "civil_date({days}) = {got:?}, expected {expected:?}"
            ));
        }
    }
    let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    let p = |q| percentile(&samples, q);
    if (p(50.0), p(99.0), p(100.0)) != (Some(samples[49]), Some(samples[98]), Some(samples[99])) {
        return Err("nearest-rank percentile is off".to_owned());
    }
    if thousands(1_234_567) != "1,234,567" || thousands(999) != "999" {
        return Err("thousands separator is off".to_owned());
    }
    Ok(())
}
