//! SOPS's file format, read without any key: recognising an encrypted file, its tree of
//! (still encrypted) values and its `sops` metadata block, in the four formats `sops` writes:
//! YAML and JSON (the tree beside a top-level `sops` mapping), dotenv (`KEY=VALUE` lines, the
//! metadata flattened into `sops_…` keys) and binary (a JSON envelope whose `data` is the
//! encrypted file). Facts from getsops/sops (`stores/`, `sops.go`, `aes/cipher.go`).
//!
//! Invariants: no IO and no decryption here (the manifest stage never holds a key: opening a
//! file is `assets::sops`); a file is SOPS when, and only when, it carries the metadata block
//! with a `mac`; values are kept in file order, the order SOPS's MAC covers them in.

/// How a SOPS file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SopsFormat {
    Yaml,
    Json,
    Dotenv,
    /// A JSON envelope `{"data": "ENC[…]", "sops": {…}}` around an arbitrary file.
    Binary,
}

/// One value of the tree, as the file holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Map(Vec<(String, Node)>),
    List(Vec<Node>),
    Str(String),
    Int(i64),
    /// A float as written (parsed when needed).
    Float(String),
    Bool(bool),
    Null,
    /// A decrypted value that is not UTF-8 (a binary file's `data`); never parsed from a file.
    Bytes(Vec<u8>),
}

/// A data key wrapped for one age recipient: an armored age file holding the 32-byte key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgeStanza {
    pub(crate) recipient: String,
    pub(crate) enc: String,
}

/// The `sops` block: what the values are encrypted with and the MAC over them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Metadata {
    /// The data key for each age recipient (top level and single key group alike).
    pub(crate) age: Vec<AgeStanza>,
    /// Key sources the agent cannot use (`pgp`, `kms`, …), by name, for messages.
    pub(crate) other_keys: Vec<String>,
    /// `ENC[…]` of the MAC; its additional data is `lastmodified`.
    pub(crate) mac: String,
    pub(crate) lastmodified: String,
    /// `mac_only_encrypted`: the MAC covers only the encrypted values.
    pub(crate) mac_only_encrypted: bool,
    /// More than one key group (Shamir's secret sharing): unsupported.
    pub(crate) key_groups: usize,
}

/// A SOPS file, parsed: its tree (one branch per YAML document) and metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct SopsFile {
    pub format: SopsFormat,
    pub(crate) branches: Vec<Vec<(String, Node)>>,
    pub(crate) metadata: Metadata,
}

impl SopsFile {
    /// The top-level keys of the first branch: what an `env_file` of this file sets.
    pub(crate) fn top_level_keys(&self) -> Vec<&str> {
        self.branches
            .first()
            .map(|branch| branch.iter().map(|(key, _)| key.as_str()).collect())
            .unwrap_or_default()
    }
}

/// Why a file that carries SOPS metadata cannot be read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SopsError {
    #[error("a document is not a mapping")]
    NotAMapping,
    /// A mapping key that is not a string or a number (as YAML shows it).
    #[error("unsupported mapping key {0}")]
    MappingKey(String),
    #[error("YAML aliases are not supported")]
    Alias,
    #[error("the `sops` entry is not a mapping")]
    MetadataNotAMapping,
    #[error("the `sops` block has no `mac`")]
    NoMac,
    /// A dotenv SOPS file's line (1-based) that is not `KEY=VALUE`.
    #[error("line {0}: not KEY=VALUE")]
    DotenvLine(usize),
    /// A flattened `sops_<key>` whose list index does not parse.
    #[error("sops_{0}: bad list index")]
    ListIndex(String),
}

/// `Some` when `bytes` are a SOPS file (the metadata block with a MAC is there), with the
/// parse or its problem; `None` for any other file.
pub fn parse(bytes: &[u8]) -> Option<Result<SopsFile, SopsError>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let trimmed = text.trim_start();
    if text
        .lines()
        .any(|line| line.starts_with("sops_mac=") || line.starts_with("sops_version="))
    {
        return Some(parse_dotenv(text));
    }
    let looks_structured = trimmed.starts_with('{')
        || text
            .lines()
            .any(|line| line.starts_with("sops:") || line.starts_with("\"sops\":"));
    if !looks_structured || !text.contains("sops") {
        return None;
    }
    let documents = yaml_rust2::YamlLoader::load_from_str(text).ok()?;
    let first = documents.first()?;
    let yaml_rust2::Yaml::Hash(map) = first else {
        return None;
    };
    let sops = map.get(&yaml_rust2::Yaml::String("sops".to_owned()))?;
    let yaml_rust2::Yaml::Hash(sops) = sops else {
        return None;
    };
    if !sops.contains_key(&yaml_rust2::Yaml::String("mac".to_owned())) {
        return None;
    }
    let format = if trimmed.starts_with('{') {
        let is_binary = map.len() == 2
            && matches!(
                map.get(&yaml_rust2::Yaml::String("data".to_owned())),
                Some(yaml_rust2::Yaml::String(_))
            );
        if is_binary {
            SopsFormat::Binary
        } else {
            SopsFormat::Json
        }
    } else {
        SopsFormat::Yaml
    };
    Some(structured(format, &documents, sops))
}

fn structured(
    format: SopsFormat,
    documents: &[yaml_rust2::Yaml],
    sops: &yaml_rust2::yaml::Hash,
) -> Result<SopsFile, SopsError> {
    let metadata = metadata_of(&node(&yaml_rust2::Yaml::Hash(sops.clone()))?)?;
    let mut branches = Vec::new();
    for document in documents {
        let Node::Map(entries) = node(document)? else {
            return Err(SopsError::NotAMapping);
        };
        branches.push(
            entries
                .into_iter()
                .filter(|(key, _)| key != "sops")
                .collect(),
        );
    }
    Ok(SopsFile {
        format,
        branches,
        metadata,
    })
}

fn node(yaml: &yaml_rust2::Yaml) -> Result<Node, SopsError> {
    use yaml_rust2::Yaml;
    Ok(match yaml {
        Yaml::Hash(map) => {
            let mut entries = Vec::with_capacity(map.len());
            for (key, value) in map {
                let key = match key {
                    Yaml::String(key) => key.clone(),
                    Yaml::Integer(key) => key.to_string(),
                    Yaml::Boolean(key) => key.to_string(),
                    Yaml::Real(key) => key.clone(),
                    other => return Err(SopsError::MappingKey(format!("{other:?}"))),
                };
                entries.push((key, node(value)?));
            }
            Node::Map(entries)
        }
        Yaml::Array(items) => Node::List(items.iter().map(node).collect::<Result<_, _>>()?),
        Yaml::String(text) => Node::Str(text.clone()),
        Yaml::Integer(value) => Node::Int(*value),
        Yaml::Real(text) => Node::Float(text.clone()),
        Yaml::Boolean(value) => Node::Bool(*value),
        Yaml::Null => Node::Null,
        Yaml::Alias(_) | Yaml::BadValue => return Err(SopsError::Alias),
    })
}

/// Reads the `sops` block (already a tree).
fn metadata_of(sops: &Node) -> Result<Metadata, SopsError> {
    let Node::Map(entries) = sops else {
        return Err(SopsError::MetadataNotAMapping);
    };
    let mut metadata = Metadata::default();
    let text = |node: &Node| match node {
        Node::Str(text) | Node::Float(text) => text.clone(),
        Node::Int(value) => value.to_string(),
        Node::Bool(value) => value.to_string(),
        _ => String::new(),
    };
    let stanzas = |node: &Node, out: &mut Vec<AgeStanza>| {
        if let Node::List(items) = node {
            for item in items {
                if let Node::Map(fields) = item {
                    let field = |name: &str| {
                        fields
                            .iter()
                            .find(|(key, _)| key == name)
                            .map(|(_, value)| text(value))
                            .unwrap_or_default()
                    };
                    out.push(AgeStanza {
                        recipient: field("recipient"),
                        enc: field("enc"),
                    });
                }
            }
        }
    };
    for (key, value) in entries {
        match key.as_str() {
            "age" => stanzas(value, &mut metadata.age),
            "mac" => metadata.mac = text(value),
            "lastmodified" => metadata.lastmodified = text(value),
            "mac_only_encrypted" => {
                metadata.mac_only_encrypted = matches!(value, Node::Bool(true))
                    || matches!(value, Node::Str(text) if text == "true")
            }
            "key_groups" => {
                if let Node::List(groups) = value {
                    metadata.key_groups = groups.len();
                    for group in groups {
                        if let Node::Map(sources) = group {
                            for (source, keys) in sources {
                                if source == "age" {
                                    stanzas(keys, &mut metadata.age);
                                } else if !matches!(keys, Node::Null)
                                    && !matches!(keys, Node::List(items) if items.is_empty())
                                {
                                    metadata.other_keys.push(source.clone());
                                }
                            }
                        }
                    }
                }
            }
            "pgp" | "kms" | "gcp_kms" | "azure_kv" | "hc_vault" | "hckms"
                if !matches!(value, Node::Null)
                    && !matches!(value, Node::List(items) if items.is_empty()) =>
            {
                metadata.other_keys.push(key.clone());
            }
            _ => {}
        }
    }
    if metadata.mac.is_empty() {
        return Err(SopsError::NoMac);
    }
    Ok(metadata)
}

/// Dotenv: `KEY=VALUE` lines (`\n` in a value is a newline), `#` lines are (encrypted)
/// comments, and the metadata is flattened into `sops_…` keys (`sops_age__list_0__map_enc`).
fn parse_dotenv(text: &str) -> Result<SopsFile, SopsError> {
    let mut entries = Vec::new();
    let mut flat = Vec::new();
    for (index, line) in text.split('\n').enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(SopsError::DotenvLine(index + 1));
        };
        let value = value.replace("\\n", "\n");
        match key.strip_prefix("sops_") {
            Some(meta) => flat.push((meta.to_owned(), value)),
            None => entries.push((key.to_owned(), Node::Str(value))),
        }
    }
    let metadata = metadata_of(&unflatten(&flat)?)?;
    Ok(SopsFile {
        format: SopsFormat::Dotenv,
        branches: vec![entries],
        metadata,
    })
}

/// Rebuilds the metadata tree from flattened keys: `a__map_b` is `a.b`, `a__list_0` is `a[0]`.
fn unflatten(flat: &[(String, String)]) -> Result<Node, SopsError> {
    #[derive(Default)]
    struct Tree {
        value: Option<String>,
        map: Vec<(String, Tree)>,
        list: std::collections::BTreeMap<usize, Tree>,
    }
    fn insert(tree: &mut Tree, path: &[Segment], value: &str) {
        let Some((first, rest)) = path.split_first() else {
            tree.value = Some(value.to_owned());
            return;
        };
        let child = match first {
            Segment::Key(key) => {
                if let Some(index) = tree.map.iter().position(|(existing, _)| existing == key) {
                    &mut tree.map[index].1
                } else {
                    tree.map.push((key.clone(), Tree::default()));
                    let last = tree.map.len() - 1;
                    &mut tree.map[last].1
                }
            }
            Segment::Index(index) => tree.list.entry(*index).or_default(),
        };
        insert(child, rest, value);
    }
    fn to_node(tree: Tree) -> Node {
        if let Some(value) = tree.value {
            return match value.as_str() {
                "true" => Node::Bool(true),
                "false" => Node::Bool(false),
                _ => Node::Str(value),
            };
        }
        if !tree.list.is_empty() {
            return Node::List(tree.list.into_values().map(to_node).collect());
        }
        Node::Map(
            tree.map
                .into_iter()
                .map(|(key, child)| (key, to_node(child)))
                .collect(),
        )
    }
    enum Segment {
        Key(String),
        Index(usize),
    }
    let mut root = Tree::default();
    for (key, value) in flat {
        let mut segments = Vec::new();
        let mut rest = key.as_str();
        let mut current = Segment::Key(String::new());
        loop {
            let map = rest.find("__map_");
            let list = rest.find("__list_");
            let next = match (map, list) {
                (Some(m), Some(l)) => Some(m.min(l)),
                (m, l) => m.or(l),
            };
            let end = next.unwrap_or(rest.len());
            match &mut current {
                Segment::Key(text) => text.push_str(&rest[..end]),
                Segment::Index(index) => {
                    *index = rest[..end]
                        .parse()
                        .map_err(|_| SopsError::ListIndex(key.to_owned()))?;
                }
            }
            let Some(at) = next else {
                segments.push(current);
                break;
            };
            segments.push(std::mem::replace(&mut current, Segment::Key(String::new())));
            if rest[at..].starts_with("__map_") {
                rest = &rest[at + "__map_".len()..];
            } else {
                current = Segment::Index(0);
                rest = &rest[at + "__list_".len()..];
            }
        }
        insert(&mut root, &segments, value);
    }
    Ok(to_node(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_sops_file_says_what_is_wrong_in_a_type() {
        let dotenv = b"A=1\nnot a pair\nsops_mac=ENC[x]\nsops_version=3.8.1\n";
        assert_eq!(parse(dotenv), Some(Err(SopsError::DotenvLine(2))));
        assert_eq!(
            SopsError::DotenvLine(2).to_string(),
            "line 2: not KEY=VALUE"
        );
        let no_mac = b"a: 1\nsops:\n  version: 3.8.1\n";
        assert_eq!(parse(no_mac), None, "no MAC: not a SOPS file at all");
    }

    #[test]
    fn files_without_sops_metadata_are_not_sops() {
        for text in [
            "A=1\nB=2\n",
            "sops: nothing here\n",
            "{\"sops\": {\"version\": \"3\"}}",
            "key: value\nsops:\n  version: 3\n",
            "",
        ] {
            assert!(parse(text.as_bytes()).is_none(), "{text:?}");
        }
        assert!(parse(&[0xff, 0xfe]).is_none());
    }

    #[test]
    fn yaml_json_dotenv_and_binary_are_recognised_with_their_metadata() {
        let yaml = "DB: ENC[AES256_GCM,data:AA==,iv:AA==,tag:AA==,type:str]\nport_unencrypted: 8080\nsops:\n  age:\n    - recipient: age1xyz\n      enc: |\n        -----BEGIN AGE ENCRYPTED FILE-----\n        x\n        -----END AGE ENCRYPTED FILE-----\n  lastmodified: \"2026-01-01T00:00:00Z\"\n  mac: ENC[AES256_GCM,data:AA==,iv:AA==,tag:AA==,type:str]\n  version: 3.11.0\n";
        let file = parse(yaml.as_bytes()).and_then(Result::ok);
        let file = file.expect("a SOPS YAML file");
        assert_eq!(file.format, SopsFormat::Yaml);
        assert_eq!(file.top_level_keys(), ["DB", "port_unencrypted"]);
        assert_eq!(file.metadata.age[0].recipient, "age1xyz");
        assert!(file.metadata.age[0].enc.starts_with("-----BEGIN AGE"));
        assert_eq!(file.metadata.lastmodified, "2026-01-01T00:00:00Z");
        assert_eq!(file.branches[0][1].1, Node::Int(8080));

        let json = "{\n\t\"DB\": \"ENC[x]\",\n\t\"sops\": {\"age\": [{\"recipient\": \"age1a\", \"enc\": \"e\"}], \"lastmodified\": \"t\", \"mac\": \"ENC[m]\", \"pgp\": null}\n}";
        let file = parse(json.as_bytes()).and_then(Result::ok).expect("JSON");
        assert_eq!(file.format, SopsFormat::Json);
        assert!(file.metadata.other_keys.is_empty());

        let binary = "{\n\t\"data\": \"ENC[x]\",\n\t\"sops\": {\"age\": [], \"lastmodified\": \"t\", \"mac\": \"ENC[m]\", \"kms\": [{\"arn\": \"a\"}]}\n}";
        let file = parse(binary.as_bytes())
            .and_then(Result::ok)
            .expect("binary");
        assert_eq!(file.format, SopsFormat::Binary);
        assert_eq!(file.metadata.other_keys, ["kms"]);

        let dotenv = "DB=ENC[x]\n#ENC[comment]\nsops_age__list_0__map_enc=-----BEGIN AGE ENCRYPTED FILE-----\\nabc\\n-----END AGE ENCRYPTED FILE-----\\n\nsops_age__list_0__map_recipient=age1r\nsops_lastmodified=t\nsops_mac=ENC[m]\nsops_mac_only_encrypted=true\nsops_version=3.11.0\n";
        let file = parse(dotenv.as_bytes())
            .and_then(Result::ok)
            .expect("dotenv");
        assert_eq!(file.format, SopsFormat::Dotenv);
        assert_eq!(file.top_level_keys(), ["DB"]);
        assert_eq!(file.metadata.age[0].recipient, "age1r");
        assert_eq!(
            file.metadata.age[0].enc,
            "-----BEGIN AGE ENCRYPTED FILE-----\nabc\n-----END AGE ENCRYPTED FILE-----\n"
        );
        assert!(file.metadata.mac_only_encrypted);
    }
}
