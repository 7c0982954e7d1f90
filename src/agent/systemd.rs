//! The service manager's notification protocol (`sd_notify(3)`): under systemd with
//! `Type=notify`, the agent says when it is ready (`READY=1`), that it is alive
//! (`WATCHDOG=1`, at half of `WatchdogSec=`), what it is doing (`STATUS=…`, shown by
//! `systemctl status`) and that it is stopping (`STOPPING=1`).
//!
//! The protocol is a datagram of `KEY=VALUE` lines sent to the unix socket named by
//! `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace): a dozen lines, so no crate.
//!
//! Invariants: without `NOTIFY_SOCKET` every call does nothing; a failed send is logged once
//! at debug level and never stops the agent (systemd going away must not take it down).

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// Where notifications go; `ServiceNotify::default()` sends nothing.
#[derive(Debug, Clone, Default)]
pub struct ServiceNotify {
    socket: Option<NotifySocket>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum NotifySocket {
    Path(PathBuf),
    /// A name in Linux's abstract socket namespace (`NOTIFY_SOCKET=@name`).
    Abstract(Vec<u8>),
}

impl ServiceNotify {
    /// The socket systemd gave this process in `NOTIFY_SOCKET`, if any.
    pub(crate) fn from_env() -> ServiceNotify {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|value| parse_socket(&value));
        ServiceNotify { socket }
    }

    #[cfg(test)]
    /// Notifications to the datagram socket bound at `path` (tests).
    pub(crate) fn to_path(path: impl Into<PathBuf>) -> ServiceNotify {
        ServiceNotify {
            socket: Some(NotifySocket::Path(path.into())),
        }
    }

    #[cfg(test)]
    /// True when there is a service manager to tell.
    pub(crate) fn is_active(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends one notification (`KEY=VALUE` lines). Nothing without a socket.
    pub(crate) fn send(&self, state: &str) -> io::Result<()> {
        let Some(socket) = &self.socket else {
            return Ok(());
        };
        let address = match socket {
            NotifySocket::Path(path) => SocketAddr::from_pathname(path)?,
            NotifySocket::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                SocketAddr::from_abstract_name(name)?
            }
        };
        let sent = UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &address)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the notification was cut",
            ));
        }
        Ok(())
    }

    /// The agent serves and syncs: `READY=1` with a status line.
    pub(crate) fn ready(&self, status: &str) {
        self.report(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// What the agent is doing, for `systemctl status`.
    pub(crate) fn status(&self, status: &str) {
        self.report(&format!("STATUS={}", one_line(status)));
    }

    /// The agent is alive (the watchdog's keep-alive).
    pub(crate) fn watchdog(&self) {
        self.report("WATCHDOG=1");
    }

    /// A stop was asked for: in-flight work is finishing.
    pub(crate) fn stopping(&self) {
        self.report("STOPPING=1\nSTATUS=stopping: letting in-flight work finish");
    }

    fn report(&self, state: &str) {
        if let Err(error) = self.send(state) {
            tracing::debug!(%error, "cannot notify the service manager");
        }
    }
}

/// How often to send `WATCHDOG=1`: half of the `WATCHDOG_USEC` systemd set for this process
/// (`WATCHDOG_PID`, when set, must be this process); `None` without a watchdog.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

fn parse_socket(value: &std::ffi::OsStr) -> Option<NotifySocket> {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = value.as_bytes();
    match bytes.first()? {
        b'@' => Some(NotifySocket::Abstract(bytes[1..].to_vec())),
        b'/' => Some(NotifySocket::Path(PathBuf::from(value))),
        // vsock and relative paths are not for a system service.
        _ => None,
    }
}

/// A status is one line: newlines would start new assignments.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_real_datagram_socket() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("notify.sock");
        let receiver = UnixDatagram::bind(&path)?;
        receiver.set_read_timeout(Some(Duration::from_secs(5)))?;
        let notify = ServiceNotify::to_path(&path);
        assert!(notify.is_active());
        let mut buffer = [0u8; 512];
        let mut next = || -> io::Result<String> {
            let n = receiver.recv(&mut buffer)?;
            Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
        };
        notify.ready("watching repo\nbranch main");
        assert_eq!(next()?, "READY=1\nSTATUS=watching repo branch main");
        notify.watchdog();
        assert_eq!(next()?, "WATCHDOG=1");
        notify.status("syncing");
        assert_eq!(next()?, "STATUS=syncing");
        notify.stopping();
        assert_eq!(
            next()?,
            "STOPPING=1\nSTATUS=stopping: letting in-flight work finish"
        );
        Ok(())
    }

    #[test]
    fn abstract_sockets_are_reached_by_name() -> io::Result<()> {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("voodu-notify-test-{}", std::process::id());
        let receiver = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
        receiver.set_read_timeout(Some(Duration::from_secs(5)))?;
        let notify = ServiceNotify {
            socket: parse_socket(std::ffi::OsStr::new(&format!("@{name}"))),
        };
        notify.send("READY=1")?;
        let mut buffer = [0u8; 64];
        let n = receiver.recv(&mut buffer)?;
        assert_eq!(&buffer[..n], b"READY=1");
        Ok(())
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let notify = ServiceNotify::default();
        assert!(!notify.is_active());
        assert!(notify.send("READY=1").is_ok());
        assert_eq!(parse_socket(std::ffi::OsStr::new("relative")), None);
        assert_eq!(parse_socket(std::ffi::OsStr::new("")), None);
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error_not_a_panic() {
        let notify = ServiceNotify::to_path("/nonexistent/notify.sock");
        assert!(notify.send("READY=1").is_err());
        // The reporting calls swallow it.
        notify.ready("x");
    }
}
