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

use tracing_subscriber::filter::Targets;

/// Lines queued for the writer thread before new ones are dropped.
const QUEUE_LINES: usize = 1024;
/// Longest line kept; the rest is replaced by a marker.
pub(super) const MAX_LINE_BYTES: usize = 16 * 1024;
/// How long exit waits for queued lines to reach stderr.
pub(super) const FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// The process-wide sink once `install` ran (the `run` command only).
static SINK: OnceLock<LogSink> = OnceLock::new();

/// `--log-format`: how each line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum LogFormat {
    /// For people: time, level, message and fields on one line.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the event's fields, `target`.
    Json,
}

/// The producer side: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub(super) struct LogSink {
    sender: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
    /// Prefix each line with its syslog priority (`<3>` for errors, …), as journald reads
    /// it when stderr is the journal (`SyslogLevelPrefix=`, on by default).
    priority_prefix: bool,
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
        Ok(LogSink {
            sender,
            dropped,
            priority_prefix: false,
        })
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

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> LineWriter<'a> {
        let mut line = Vec::new();
        if self.priority_prefix {
            line.extend_from_slice(syslog_priority(*meta.level()).as_bytes());
        }
        LineWriter { sink: self, line }
    }
}

/// The syslog priority prefix journald strips from a line and records as `PRIORITY`.
fn syslog_priority(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::ERROR => "<3>",
        tracing::Level::WARN => "<4>",
        tracing::Level::INFO => "<6>",
        tracing::Level::DEBUG | tracing::Level::TRACE => "<7>",
    }
}

/// True when stderr is the journal's stream: systemd sets `JOURNAL_STREAM` to its
/// `device:inode`, which a redirected stderr no longer matches.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((device, inode)) = stream.to_str().and_then(|text| text.split_once(':')) else {
        return false;
    };
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct fstat fills.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 2 is only inspected, and `stat` is a valid, writable struct.
    if unsafe { libc::fstat(2, &mut stat) } != 0 {
        return false;
    }
    device.parse::<u64>().ok() == Some(stat.st_dev)
        && inode.parse::<u64>().ok() == Some(stat.st_ino)
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

/// The log filter `RUST_LOG` names, else `default`: a level, or `target=level` pairs and a
/// level for the rest, comma-separated; one that does not parse is an error naming it.
pub(super) fn filter(default: &str) -> anyhow::Result<Targets> {
    match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => parse_filter("RUST_LOG", &text),
        _ => parse_filter("--log", default),
    }
}

fn parse_filter(source: &str, text: &str) -> anyhow::Result<Targets> {
    text.parse::<Targets>().map_err(|error| {
        anyhow::anyhow!(
            "{source} {:?}: {error}; give a level, or target=level pairs and a level, comma-separated (warn,voodu_agent=debug)",
            text.escape_debug().to_string()
        )
    })
}

/// Installs the sink over stderr as the global tracing subscriber and routes panic messages
/// through it (the default hook writes to stderr and would block on a full pipe).
pub(super) fn install(filter: Targets, format: LogFormat) -> io::Result<()> {
    let mut sink = LogSink::start(io::stderr(), QUEUE_LINES)?;
    sink.priority_prefix = stderr_is_journal();
    let ansi = super::colour_stderr();
    // `try_init` (not `set_global_default`) also routes the `log` crate's records here.
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(subscriber(
        filter,
        format,
        ansi,
        sink.clone(),
    ));
    let _ = SINK.set(sink);
    std::panic::set_hook(Box::new(|info| {
        tracing::error!("{info}");
    }));
    Ok(())
}

/// The subscriber writing `format` lines through `sink`.
fn subscriber(
    filter: Targets,
    format: LogFormat,
    ansi: bool,
    sink: LogSink,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use tracing_subscriber::layer::SubscriberExt as _;
    let max = filter
        .default_level()
        .into_iter()
        .chain(filter.iter().map(|(_, level)| level))
        .max();
    let max = max.unwrap_or(tracing::level_filters::LevelFilter::OFF);
    match format {
        LogFormat::Text => Box::new(
            tracing_subscriber::fmt()
                .with_max_level(max)
                .with_writer(sink)
                .with_ansi(ansi)
                .finish()
                .with(filter),
        ),
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_max_level(max)
                .with_writer(sink)
                .finish()
                .with(filter),
        ),
    }
}

/// Writes `message` to stderr as one line: through the sink when it is installed (then waits
/// for it at most [`FLUSH_LIMIT`]), else directly, ignoring a closed stderr.
pub(super) fn stderr_line(message: &str) {
    // An error may quote a file name or an engine's message: no control character of
    // theirs reaches the terminal (the error's own line breaks stay).
    let message: Vec<_> = message
        .split('\n')
        .map(crate::model::text::escape)
        .collect();
    let message = message.join("\n");
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

    #[test]
    fn a_log_filter_is_a_level_or_target_level_pairs_and_anything_else_is_named() {
        let filter = parse_filter("--log", "warn,voodu_agent=debug").expect("parses");
        assert_eq!(
            filter.default_level(),
            Some(tracing::level_filters::LevelFilter::WARN)
        );
        assert!(filter.would_enable("voodu_agent::reconcile", &tracing::Level::DEBUG));
        assert!(!filter.would_enable("hyper", &tracing::Level::INFO));
        let error = parse_filter("RUST_LOG", "voodu_agent=loud")
            .expect_err("not a level")
            .to_string();
        assert!(
            error.starts_with("RUST_LOG \"voodu_agent=loud\": ") && error.contains("target=level"),
            "{error}"
        );
    }

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

    /// `--log-format json` writes one object per line with the event's fields at the top;
    /// under journald each line starts with its syslog priority, which journald strips.
    #[test]
    fn json_lines_carry_fields_and_journal_priorities() -> Result<(), Box<dyn std::error::Error>> {
        let fake = Fake {
            behaviour: Stderr::Reads,
            written: Arc::default(),
            release: Arc::default(),
        };
        let mut sink = LogSink::start(fake.clone(), 8)?;
        sink.priority_prefix = true;
        let filter: Targets = "info".parse()?;
        let subscriber = subscriber(filter, LogFormat::Json, false, sink.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(commit = "abc123", "commit rejected");
            tracing::info!(n_resources = 3, "applied");
            tracing::debug!("filtered out");
        });
        assert!(sink.flush(Duration::from_secs(60)));
        let written = String::from_utf8(fake.written.lock().map_err(|_| "poisoned")?.clone())?;
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 2, "{written}");
        let (warn, info) = (lines[0], lines[1]);
        assert!(
            warn.starts_with("<4>{") && info.starts_with("<6>{"),
            "{written}"
        );
        let warn: serde_json::Value = serde_json::from_str(&warn[3..])?;
        assert_eq!(
            (&warn["level"], &warn["message"], &warn["commit"]),
            (
                &serde_json::json!("WARN"),
                &serde_json::json!("commit rejected"),
                &serde_json::json!("abc123")
            )
        );
        let info: serde_json::Value = serde_json::from_str(&info[3..])?;
        assert_eq!(info["n_resources"], 3);
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
