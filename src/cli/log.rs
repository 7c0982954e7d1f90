//! The agent's log sink: every tracing line goes through a bounded queue to one writer
//! thread, so logging never blocks, fails or kills a task.
//!
//! Whatever reads the agent's stderr may go away (a log shipper, `| tee`, journald
//! restarting) or stop reading. Written straight to stderr, the first case returns `EPIPE`
//! (Rust ignores `SIGPIPE`), which tracing-subscriber reports with `eprintln!`, which panics:
//! the logging task died, the signal task among them, so the agent stopped syncing and
//! ignored SIGTERM. The second case blocks a runtime worker on a full pipe.
//!
//! Invariants: a producer only ever does a `try_send`; a line that does not fit the queue, or
//! arrives after stderr failed, is dropped and counted, and the next line written says how
//! many were lost. A line is cut at [`MAX_LINE_BYTES`], so the queue holds at most
//! `QUEUE_LINES × MAX_LINE_BYTES`. Flushing at exit waits at most [`FLUSH_LIMIT`].

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Lines queued for the writer thread before new ones are dropped.
const QUEUE_LINES: usize = 1024;
/// Longest line kept; the rest is replaced by a marker.
pub(super) const MAX_LINE_BYTES: usize = 16 * 1024;
/// How long exit waits for queued lines to reach stderr.
pub(super) const FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// The process-wide sink once `install` ran (the `run` command only).
static SINK: OnceLock<LogSink> = OnceLock::new();

/// The producer side: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub(super) struct LogSink {
    sender: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

#[derive(Debug)]
enum Message {
    Line(Vec<u8>),
    Flush(SyncSender<()>),
}

impl LogSink {
    /// Starts the writer thread over `out` with room for `capacity` queued lines.
    pub(super) fn start(out: impl Write + Send + 'static, capacity: usize) -> io::Result<LogSink> {
        let (sender, receiver) = std::sync::mpsc::sync_channel(capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&dropped);
        std::thread::Builder::new()
            .name("voodu-log".to_owned())
            .spawn(move || write_lines(out, &receiver, &counter))?;
        Ok(LogSink { sender, dropped })
    }

    /// Queues one line (cut at [`MAX_LINE_BYTES`]); drops and counts it when the queue is
    /// full or the writer is gone.
    pub(super) fn send(&self, mut line: Vec<u8>) {
        if line.len() > MAX_LINE_BYTES {
            line.truncate(MAX_LINE_BYTES);
            line.extend_from_slice(b" [line cut]\n");
        }
        match self.sender.try_send(Message::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits up to `limit` for the lines queued so far to be written. False when they were
    /// not (the writer is stuck on a full pipe, or the queue has no room for the request).
    pub(super) fn flush(&self, limit: Duration) -> bool {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        if self.sender.try_send(Message::Flush(ack)).is_err() {
            return false;
        }
        done.recv_timeout(limit).is_ok()
    }

    /// Lines lost so far.
    #[cfg(test)]
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// One event's text, sent as one line when tracing drops the writer.
#[derive(Debug)]
pub(super) struct LineWriter<'a> {
    sink: &'a LogSink,
    line: Vec<u8>,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Bounded here too, so a huge event never allocates more than it keeps.
        let room = (MAX_LINE_BYTES + 1).saturating_sub(self.line.len());
        self.line.extend_from_slice(&buf[..buf.len().min(room)]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.sink.send(std::mem::take(&mut self.line));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            sink: self,
            line: Vec::new(),
        }
    }
}

/// The writer thread: writes lines in order, first saying how many were dropped since the
/// last one. After stderr fails once it only drains (a closed pipe does not reopen).
fn write_lines(mut out: impl Write, receiver: &Receiver<Message>, dropped: &AtomicU64) {
    let mut reported = 0;
    let mut broken = false;
    for message in receiver {
        match message {
            Message::Line(line) => {
                if broken {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let lost = dropped.load(Ordering::Relaxed);
                if lost > reported {
                    let notice = format!(
                        "voodu-agent: {} log line(s) dropped (the log reader was slow or gone)\n",
                        lost - reported
                    );
                    reported = lost;
                    broken = out.write_all(notice.as_bytes()).is_err();
                }
                if !broken {
                    broken = out.write_all(&line).is_err();
                }
                if broken {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Message::Flush(ack) => {
                let _ = out.flush();
                let _ = ack.send(());
            }
        }
    }
}

/// Installs the sink over stderr as the global tracing subscriber and routes panic messages
/// through it (the default hook writes to stderr and would block on a full pipe).
pub(super) fn install(filter: tracing_subscriber::EnvFilter) -> io::Result<()> {
    let sink = LogSink::start(io::stderr(), QUEUE_LINES)?;
    let ansi = io::IsTerminal::is_terminal(&io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sink.clone())
        .with_ansi(ansi)
        .try_init();
    let _ = SINK.set(sink);
    std::panic::set_hook(Box::new(|info| {
        tracing::error!("{info}");
    }));
    Ok(())
}

/// Writes `message` to stderr as one line: through the sink when it is installed (then waits
/// for it at most [`FLUSH_LIMIT`]), else directly, ignoring a closed stderr.
pub(super) fn stderr_line(message: &str) {
    match SINK.get() {
        Some(sink) => {
            sink.send(format!("{message}\n").into_bytes());
            sink.flush(FLUSH_LIMIT);
        }
        None => {
            let _ = writeln!(io::stderr().lock(), "{message}");
        }
    }
}

/// Waits (at most [`FLUSH_LIMIT`]) for queued log lines to reach stderr, at exit.
pub(super) fn flush() {
    if let Some(sink) = SINK.get() {
        sink.flush(FLUSH_LIMIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// What the fake stderr does with each write.
    #[derive(Debug, Clone, Copy)]
    enum Stderr {
        /// Takes everything.
        Reads,
        /// Fails every write with EPIPE, as a pipe whose reader went away.
        Closed,
        /// Blocks every write until the test ends, as a pipe nobody reads.
        Stuck,
    }

    #[derive(Debug, Clone)]
    struct Fake {
        behaviour: Stderr,
        written: Arc<Mutex<Vec<u8>>>,
        release: Arc<Mutex<()>>,
    }

    impl Write for Fake {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            match self.behaviour {
                Stderr::Reads => {
                    self.written
                        .lock()
                        .map_err(|_| io::Error::other("poisoned"))?
                        .extend_from_slice(buf);
                    Ok(buf.len())
                }
                Stderr::Closed => Err(io::ErrorKind::BrokenPipe.into()),
                Stderr::Stuck => {
                    let _wait = self.release.lock();
                    Err(io::ErrorKind::BrokenPipe.into())
                }
            }
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Sends `n_lines` through a sink with room for `capacity` over `behaviour`; every send
    /// returns (the test would hang otherwise). Returns what reached stderr and the count of
    /// dropped lines once the writer settled.
    fn check(
        behaviour: Stderr,
        capacity: usize,
        lines: &[&str],
        expected_text: &str,
        expected_dropped: u64,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let release = Arc::new(Mutex::new(()));
        let hold = release.lock().map_err(|_| "poisoned")?;
        let fake = Fake {
            behaviour,
            written: Arc::default(),
            release: Arc::clone(&release),
        };
        let sink = LogSink::start(fake.clone(), capacity)?;
        if let Stderr::Stuck = behaviour {
            // Let the writer thread take the first line and block on it.
            sink.send(b"first\n".to_vec());
            while sink.sender.try_send(Message::Line(Vec::new())).is_ok() {}
        }
        for line in lines {
            sink.send(line.as_bytes().to_vec());
        }
        drop(hold);
        // A flush request needs room in the queue, which the released writer makes.
        let mut settled = false;
        for _ in 0..6000 {
            settled = sink.flush(Duration::from_secs(10));
            if settled {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(settled, "writer never settled");
        let written = fake.written.lock().map_err(|_| "poisoned")?.clone();
        assert_eq!(String::from_utf8(written)?, expected_text, "{behaviour:?}");
        if !matches!(behaviour, Stderr::Stuck) {
            assert_eq!(sink.dropped(), expected_dropped, "{behaviour:?}");
        } else {
            // Every line sent while the writer was stuck found the queue full.
            assert!(sink.dropped() >= expected_dropped, "{behaviour:?}");
        }
        Ok(())
    }

    #[test]
    fn logging_never_blocks_or_fails_and_counts_what_it_drops()
    -> Result<(), Box<dyn std::error::Error>> {
        check(Stderr::Reads, 8, &["a\n", "b\n"], "a\nb\n", 0)?;
        check(Stderr::Closed, 8, &["a\n", "b\n", "c\n"], "", 3)?;
        check(Stderr::Stuck, 2, &["a\n", "b\n", "c\n"], "", 3)?;
        Ok(())
    }

    #[test]
    fn a_dropped_line_is_reported_and_a_long_line_is_cut() -> Result<(), Box<dyn std::error::Error>>
    {
        let fake = Fake {
            behaviour: Stderr::Reads,
            written: Arc::default(),
            release: Arc::default(),
        };
        let sink = LogSink::start(fake.clone(), 8)?;
        sink.dropped.fetch_add(2, Ordering::Relaxed);
        sink.send(b"after\n".to_vec());
        sink.send(vec![b'x'; MAX_LINE_BYTES + 10]);
        assert!(sink.flush(Duration::from_secs(60)));
        let written = String::from_utf8(fake.written.lock().map_err(|_| "poisoned")?.clone())?;
        let expected = format!(
            "voodu-agent: 2 log line(s) dropped (the log reader was slow or gone)\nafter\n{} [line cut]\n",
            "x".repeat(MAX_LINE_BYTES)
        );
        assert_eq!(written, expected);
        Ok(())
    }
}
