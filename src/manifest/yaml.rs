//! The little YAML the agent reads beside its manifests (deploy trigger files, Compose files
//! for `convert`): one document of mappings, lists and scalars, each node with its 1-based
//! line and column, read from yaml-rust2's event stream (the crate SOPS files are read with:
//! one YAML parser in the binary).
//!
//! Invariants: the tree is built here, bounded, from events: nesting deeper than the rules'
//! depth, more nodes than their count, a second document, tags and a key given twice in one
//! mapping are refused. Trigger files refuse anchors and aliases; a Compose file may use them
//! ([`Rules::aliases`]), and every node an alias copies counts against the same node budget,
//! so a few bytes can never become gigabytes. Errors carry the position they were found at.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// What a file may hold: its name in messages, its bounds, whether anchors may be used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// How messages name the file ("a trigger file").
    pub(crate) what: &'static str,
    pub(crate) max_depth: usize,
    pub(crate) max_nodes: usize,
    /// Anchors (`&a`) and aliases (`*a`) are read, each alias a bounded copy of its node.
    pub(crate) aliases: bool,
}

/// Deepest nesting a trigger file needs is 4 (`on.push.paths[i]`); a little slack.
const MAX_DEPTH: usize = 8;
/// Nodes in one file; a trigger file has a few dozen.
const MAX_NODES: usize = 10_000;

/// A trigger file's rules.
pub(crate) const TRIGGER_FILE: Rules = Rules {
    what: "a trigger file",
    max_depth: MAX_DEPTH,
    max_nodes: MAX_NODES,
    aliases: false,
};

/// A node and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) value: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// A scalar as written; `null` for a plain empty, `~` or `null` scalar.
    Scalar {
        text: String,
        null: bool,
    },
    List(Vec<Node>),
    /// Keys in order; keys are scalars (their text), each with its own node for positions.
    Map(Vec<(Node, Node)>),
}

/// A problem at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub(crate) line: usize,
    pub(crate) col: usize,
    pub(crate) message: String,
}

impl Node {
    /// The text of a key node (keys are always scalars here).
    pub(crate) fn key_text(&self) -> &str {
        match &self.value {
            Value::Scalar { text, .. } => text,
            _ => "",
        }
    }

    /// What a node is, for messages.
    pub(crate) fn what(&self) -> &'static str {
        match &self.value {
            Value::Scalar { null: true, .. } => "empty",
            Value::Scalar { .. } => "a scalar",
            Value::List(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

fn at(mark: Marker, message: impl Into<String>) -> YamlError {
    YamlError {
        line: mark.line().max(1),
        col: mark.col() + 1,
        message: message.into(),
    }
}

/// A problem at a 1-based line and 0-based column.
fn at_col((line, col): (usize, usize), message: impl Into<String>) -> YamlError {
    YamlError {
        line: line.max(1),
        col: col + 1,
        message: message.into(),
    }
}

/// One frame of the tree being built: a list or a mapping still open.
/// Each with its anchor id (0: none).
enum Open {
    List(Node, Vec<Node>, usize),
    Map(Node, Vec<(Node, Node)>, Option<Node>, usize),
}

/// How many nodes `node` holds, itself included (keys count).
fn size(node: &Node) -> usize {
    1 + match &node.value {
        Value::Scalar { .. } => 0,
        Value::List(items) => items.iter().map(size).sum(),
        Value::Map(entries) => entries.iter().map(|(k, v)| size(k) + size(v)).sum(),
    }
}

/// Parses one trigger file's YAML document; `None` for a file with no document (empty, or
/// comments only).
pub(crate) fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    parse_with(text, &TRIGGER_FILE)
}

/// Parses one YAML document under `rules`; `None` for a file with no document.
pub(crate) fn parse_with(text: &str, rules: &Rules) -> Result<Option<Node>, YamlError> {
    let mut stack: Vec<Open> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut nodes = 0usize;
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, mark) = parser.next_token().map_err(|error| YamlError {
            line: error.marker().line().max(1),
            col: error.marker().col() + 1,
            message: format!("not valid YAML: {}", error.info()),
        })?;
        let node_start = |value| Node {
            line: mark.line().max(1),
            col: mark.col() + 1,
            value,
        };
        let finished = match event {
            Event::StreamEnd => break,
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => None,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(at(
                        mark,
                        format!(
                            "{} holds one YAML document; remove the second `---`",
                            rules.what
                        ),
                    ));
                }
                None
            }
            Event::Alias(id) => {
                if !rules.aliases {
                    return Err(at(
                        mark,
                        format!(
                            "aliases (`*name`) are not supported in {}s; write the value out",
                            rules.what.trim_start_matches("a ")
                        ),
                    ));
                }
                let Some(anchored) = anchors.get(&id) else {
                    return Err(at(mark, "not valid YAML: an alias to no anchor"));
                };
                // The copy counts as many nodes as it holds (less the one counted below).
                nodes += size(anchored) - 1;
                Some((anchored.clone(), 0))
            }
            Event::Scalar(value, style, anchor, tag) => {
                refuse_anchor_or_tag(text, mark, anchor, tag.is_some(), rules)?;
                let null = style == TScalarStyle::Plain
                    && matches!(&*value, "" | "~" | "null" | "Null" | "NULL");
                Some((node_start(Value::Scalar { text: value, null }), anchor))
            }
            Event::SequenceStart(anchor, tag) => {
                refuse_anchor_or_tag(text, mark, anchor, tag.is_some(), rules)?;
                stack.push(Open::List(
                    node_start(Value::List(Vec::new())),
                    Vec::new(),
                    anchor,
                ));
                None
            }
            Event::MappingStart(anchor, tag) => {
                refuse_anchor_or_tag(text, mark, anchor, tag.is_some(), rules)?;
                stack.push(Open::Map(
                    node_start(Value::Map(Vec::new())),
                    Vec::new(),
                    None,
                    anchor,
                ));
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Open::List(mut node, items, anchor)) => {
                    node.value = Value::List(items);
                    Some((node, anchor))
                }
                _ => return Err(at(mark, "not valid YAML: unbalanced sequence")),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Open::Map(mut node, entries, None, anchor)) => {
                    node.value = Value::Map(entries);
                    Some((node, anchor))
                }
                _ => return Err(at(mark, "not valid YAML: unbalanced mapping")),
            },
        };
        if stack.len() > rules.max_depth {
            return Err(at(
                mark,
                if rules.aliases {
                    format!("nested deeper than {} levels", rules.max_depth)
                } else {
                    format!(
                        "nested deeper than {} levels; {} needs 4",
                        rules.max_depth, rules.what
                    )
                },
            ));
        }
        let Some((node, anchor)) = finished else {
            continue;
        };
        nodes += 1;
        if nodes > rules.max_nodes {
            return Err(at(
                mark,
                format!(
                    "more than {} values in one {}",
                    rules.max_nodes,
                    rules.what.trim_start_matches("a ")
                ),
            ));
        }
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        attach(&mut stack, &mut root, node)?;
    }
    Ok(root)
}

/// Puts a finished `node` where it belongs: the root, an item of the open list, or the key or
/// value of the open mapping (a key is a plain name, given once).
fn attach(stack: &mut [Open], root: &mut Option<Node>, node: Node) -> Result<(), YamlError> {
    match stack.last_mut() {
        None => *root = Some(node),
        Some(Open::List(_, items, _)) => items.push(node),
        Some(Open::Map(map, entries, pending, _)) => match pending.take() {
            Some(key) => entries.push((key, node)),
            None => {
                // yaml-rust2 marks a block mapping at its first `:`; it starts at its
                // first key (a flow mapping's `{` comes before its first key).
                if entries.is_empty() && (node.line, node.col) < (map.line, map.col) {
                    (map.line, map.col) = (node.line, node.col);
                }
                if !matches!(node.value, Value::Scalar { .. }) {
                    return Err(YamlError {
                        line: node.line,
                        col: node.col,
                        message: format!("a key must be a plain name, not {}", node.what()),
                    });
                }
                if let Some((first, _)) = entries
                    .iter()
                    .find(|(existing, _)| existing.key_text() == node.key_text())
                {
                    return Err(YamlError {
                        line: node.line,
                        col: node.col,
                        message: format!(
                            "key {:?} is given twice (first at line {})",
                            node.key_text(),
                            first.line
                        ),
                    });
                }
                *pending = Some(node);
            }
        },
    }
    Ok(())
}

fn refuse_anchor_or_tag(
    text: &str,
    mark: Marker,
    anchor: usize,
    tagged: bool,
    rules: &Rules,
) -> Result<(), YamlError> {
    let files = rules.what.trim_start_matches("a ");
    if anchor != 0 && !rules.aliases {
        return Err(at_col(
            back_to(text, mark, '&'),
            format!("anchors (`&name`) are not supported in {files}s; write the value out"),
        ));
    }
    if tagged {
        return Err(at_col(
            back_to(text, mark, '!'),
            format!("tags (`!name`) are not supported in {files}s"),
        ));
    }
    Ok(())
}

/// yaml-rust2 marks an anchored or tagged node where its value starts; the problem is the
/// `&name`/`!tag` before it (on this line or an earlier one): its 1-based line and 0-based
/// column, or the mark's when none is found.
fn back_to(text: &str, mark: Marker, sign: char) -> (usize, usize) {
    let lines: Vec<&str> = text.lines().take(mark.line()).collect();
    for (n, line) in lines.iter().enumerate().rev() {
        let chars: Vec<char> = if n + 1 == mark.line() {
            line.chars().take(mark.col()).collect()
        } else {
            line.chars().collect()
        };
        if let Some(mut col) = chars.iter().rposition(|c| *c == sign) {
            // The start of the word it is in (`!!str` starts at its first `!`).
            while col > 0 && !matches!(chars[col - 1], ' ' | '\t' | ',' | '[' | '{') {
                col -= 1;
            }
            return (n + 1, col);
        }
    }
    (mark.line(), mark.col())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(node) => format!("ok: {node:?}"),
            Err(error) => format!("{}:{}: {}", error.line, error.col, error.message),
        }
    }

    #[test]
    fn nodes_carry_their_positions() -> Result<(), String> {
        let root = parse("name: api\non:\n  push:\n    branches: [main, 'dev']\n")
            .map_err(|error| error.message)?
            .ok_or("a document")?;
        let Value::Map(entries) = &root.value else {
            return Err("a mapping".into());
        };
        assert_eq!(entries[0].0.key_text(), "name");
        assert_eq!((entries[0].1.line, entries[0].1.col), (1, 7));
        let Value::Map(on) = &entries[1].1.value else {
            return Err("on is a mapping".into());
        };
        let Value::Map(push) = &on[0].1.value else {
            return Err("push is a mapping".into());
        };
        assert_eq!((push[0].0.line, push[0].0.col), (4, 5));
        let Value::List(branches) = &push[0].1.value else {
            return Err("a list".into());
        };
        assert_eq!((branches[1].line, branches[1].col), (4, 22));
        Ok(())
    }

    #[test]
    fn hostile_and_unsupported_yaml_is_refused_with_its_position() {
        for (text, expected) in [
            (
                "a: &x [1]\nb: *x\n",
                "1:4: anchors (`&name`) are not supported in trigger files; write the value out",
            ),
            (
                "a: !!str x\n",
                "1:4: tags (`!name`) are not supported in trigger files",
            ),
            (
                "a:\n  - 1\nb: &x\n  - 2\n",
                "3:4: anchors (`&name`) are not supported in trigger files; write the value out",
            ),
            (
                "a: { b: !t [1] }\n",
                "1:9: tags (`!name`) are not supported in trigger files",
            ),
            (
                "a: 1\n---\nb: 2\n",
                "2:1: a trigger file holds one YAML document; remove the second `---`",
            ),
            (
                "name: a\nname: b\n",
                "2:1: key \"name\" is given twice (first at line 1)",
            ),
            (
                "? [a]\n: b\n",
                "1:3: a key must be a plain name, not a list",
            ),
            (
                "a: [[[[[[[[[[1]]]]]]]]]]\n",
                "1:11: nested deeper than 8 levels; a trigger file needs 4",
            ),
        ] {
            assert_eq!(error(text), expected, "{text}");
        }
        assert!(
            error("a: [1\n").starts_with("2:1: not valid YAML:"),
            "{}",
            error("a: [1\n")
        );
        assert_eq!(error("# nothing\n"), "ok: None");
    }

    #[test]
    fn a_billion_laughs_costs_nothing() {
        // Exponential expansion needs aliases, which are refused at the first one.
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..30 {
            let previous = level - 1;
            text.push_str(&format!(
                "a{level}: &a{level} [*a{previous}, *a{previous}, *a{previous}, *a{previous}]\n"
            ));
        }
        assert!(error(&text).starts_with("1:5: anchors"));
    }

    #[test]
    fn many_values_are_bounded() {
        let text = format!("a: [{}]\n", vec!["1"; MAX_NODES + 10].join(", "));
        assert!(
            error(&text).contains("more than 10000 values"),
            "{}",
            &error(&text)[..80]
        );
    }
}
