//! Container output made fit to show (`voodu-agent logs`, the dashboard's log tail): cut into
//! lines of bounded length, secrets the agent knows masked, terminal controls escaped; and the
//! per-client byte budget a log stream is sent under.
//!
//! Invariants (pure, no I/O): a `Splitter` holds at most [`MAX_RAW_LINE`] bytes of a line
//! still open, whatever the input; a shown line (`Shown::text`) has no control character
//! (`text::escape`), no value of its `Masker` of at least [`MIN_SECRET_LEN`] bytes that was
//! whole in the first [`MAX_RAW_LINE`] bytes of the line, and at most [`MAX_LINE`] bytes plus
//! the [`CUT_MARKER`]; a `Budget` never lets more than its burst through at once, nor more
//! than its rate over time.

use std::borrow::Cow;

use super::text;

/// A shown line is cut past this many bytes (after masking and escaping), marked.
pub const MAX_LINE: usize = 8 * 1024;
/// Of a longer line, what is kept to mask and show; the rest, up to its end, is dropped.
pub const MAX_RAW_LINE: usize = 64 * 1024;
/// What a cut line ends with.
pub const CUT_MARKER: &str = " …[line cut]";
/// What a masked value is shown as.
pub const MASK: &str = "••••••";
/// Shorter values are not masked: they would hide ordinary words and numbers of the output
/// (`true`, `8080`) and tell little of themselves.
pub const MIN_SECRET_LEN: usize = 6;
/// At most this many values are masked (the longest first).
pub const MAX_SECRETS: usize = 4096;

/// One line of a container's output, ready to show: `source` is the container it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub source: String,
    pub text: String,
}

/// The values masked out of every line: sealed env values, config values, registry tokens.
/// `Debug` shows how many, never a value.
#[derive(Clone, Default)]
pub struct Masker {
    /// Longest first, so a value inside another is never shown in part.
    values: Vec<String>,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Masker({} values)", self.values.len())
    }
}

impl Masker {
    /// Masks every value of at least [`MIN_SECRET_LEN`] bytes (at most [`MAX_SECRETS`]).
    pub fn new(values: impl IntoIterator<Item = String>) -> Masker {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|value| value.len() >= MIN_SECRET_LEN)
            .collect();
        values.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        values.truncate(MAX_SECRETS);
        Masker { values }
    }

    /// How many values it masks.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `line` with every occurrence of a value replaced by [`MASK`].
    pub fn mask<'a>(&self, line: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(line);
        for value in &self.values {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), MASK));
            }
        }
        out
    }

    /// `raw` (one line of output, without its line feed) as shown: masked, escaped, cut to
    /// [`MAX_LINE`] bytes and marked when it was longer (or was cut before already: `cut`).
    pub fn show(&self, raw: &[u8], cut: bool) -> String {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let lossy = String::from_utf8_lossy(raw);
        let masked = self.mask(&lossy);
        let escaped = text::escape(&masked);
        if !cut && escaped.len() <= MAX_LINE {
            return escaped.into_owned();
        }
        let mut shown = text::cut(&escaped, MAX_LINE).to_owned();
        shown.push_str(CUT_MARKER);
        shown
    }
}

/// Cuts a stream of output chunks into lines, holding at most [`MAX_RAW_LINE`] bytes of the
/// line still open: the rest of a longer line is dropped and the line marked as cut.
#[derive(Debug, Default)]
pub struct Splitter {
    open: Vec<u8>,
    /// The open line went past [`MAX_RAW_LINE`]; its rest is dropped.
    cut: bool,
}

impl Splitter {
    /// The lines `chunk` ends, each with whether it was cut (without its line feed).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<(Vec<u8>, bool)> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|byte| *byte == b'\n') {
            self.take(&rest[..end]);
            lines.push((
                std::mem::take(&mut self.open),
                std::mem::take(&mut self.cut),
            ));
            rest = &rest[end + 1..];
        }
        self.take(rest);
        lines
    }

    /// The open line, when the output ends without a line feed.
    pub fn finish(&mut self) -> Option<(Vec<u8>, bool)> {
        if self.open.is_empty() && !self.cut {
            return None;
        }
        Some((
            std::mem::take(&mut self.open),
            std::mem::take(&mut self.cut),
        ))
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_RAW_LINE.saturating_sub(self.open.len());
        if bytes.len() > room {
            self.cut = true;
        }
        self.open.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// A token bucket of bytes: `rate` a second, at most `burst` at once. Times are the caller's
/// (milliseconds of any clock that does not go back).
#[derive(Debug, Clone)]
pub struct Budget {
    rate: u64,
    burst: u64,
    tokens: u64,
    at_ms: u64,
}

impl Budget {
    /// Full at `now_ms`.
    pub fn new(rate: u64, burst: u64, now_ms: u64) -> Budget {
        Budget {
            rate,
            burst,
            tokens: burst,
            at_ms: now_ms,
        }
    }

    /// Spends `bytes` if the budget has them at `now_ms`; false (nothing spent) when not.
    pub fn spend(&mut self, bytes: u64, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        let earned = elapsed.saturating_mul(self.rate) / 1000;
        if earned > 0 {
            self.tokens = self.tokens.saturating_add(earned).min(self.burst);
            self.at_ms = now_ms;
        }
        if bytes > self.tokens {
            return false;
        }
        self.tokens -= bytes;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_masked_longest_first_and_short_ones_are_not() {
        let masker = Masker::new([
            "hunter2hunter2".to_owned(),
            "hunter2".to_owned(),
            "true".to_owned(),
            "hunter2".to_owned(),
        ]);
        assert_eq!(masker.len(), 2);
        assert_eq!(
            masker.mask("pw=hunter2hunter2 or hunter2, true"),
            format!("pw={MASK} or {MASK}, true")
        );
        assert!(matches!(masker.mask("nothing here"), Cow::Borrowed(_)));
        assert_eq!(format!("{masker:?}"), "Masker(2 values)");
    }

    #[test]
    fn a_shown_line_is_masked_then_escaped_then_cut() {
        let masker = Masker::new(["s3cr3t-value".to_owned()]);
        assert_eq!(
            masker.show(b"\x1b[31m<script>s3cr3t-value</script>\x07\r", false),
            format!("\\x1b[31m<script>{MASK}</script>\\x07")
        );
        // Invalid UTF-8 is replaced, C1 controls and bidi overrides escaped.
        assert_eq!(
            masker.show(
                &[&b"a"[..], "\u{9b}b\u{202e}c".as_bytes(), b"\xff"].concat(),
                false
            ),
            "a\\u{9b}b\\u{202e}c\u{fffd}"
        );
        let long = vec![b'x'; MAX_LINE + 10];
        let shown = masker.show(&long, false);
        assert_eq!(shown.len(), MAX_LINE + CUT_MARKER.len());
        assert!(shown.ends_with(CUT_MARKER));
        // A secret past the cut is never shown in part: it is masked before.
        let mut straddling = vec![b'x'; MAX_LINE - 4];
        straddling.extend_from_slice(b"s3cr3t-value");
        let shown = masker.show(&straddling, false);
        assert!(!shown.contains("s3cr"), "{}", &shown[MAX_LINE - 10..]);
        assert!(masker.show(b"short", true).ends_with(CUT_MARKER));
    }

    #[test]
    fn the_splitter_holds_one_bounded_open_line() {
        let mut splitter = Splitter::default();
        assert_eq!(splitter.push(b"one\ntw"), [(b"one".to_vec(), false)]);
        assert_eq!(
            splitter.push(b"o\n\nthree"),
            [(b"two".to_vec(), false), (Vec::new(), false)]
        );
        assert_eq!(splitter.finish(), Some((b"three".to_vec(), false)));
        assert_eq!(splitter.finish(), None);
        // A line without end: the splitter never holds more than MAX_RAW_LINE bytes.
        for _ in 0..100 {
            assert!(splitter.push(&[b'y'; 4096]).is_empty());
            assert!(splitter.open.len() <= MAX_RAW_LINE);
        }
        let lines = splitter.push(b"z\nnext\n");
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].0.len(), lines[0].1), (MAX_RAW_LINE, true));
        assert_eq!(lines[1], (b"next".to_vec(), false));
    }

    #[test]
    fn the_budget_lets_through_its_burst_then_its_rate() {
        let mut budget = Budget::new(1000, 2000, 0);
        assert!(budget.spend(1500, 0));
        assert!(!budget.spend(1000, 0));
        assert!(budget.spend(500, 0));
        assert!(!budget.spend(1, 0));
        // 100 ms earn 100 bytes.
        assert!(budget.spend(100, 100));
        assert!(!budget.spend(1, 100));
        // Never more than the burst, however long it waited.
        assert!(!budget.spend(2001, 1_000_000));
        assert!(budget.spend(2000, 1_000_000));
    }
}
