//! The text log line, written in `tracing-subscriber`'s own format at half its cost.
//!
//! Every tool call logs one line, so its formatting is on the hot path. The subscriber's
//! defaults spend most of a line on three things: a timestamp formatted field by field, string
//! fields escaped character by character through `Debug`, and floats through `Debug`. Here:
//!
//! - [`LineTime`] writes the same RFC 3339 timestamp (`2026-12-05T06:26:11.183772Z`) from the
//!   date and time of the current second, formatted once per second and thread;
//! - [`LineFields`] writes the same `name=value` fields. A string with nothing to escape
//!   (printable ASCII without `"` or `\`) is quoted as it is, a finite float is written by
//!   `ryu` (the shortest form that reads back as the same number, as `Debug` writes it;
//!   numbers `Debug` writes with an exponent are left to it), and a
//!   message that is printable ASCII is written once formatted. Everything else (other
//!   characters, `r#` names, non-finite floats) goes through the subscriber's own
//!   [`DefaultVisitor`], escaping included, so no line says anything the default would not.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::FormatTime;

/// The subscriber's UTC timestamp with microseconds, the date and time formatted once a
/// second.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineTime;

impl FormatTime for LineTime {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        thread_local! {
            /// The second last formatted on this thread, and its `YYYY-MM-DDTHH:MM:SS`.
            static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = now.as_secs();
        SECOND.with(|second| {
            let mut second = second.borrow_mut();
            if second.0 != secs {
                let (cached, text) = &mut *second;
                text.clear();
                let time = i64::try_from(secs)
                    .ok()
                    .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
                    .unwrap_or_default();
                write!(text, "{}", time.format("%Y-%m-%dT%H:%M:%S"))?;
                *cached = secs;
            }
            w.write_str(&second.1)?;
            let mut fraction = *b".000000Z";
            let mut micros = now.subsec_micros();
            for digit in fraction[1..7].iter_mut().rev() {
                *digit = b'0' + (micros % 10) as u8;
                micros /= 10;
            }
            // Only ASCII digits were written into an ASCII template.
            w.write_str(std::str::from_utf8(&fraction).map_err(|_| fmt::Error)?)
        })
    }
}

/// The fields of a log line as the subscriber's default writes them, faster where nothing
/// needs escaping.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineFields;

/// Writes one event's or span's fields for [`LineFields`].
pub struct LineVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl<'a> MakeVisitor<Writer<'a>> for LineFields {
    type Visitor = LineVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> LineVisitor<'a> {
        LineVisitor {
            writer: target,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// Whether `bytes` are printable ASCII, which no escaping changes (given `"` and `\` are not
/// among them where `Debug` quotes).
fn printable(bytes: &[u8], quoted: bool) -> bool {
    bytes
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && !(quoted && (b == b'"' || b == b'\\')))
}

impl LineVisitor<'_> {
    /// Writes a field the way the subscriber's default visitor does.
    fn default_way(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.is_empty = false;
    }

    /// Writes the space before every field but the first.
    fn separate(&mut self) -> fmt::Result {
        if std::mem::take(&mut self.is_empty) {
            Ok(())
        } else {
            self.writer.write_str(" ")
        }
    }

    /// Writes `name=`.
    fn name(&mut self, name: &str) -> fmt::Result {
        self.separate()?;
        self.writer.write_str(name)?;
        self.writer.write_str("=")
    }
}

impl Visit for LineVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name == "message" || name.starts_with("r#") || !printable(value.as_bytes(), true) {
            return self.default_way(|v| v.record_str(field, value));
        }
        self.result = self.name(name).and_then(|()| {
            self.writer.write_str("\"")?;
            self.writer.write_str(value)?;
            self.writer.write_str("\"")
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // `Debug` writes numbers under 1e-4 and from 1e16 on with an exponent, from
        // other bounds than `ryu`'s: those (and non-finite ones) are left to it.
        let decimal = value == 0.0 || (1e-4..1e16).contains(&value.abs());
        if name.starts_with("r#") || !decimal {
            return self.default_way(|v| v.record_f64(field, value));
        }
        let mut buffer = ryu::Buffer::new();
        let text = buffer.format_finite(value);
        self.result = self.name(name).and_then(|()| self.writer.write_str(text));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        if name.starts_with("r#") {
            return self.default_way(|v| v.record_debug(field, value));
        }
        if name != "message" {
            // The default writes any other field's `Debug` as it is, unescaped.
            self.result = self
                .name(name)
                .and_then(|()| write!(self.writer, "{value:?}"));
            return;
        }
        // The default strips escape sequences from a message character by character; one
        // that is printable ASCII has none.
        thread_local! {
            static MESSAGE: RefCell<String> = const { RefCell::new(String::new()) };
        }
        let written = MESSAGE.with(|message| {
            let mut message = message.borrow_mut();
            message.clear();
            if write!(message, "{value:?}").is_err() || !printable(message.as_bytes(), false) {
                return None;
            }
            Some(
                self.separate()
                    .and_then(|()| self.writer.write_str(&message)),
            )
        });
        match written {
            Some(result) => self.result = result,
            None => self.default_way(|v| v.record_debug(field, value)),
        }
    }
}

impl VisitOutput<fmt::Result> for LineVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for LineVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::format::DefaultFields;
    use tracing_subscriber::fmt::time::SystemTime as DefaultTime;
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    /// Logs the same events under the default formatter and under ours; the lines without
    /// their timestamps.
    fn both(log: fn()) -> (String, String) {
        let strip = |lines: &Lines| {
            String::from_utf8(lines.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(|l| l.split_once(' ').unwrap().1.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let default = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(default.clone())
            .with_ansi(false)
            .fmt_fields(DefaultFields::new())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let ours = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(ours.clone())
            .with_ansi(false)
            .with_timer(LineTime)
            .fmt_fields(LineFields)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        (strip(&default), strip(&ours))
    }

    #[test]
    fn fields_are_written_as_the_default_writes_them() {
        let (default, ours) = both(|| {
            let outcome = String::from("fresh");
            tracing::info!(target: "toolledger::call", tool = "create_automation", principal = "bench", operation = "-", outcome = %outcome, latency_ms = 328.929_362_999_999_97, "tool call");
            tracing::warn!(
                tool = "quote\"d",
                principal = "back\\slash",
                operation = "tab\there",
                latency_ms = 0.000_12,
                "with {} args",
                2
            );
            tracing::info!(
                tool = "ünïcode",
                control = "\u{1b}[31mred",
                n = 7_u64,
                i = -3_i64,
                ok = true,
                latency_ms = 1.0,
                "message \u{1b}[2J cleared"
            );
            tracing::info!(
                latency_ms = 12_345.678,
                big = 1.5e15,
                huge = 2.5e16,
                small = 0.25,
                tiny = 0.000_05,
                least = 0.000_1,
                zero = 0.0,
                minus = -0.0,
                negative = -7.125,
                nan = f64::NAN,
                inf = f64::INFINITY,
                "floats"
            );
            tracing::info!(r#type = "raw", value = ?vec![1, 2], "raw names and Debug values");
            let span = tracing::info_span!("call", tool = "x\"y", n = 1);
            let _entered = span.enter();
            tracing::error!(error = "store unavailable", "inside a span");
        });
        assert_eq!(ours, default);
        assert!(ours.contains("tool=\"create_automation\""), "{ours}");
        assert!(ours.contains("latency_ms=328.92936299999997"), "{ours}");
    }

    #[test]
    fn the_timestamp_is_the_default_one() {
        let format = |timer: &dyn FormatTime| {
            let mut text = String::new();
            timer.format_time(&mut Writer::new(&mut text)).unwrap();
            text
        };
        // Taken until both fall in the same second (one second boundary at most).
        let (default, ours) = (0..3)
            .map(|_| (format(&DefaultTime), format(&LineTime)))
            .find(|(d, o)| d[..19] == o[..19])
            .expect("three tries within one second");
        assert_eq!(ours.len(), default.len(), "{ours} vs {default}");
        assert!(ours.ends_with('Z') && ours.as_bytes()[19] == b'.', "{ours}");
        assert!(ours[20..26].bytes().all(|b| b.is_ascii_digit()), "{ours}");
        assert!(
            ours >= default,
            "taken after the default: {ours} vs {default}"
        );
    }
}
