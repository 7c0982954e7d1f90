//! `docker_options`: voodu appends them verbatim to `docker run`; the agent drives Docker's API,
//! so each flag is parsed into the field it sets. The manifest stage reports a flag this
//! agent cannot express at the line that writes it; the runtime applies the parsed options.
//!
//! Both `--flag=value` and `--flag value` (two list items) are accepted, as the CLI does.
//! Invariant: a parsed `DockerOptions` only holds values that were checked here (sizes,
//! numbers, `KEY=VALUE` pairs), so applying it cannot fail on their form.

use std::collections::BTreeMap;

use super::units::parse_docker_size;

/// The `docker run` flags the agent maps onto the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerOptions {
    pub(crate) shm_size: Option<i64>,
    pub(crate) sysctls: BTreeMap<String, String>,
    pub(crate) pids_limit: Option<i64>,
    pub privileged: bool,
    pub cap_add: Vec<String>,
    pub(crate) cap_drop: Vec<String>,
    pub devices: Vec<String>,
    pub security_opt: Vec<String>,
    pub(crate) user: Option<String>,
    pub(crate) workdir: Option<String>,
    pub(crate) hostname: Option<String>,
    /// `--entrypoint`; an empty string resets the image's entrypoint.
    pub(crate) entrypoint: Option<String>,
    pub(crate) read_only: bool,
    /// `--tmpfs PATH[:OPTIONS]`.
    pub(crate) tmpfs: BTreeMap<String, String>,
    pub ipc: Option<String>,
    pub pid: Option<String>,
    pub(crate) memory_swap: Option<i64>,
    pub(crate) memory_reservation: Option<i64>,
    pub(crate) cpuset_cpus: Option<String>,
    pub(crate) cpu_shares: Option<i64>,
    pub(crate) oom_score_adj: Option<i64>,
    pub(crate) oom_kill_disable: bool,
    pub(crate) stop_signal: Option<String>,
    pub(crate) stop_timeout: Option<i64>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) add_hosts: Vec<String>,
    pub(crate) dns: Vec<String>,
    pub(crate) dns_search: Vec<String>,
    pub(crate) dns_options: Vec<String>,
    pub(crate) env: Vec<String>,
    pub(crate) group_add: Vec<String>,
    /// `--gpus all` or `--gpus N`: `Some(-1)` for all.
    pub(crate) gpus: Option<i64>,
    pub log_driver: Option<String>,
    pub(crate) log_opts: BTreeMap<String, String>,
}

/// Flags that take a value, and flags that do not.
const VALUE_FLAGS: &[&str] = &[
    "--shm-size",
    "--sysctl",
    "--pids-limit",
    "--cap-add",
    "--cap-drop",
    "--device",
    "--security-opt",
    "--user",
    "-u",
    "--workdir",
    "-w",
    "--hostname",
    "-h",
    "--entrypoint",
    "--tmpfs",
    "--ipc",
    "--pid",
    "--memory-swap",
    "--memory-reservation",
    "--cpuset-cpus",
    "--cpu-shares",
    "-c",
    "--oom-score-adj",
    "--stop-signal",
    "--stop-timeout",
    "--label",
    "-l",
    "--add-host",
    "--dns",
    "--dns-search",
    "--dns-option",
    "--env",
    "-e",
    "--group-add",
    "--gpus",
    "--log-driver",
    "--log-opt",
];
const BOOL_FLAGS: &[&str] = &[
    "--privileged",
    "--read-only",
    "--oom-kill-disable",
    "--init",
];

/// Why a `docker_options` list is refused; each variant names the flag or item at fault.
/// Display is the reason; the manifest stage reports it at the field's `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerOptionsError {
    #[error(
        "{item:?} contains {problem}: Docker would refuse or misread it; write one flag or value per list item"
    )]
    ControlCharacter { item: String, problem: &'static str },
    #[error("{flag} takes no value (got {value:?})")]
    TakesNoValue { flag: String, value: String },
    #[error(
        "{0:?} is not supported by this agent (it drives Docker's API, not the CLI); supported: {list}",
        list = supported()
    )]
    Unsupported(String),
    #[error(
        "{0:?} is not a flag: docker_options holds `docker run` flags such as \"--shm-size=1g\""
    )]
    NotAFlag(String),
    #[error("{0} needs a value")]
    NeedsValue(String),
    #[error("{flag} {value:?} is not a size like 64m or 2g")]
    NotASize { flag: String, value: String },
    #[error(
        "{flag} {value:?} is above the limit of 16t ({max} bytes): write a smaller size",
        max = DockerOptions::MAX_SIZE
    )]
    SizeAboveLimit { flag: String, value: String },
    #[error("{flag} {value:?} is not a whole number")]
    NotANumber { flag: String, value: String },
    #[error("{flag} {value:?} is out of range: {what} is {low} to {high}")]
    OutOfRange {
        flag: String,
        value: String,
        what: &'static str,
        low: i64,
        high: i64,
    },
    #[error("{flag} {value:?} is not KEY=VALUE")]
    NotKeyValue { flag: String, value: String },
    #[error("{flag} {key:?}: `voodu.*` and `createdby` labels are the agent's own")]
    ReservedLabel { flag: String, key: String },
    #[error("{flag} {value:?}: {problem}")]
    AddHost {
        flag: String,
        value: String,
        problem: ExtraHostError,
    },
    #[error("{flag} {value:?} has an empty variable name")]
    EmptyEnvName { flag: String, value: String },
    #[error(
        "{flag} {value:?} must be KEY=VALUE (the agent's own environment is not passed through)"
    )]
    EnvWithoutValue { flag: String, value: String },
    #[error("--gpus {0:?}: write all or a count from 1 to {max}", max = DockerOptions::MAX_GPUS)]
    Gpus(String),
    /// A flag listed as taking a value that `set` does not handle (a gap in this file).
    #[error("{0} is not supported")]
    Unhandled(String),
}

/// Why an `extra_hosts` / `--add-host` entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtraHostError {
    #[error("it contains {0}")]
    ControlCharacter(&'static str),
    #[error("write \"host:ip\"")]
    NoSeparator,
    #[error("the host name must be non-empty, without spaces")]
    BadHost,
    #[error("{0:?} is not an IP address (or host-gateway)")]
    BadAddress(String),
}

impl DockerOptions {
    /// Sizes (`--shm-size`, `--memory-swap`, `--memory-reservation`): 16 TiB.
    pub(crate) const MAX_SIZE: i64 = 1 << 44;
    /// `--pids-limit`: the kernel's largest `pid_max` (-1 or 0 mean unlimited).
    pub(crate) const MAX_PIDS_LIMIT: i64 = 1 << 22;
    /// `--cpu-shares`: the kernel's range for cgroup v1 shares (0 means Docker's default).
    pub(crate) const MAX_CPU_SHARES: i64 = 262_144;
    /// `--oom-score-adj`: the kernel's range, which Docker checks too.
    pub(crate) const OOM_SCORE_ADJ: std::ops::RangeInclusive<i64> = -1000..=1000;
    /// `--stop-timeout`, in seconds: an hour.
    pub(crate) const MAX_STOP_TIMEOUT: i64 = 3600;
    /// `--gpus N`.
    pub(crate) const MAX_GPUS: i64 = 256;

    /// Parses a `docker_options` list. The error names the offending item.
    pub fn parse(items: &[String]) -> Result<DockerOptions, DockerOptionsError> {
        let mut options = DockerOptions::default();
        for item in items {
            if let Some(problem) = control_character(item.trim()) {
                return Err(DockerOptionsError::ControlCharacter {
                    item: item.clone(),
                    problem,
                });
            }
        }
        let mut index = 0;
        while index < items.len() {
            let item = items[index].trim();
            index += 1;
            let (flag, inline) = match item.split_once('=') {
                Some((flag, value)) if flag.starts_with('-') => (flag, Some(value.to_owned())),
                _ => (item, None),
            };
            if BOOL_FLAGS.contains(&flag) {
                let on = match inline.as_deref() {
                    None | Some("true") => true,
                    Some("false") => false,
                    Some(other) => {
                        return Err(DockerOptionsError::TakesNoValue {
                            flag: flag.to_owned(),
                            value: other.to_owned(),
                        });
                    }
                };
                match flag {
                    "--privileged" => options.privileged = on,
                    "--read-only" => options.read_only = on,
                    "--oom-kill-disable" => options.oom_kill_disable = on,
                    _ => {} // --init: managed containers always run with an init process.
                }
                continue;
            }
            if !VALUE_FLAGS.contains(&flag) {
                return Err(if flag.starts_with('-') {
                    DockerOptionsError::Unsupported(flag.to_owned())
                } else {
                    DockerOptionsError::NotAFlag(item.to_owned())
                });
            }
            let value = match inline {
                Some(value) => value,
                None => {
                    let Some(next) = items.get(index) else {
                        return Err(DockerOptionsError::NeedsValue(flag.to_owned()));
                    };
                    index += 1;
                    next.trim().to_owned()
                }
            };
            options.set(flag, value)?;
        }
        Ok(options)
    }

    fn set(&mut self, flag: &str, value: String) -> Result<(), DockerOptionsError> {
        match flag {
            "--cap-add" => self.cap_add.push(value),
            "--cap-drop" => self.cap_drop.push(value),
            "--device" => self.devices.push(value),
            "--security-opt" => self.security_opt.push(value),
            "--user" | "-u" => self.user = Some(value),
            "--workdir" | "-w" => self.workdir = Some(value),
            "--hostname" | "-h" => self.hostname = Some(value),
            "--entrypoint" => self.entrypoint = Some(value),
            "--tmpfs" => {
                let (path, mount_options) = match value.split_once(':') {
                    Some((path, mount_options)) => (path.to_owned(), mount_options.to_owned()),
                    None => (value, String::new()),
                };
                self.tmpfs.insert(path, mount_options);
            }
            "--ipc" => self.ipc = Some(value),
            "--pid" => self.pid = Some(value),
            "--cpuset-cpus" => self.cpuset_cpus = Some(value),
            "--stop-signal" => self.stop_signal = Some(value),
            "--dns" => self.dns.push(value),
            "--dns-search" => self.dns_search.push(value),
            "--dns-option" => self.dns_options.push(value),
            "--group-add" => self.group_add.push(value),
            "--log-driver" => self.log_driver = Some(value),
            _ => self.set_checked(flag, value)?,
        }
        Ok(())
    }

    /// The flags whose value is checked as it is read (numbers, sizes, `key=value` pairs,
    /// labels, env entries, hosts, GPUs).
    fn set_checked(&mut self, flag: &str, value: String) -> Result<(), DockerOptionsError> {
        match flag {
            "--shm-size" => self.shm_size = Some(size(flag, &value)?),
            "--sysctl" => {
                let (key, value) = pair(flag, &value)?;
                self.sysctls.insert(key, value);
            }
            "--pids-limit" => {
                self.pids_limit = Some(within(
                    flag,
                    &value,
                    -1..=DockerOptions::MAX_PIDS_LIMIT,
                    "a process count (-1 for unlimited)",
                )?);
            }
            "--memory-swap" => {
                self.memory_swap = Some(if value == "-1" {
                    -1
                } else {
                    size(flag, &value)?
                });
            }
            "--memory-reservation" => self.memory_reservation = Some(size(flag, &value)?),
            "--cpu-shares" | "-c" => {
                self.cpu_shares = Some(within(
                    flag,
                    &value,
                    0..=DockerOptions::MAX_CPU_SHARES,
                    "a relative weight",
                )?);
            }
            "--oom-score-adj" => {
                self.oom_score_adj = Some(within(
                    flag,
                    &value,
                    DockerOptions::OOM_SCORE_ADJ,
                    "the kernel's OOM score adjustment",
                )?);
            }
            "--stop-timeout" => {
                self.stop_timeout = Some(within(
                    flag,
                    &value,
                    0..=DockerOptions::MAX_STOP_TIMEOUT,
                    "seconds to wait before SIGKILL",
                )?);
            }
            "--label" | "-l" => {
                let (key, value) = label(flag, value)?;
                self.labels.insert(key, value);
            }
            "--add-host" => {
                DockerOptions::check_extra_host(&value).map_err(|problem| {
                    DockerOptionsError::AddHost {
                        flag: flag.to_owned(),
                        value: value.clone(),
                        problem,
                    }
                })?;
                self.add_hosts.push(value);
            }
            "--env" | "-e" => {
                if value.starts_with('=') {
                    return Err(DockerOptionsError::EmptyEnvName {
                        flag: flag.to_owned(),
                        value,
                    });
                }
                if !value.contains('=') {
                    return Err(DockerOptionsError::EnvWithoutValue {
                        flag: flag.to_owned(),
                        value,
                    });
                }
                self.env.push(value);
            }
            "--gpus" => self.gpus = Some(gpus(value)?),
            "--log-opt" => {
                let (key, value) = pair(flag, &value)?;
                self.log_opts.insert(key, value);
            }
            other => return Err(DockerOptionsError::Unhandled(other.to_owned())),
        }
        Ok(())
    }

    /// One `extra_hosts` / `--add-host` entry as Docker reads it: `host:ip` or `host=ip`, the
    /// address an IPv4 or IPv6 address (optionally in brackets) or `host-gateway`. The error
    /// says what is wrong with `entry`.
    pub(crate) fn check_extra_host(entry: &str) -> Result<(), ExtraHostError> {
        if let Some(problem) = control_character(entry) {
            return Err(ExtraHostError::ControlCharacter(problem));
        }
        let split = entry.split_once('=').or_else(|| entry.split_once(':'));
        let Some((host, address)) = split else {
            return Err(ExtraHostError::NoSeparator);
        };
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(ExtraHostError::BadHost);
        }
        let address = address
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
            .unwrap_or(address);
        if address != "host-gateway" && address.parse::<std::net::IpAddr>().is_err() {
            return Err(ExtraHostError::BadAddress(address.to_owned()));
        }
        Ok(())
    }
}

/// What makes `text` unusable as one argument or value: a NUL, or a line break.
pub(crate) fn control_character(text: &str) -> Option<&'static str> {
    if text.contains('\0') {
        Some("a NUL character")
    } else if text.contains(['\n', '\r']) {
        Some("a line break")
    } else {
        None
    }
}

fn supported() -> String {
    let mut flags: Vec<&str> = VALUE_FLAGS
        .iter()
        .chain(BOOL_FLAGS)
        .copied()
        .filter(|flag| flag.starts_with("--"))
        .collect();
    flags.sort_unstable();
    flags.join(" ")
}

/// `value` of `flag` as a size Docker reads (`1g`), within `DockerOptions::MAX_SIZE`.
fn size(flag: &str, value: &str) -> Result<i64, DockerOptionsError> {
    let bytes = parse_docker_size(value).ok_or_else(|| DockerOptionsError::NotASize {
        flag: flag.to_owned(),
        value: value.to_owned(),
    })?;
    if bytes > DockerOptions::MAX_SIZE {
        return Err(DockerOptionsError::SizeAboveLimit {
            flag: flag.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(bytes)
}

/// `value` of `flag` as a number in `range`; `what` says what the number counts.
fn within(
    flag: &str,
    value: &str,
    range: std::ops::RangeInclusive<i64>,
    what: &'static str,
) -> Result<i64, DockerOptionsError> {
    let parsed = value
        .parse::<i64>()
        .map_err(|_| DockerOptionsError::NotANumber {
            flag: flag.to_owned(),
            value: value.to_owned(),
        })?;
    if range.contains(&parsed) {
        Ok(parsed)
    } else {
        Err(DockerOptionsError::OutOfRange {
            flag: flag.to_owned(),
            value: value.to_owned(),
            what,
            low: *range.start(),
            high: *range.end(),
        })
    }
}

/// `value` of `--label` as `key[=value]`; the agent's own keys are refused.
fn label(flag: &str, value: String) -> Result<(String, String), DockerOptionsError> {
    let (key, value) = match value.split_once('=') {
        Some((key, value)) => (key.to_owned(), value.to_owned()),
        None => (value, String::new()),
    };
    if key.starts_with("voodu.") || key == "createdby" {
        return Err(DockerOptionsError::ReservedLabel {
            flag: flag.to_owned(),
            key,
        });
    }
    Ok((key, value))
}

/// `value` of `--gpus`: `all` (-1) or a count within `DockerOptions::MAX_GPUS`.
fn gpus(value: String) -> Result<i64, DockerOptionsError> {
    match value.as_str() {
        "all" | "count=all" => Ok(-1),
        other => other
            .strip_prefix("count=")
            .unwrap_or(other)
            .parse()
            .ok()
            .filter(|count| (1..=DockerOptions::MAX_GPUS).contains(count))
            .ok_or_else(|| DockerOptionsError::Gpus(value.clone())),
    }
}

/// `value` of `flag` as `key=value` with a key.
fn pair(flag: &str, value: &str) -> Result<(String, String), DockerOptionsError> {
    value
        .split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| DockerOptionsError::NotKeyValue {
            flag: flag.to_owned(),
            value: value.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(items: &[&str]) -> Result<DockerOptions, DockerOptionsError> {
        DockerOptions::parse(
            &items
                .iter()
                .map(|item| (*item).to_owned())
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn voodus_examples_parse() -> Result<(), DockerOptionsError> {
        let options = parse(&[
            "--shm-size=2g",
            "--sysctl=net.core.somaxconn=4096",
            "--sysctl",
            "net.ipv4.tcp_keepalive_time=60",
            "--pids-limit=4096",
            "--privileged",
            "-e",
            "A=1",
        ])?;
        assert_eq!(options.shm_size, Some(2 << 30));
        assert_eq!(
            options.sysctls,
            BTreeMap::from([
                ("net.core.somaxconn".into(), "4096".into()),
                ("net.ipv4.tcp_keepalive_time".into(), "60".into()),
            ])
        );
        assert_eq!(options.pids_limit, Some(4096));
        assert!(options.privileged);
        assert_eq!(options.env, ["A=1"]);
        let hosts = parse(&[
            "--add-host=db:10.0.0.1",
            "--add-host",
            "v6:::1",
            "--add-host=gw=host-gateway",
            "--add-host=b:[fe80::1]",
        ])?;
        assert_eq!(hosts.add_hosts.len(), 4);
        Ok(())
    }

    #[test]
    fn what_cannot_be_expressed_is_refused_by_name() {
        for (items, wanted) in [
            (
                &["--mount=type=bind,src=/a,dst=/b"][..],
                "\"--mount\" is not supported",
            ),
            (&["--shm-size=lots"][..], "is not a size"),
            (&["--pids-limit"][..], "needs a value"),
            (&["2g"][..], "is not a flag"),
            (&["--label=voodu.kind=x"][..], "the agent's own"),
            (&["-e", "HOME"][..], "must be KEY=VALUE"),
            (&["--privileged=maybe"][..], "takes no value"),
            (&["--pids-limit=9999999"][..], "is -1 to 4194304"),
            (&["--cpu-shares=300000"][..], "is 0 to 262144"),
            (&["--oom-score-adj=-1001"][..], "is -1000 to 1000"),
            (&["--stop-timeout", "-5"][..], "is 0 to 3600"),
            (&["--shm-size=17t"][..], "is not a size"),
            (&["--shm-size=20000g"][..], "above the limit"),
            (&["--memory-swap=99999999g"][..], "above the limit"),
            (&["--gpus=0"][..], "a count from 1 to 256"),
            (&["--gpus", "1000"][..], "a count from 1 to 256"),
            (&["-e", "=x"][..], "empty variable name"),
            (&["--add-host=db"][..], "write \"host:ip\""),
            (&["--add-host", "db:10.0.0.300"][..], "is not an IP address"),
            (
                &["--add-host", "db:1.2.3.4\nevil:5.6.7.8"][..],
                "a line break",
            ),
            (&["--entrypoint", "sh\0"][..], "a NUL character"),
            (&["--label=a=b\0c"][..], "a NUL character"),
        ] {
            let error = parse(items).expect_err("must be refused").to_string();
            assert!(error.contains(wanted), "{items:?}: {error}");
        }
    }
}
