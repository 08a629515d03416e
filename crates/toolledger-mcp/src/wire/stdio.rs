//! The stdio transport of the strict wire entry: newline-delimited JSON-RPC messages, each
//! checked by [`check_message`], every refused line answered.
//!
//! - Reading is bounded: a line is buffered up to [`MAX_MESSAGE_BYTES`]
//!   (plus its `\r\n`); a longer one is answered -32700 `too_large` as soon as it crosses the
//!   limit and the rest of it is read in chunks and discarded up to its newline.
//! - Receiving is cancel-safe (rmcp polls it inside `select!`): a partly read line stays in
//!   the transport's buffer, and an answer to a refused line is kept until it is written;
//!   a write cut off by cancellation is resumed, never restarted, by the next writer.
//! - Replies written concurrently share write calls: each reply is queued, and whoever holds
//!   the writer writes everything queued so far, so under load one write carries many lines.
//! - The server keeps serving after a refused line; only end of input or an I/O error ends
//!   the session. Empty lines are skipped.
//! - Requests in flight are bounded ([`StdioTransport::with_max_in_flight`], default
//!   [`DEFAULT_MAX_IN_FLIGHT`]): while that many requests are unanswered, no further line is
//!   read, so a client that pipelines without limit is slowed by the pipe (its writes block)
//!   instead of growing the server's memory. A request counts from the moment it is handed to
//!   rmcp until its response or error is written: a client that stops reading its answers
//!   stops the server reading its requests (back-pressure), so the replies waiting to be
//!   written are bounded too.

use std::borrow::Cow;
use std::future::Future;
use std::io;
use std::sync::Arc;

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{check_message, WireError, MAX_MESSAGE_BYTES};

/// The longest line buffered: the largest message and a `\r\n`.
const MAX_LINE: usize = MAX_MESSAGE_BYTES + 2;

/// A line buffer grown past this by a large message is given back after it.
const KEEP_CAPACITY: usize = 64 << 10;

/// Requests in flight on one stdio connection by default: as many as a store's queue holds.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Requests handed to rmcp whose answer is not yet written.
#[derive(Debug, Default)]
struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    answered: tokio::sync::Notify,
}

/// One request's place in [`InFlight`], given back when dropped: once its answer is written,
/// or when writing it failed or was abandoned.
struct Answering {
    in_flight: Arc<InFlight>,
    limit: usize,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.in_flight.done(self.limit);
    }
}

impl InFlight {
    /// One request answered (never below zero). Only a reader at the limit waits, so only
    /// an answer that leaves the limit wakes it.
    fn done(&self, limit: usize) {
        let before = self.count.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| n.checked_sub(1),
        );
        if before.is_ok_and(|n| n >= limit) {
            self.answered.notify_waiters();
        }
    }

    /// Waits until fewer than `limit` requests are in flight. Cancel-safe: it changes nothing.
    async fn room(&self, limit: usize) {
        loop {
            // Created before the check, so an answer between the check and the wait wakes it.
            let answered = self.answered.notified();
            if self.count.load(std::sync::atomic::Ordering::Acquire) < limit {
                return;
            }
            answered.await;
        }
    }
}

/// rmcp's `Transport<RoleServer>` over a reader and a writer of newline-delimited JSON-RPC
/// (a server's stdin and stdout), with the strict wire entry on every incoming line.
pub struct StdioTransport<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    /// Set while the rest of an oversized line is skipped, until its newline.
    discarding: bool,
    /// The answer to a refused line, not yet handed to the writer.
    answer: Option<Vec<u8>>,
    /// An answer was handed to the writer whose bytes may not all be written yet.
    flushing: bool,
    out: Arc<Shared<W>>,
    in_flight: Arc<InFlight>,
    max_in_flight: usize,
    /// Cancelled when the transport should stop reading ([`StdioTransport::with_stop`]).
    stop: Option<CancellationToken>,
}

/// The writing half, shared by every reply in flight.
struct Shared<W> {
    /// Whole lines not yet taken by a writer, in the order they were queued.
    queue: std::sync::Mutex<Vec<u8>>,
    out: Mutex<Outbox<W>>,
}

impl<W: AsyncWrite + Unpin> Shared<W> {
    /// Queues one whole line (no await: it cannot be cut off).
    fn queue(&self, line: &[u8]) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.extend_from_slice(line);
    }

    /// Writes everything queued so far (this caller's lines and any other's) and flushes.
    /// When it returns `Ok`, every line queued before the call is written.
    async fn write_queued(&self) -> io::Result<()> {
        let mut out = self.out.lock().await;
        out.take_queue(&self.queue);
        out.drain().await
    }
}

/// The writer and the bytes taken from the queue but not yet written: a cancelled write
/// leaves them here and the next writer resumes them.
struct Outbox<W> {
    writer: Option<W>,
    pending: Vec<u8>,
    written: usize,
}

impl<W: AsyncWrite + Unpin> Outbox<W> {
    fn take_queue(&mut self, queue: &std::sync::Mutex<Vec<u8>>) {
        let mut queue = queue.lock().unwrap_or_else(|e| e.into_inner());
        if self.pending.is_empty() {
            // The two buffers trade places: no copy, no allocation.
            std::mem::swap(&mut self.pending, &mut *queue);
            self.written = 0;
        } else {
            self.pending.extend_from_slice(&queue);
            queue.clear();
        }
    }

    /// Writes everything pending and flushes. Cancel-safe: what was not written stays pending.
    async fn drain(&mut self) -> io::Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the transport is closed",
            ));
        };
        while self.written < self.pending.len() {
            let n = writer.write(&self.pending[self.written..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        writer.flush().await
    }
}

/// What one bounded line read found.
enum LineRead {
    /// A whole line (or the unterminated last one) is in the buffer.
    Line,
    /// The line is longer than the limit; what was read of it is dropped.
    Oversized,
    /// End of input.
    Eof,
    /// The reader failed.
    Failed,
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// A transport reading messages from `read` and writing to `write`.
    pub fn new(read: R, write: W) -> Self {
        StdioTransport {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            answer: None,
            flushing: false,
            out: Arc::new(Shared {
                queue: std::sync::Mutex::new(Vec::new()),
                out: Mutex::new(Outbox {
                    writer: Some(write),
                    pending: Vec::new(),
                    written: 0,
                }),
            }),
            in_flight: Arc::new(InFlight::default()),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            stop: None,
        }
    }

    /// Stops reading once `stop` is cancelled (on a shutdown signal), as if the input had
    /// ended: rmcp then answers the requests in flight (it waits a few seconds for them) and
    /// ends the session, where cancelling the service would cancel them.
    pub fn with_stop(mut self, stop: CancellationToken) -> Self {
        self.stop = Some(stop);
        self
    }

    /// At most `limit` requests unanswered (at least 1); at the limit no further line is read
    /// until one is answered.
    pub fn with_max_in_flight(mut self, limit: usize) -> Self {
        self.max_in_flight = limit.max(1);
        self
    }

    /// Reads one line into `self.line` without letting it grow past [`MAX_LINE`]. Cancel-safe:
    /// `fill_buf` consumes nothing when dropped, and the copy and the matching `consume` have
    /// no await between them, so a cancelled read resumes the same line.
    async fn read_line(&mut self) -> LineRead {
        loop {
            let (consumed, step) = {
                let available = match self.read.fill_buf().await {
                    Ok(available) => available,
                    Err(_) => return LineRead::Failed,
                };
                if available.is_empty() {
                    if self.discarding || self.line.is_empty() {
                        return LineRead::Eof;
                    }
                    // The last line had no newline: it is still a message to answer.
                    return LineRead::Line;
                }
                let newline = available.iter().position(|b| *b == b'\n');
                let take = newline.map_or(available.len(), |at| at + 1);
                let step = if self.discarding {
                    if newline.is_some() {
                        self.discarding = false;
                    }
                    None
                } else if self.line.len() + take > MAX_LINE {
                    self.line.clear();
                    self.discarding = newline.is_none();
                    Some(LineRead::Oversized)
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    newline.map(|_| LineRead::Line)
                };
                (take, step)
            };
            self.read.consume(consumed);
            if let Some(step) = step {
                return step;
            }
        }
    }

    /// Queues the answer to a refused line and writes it (cancel-safe: once queued it is
    /// written by this call, the next one, or any reply's writer).
    async fn answer_refused(&mut self) -> io::Result<()> {
        if let Some(mut answer) = self.answer.take() {
            answer.push(b'\n');
            self.out.queue(&answer);
            self.flushing = true;
        }
        self.out.write_queued().await?;
        self.flushing = false;
        Ok(())
    }

    fn refuse(&mut self, error: &WireError) {
        tracing::debug!(
            code = error.code,
            rule = error.rule,
            "refused an incoming message"
        );
        self.answer = Some(error.to_bytes());
    }
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn name() -> Cow<'static, str> {
        "toolledger-stdio".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // rmcp calls `send` on its service loop and runs the future in a task of its own:
        // the reply is encoded there, in parallel with other replies, not on the loop.
        let answers_request = match &item {
            rmcp::model::JsonRpcMessage::Response(_) => true,
            rmcp::model::JsonRpcMessage::Error(e) => e.id.is_some(),
            _ => false,
        };
        let answering = answers_request.then(|| Answering {
            in_flight: self.in_flight.clone(),
            limit: self.max_in_flight,
        });
        let out = self.out.clone();
        async move {
            let mut bytes = serde_json::to_vec(&item)?;
            bytes.push(b'\n');
            out.queue(&bytes);
            let written = out.write_queued().await;
            drop(answering);
            written
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        let Some(stop) = self.stop.clone() else {
            return self.receive_line().await;
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            received = self.receive_line() => received,
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let mut out = self.out.out.lock().await;
        out.take_queue(&self.out.queue);
        let drained = if out.writer.is_some() {
            out.drain().await
        } else {
            Ok(())
        };
        out.writer = None;
        drained
    }
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// The next message: lines are read and checked, refused ones answered, until one passes
    /// (`None`: end of input). Cancel-safe, as `receive` must be.
    async fn receive_line(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            if (self.answer.is_some() || self.flushing) && self.answer_refused().await.is_err() {
                return None;
            }
            self.in_flight.room(self.max_in_flight).await;
            match self.read_line().await {
                LineRead::Line => {}
                LineRead::Oversized => {
                    self.refuse(&WireError::too_large());
                    continue;
                }
                LineRead::Eof | LineRead::Failed => return None,
            }
            let line = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let checked = (!line.is_empty()).then(|| check_message(line));
            self.line.clear();
            if self.line.capacity() > KEEP_CAPACITY {
                self.line.shrink_to(KEEP_CAPACITY);
            }
            match checked {
                None => continue,
                Some(Ok(message)) => {
                    if matches!(message, rmcp::model::JsonRpcMessage::Request(_)) {
                        self.in_flight
                            .count
                            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    return Some(message);
                }
                Some(Err(error)) => self.refuse(&error),
            }
        }
    }
}

/// The strict transport over the process's stdin and stdout: through the IO reactor when
/// both are pipes (how MCP clients launch a server), else the blocking handles
/// (`rmcp::transport::stdio_pipes`).
pub fn stdio() -> StdioTransport<rmcp::transport::StdioReader, rmcp::transport::StdioWriter> {
    let (read, write) = rmcp::transport::stdio_pipes();
    StdioTransport::new(read, write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    type Pipe = tokio::io::DuplexStream;

    /// A transport on in-memory pipes (its output pipe holds `out_capacity` bytes): the test
    /// writes its input and reads its output.
    fn transport_with(out_capacity: usize) -> (StdioTransport<Pipe, Pipe>, Pipe, Pipe) {
        let (input, feed) = tokio::io::duplex(1 << 16);
        let (output, answers) = tokio::io::duplex(out_capacity);
        (StdioTransport::new(input, output), feed, answers)
    }

    fn transport() -> (
        StdioTransport<Pipe, Pipe>,
        Pipe,
        tokio::io::Lines<BufReader<Pipe>>,
    ) {
        let (t, feed, answers) = transport_with(1 << 16);
        (t, feed, BufReader::new(answers).lines())
    }

    /// Polls `receive` until it waits for input, then drops it (as rmcp's `select!` does when
    /// another branch is ready first).
    async fn poll_then_cancel(t: &mut StdioTransport<Pipe, Pipe>) {
        tokio::select! {
            biased;
            m = t.receive() => panic!("no whole message yet: {m:?}"),
            () = tokio::task::yield_now() => {}
        }
    }

    #[tokio::test]
    async fn the_stop_signal_ends_the_input_and_replies_are_still_written() {
        let (t, mut feed, mut answers) = transport();
        let stop = CancellationToken::new();
        let mut t = t.with_stop(stop.clone());
        let ping = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
        feed.write_all(ping).await.unwrap();
        let message = t.receive().await.expect("read before the stop");
        assert!(matches!(message, rmcp::model::JsonRpcMessage::Request(_)));
        poll_then_cancel(&mut t).await;
        stop.cancel();
        assert!(
            t.receive().await.is_none(),
            "no line is read after the stop"
        );
        // A line arriving later is not read either.
        feed.write_all(ping).await.unwrap();
        assert!(t.receive().await.is_none());
        // The request read before the stop is still answered.
        let reply: TxJsonRpcMessage<RoleServer> =
            serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {}}))
                .unwrap();
        t.send(reply).await.unwrap();
        let answer: Value =
            serde_json::from_str(&answers.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["id"], 1);
    }

    #[tokio::test]
    async fn a_refused_line_is_answered_and_the_next_one_is_served() {
        let (mut t, mut feed, mut answers) = transport();
        feed.write_all(b"NaN\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        let message = t.receive().await.expect("the ping");
        assert!(matches!(message, rmcp::model::JsonRpcMessage::Request(_)));
        let answer: Value =
            serde_json::from_str(&answers.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["error"]["code"], -32700);
        assert_eq!(answer["id"], Value::Null);
    }

    #[tokio::test]
    async fn an_oversized_line_is_answered_once_and_skipped_in_bounded_chunks() {
        let (mut t, mut feed, mut answers) = transport();
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 1 << 16];
            for _ in 0..(MAX_LINE / chunk.len() + 4) {
                feed.write_all(&chunk).await.unwrap();
            }
            feed.write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n")
                .await
                .unwrap();
            feed
        });
        let message = t.receive().await.expect("the ping after the long line");
        assert!(
            matches!(message, rmcp::model::JsonRpcMessage::Request(r) if r.id == rmcp::model::RequestId::Number(2))
        );
        assert!(t.line.capacity() <= KEEP_CAPACITY);
        let answer: Value =
            serde_json::from_str(&answers.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["error"]["data"]["rule"], "too_large");
        drop(writer.await.unwrap());
        assert!(t.receive().await.is_none());
        // Exactly one answer: the next line is the end of output.
        t.close().await.unwrap();
        drop(t);
        assert_eq!(answers.next_line().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_cancelled_receive_loses_neither_the_partial_line_nor_a_half_written_answer() {
        // The output pipe holds 16 bytes: the answer to the refused line cannot be written
        // in one go, so the receive is cancelled in the middle of writing it.
        let (mut t, mut feed, answers) = transport_with(16);
        feed.write_all(b"{\"a\":1,\"a\":2}\n{\"jsonrpc\":\"2.0\",")
            .await
            .unwrap();
        poll_then_cancel(&mut t).await;
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(answers).lines();
            lines.next_line().await.unwrap().unwrap()
        });
        poll_then_cancel(&mut t).await;
        feed.write_all(b"\"id\":3,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        let message = t.receive().await.expect("the ping, resumed");
        assert!(
            matches!(message, rmcp::model::JsonRpcMessage::Request(r) if r.id == rmcp::model::RequestId::Number(3))
        );
        let answer: Value = serde_json::from_str(&reader.await.unwrap()).unwrap();
        assert_eq!(answer["error"]["data"]["rule"], "duplicate_key");
    }

    #[tokio::test]
    async fn an_unterminated_last_line_is_answered_before_the_end() {
        let (mut t, mut feed, mut answers) = transport();
        feed.write_all(b"garbage").await.unwrap();
        drop(feed);
        assert!(t.receive().await.is_none());
        let answer: Value =
            serde_json::from_str(&answers.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["error"]["code"], -32700);
    }

    #[tokio::test]
    async fn past_its_in_flight_limit_the_transport_reads_nothing_until_a_request_is_answered() {
        let (t, mut feed, mut answers) = transport();
        let mut t = t.with_max_in_flight(2);
        for id in 1..=3 {
            feed.write_all(
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n").as_bytes(),
            )
            .await
            .unwrap();
        }
        let id_of = |m: RxJsonRpcMessage<RoleServer>| match m {
            rmcp::model::JsonRpcMessage::Request(r) => r.id,
            other => panic!("not a request: {other:?}"),
        };
        assert_eq!(
            id_of(t.receive().await.unwrap()),
            rmcp::model::RequestId::Number(1)
        );
        assert_eq!(
            id_of(t.receive().await.unwrap()),
            rmcp::model::RequestId::Number(2)
        );
        // Two unanswered: the third line is in the pipe but not read.
        poll_then_cancel(&mut t).await;
        assert!(t.line.is_empty(), "the third line is not taken");
        // Answering the first makes room; an error without an id answers no request.
        let unanswerable: TxJsonRpcMessage<RoleServer> =
            rmcp::model::JsonRpcMessage::Error(rmcp::model::JsonRpcError {
                jsonrpc: Default::default(),
                id: None,
                error: rmcp::model::ErrorData::parse_error("x", None),
            });
        t.send(unanswerable).await.unwrap();
        poll_then_cancel(&mut t).await;
        let answer: TxJsonRpcMessage<RoleServer> = rmcp::model::JsonRpcMessage::response(
            rmcp::model::ServerResult::empty(()),
            rmcp::model::RequestId::Number(1),
        );
        t.send(answer).await.unwrap();
        assert_eq!(
            id_of(t.receive().await.unwrap()),
            rmcp::model::RequestId::Number(3)
        );
        for _ in 0..2 {
            answers.next_line().await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_answers_is_not_read_from() {
        // The answers' pipe holds 64 bytes and nobody reads it.
        let (t, mut feed, mut answers) = transport_with(64);
        let mut t = t.with_max_in_flight(1);
        for id in 1..=2 {
            feed.write_all(
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n").as_bytes(),
            )
            .await
            .unwrap();
        }
        assert!(matches!(
            t.receive().await,
            Some(rmcp::model::JsonRpcMessage::Request(_))
        ));
        // The answer is larger than the pipe: its write cannot finish.
        let big = rmcp::model::CallToolResult::success(vec![rmcp::model::ContentBlock::text(
            "x".repeat(4096),
        )]);
        let answer: TxJsonRpcMessage<RoleServer> = rmcp::model::JsonRpcMessage::response(
            rmcp::model::ServerResult::CallToolResult(big),
            rmcp::model::RequestId::Number(1),
        );
        let writing = tokio::spawn(t.send(answer));
        tokio::task::yield_now().await;
        // Answered but not written: the second request is not read.
        for _ in 0..3 {
            poll_then_cancel(&mut t).await;
            tokio::task::yield_now().await;
        }
        assert!(t.line.is_empty(), "the second line is not taken");
        // The client reads: the answer is written, and the next request is read.
        let mut drained = Vec::new();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                use tokio::io::AsyncReadExt;
                match answers.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => drained.extend_from_slice(&buf[..n]),
                }
                if drained.ends_with(b"\n") {
                    break;
                }
            }
            drained
        });
        writing.await.unwrap().unwrap();
        assert!(reader.await.unwrap().len() > 4096);
        assert!(matches!(
            t.receive().await,
            Some(rmcp::model::JsonRpcMessage::Request(_))
        ));
    }
}
