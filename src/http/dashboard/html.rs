//! HTML building blocks of the dashboard: escaping, the page layout, and small formatters.
//!
//! Invariant: every value that comes from the store (names, messages, commit text, spec
//! values, diagnostics: all attacker-controlled, since anyone who can push writes them)
//! reaches the page through [`Esc`] (text and quoted attribute values) or [`UrlPart`]
//! (path segments and query values); markup is only ever written as string literals here.

use std::fmt::{self, Display, Write as _};

/// Text escaped for HTML element content and double- or single-quoted attribute values.
#[derive(Debug, Clone, Copy)]
pub(super) struct Esc<'a>(pub(super) &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'', '\0']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                b'\'' => "&#39;",
                _ => "\u{FFFD}",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// Text percent-encoded for one URL path segment or query value (everything but
/// unreserved characters), so it is also safe inside a quoted attribute.
#[derive(Debug, Clone, Copy)]
pub(super) struct UrlPart<'a>(pub(super) &'a str);

impl Display for UrlPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
                f.write_char(char::from(byte))?;
            } else {
                write!(f, "%{byte:02X}")?;
            }
        }
        Ok(())
    }
}

/// What a page shows in its header, besides its body.
#[derive(Debug)]
pub(super) struct Layout<'a> {
    pub(super) title: &'a str,
    /// The `EventSource` URL the page's script follows; `None` for a page that is not live.
    pub(super) events: Option<String>,
    /// Breadcrumb back to the overview.
    pub(super) back: bool,
}

/// The whole document around `body`. The stylesheet and script are files (`/ui/static/…`):
/// the Content-Security-Policy allows no inline script or style. Without JavaScript the
/// live pages refresh themselves every 10 s.
pub(super) fn page(layout: &Layout<'_>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{} · voodu-agent</title>\n<link rel=\"stylesheet\" href=\"/ui/static/app.css\">\n",
        Esc(layout.title)
    );
    if let Some(events) = &layout.events {
        let _ = write!(
            out,
            "<noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\n<script src=\"/ui/static/app.js\" defer></script>\n</head>\n<body data-events=\"{}\">\n",
            Esc(events)
        );
    } else {
        out.push_str("</head>\n<body>\n");
    }
    out.push_str("<header class=\"top\"><a class=\"brand\" href=\"/ui\">voodu-agent</a>");
    if layout.back {
        out.push_str("<a class=\"crumb\" href=\"/ui\">← all resources</a>");
    }
    let _ = write!(
        out,
        "<span class=\"live\" id=\"live\" hidden>live</span><span class=\"version\">{} · {}</span></header>\n<main>\n",
        Esc(crate::metrics::VERSION),
        Esc(crate::metrics::COMMIT)
    );
    out.push_str(body);
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// A phase badge: the CSS class is chosen from a closed list, the text escaped.
pub(super) fn badge(phase: &str) -> String {
    format!(
        "<span class=\"badge {}\">{}</span>",
        phase_class(phase),
        Esc(phase)
    )
}

/// The CSS class of a resource or release phase (never the phase text itself).
pub(super) fn phase_class(phase: &str) -> &'static str {
    match phase.to_ascii_lowercase().as_str() {
        "ready" | "succeeded" | "applied" | "ok" | "reachable" | "scheduled" | "promoted"
        | "passed" => "good",
        "progressing" | "running" | "pending" => "busy",
        "degraded" | "superseded" | "suspended" | "disabled" | "rolled-back" | "paused" => "warn",
        "failed" | "rejected" | "failing" | "unreachable" | "aborted" => "bad",
        _ => "none",
    }
}

/// A Unix time as UTC `YYYY-MM-DD HH:MM:SS`.
pub(super) fn time(unix: i64) -> String {
    crate::base::utc_date_time(unix, ' ')
}

/// A duration in seconds, short (`42s`, `3m 05s`, `2h 10m`).
pub(super) fn duration(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h {:02}m", seconds / 3600, (seconds % 3600) / 60),
    }
}

/// The first 12 characters of a commit.
pub(super) fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        let hostile = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>&amp;\0";
        let escaped = Esc(hostile).to_string();
        assert_eq!(
            escaped,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;amp;\u{FFFD}"
        );
        for forbidden in ['<', '>', '"', '\''] {
            assert!(!escaped.contains(forbidden), "{escaped}");
        }
        assert_eq!(Esc("plain text").to_string(), "plain text");
    }

    #[test]
    fn url_parts_encode_everything_but_unreserved() {
        assert_eq!(UrlPart("web-1_a.b~").to_string(), "web-1_a.b~");
        assert_eq!(
            UrlPart("a/b?c=\"d\" <e>").to_string(),
            "a%2Fb%3Fc%3D%22d%22%20%3Ce%3E"
        );
        assert_eq!(UrlPart("é").to_string(), "%C3%A9");
    }

    #[test]
    fn a_title_is_escaped_in_the_layout() {
        let html = page(
            &Layout {
                title: "<b>",
                events: Some("/ui/events?x=\"1\"".to_owned()),
                back: false,
            },
            "",
        );
        assert!(
            html.contains("<title>&lt;b&gt; · voodu-agent</title>"),
            "{html}"
        );
        assert!(
            html.contains("data-events=\"/ui/events?x=&quot;1&quot;\""),
            "{html}"
        );
        assert!(!html.contains("<script>"), "no inline script: {html}");
    }

    #[test]
    fn durations_and_times_read_well() {
        assert_eq!(duration(42), "42s");
        assert_eq!(duration(185), "3m 05s");
        assert_eq!(duration(7800), "2h 10m");
        assert_eq!(time(0), "1970-01-01 00:00:00");
    }
}
