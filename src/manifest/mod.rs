//! Manifest stage: a commit's `Snapshot` → the set of resources it declares, or every problem
//! in it.
//!
//! Invariant: this stage does no IO; it reads only the snapshot. A commit is accepted whole or
//! rejected whole: `load` returns every diagnostic of every file, never a partial manifest.

mod decode;
mod diagnostic;
pub mod spec;

pub use decode::Resource;
pub use diagnostic::{Diagnostic, Diagnostics};

use std::collections::BTreeMap;

pub use crate::model::{MANIFEST_EXTENSIONS, is_manifest_path};
use crate::model::{ResourceKey, Snapshot};

/// The resources one commit declares, ordered by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    pub resources: Vec<Resource>,
}

/// Parses and validates every file of the snapshot.
pub fn load(snapshot: &Snapshot) -> Result<Manifest, Diagnostics> {
    let mut diagnostics = Vec::new();
    let mut by_key: BTreeMap<ResourceKey, Resource> = BTreeMap::new();
    for (path, why) in &snapshot.refused {
        diagnostics.push(Diagnostic {
            path: path.clone(),
            line: 1,
            col: 1,
            message: why.clone(),
        });
    }
    for file in &snapshot.files {
        let Ok(text) = std::str::from_utf8(&file.contents) else {
            diagnostics.push(Diagnostic {
                path: file.path.clone(),
                line: 1,
                col: 1,
                message: "file is not valid UTF-8; manifests must be UTF-8 text".to_owned(),
            });
            continue;
        };
        let body = match hcl::edit::parser::parse_body(text) {
            Ok(body) => body,
            Err(error) => {
                diagnostics.push(Diagnostic {
                    path: file.path.clone(),
                    line: error.location().line(),
                    col: error.location().column(),
                    message: format!("HCL syntax error: {}", error.message()),
                });
                continue;
            }
        };
        let mut decoder = decode::FileDecoder::new(&file.path, text);
        for resource in decoder.decode_file(&body) {
            if let Some(first) = by_key.get(&resource.key) {
                let first = &first.origin;
                decoder.diagnostics.push(Diagnostic {
                    message: format!(
                        "duplicate {}: also declared at {}:{}:{}; each resource may be declared once per commit",
                        resource.key, first.path, first.line, first.col
                    ),
                    ..resource.origin.clone()
                });
                continue;
            }
            by_key.insert(resource.key.clone(), resource);
        }
        diagnostics.append(&mut decoder.diagnostics);
    }
    if diagnostics.is_empty() {
        Ok(Manifest {
            resources: by_key.into_values().collect(),
        })
    } else {
        Err(Diagnostics(diagnostics))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CommitSha, SourceFile};
    use spec::Spec;

    fn snapshot(files: &[(&str, &str)]) -> Snapshot {
        Snapshot {
            commit: CommitSha::new("0".repeat(40)),
            files: files
                .iter()
                .map(|(path, text)| SourceFile {
                    path: (*path).to_owned(),
                    contents: text.as_bytes().to_vec(),
                })
                .collect(),
            refused: Vec::new(),
        }
    }

    fn check_err(text: &str, expected: &[&str]) {
        let errors = load(&snapshot(&[("m/app.hcl", text)])).expect_err("must be rejected");
        let got: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn decodes_a_deployment() -> Result<(), Diagnostics> {
        let manifest = load(&snapshot(&[(
            "app.hcl",
            r#"
deployment "shop" "web" {
  image    = "busybox"
  command  = ["httpd", "-f", "-p", 8080]
  replicas = "3"
  env      = { GREETING = "hi", PORT = 8080 }
  ports    = ["8080"]
}
"#,
        )]))?;
        assert_eq!(manifest.resources.len(), 1);
        let resource = &manifest.resources[0];
        assert_eq!(resource.key.to_string(), "deployment/shop/web");
        let Spec::Deployment(spec) = &resource.spec;
        assert_eq!(spec.n_replicas(), 3);
        assert_eq!(spec.command.as_deref().map(<[String]>::len), Some(4));
        assert_eq!(spec.env.get("PORT").map(String::as_str), Some("8080"));
        assert_eq!(spec.health_check.as_deref(), Some("/"));
        Ok(())
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        check_err(
            "deployment \"a\" \"b\" {\n  image = \n}\n",
            &[
                "m/app.hcl:2:11: HCL syntax error: invalid expression; expected `\"`, `[`, `{`, `-`, `!`, `(`, `_`, `<`, letter or digit",
            ],
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        check_err(
            "deployment \"a\" \"b\" {\n  imagee = \"x\"\n  replicas = [1]\n  env_from = [\"x\"]\n}\n",
            &[
                "m/app.hcl:2:3: unknown attribute `imagee` in deployment (did you mean `image`?)",
                "m/app.hcl:3:14: `replicas` must be a whole number, got a list",
                "m/app.hcl:4:3: `env_from` is a voodu deployment field this agent does not support yet",
            ],
        );
    }

    #[test]
    fn labels_are_checked() {
        check_err(
            "deployment \"a\" {}\ndeployment \"a/b\" \"c\" {}\n",
            &[
                "m/app.hcl:1:1: deployment block needs scope and name labels (got 1): write `deployment \"scope\" \"name\" { … }`",
                "m/app.hcl:2:12: deployment scope \"a/b\" must not contain `..`, `/` or NUL",
            ],
        );
    }

    #[test]
    fn duplicates_across_files_are_errors() {
        let errors = load(&snapshot(&[
            ("a.hcl", "deployment \"s\" \"n\" { image = \"x\" }\n"),
            ("b.hcl", "\n\ndeployment \"s\" \"n\" { image = \"y\" }\n"),
        ]))
        .expect_err("duplicate must be rejected");
        assert_eq!(
            errors.to_string(),
            "b.hcl:3:1: duplicate deployment/s/n: also declared at a.hcl:1:1; each resource may be declared once per commit"
        );
    }

    #[test]
    fn manifest_extensions_follow_voodu() {
        for yes in ["a.hcl", "x/b.voodu", "c.VD", "d.vdu"] {
            assert!(is_manifest_path(yes), "{yes}");
        }
        for no in ["a.yaml", "hcl", "x/.hcl", "README.md"] {
            assert!(!is_manifest_path(no), "{no}");
        }
    }
}
