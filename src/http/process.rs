//! The `process_*` families of `GET /metrics` (the names every Prometheus client library
//! exports: CPU time, memory, file descriptors, start time, threads) and
//! `voodu_agent_build_info`, read from `/proc/self` at scrape time.
//!
//! Invariant: a figure that cannot be read (not Linux, a restricted `/proc`) is left out,
//! never reported as 0.

use std::fmt::Write as _;

use crate::metrics::{COMMIT, VERSION, render_gauge};

/// Appends `voodu_agent_build_info` and the process families to `out`.
pub(super) fn render(out: &mut String) {
    render_gauge(
        out,
        "voodu_agent_build_info",
        "The agent's version and the git commit it was built from; always 1.",
        &["version", "commit"],
        &[(vec![VERSION.to_owned(), COMMIT.to_owned()], 1.0)],
    );
    let Some(figures) = read() else {
        return;
    };
    let _ = writeln!(
        out,
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds."
    );
    let _ = writeln!(out, "# TYPE process_cpu_seconds_total counter");
    let _ = writeln!(out, "process_cpu_seconds_total {}", figures.cpu_seconds);
    let gauges: [(&str, &str, Option<f64>); 6] = [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            Some(figures.resident_bytes),
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            Some(figures.virtual_bytes),
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            figures.start_time_seconds,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            figures.open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            figures.max_fds,
        ),
        (
            "process_threads",
            "Number of OS threads in the process.",
            Some(figures.threads),
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(value) = value {
            render_gauge(out, name, help, &[], &[(Vec::new(), value)]);
        }
    }
}

/// One reading of `/proc/self`.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    threads: f64,
    start_time_seconds: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
}

fn read() -> Option<Figures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    let boot_time = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| boot_time(&text));
    let mut figures = parse_stat(&stat, ticks as f64, page as f64, boot_time)?;
    figures.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as f64);
    figures.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| max_open_files(&text));
    Some(figures)
}

/// The figures of a `/proc/<pid>/stat` line (proc(5)); the command name, field 2, may hold
/// spaces and parentheses, so fields are counted from its closing parenthesis.
fn parse_stat(stat: &str, ticks: f64, page: f64, boot_time: Option<f64>) -> Option<Figures> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| -> Option<f64> { fields.get(number - 3)?.parse().ok() };
    let utime = field(14)?;
    let stime = field(15)?;
    let threads = field(20)?;
    let start_ticks = field(22)?;
    let virtual_bytes = field(23)?;
    let resident_pages = field(24)?;
    Some(Figures {
        cpu_seconds: (utime + stime) / ticks,
        resident_bytes: resident_pages * page,
        virtual_bytes,
        threads,
        start_time_seconds: boot_time.map(|boot| boot + start_ticks / ticks),
        open_fds: None,
        max_fds: None,
    })
}

/// `btime` of `/proc/stat`: the boot time, Unix seconds.
fn boot_time(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft limit of "Max open files" in `/proc/self/limits`; `None` when unlimited.
fn max_open_files(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find(|line| line.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (voodu (agent) x) S 1 4242 4242 0 -1 4194560 2763 0 0 0 150 50 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let figures = parse_stat(stat, 100.0, 4096.0, Some(1_700_000_000.0));
        assert_eq!(
            figures,
            Some(Figures {
                cpu_seconds: 2.0,
                resident_bytes: 2560.0 * 4096.0,
                virtual_bytes: 104_857_600.0,
                threads: 7.0,
                start_time_seconds: Some(1_700_000_000.0 + 123.45),
                open_fds: None,
                max_fds: None,
            })
        );
        assert_eq!(parse_stat("garbage", 100.0, 4096.0, None), None);
    }

    #[test]
    fn limits_and_boot_time_are_read_from_their_files() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024.0));
        assert_eq!(
            max_open_files("Max open files            unlimited            unlimited"),
            None
        );
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000.0)
        );
    }

    #[test]
    fn this_process_is_read() {
        let figures = read().expect("/proc/self is readable on Linux");
        assert!(
            figures.resident_bytes > 0.0 && figures.threads >= 1.0,
            "{figures:?}"
        );
        assert!(
            figures.open_fds.is_some_and(|fds| fds >= 3.0),
            "{figures:?}"
        );
    }
}
