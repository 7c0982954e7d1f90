//! Values that reach Docker as written, checked as Docker would read them: image references
//! (Docker's reference grammar), `volumes` entries, environment variables, command arguments,
//! `extra_hosts`, ulimit names. Each check is pure and returns a [`ValueError`] saying what is
//! wrong; `kinds` reports it at the value's `path:line:col`.
//!
//! Invariant: a value still holding a `${asset.…}` or `${ref.…}` reference (resolved only at
//! reconcile time, to an absolute data-dir path or an ingress field) is checked for what the
//! reference cannot change: a bind source written as `${asset.…}` is absolute once resolved.

use crate::model::control_character;

/// What is wrong with one value Docker would read as written. Display is the reason alone
/// (`it is empty`); `kinds` prefixes the field and the value and reports it at their
/// `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ValueError {
    #[error("it is empty")]
    Empty,
    #[error("it contains {0}")]
    ControlCharacter(&'static str),
    #[error("it contains whitespace")]
    Whitespace,
    #[error(
        "tag {0:?} is not a tag (letters, digits, `_`, `.` and `-`, at most 128, not starting with `.` or `-`)"
    )]
    Tag(String),
    #[error("the name is empty")]
    EmptyName,
    #[error("the name is longer than 255 characters")]
    LongName,
    #[error(
        "registry {0:?} is not a host[:port] (letters, digits, `-` and `.`, or an [IPv6] address)"
    )]
    Registry(String),
    #[error("digest {0:?} is not algorithm:hex (e.g. sha256: and 64 hex digits)")]
    Digest(String),
    #[error("the repository name must be lowercase")]
    UppercaseRepository,
    #[error(
        "{0:?} is not a name component (lowercase letters and digits, joined by `.`, `_`, `__` or `-`)"
    )]
    NameComponent(String),
    #[error("it has more than three `:`-separated parts; write source:target[:options]")]
    VolumeParts,
    #[error("the source is empty; write source:target[:options]")]
    EmptySource,
    #[error(
        "{0:?} is a relative host path: a bind source must be absolute (\"/srv/data\"), a named volume a plain name (\"data\")"
    )]
    RelativeSource(String),
    #[error(
        "{0:?} is not a volume name (letters, digits, `_`, `.` and `-`, starting with a letter or digit, at least two characters); a bind source is an absolute path"
    )]
    VolumeName(String),
    #[error("the target {0:?} must be an absolute path in the container")]
    RelativeTarget(String),
    #[error("the target must not be the container's root `/`")]
    RootTarget,
    #[error("{0:?} is not a mount option ({list})", list = MOUNT_OPTIONS.join(", "))]
    MountOption(String),
    #[error("the name contains `=`, where Docker would split it")]
    NameWithEquals,
    #[error("the name contains {0}")]
    NameControlCharacter(&'static str),
    #[error("the value contains a NUL character, where the process would see it end")]
    ValueWithNul,
    #[error("it contains a NUL character, which no process can receive")]
    ArgumentWithNul,
}

/// The grammar, for messages.
pub(super) const IMAGE_FORM: &str =
    "write [registry[:port]/]name[:tag][@digest], e.g. \"nginx:1.27\" or \"ghcr.io/org/app:v1\"";

/// Docker's reference grammar (distribution/reference): `name[:tag][@digest]`, the name
/// `[domain/]path`, path components `[a-z0-9]+` joined by `.`, `_`, `__` or `-`+, the
/// domain `host[:port]`, the tag `[\w][\w.-]{0,127}`, the digest `algorithm:hex`.
pub(crate) fn image_reference(reference: &str) -> Result<(), ValueError> {
    if reference.is_empty() {
        return Err(ValueError::Empty);
    }
    if let Some(problem) = control_character(reference) {
        return Err(ValueError::ControlCharacter(problem));
    }
    if reference.contains(char::is_whitespace) {
        return Err(ValueError::Whitespace);
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if !rest[colon..].contains('/') => (&rest[..colon], Some(&rest[colon + 1..])),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let valid = chars.next().is_some_and(word)
            && chars.all(|c| word(c) || c == '.' || c == '-')
            && tag.len() <= 128;
        if !valid {
            return Err(ValueError::Tag(tag.to_owned()));
        }
    }
    if name.is_empty() {
        return Err(ValueError::EmptyName);
    }
    if name.len() > 255 {
        return Err(ValueError::LongName);
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (Some(first), path)
        }
        _ => (None, name),
    };
    if let Some(domain) = domain {
        check_domain(domain)?;
    }
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(ValueError::UppercaseRepository);
    }
    for component in path.split('/') {
        if !is_path_component(component) {
            return Err(ValueError::NameComponent(component.to_owned()));
        }
    }
    Ok(())
}

fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alphanumeric = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit();
    let mut at = 0;
    loop {
        let start = at;
        while at < bytes.len() && alphanumeric(bytes[at]) {
            at += 1;
        }
        if at == start {
            return false;
        }
        if at == bytes.len() {
            return true;
        }
        match bytes[at] {
            b'.' => at += 1,
            b'_' => {
                at += 1;
                if bytes.get(at) == Some(&b'_') {
                    at += 1;
                }
            }
            b'-' => {
                while bytes.get(at) == Some(&b'-') {
                    at += 1;
                }
            }
            _ => return false,
        }
    }
}

fn check_domain(domain: &str) -> Result<(), ValueError> {
    let bad = || Err(ValueError::Registry(domain.to_owned()));
    let (host, port) = if let Some(bracketed) = domain.strip_prefix('[') {
        let Some((address, tail)) = bracketed.split_once(']') else {
            return bad();
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return bad();
        }
        match tail {
            "" => return Ok(()),
            tail => ("", tail.strip_prefix(':').unwrap_or("x")),
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (host, port),
            None => (domain, "0"),
        }
    };
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let bracketed = host.is_empty() && domain.starts_with('[');
    if !(bracketed || host.split('.').all(label_ok)) {
        return bad();
    }
    if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) {
        return bad();
    }
    Ok(())
}

fn check_digest(digest: &str) -> Result<(), ValueError> {
    let bad = || Err(ValueError::Digest(digest.to_owned()));
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return bad();
    };
    let component_ok = |component: &str| {
        let mut chars = component.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric())
    };
    if !algorithm.split(['+', '.', '-', '_']).all(component_ok)
        || !hex.chars().all(|c| c.is_ascii_hexdigit())
    {
        return bad();
    }
    let wanted = match algorithm {
        "sha256" => Some(64),
        "sha384" => Some(96),
        "sha512" => Some(128),
        _ => None,
    };
    match wanted {
        Some(length) if hex.len() != length => bad(),
        None if hex.len() < 32 => bad(),
        _ => Ok(()),
    }
}

/// Mount options Docker's bind/volume parser knows.
const MOUNT_OPTIONS: &[&str] = &[
    "ro",
    "rw",
    "z",
    "Z",
    "nocopy",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "consistent",
    "cached",
    "delegated",
];

/// One `volumes` entry as Docker's bind parser reads it: `source:target[:options]` or a bare
/// `target` (an anonymous volume). A source is an absolute host path (a bind mount), a
/// `${asset.…}` reference (an absolute path once resolved) or a volume name.
pub(crate) fn volume(entry: &str) -> Result<(), ValueError> {
    if let Some(problem) = control_character(entry) {
        return Err(ValueError::ControlCharacter(problem));
    }
    let parts: Vec<&str> = entry.split(':').collect();
    let (source, target, options) = match parts.as_slice() {
        [target] => (None, *target, None),
        [source, target] => (Some(*source), *target, None),
        [source, target, options] => (Some(*source), *target, Some(*options)),
        _ => {
            return Err(ValueError::VolumeParts);
        }
    };
    if let Some(source) = source
        && !source.starts_with('/')
        && !source.starts_with("${")
    {
        if source.is_empty() {
            return Err(ValueError::EmptySource);
        }
        if source.starts_with('.') || source.starts_with('~') || source.contains('/') {
            return Err(ValueError::RelativeSource(source.to_owned()));
        }
        let mut chars = source.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && source.len() >= 2
            && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !valid {
            return Err(ValueError::VolumeName(source.to_owned()));
        }
    }
    if !target.starts_with('/') {
        return Err(ValueError::RelativeTarget(target.to_owned()));
    }
    if target == "/" {
        return Err(ValueError::RootTarget);
    }
    if let Some(options) = options {
        for option in options.split(',') {
            if !MOUNT_OPTIONS.contains(&option) {
                return Err(ValueError::MountOption(option.to_owned()));
            }
        }
    }
    Ok(())
}

/// An environment variable name: Docker splits `NAME=value` at the first `=`.
pub(crate) fn env_name(name: &str) -> Result<(), ValueError> {
    if name.is_empty() {
        return Err(ValueError::EmptyName);
    }
    if name.contains('=') {
        return Err(ValueError::NameWithEquals);
    }
    if let Some(problem) = control_character(name) {
        return Err(ValueError::NameControlCharacter(problem));
    }
    Ok(())
}

/// An environment variable value: anything but NUL (a C string ends there).
pub(crate) fn env_value(value: &str) -> Result<(), ValueError> {
    if value.contains('\0') {
        return Err(ValueError::ValueWithNul);
    }
    Ok(())
}

/// One argument of a command: anything but NUL (`exec` cannot pass it).
pub(crate) fn argument(argument: &str) -> Result<(), ValueError> {
    if argument.contains('\0') {
        return Err(ValueError::ArgumentWithNul);
    }
    Ok(())
}

/// A one-line value (a network, capability or bucket name…): no NUL, no line break.
pub(crate) fn one_line(value: &str) -> Result<(), ValueError> {
    match control_character(value) {
        Some(problem) => Err(ValueError::ControlCharacter(problem)),
        None => Ok(()),
    }
}

/// Resource limits `docker run --ulimit` knows.
pub(crate) const ULIMIT_NAMES: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_follow_dockers_grammar() {
        for good in [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "ghcr.io/org/app:v1.2.3",
            "localhost:5000/app",
            "localhost/app",
            "registry.example.com:443/a/b/c:tag_1",
            "[::1]:5000/app:x",
            "a__b/c-d--e.f:1",
            "Registry.Example.COM/app",
            "busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "busybox:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "voodu-busybox:latest",
        ] {
            assert_eq!(image_reference(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("nginx;rm -rf /", "whitespace"),
            ("nginx;x", "name component"),
            ("Nginx", "lowercase"),
            ("org/App", "lowercase"),
            ("nginx:", "tag"),
            ("nginx:-x", "tag"),
            ("nginx:a b", "whitespace"),
            ("nginx:$x", "tag"),
            ("-nginx", "name component"),
            ("nginx-", "name component"),
            ("a._b", "name component"),
            ("a___b", "name component"),
            ("ghcr.io/", "name component"),
            ("ghcr.io:x/app", "registry"),
            ("-bad.io/app", "registry"),
            ("nginx@sha256:abc", "digest"),
            ("nginx@md5", "digest"),
            ("a\0b", "NUL"),
            ("a\nb", "line break"),
        ] {
            let error = image_reference(bad).expect_err(bad).to_string();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
        assert!(image_reference(&format!("{}:1", "a".repeat(256))).is_err());
        assert!(image_reference(&format!("a:{}", "b".repeat(129))).is_err());
    }

    #[test]
    fn volumes_follow_dockers_bind_syntax() {
        for good in [
            "/srv/data:/data",
            "/srv/data:/data:ro",
            "/srv:/srv:ro,z",
            "data:/data",
            "pg-data.v1:/var/lib/postgresql/data:rw",
            "${asset.s.n.k}:/etc/app.conf:ro",
            "/cache",
        ] {
            assert_eq!(volume(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("./data:/data", "relative host path"),
            ("data/x:/data", "relative host path"),
            ("~/x:/x", "relative host path"),
            ("d:/data", "not a volume name"),
            ("-d:/data", "not a volume name"),
            (":/data", "source is empty"),
            ("/a:data", "absolute path in the container"),
            ("cache", "absolute path in the container"),
            ("/a:/", "root"),
            ("/a:/b:rx", "not a mount option"),
            ("/a:/b:ro:z", "more than three"),
            ("/a\n:/b", "line break"),
        ] {
            let error = volume(bad).expect_err(bad).to_string();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

    #[test]
    fn environment_and_arguments() {
        assert_eq!(env_name("PATH"), Ok(()));
        for bad in ["", "A=B", "A\nB", "A\0"] {
            assert!(env_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(env_value("multi\nline"), Ok(()));
        assert!(env_value("x\0y").is_err());
        assert_eq!(argument("echo\nhi"), Ok(()));
        assert!(argument("x\0").is_err());
        assert!(one_line("net\n").is_err());
    }
}
