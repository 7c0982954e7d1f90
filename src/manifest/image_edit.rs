//! The edit `image_update`'s commit mode makes: a resource's image tag replaced in its manifest
//! file, at the exact bytes of the tag; the rest of the file is unchanged byte for byte.
//!
//! Pure: text in, text out. The file is lexed as `load` lexes it (so hostile input never reaches
//! the HCL parser's slow paths), parsed with `hcl::edit` for spans only, and edited in the
//! original text.
//!
//! Invariants: only a plain string literal (no escapes, no interpolation) is edited; the image's
//! repository must be the one the scan followed, so a human edit that moved the resource to
//! another image is a conflict, never overwritten.

use hcl::edit::Span;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Block, Structure};

use super::lex::{MARK, mark_interpolations};
use crate::model::{Kind, is_valid_tag, split_image};

/// Why a tag could not be set; each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("the file does not parse as a manifest; fix it first")]
    Unparsable,
    #[error(
        "the file has no {kind} \"{scope}\" \"{name}\" with an `image`; it moved or was removed"
    )]
    NotFound {
        kind: &'static str,
        scope: String,
        name: String,
    },
    #[error(
        "`image` of {resource} is not a plain string literal; write it as \"repository:tag\" without escapes or `${{…}}`"
    )]
    NotLiteral { resource: String },
    #[error("{tag:?} is not an image tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}); not written")]
    InvalidTag { tag: String },
    #[error(
        "`image` of {resource} is now {found:?}, not a tag of {repository}; the image was changed in git, so no tag is written"
    )]
    OtherRepository {
        resource: String,
        found: String,
        repository: String,
    },
}

/// A tag change made to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagEdit {
    /// The whole file after the edit.
    pub text: String,
    /// The image before, as written (`app:1.4.2`).
    pub before: String,
    /// The image after (`app:1.4.3`).
    pub after: String,
}

/// Sets the tag of the `image` of `kind "scope" "name"` (an `app` block counts as its
/// deployment) to `tag`, when the image is a tag of `repository`. `Ok(None)`: it already is.
pub fn set_image_tag(
    text: &str,
    kind: Kind,
    scope: &str,
    name: &str,
    repository: &str,
    tag: &str,
) -> Result<Option<TagEdit>, EditError> {
    check_tag(tag)?;
    let (marked, errors) = mark_interpolations(text);
    if errors.iter().any(|error| error.blocks_parse) {
        return Err(EditError::Unparsable);
    }
    let body = hcl::edit::parser::parse_body(&marked).map_err(|_| EditError::Unparsable)?;
    let resource = format!("{} \"{scope}\" \"{name}\"", kind.as_str());
    let not_found = || EditError::NotFound {
        kind: kind.as_str(),
        scope: scope.to_owned(),
        name: name.to_owned(),
    };
    let block = body
        .iter()
        .filter_map(|structure| match structure {
            Structure::Block(block) => Some(block),
            Structure::Attribute(_) => None,
        })
        .find(|block| is_resource(block, kind, scope, name))
        .ok_or_else(not_found)?;
    let value = block
        .body
        .iter()
        .find_map(|structure| match structure {
            Structure::Attribute(attribute) if attribute.key.as_str() == "image" => {
                Some(&attribute.value)
            }
            _ => None,
        })
        .ok_or_else(not_found)?;
    let not_literal = || EditError::NotLiteral {
        resource: resource.clone(),
    };
    let Expression::String(image) = value else {
        return Err(not_literal());
    };
    let span = value.span().ok_or_else(not_literal)?;
    // Marks are 3 bytes standing for a 1-byte `$`: map the span back to the input.
    let shift = |at: usize| at - 2 * marked[..at].matches(MARK).count();
    let (start, end) = (shift(span.start), shift(span.end));
    let written = text.get(start..end).ok_or_else(not_literal)?;
    let image = image.as_str();
    if written.len() != image.len() + 2 || &written[1..written.len() - 1] != image {
        return Err(not_literal());
    }
    let other_repository = || EditError::OtherRepository {
        resource: resource.clone(),
        found: image.to_owned(),
        repository: repository.to_owned(),
    };
    // A digest after the tag (`app:stable@sha256:…`) goes with it.
    let (reference, found_digest) = match image.split_once('@') {
        Some((reference, digest)) => (reference, Some(digest)),
        None => (image, None),
    };
    let (found_repository, found_tag) = split_image(reference).ok_or_else(other_repository)?;
    if found_repository != repository {
        return Err(other_repository());
    }
    let found = match found_digest {
        Some(digest) => format!("{found_tag}@{digest}"),
        None => found_tag.to_owned(),
    };
    if found == tag {
        return Ok(None);
    }
    // The tag (and its digest) is the literal's last bytes before its closing quote.
    let tag_end = end - 1;
    let tag_start = tag_end - found.len();
    let mut edited = String::with_capacity(text.len() + tag.len());
    edited.push_str(&text[..tag_start]);
    edited.push_str(tag);
    edited.push_str(&text[tag_end..]);
    Ok(Some(TagEdit {
        text: edited,
        before: image.to_owned(),
        after: format!("{repository}:{tag}"),
    }))
}

/// `TAG` or `TAG@sha256:<hex>` (`policy = "digest"` pins the tag's digest).
fn check_tag(tag: &str) -> Result<(), EditError> {
    let (bare_tag, digest) = match tag.split_once('@') {
        Some((bare, digest)) => (bare, Some(digest)),
        None => (tag, None),
    };
    let digest_ok = digest.is_none_or(|digest| {
        digest.strip_prefix("sha256:").is_some_and(|hex| {
            hex.len() == 64 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        })
    });
    if !is_valid_tag(bare_tag) || !digest_ok {
        return Err(EditError::InvalidTag {
            tag: tag.to_owned(),
        });
    }
    Ok(())
}

fn is_resource(block: &Block, kind: Kind, scope: &str, name: &str) -> bool {
    let block_type = block.ident.as_str();
    let kind_matches =
        block_type == kind.as_str() || (kind == Kind::Deployment && block_type == "app");
    let labels: Vec<&str> = block.labels.iter().map(|label| label.as_str()).collect();
    kind_matches && labels == [scope, name]
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# the shop
deployment "shop" "web" {
  image = "app:1.4.2"   # pinned
  env   = { GREETING = "${HOST:-x}", B = "$${not}" }
}

app "shop" "api" {
  host  = "api.example"
  image = "127.0.0.1:5000/app:1.4.2"
}

job "shop" "migrate" {
  image   = "app:1.4.2"
  command = ["migrate"]
}
"#;

    #[test]
    fn only_the_tag_changes() -> Result<(), EditError> {
        let edit = set_image_tag(FILE, Kind::Deployment, "shop", "web", "app", "1.4.3")?
            .expect("a change");
        assert_eq!(
            edit.text,
            FILE.replacen("app:1.4.2\"   #", "app:1.4.3\"   #", 1)
        );
        assert_eq!(
            (edit.before.as_str(), edit.after.as_str()),
            ("app:1.4.2", "app:1.4.3")
        );
        let edit = set_image_tag(
            FILE,
            Kind::Deployment,
            "shop",
            "api",
            "127.0.0.1:5000/app",
            "10.0.0-rc.1",
        )?
        .expect("a change");
        assert_eq!(
            edit.text,
            FILE.replace("127.0.0.1:5000/app:1.4.2", "127.0.0.1:5000/app:10.0.0-rc.1")
        );
        let edit =
            set_image_tag(FILE, Kind::Job, "shop", "migrate", "app", "2")?.expect("a change");
        let want = FILE.replacen("app:1.4.2\"\n  command", "app:2\"\n  command", 1);
        assert_eq!(edit.text, want);
        Ok(())
    }

    #[test]
    fn refusals() {
        let cases: &[(&str, Kind, &str, &str, &str)] = &[
            (FILE, Kind::Statefulset, "web", "app", "no statefulset"),
            (
                FILE,
                Kind::Deployment,
                "gone",
                "app",
                "no deployment \"shop\" \"gone\"",
            ),
            (
                FILE,
                Kind::Deployment,
                "web",
                "other",
                "now \"app:1.4.2\", not a tag of other",
            ),
            (
                "deployment \"shop\" \"web\" {\n  image = \"app:\\u0031\"\n}\n",
                Kind::Deployment,
                "web",
                "app",
                "not a plain string literal",
            ),
            (
                "deployment \"shop\" \"web\" {\n  image = \"${IMG}\"\n}\n",
                Kind::Deployment,
                "web",
                "app",
                "not a plain string literal",
            ),
            (
                "deployment \"shop\" \"web\" {\n  image = 1 + 2\n}\n",
                Kind::Deployment,
                "web",
                "app",
                "does not parse",
            ),
        ];
        for (text, kind, name, repository, part) in cases {
            match set_image_tag(text, *kind, "shop", name, repository, "9") {
                Ok(edit) => panic!("{text}: {edit:?}"),
                Err(error) => assert!(error.to_string().contains(part), "{error}"),
            }
        }
    }

    /// A registry's tags are hostile: a quote, `${`, a newline or an over-long tag would write
    /// HCL into the repository.
    #[test]
    fn only_valid_tags_are_written() {
        for tag in [
            "1.4.3\"\n  command = \"sh",
            "${X}",
            "a b",
            ".hidden",
            "-x",
            "",
            &"a".repeat(129),
        ] {
            match set_image_tag(FILE, Kind::Deployment, "shop", "web", "app", tag) {
                Err(EditError::InvalidTag { .. }) => {}
                other => panic!("{tag:?}: {other:?}"),
            }
        }
        assert!(matches!(
            set_image_tag(
                FILE,
                Kind::Deployment,
                "shop",
                "web",
                "app",
                &"a".repeat(128)
            ),
            Ok(Some(_))
        ));
    }

    #[test]
    fn the_same_tag_is_no_edit() -> Result<(), EditError> {
        assert_eq!(
            set_image_tag(FILE, Kind::Deployment, "shop", "web", "app", "1.4.2")?,
            None
        );
        Ok(())
    }

    #[test]
    fn a_digest_policy_pins_the_tag_to_a_digest_and_moves_it() -> Result<(), EditError> {
        let hex_a = "a".repeat(64);
        let hex_b = "b".repeat(64);
        let file = "deployment \"shop\" \"web\" {\n  image = \"127.0.0.1:5000/app:stable\"\n}\n";
        let pinned = set_image_tag(
            file,
            Kind::Deployment,
            "shop",
            "web",
            "127.0.0.1:5000/app",
            &format!("stable@sha256:{hex_a}"),
        )?
        .ok_or(EditError::Unparsable)?;
        assert_eq!(
            pinned.text,
            format!(
                "deployment \"shop\" \"web\" {{\n  image = \"127.0.0.1:5000/app:stable@sha256:{hex_a}\"\n}}\n"
            )
        );
        let moved = set_image_tag(
            &pinned.text,
            Kind::Deployment,
            "shop",
            "web",
            "127.0.0.1:5000/app",
            &format!("stable@sha256:{hex_b}"),
        )?
        .ok_or(EditError::Unparsable)?;
        assert!(
            moved.text.contains(&format!("app:stable@sha256:{hex_b}\"")),
            "{}",
            moved.text
        );
        assert_eq!(
            set_image_tag(
                &moved.text,
                Kind::Deployment,
                "shop",
                "web",
                "127.0.0.1:5000/app",
                &format!("stable@sha256:{hex_b}")
            )?,
            None
        );
        assert!(matches!(
            set_image_tag(
                file,
                Kind::Deployment,
                "shop",
                "web",
                "127.0.0.1:5000/app",
                "stable@sha256:\"x"
            ),
            Err(EditError::InvalidTag { .. })
        ));
        Ok(())
    }
}
