//! Host paths as the agent judges them: a bind's source, normalised, whether one lies within
//! another, resolved through the host's symlinks, and the paths the agent itself makes and
//! mounts (`OwnedPaths`). Both the host policy (`policy.rs`) and what one source may point at
//! (`scopes.rs`) judge paths with these.
//!
//! Invariant: pure, but for `resolve_on_host`, which reads the file system (the sink and the
//! sync stage call it, never the manifest stage).

/// The directory under the data dir that holds asset files (`<data-dir>/assets`).
pub const ASSETS_DIR: &str = "assets";

/// Host paths the agent itself makes and mounts, which a bind may name although they lie in
/// its data dir: asset files (`<assets_root>/<scope>/<name>/<key>`, exactly that deep: a file,
/// never a directory of them) and the ingress proxy's own directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedPaths {
    /// `<data-dir>/assets`, absolute and normalised.
    pub(crate) assets_root: Option<String>,
    /// Paths mounted as they are (the ingress's `data` and `config`), absolute, normalised.
    pub(crate) exact: Vec<String>,
}

impl OwnedPaths {
    /// The asset files of the agent whose data dir is `data_dir` (absolute).
    pub fn for_data_dir(data_dir: &str) -> OwnedPaths {
        OwnedPaths {
            assets_root: normalize_path(&format!("{data_dir}/{ASSETS_DIR}")),
            exact: Vec::new(),
        }
    }

    /// The scope whose asset file `source` (absolute, normalised) is, when it is one (`""`
    /// for an unscoped asset's).
    pub(crate) fn asset_scope<'a>(&self, source: &'a str) -> Option<&'a str> {
        let root = self.assets_root.as_deref()?;
        if !is_within(source, root) {
            return None;
        }
        let rest = source.strip_prefix(root)?;
        let parts: Vec<&str> = rest.split('/').filter(|part| !part.is_empty()).collect();
        match parts.as_slice() {
            [scope, _, _] if *scope == super::assets::UNSCOPED_ASSETS => Some(""),
            [scope, _, _] => Some(scope),
            _ => None,
        }
    }

    /// Whether `source` (absolute, normalised) is one of these paths.
    pub(crate) fn holds(&self, source: &str) -> bool {
        let asset_file = self.assets_root.as_deref().is_some_and(|root| {
            is_within(source, root)
                && source.strip_prefix(root).is_some_and(|rest| {
                    rest.split('/').filter(|part| !part.is_empty()).count() == 3
                })
        });
        asset_file || self.exact.iter().any(|path| path == source)
    }
}

/// The source of a `docker -v` entry (`src:dst[:opts]`): everything before the first `:`.
pub(crate) fn bind_source_text(volume: &str) -> &str {
    volume.split(':').next().unwrap_or_default()
}

/// `/a//b/./c/../d/` → `/a/b/d`; `None` for a relative path.
pub(crate) fn normalize_path(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Whether `path` is `dir` or lies under it (both normalised).
pub(crate) fn is_within(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `path` (absolute, folded) with the symlinks of its longest existing prefix resolved, as the
/// kernel will follow them when Docker mounts it (Docker creates the missing rest as
/// directories). A dangling link on the way cannot be judged: it is an error. Blocking: it reads the
/// file system, so the sink and the sync stage call it, never the manifest stage.
pub(crate) fn resolve_on_host(path: &std::path::Path) -> Result<String, ResolveError> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(real) => {
                let mut resolved = real;
                for part in rest.iter().rev() {
                    resolved.push(part);
                }
                return resolved.to_str().map(ToOwned::to_owned).ok_or_else(|| {
                    ResolveError::NotUtf8 {
                        path: path.to_owned(),
                    }
                });
            }
            Err(_) if std::fs::symlink_metadata(existing).is_ok() => {
                return Err(ResolveError::DanglingLink {
                    link: existing.to_owned(),
                });
            }
            Err(_) => {}
        }
        let (Some(name), Some(parent)) = (existing.file_name(), existing.parent()) else {
            return Err(ResolveError::Unresolvable {
                path: path.to_owned(),
            });
        };
        rest.push(name);
        existing = parent;
    }
}

/// Why `resolve_on_host` cannot say where a path leads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("{} is not UTF-8 once resolved", .path.display())]
    NotUtf8 { path: std::path::PathBuf },
    #[error(
        "{} is a link that leads nowhere on this host, so where it would lead cannot be judged",
        .link.display()
    )]
    DanglingLink { link: std::path::PathBuf },
    #[error("{} cannot be resolved on this host", .path.display())]
    Unresolvable { path: std::path::PathBuf },
}
