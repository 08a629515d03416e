//! stderr for log lines, buffered so that a call's log line costs no system call.
//!
//! Every long-running command logs a line per tool call. Written straight to stderr that is a
//! `write(2)` per call, and into a pipe (a supervisor, a container runtime, an MCP client
//! reading the server's stderr) a wake-up of the reader too. Here `info`, `debug` and `trace`
//! lines are appended to a buffer in memory, and a thread of the sink's own writes what has
//! gathered [`FLUSH_AFTER`] after the first of them arrived: one write for many lines under
//! load, a line at most that late when idle. `warn` and `error` lines are written at once,
//! after whatever is buffered, so the order of lines is kept and an unsure outcome is never
//! held back. [`flush`] writes the rest (the command's end).
//!
//! Every line is scrubbed before it is kept ([`scrub`]), whichever crate logged it: the
//! values of registered secrets ([`register_secrets`]: a proxy's upstream headers and URL
//! credentials) are replaced by `[redacted]`, and so are the user information and query values
//! of every `http://` or `https://` URL in the line.
//!
//! Memory is bounded: while stderr does not take what is written (a reader that stopped
//! reading), at most [`MAX_PENDING`] bytes wait, later `info` lines are dropped and counted,
//! and a line saying how many were dropped comes first once stderr takes writes again. Calls
//! never wait for stderr because of an `info` line. A failed write (stderr closed) is
//! ignored: logging never makes a call fail.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

/// How long the first buffered line waits for others before they are written together.
pub const FLUSH_AFTER: Duration = Duration::from_millis(20);

/// Most bytes of buffered lines; further `info` lines are dropped (and counted) meanwhile.
pub const MAX_PENDING: usize = 1 << 20;

/// Lines waiting to be written.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    dropped: u64,
}

/// The process's one log sink.
struct Sink {
    pending: Mutex<Pending>,
    /// Signalled when the first line is added to an empty buffer.
    arrived: Condvar,
    /// Where lines go (stderr). Held while writing, and taken before `pending`: whoever takes
    /// a batch writes it before anyone takes the next one, so lines are written in the order
    /// they were logged.
    output: Mutex<Box<dyn Write + Send>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Sink {
    /// Writes every buffered line, then `line` (an urgent one, or none).
    fn write_out(&self, line: &[u8]) {
        let mut out = lock(&self.output);
        let (mut bytes, dropped) = {
            let mut pending = lock(&self.pending);
            let dropped = std::mem::take(&mut pending.dropped);
            (std::mem::take(&mut pending.bytes), dropped)
        };
        if dropped > 0 {
            let notice = format!(
                "toolledger: {dropped} log lines were dropped while stderr was not being read\n"
            );
            bytes.splice(0..0, notice.into_bytes());
        }
        bytes.extend_from_slice(line);
        if !bytes.is_empty() {
            let _ = out.write_all(&bytes);
            let _ = out.flush();
        }
    }

    fn new(output: Box<dyn Write + Send>) -> Self {
        Sink {
            pending: Mutex::default(),
            arrived: Condvar::new(),
            output: Mutex::new(output),
        }
    }

    /// A sink on `output` with its thread started (`None`: no thread could be started).
    fn start(output: Box<dyn Write + Send>) -> (&'static Sink, bool) {
        let sink: &'static Sink = Box::leak(Box::new(Sink::new(output)));
        let started = std::thread::Builder::new()
            .name("toolledger-log".into())
            .spawn(move || sink.run());
        (sink, started.is_ok())
    }

    /// Buffers a non-urgent line.
    fn append(&self, line: &[u8]) {
        let mut pending = lock(&self.pending);
        if pending.bytes.len() + line.len() > MAX_PENDING {
            pending.dropped += 1;
            return;
        }
        let first = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(line);
        drop(pending);
        if first {
            self.arrived.notify_one();
        }
    }

    /// The sink's thread: waits for a first line, lets others gather, writes them.
    fn run(&self) {
        loop {
            {
                let mut pending = lock(&self.pending);
                while pending.bytes.is_empty() && pending.dropped == 0 {
                    pending = self
                        .arrived
                        .wait(pending)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            }
            std::thread::sleep(FLUSH_AFTER);
            self.write_out(&[]);
        }
    }
}

/// The shortest value [`register_secrets`] keeps: a shorter one would redact ordinary words.
pub const MIN_SECRET_LEN: usize = 6;

static SECRETS: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// Registers values no log line may show (a header's value, a token, a password), however a
/// library formats them: each is replaced by `[redacted]` in every later line. Values shorter
/// than [`MIN_SECRET_LEN`] are not kept (URL query values and credentials are redacted by
/// their place anyway).
pub fn register_secrets<I: IntoIterator<Item = String>>(values: I) {
    let mut secrets = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    for v in values {
        let v = v.trim().to_string();
        if v.len() >= MIN_SECRET_LEN && !secrets.contains(&v) {
            secrets.push(v);
        }
    }
    // The longest first, so a secret that contains another is redacted whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `line` as it may be logged: registered secrets and URL credentials and query values
/// replaced by `[redacted]`. Unchanged (and not copied) when it holds neither.
pub fn scrub(line: &mut Vec<u8>) {
    let secrets = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let (has_url, has_secret) = {
        let text = String::from_utf8_lossy(line);
        (
            text.contains("://"),
            secrets.iter().any(|s| text.contains(s.as_str())),
        )
    };
    if !has_url && !has_secret {
        return;
    }
    let mut text = String::from_utf8_lossy(line).into_owned();
    for s in secrets.iter() {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "[redacted]");
        }
    }
    if has_url {
        text = super::redact_urls(&text);
    }
    *line = text.into_bytes();
}

static SINK: OnceLock<&'static Sink> = OnceLock::new();

/// Set when the sink's thread could not be started: every line is then written at once.
static UNBUFFERED: AtomicBool = AtomicBool::new(false);

fn sink() -> &'static Sink {
    SINK.get_or_init(|| {
        let (sink, started) = Sink::start(Box::new(std::io::stderr()));
        if !started {
            UNBUFFERED.store(true, Ordering::Relaxed);
        }
        sink
    })
}

/// Writes every buffered line to stderr now (nothing when nothing was logged).
pub fn flush() {
    if let Some(sink) = SINK.get() {
        sink.write_out(&[]);
    }
}

/// The [`MakeWriter`] of the log subscriber: stderr behind the sink.
#[derive(Clone, Copy, Debug, Default)]
pub struct BufferedStderr;

/// One event's bytes, handed to the sink when the event is written in full.
pub struct LineWriter {
    line: Vec<u8>,
    urgent: bool,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if self.line.is_empty() {
            return;
        }
        scrub(&mut self.line);
        let sink = sink();
        if self.urgent || UNBUFFERED.load(Ordering::Relaxed) {
            sink.write_out(&self.line);
        } else {
            sink.append(&self.line);
        }
    }
}

impl<'a> MakeWriter<'a> for BufferedStderr {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            line: Vec::new(),
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        LineWriter {
            line: Vec::with_capacity(256),
            urgent: *meta.level() <= tracing::Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Instant;

    /// Collects what is written; blocks each write while `gate` holds no permit.
    #[derive(Clone)]
    struct Captured {
        written: Arc<Mutex<Vec<u8>>>,
        writes: Arc<Mutex<usize>>,
        gate: Option<Arc<Mutex<mpsc::Receiver<()>>>>,
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(gate) = &self.gate {
                let _ = lock(gate).recv();
            }
            lock(&self.written).extend_from_slice(buf);
            *lock(&self.writes) += 1;
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn captured(gate: Option<mpsc::Receiver<()>>) -> Captured {
        Captured {
            written: Arc::default(),
            writes: Arc::default(),
            gate: gate.map(|g| Arc::new(Mutex::new(g))),
        }
    }

    fn text(c: &Captured) -> String {
        String::from_utf8(lock(&c.written).clone()).unwrap()
    }

    #[test]
    fn buffered_lines_are_written_together_and_an_urgent_line_after_them() {
        let out = captured(None);
        let sink = Sink::new(Box::new(out.clone()));
        sink.append(b"info 1\n");
        sink.append(b"info 2\n");
        assert_eq!(text(&out), "", "info lines wait");
        sink.write_out(b"warn 3\n");
        assert_eq!(text(&out), "info 1\ninfo 2\nwarn 3\n");
        assert_eq!(*lock(&out.writes), 1, "one write for the three lines");
    }

    #[test]
    fn the_thread_writes_a_buffered_line_soon_without_a_flush() {
        let out = captured(None);
        let (sink, started) = Sink::start(Box::new(out.clone()));
        assert!(started);
        sink.append(b"info alone\n");
        let until = Instant::now() + Duration::from_secs(10);
        while text(&out).is_empty() {
            assert!(Instant::now() < until, "the line was never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(text(&out), "info alone\n");
    }

    #[test]
    fn a_stalled_stderr_bounds_the_buffer_and_the_dropped_lines_are_counted() {
        let (permits, gate) = mpsc::channel();
        let out = captured(Some(gate));
        let sink: &'static Sink = Box::leak(Box::new(Sink::new(Box::new(out.clone()))));
        // A first batch is being written and stderr takes nothing.
        sink.append(b"first\n");
        let writer = std::thread::spawn(move || sink.write_out(&[]));
        let until = Instant::now() + Duration::from_secs(10);
        while !lock(&sink.pending).bytes.is_empty() {
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(1));
        }
        // Meanwhile the calls go on logging, and never wait: the buffer stops at its bound.
        let line = [b'x'; 1023];
        let mut line = line.to_vec();
        line.push(b'\n');
        let n = MAX_PENDING / line.len() + 100;
        for _ in 0..n {
            sink.append(&line);
        }
        assert!(lock(&sink.pending).bytes.len() <= MAX_PENDING);
        let dropped = lock(&sink.pending).dropped;
        assert_eq!(dropped, (n - MAX_PENDING / line.len()) as u64);
        // stderr takes writes again: the first batch, then the count, then what was kept.
        permits.send(()).unwrap();
        writer.join().unwrap();
        permits.send(()).unwrap();
        sink.write_out(&[]);
        let written = text(&out);
        let expected = format!(
            "first\ntoolledger: {dropped} log lines were dropped while stderr was not being read\n"
        );
        assert!(written.starts_with(&expected), "{}", &written[..200]);
        assert_eq!(
            written.len(),
            expected.len() + MAX_PENDING / line.len() * line.len()
        );
    }

    #[test]
    fn secrets_and_url_credentials_never_reach_a_line() {
        register_secrets(["tok-abcdef-123".to_string(), "short".to_string()]);
        let mut line =
            b"ERROR x: Client(reqwest::Error { url: \"http://u:pw@h:1/mcp?key=SECRET9\" }) \
            Authorization: Bearer tok-abcdef-123 short\n"
                .to_vec();
        scrub(&mut line);
        let line = String::from_utf8(line).unwrap();
        assert!(!line.contains("SECRET9"), "{line}");
        assert!(!line.contains("pw@"), "{line}");
        assert!(!line.contains("tok-abcdef-123"), "{line}");
        assert!(line.contains("Bearer [redacted]"), "{line}");
        assert!(
            line.contains("short"),
            "a short value is not taken for a secret: {line}"
        );
        let mut plain = b"INFO nothing to hide\n".to_vec();
        scrub(&mut plain);
        assert_eq!(plain, b"INFO nothing to hide\n");
    }
}
