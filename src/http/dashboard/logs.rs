//! The log tail of a resource's page: a section whose script (`logs.js`, a file: the
//! Content-Security-Policy allows no inline script) follows the resource's log stream
//! (`http::logs`, server-sent events), all containers or the one chosen, and appends each line
//! with `textContent`, so nothing the containers print is ever parsed as HTML.
//!
//! Invariants: the stream URL is built from escaped path parts (`UrlPart`, then `Esc` in the
//! attribute); the page keeps at most `MAX_LINES` lines (`logs.js`), dropping the oldest.

use super::html::{Esc, UrlPart};

/// The tail's script.
pub(super) const JS: &str = include_str!("logs.js");

/// The section of `kind/scope/name`'s page that tails its logs.
pub(super) fn section(kind: &str, scope: &str, name: &str) -> String {
    let url = format!(
        "/ui/resource/{}/{}/{}/logs",
        UrlPart(kind),
        UrlPart(scope),
        UrlPart(name)
    );
    format!(
        "<section id=\"logs\" data-logs=\"{}\"><h2>Logs <select id=\"log-replica\" aria-label=\"container\"><option value=\"\">all containers</option></select> <span id=\"log-state\" class=\"muted\"></span></h2><pre id=\"log-lines\" class=\"logs\"></pre><noscript><p>The log tail needs JavaScript; <code>voodu-agent logs {}/{} -f</code> on the host shows the same.</p></noscript></section>\n<script src=\"/ui/static/logs.js\" defer></script>\n",
        Esc(&url),
        Esc(scope),
        Esc(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_url_is_escaped() {
        let html = section("deployment", "s\"><script>", "web");
        assert!(
            html.contains("data-logs=\"/ui/resource/deployment/s%22%3E%3Cscript%3E/web/logs\"")
        );
        assert!(!html.contains("<script>\""));
    }
}
