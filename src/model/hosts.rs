//! Which manifests a host applies, in a fleet of agents watching one repository.
//!
//! The convention (README "Fleet"): below the repository root — or below each watched
//! `--path` — a directory `hosts/<name>/` holds what only host `<name>` applies, and
//! `labels/<label>/` what only hosts started with `--host-label <label>` apply; every other
//! manifest is shared by all hosts. The repository stays a plain voodu repository: voodu
//! itself applies what it is pointed at (`vd apply -f common -f hosts/web-1`), and neither
//! directory name is a voodu file.
//!
//! Invariants: a path is addressed by its first two components below the watched path it
//! is read under (the longest one), else below the root, so `--path hosts/web-1` reads that
//! directory as shared (the operator chose it) rather than pruning everything on a host of
//! another name; a manifest directly in `hosts/` or `labels/` (no name directory) is shared;
//! `HostSelection::every_host` selects every file (`validate`, library callers that do not
//! filter). Pure: no IO (the machine's host name is read by the caller).

use serde::{Deserialize, Serialize};

/// The directory whose subdirectories are named after hosts.
pub(crate) const HOSTS_DIR: &str = "hosts";
/// The directory whose subdirectories are named after host labels.
pub(crate) const LABELS_DIR: &str = "labels";
/// At most this many `--host-label`s.
pub(crate) const MAX_HOST_LABELS: usize = 32;

/// To whom a manifest path is addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addressed<'a> {
    /// Every host applies it.
    Shared,
    /// Only the host of this name (`hosts/<name>/…`).
    Host(&'a str),
    /// Only hosts with this label (`labels/<label>/…`).
    Label(&'a str),
}

/// To whom `path` (repo-relative, `/`-separated) is addressed, given the watched `--path`
/// prefixes (normalised, empty for the whole repo).
pub(crate) fn addressed<'a>(path: &'a str, watched: &[String]) -> Addressed<'a> {
    let base = watched
        .iter()
        .filter(|prefix| {
            path.strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|prefix| prefix.len());
    let rest = match base {
        Some(prefix) => &path[prefix.len() + 1..],
        None => path,
    };
    let mut parts = rest.splitn(3, '/');
    let (Some(dir), Some(name), Some(_file)) = (parts.next(), parts.next(), parts.next()) else {
        return Addressed::Shared;
    };
    if name.is_empty() {
        return Addressed::Shared;
    }
    match dir {
        HOSTS_DIR => Addressed::Host(name),
        LABELS_DIR => Addressed::Label(name),
        _ => Addressed::Shared,
    }
}

/// The manifests one host applies: its name and labels, or every file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSelection {
    /// `None`: every file, whatever host or label it is addressed to.
    pub host: Option<String>,
    pub(crate) labels: Vec<String>,
}

impl HostSelection {
    /// Selects every manifest (no host filter).
    pub fn every_host() -> HostSelection {
        HostSelection::default()
    }

    /// The selection of host `name` with `labels`; an error says which value is wrong.
    pub fn for_host(name: &str, labels: &[String]) -> Result<HostSelection, HostNameError> {
        check_name("host name", name)?;
        if labels.len() > MAX_HOST_LABELS {
            return Err(HostNameError::TooManyLabels {
                n_given: labels.len(),
            });
        }
        let mut sorted = Vec::with_capacity(labels.len());
        for label in labels {
            check_name("host label", label)?;
            if !sorted.contains(label) {
                sorted.push(label.clone());
            }
        }
        sorted.sort_unstable();
        Ok(HostSelection {
            host: Some(name.to_owned()),
            labels: sorted,
        })
    }

    /// Whether this host applies `path` (see `addressed`).
    pub(crate) fn selects(&self, path: &str, watched: &[String]) -> bool {
        self.refusal(path, watched).is_none()
    }

    /// Why this host does not apply `path`, if it does not.
    pub(crate) fn refusal(&self, path: &str, watched: &[String]) -> Option<String> {
        let host = self.host.as_deref()?;
        match addressed(path, watched) {
            Addressed::Shared => None,
            Addressed::Host(name) if name == host => None,
            Addressed::Host(name) => Some(format!(
                "{path} is addressed to host {name} ({HOSTS_DIR}/{name}/); this agent is host {host}"
            )),
            Addressed::Label(label) if self.labels.iter().any(|mine| mine == label) => None,
            Addressed::Label(label) => Some(format!(
                "{path} is addressed to hosts labelled {label} ({LABELS_DIR}/{label}/); this agent (host {host}) has {}",
                if self.labels.is_empty() {
                    "no --host-label".to_owned()
                } else {
                    format!("--host-label {}", self.labels.join(", "))
                }
            )),
        }
    }

    /// One line for logs and `plan`: `host web-1 (labels edge, eu)`, or `every host`.
    pub(crate) fn describe(&self) -> String {
        match &self.host {
            None => "every host".to_owned(),
            Some(host) if self.labels.is_empty() => format!("host {host}"),
            Some(host) => format!("host {host} (labels {})", self.labels.join(", ")),
        }
    }
}

/// Why a host name or label is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostNameError {
    /// `what` (`host name`, `host label`, `agent name`) is not a DNS label; `dir` is the
    /// repository directory it would name.
    #[error(
        "{what} {name:?} is not a DNS label: 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-' (it names a directory {dir}/<name>/ in the repository)"
    )]
    NotDnsLabel {
        what: &'static str,
        name: String,
        dir: &'static str,
    },
    #[error("{n_given} host labels given; at most {max}", max = MAX_HOST_LABELS)]
    TooManyLabels { n_given: usize },
}

/// Checks a host name or label: a DNS label (RFC 1123: 1–63 of `a-z`, `0-9`, `-`, not
/// starting or ending with `-`), as it names a directory in the repository.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), HostNameError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(HostNameError::NotDnsLabel {
            what,
            name: name.to_owned(),
            dir: if what == "host label" {
                LABELS_DIR
            } else {
                HOSTS_DIR
            },
        })
    }
}

/// The host name a machine reports (`gethostname`), made a host name: lowercased, cut at the
/// first dot (an FQDN's first label). `None` when it is not a DNS label then.
pub(crate) fn host_name_of_machine(reported: &str) -> Option<String> {
    let first = reported.trim().split('.').next()?.to_ascii_lowercase();
    check_name("host name", &first).ok().map(|()| first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(paths: &[&str]) -> Vec<String> {
        paths.iter().map(|path| (*path).to_owned()).collect()
    }

    #[test]
    fn paths_are_addressed_by_their_first_two_components_below_the_watched_path() {
        let none = watched(&[]);
        let cases = [
            ("app.hcl", &none, Addressed::Shared),
            ("common/app.hcl", &none, Addressed::Shared),
            ("hosts/web-1/app.hcl", &none, Addressed::Host("web-1")),
            ("hosts/web-1/deep/app.hcl", &none, Addressed::Host("web-1")),
            ("labels/edge/caddy.hcl", &none, Addressed::Label("edge")),
            // A manifest directly in hosts/ names no host.
            ("hosts/app.hcl", &none, Addressed::Shared),
            // Only at the top: apps/hosts/… is an ordinary directory.
            ("apps/hosts/web-1/app.hcl", &none, Addressed::Shared),
            (
                "deploy/hosts/web-1/app.hcl",
                &watched(&["deploy"]),
                Addressed::Host("web-1"),
            ),
            // The operator watches one host's directory: it is read as shared.
            (
                "hosts/web-1/app.hcl",
                &watched(&["hosts/web-1"]),
                Addressed::Shared,
            ),
            // The longest watched prefix counts.
            (
                "deploy/prod/hosts/db/x.hcl",
                &watched(&["deploy", "deploy/prod"]),
                Addressed::Host("db"),
            ),
            // Outside every watched path: counted from the root.
            ("hosts/a/x.hcl", &watched(&["deploy"]), Addressed::Host("a")),
        ];
        for (path, watched, expected) in cases {
            assert_eq!(
                addressed(path, watched),
                expected,
                "{path} under {watched:?}"
            );
        }
    }

    #[test]
    fn a_host_applies_shared_files_its_own_and_its_labels() -> Result<(), String> {
        let web1 = HostSelection::for_host("web-1", &["edge".to_owned()])
            .map_err(|error| error.to_string())?;
        let none = watched(&[]);
        assert!(web1.selects("common/app.hcl", &none));
        assert!(web1.selects("hosts/web-1/app.hcl", &none));
        assert!(web1.selects("labels/edge/caddy.hcl", &none));
        assert_eq!(
            web1.refusal("hosts/web-2/app.hcl", &none).as_deref(),
            Some(
                "hosts/web-2/app.hcl is addressed to host web-2 (hosts/web-2/); this agent is host web-1"
            )
        );
        assert_eq!(
            web1.refusal("labels/db/pg.hcl", &none).as_deref(),
            Some(
                "labels/db/pg.hcl is addressed to hosts labelled db (labels/db/); this agent (host web-1) has --host-label edge"
            )
        );
        let every = HostSelection::every_host();
        assert!(every.selects("hosts/web-2/app.hcl", &none));
        assert!(every.selects("labels/db/pg.hcl", &none));
        assert_eq!(every.describe(), "every host");
        assert_eq!(web1.describe(), "host web-1 (labels edge)");
        Ok(())
    }

    #[test]
    fn host_names_and_labels_are_dns_labels() {
        for good in ["web-1", "a", "0db", &"x".repeat(63)] {
            assert!(check_name("host name", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Web-1",
            "web_1",
            "-web",
            "web-",
            "a.b",
            "../x",
            &"x".repeat(64),
        ] {
            assert!(check_name("host name", bad).is_err(), "{bad:?}");
        }
        assert!(HostSelection::for_host("web-1", &["Edge".to_owned()]).is_err());
        assert!(HostSelection::for_host("web-1", &vec!["a".to_owned(); 33]).is_err());
        assert_eq!(
            HostSelection::for_host("h", &["b".to_owned(), "a".to_owned(), "b".to_owned()])
                .map(|selection| selection.labels),
            Ok(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(
            host_name_of_machine("Web-1.example.com\n").as_deref(),
            Some("web-1")
        );
        assert_eq!(host_name_of_machine("under_score"), None);
        assert_eq!(host_name_of_machine(""), None);
    }
}
