//! The stderr log: one line per event, JSON (default) or text. Every line emitted inside a
//! request's span carries that span's fields — its `request_id` — at the top level, and the
//! access-log event (target `legate::access`) carries its whole record as top-level fields.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::observe::LogFormat;

/// Target of the access-log line.
pub const ACCESS_TARGET: &str = "legate::access";
/// The field holding an access record (a JSON object as text), spliced into the line.
pub const RECORD_FIELD: &str = "record";

/// Installs the global subscriber on stderr; `filter` is a tracing-subscriber filter, with the
/// directives that keep secrets out of the log (`telemetry::log_filter`).
pub fn init(format: LogFormat, filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(crate::telemetry::log_filter(filter))
        .with_writer(std::io::stderr)
        .fmt_fields(JsonFields::new())
        .event_format(Line { format })
        .try_init();
}

pub struct Line {
    pub format: LogFormat,
}

/// Event fields in order, as JSON values.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == RECORD_FIELD
            && let Ok(Value::Object(m)) = serde_json::from_str::<Value>(value)
        {
            self.0.extend(m);
            return;
        }
        self.0.push((field.name().to_string(), Value::from(value)));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_string(), Value::from(value)));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.push((field.name().to_string(), Value::from(value)));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.push((field.name().to_string(), Value::from(value)));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.push((field.name().to_string(), Value::from(value)));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == RECORD_FIELD {
            self.record_str(field, &text);
            return;
        }
        self.0.push((field.name().to_string(), Value::from(text)));
    }
}

impl<S> FormatEvent<S, JsonFields> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // Span fields (outermost first), then the event's own, which win on a clash.
        let mut span_fields: Vec<(String, Value)> = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<JsonFields>>()
                    && let Ok(Value::Object(m)) = serde_json::from_str::<Value>(f.as_str())
                {
                    span_fields.extend(m);
                }
            }
        }
        let message = fields
            .0
            .iter()
            .position(|(k, _)| k == "message")
            .map(|i| fields.0.remove(i).1);
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::from(time));
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));
        if let Some(m) = message {
            line.insert("message".into(), m);
        }
        for (k, v) in span_fields.into_iter().chain(fields.0) {
            line.insert(k, v);
        }
        match self.format {
            LogFormat::Json => writeln!(writer, "{}", Value::Object(line)),
            LogFormat::Text => writeln!(writer, "{}", text_line(line)),
        }
    }
}

/// `TIME LEVEL message key=value …`, values quoted (as JSON strings) when they contain spaces
/// or control characters: a caller's model name holding an escape sequence reached an
/// operator's terminal raw.
fn text_line(mut line: Map<String, Value>) -> String {
    let mut out = String::new();
    for k in ["timestamp", "level", "message"] {
        if let Some(v) = line.remove(k) {
            match v {
                Value::String(s) if s.contains(char::is_control) => {
                    out.push_str(&Value::String(s).to_string());
                }
                Value::String(s) => out.push_str(&s),
                other => out.push_str(&other.to_string()),
            }
            out.push(' ');
        }
    }
    line.remove("target");
    for (k, v) in line {
        let quoted =
            |s: &str| s.is_empty() || s.contains([' ', '"', '=']) || s.contains(char::is_control);
        let v = match v {
            Value::String(s) if quoted(&s) => Value::String(s).to_string(),
            Value::String(s) => s,
            other => other.to_string(),
        };
        out.push_str(&k);
        out.push('=');
        out.push_str(&v);
        out.push(' ');
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_quote_values_with_spaces() {
        let v = serde_json::json!({"timestamp": "T", "level": "INFO", "target": "x",
            "message": "request", "request_id": "lgt_1", "why": "two words", "n": 3, "z": null});
        let Value::Object(m) = v else { unreachable!() };
        assert_eq!(
            text_line(m),
            "T INFO request n=3 request_id=lgt_1 why=\"two words\" z=null"
        );
    }

    #[test]
    fn text_lines_escape_control_characters() {
        let v = serde_json::json!({"timestamp": "T", "level": "INFO", "message": "request",
            "model": "\u{1b}[31mred\u{1b}[0m", "path": "/v1/messages"});
        let Value::Object(m) = v else { unreachable!() };
        let line = text_line(m);
        assert!(!line.contains('\u{1b}'), "{line:?}");
        assert_eq!(
            line,
            "T INFO request model=\"\\u001b[31mred\\u001b[0m\" path=/v1/messages"
        );
    }
}
