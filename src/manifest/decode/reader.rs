//! `Reader`: typed, located access to one HCL body, and `DecodeCx`, the per-file decoding
//! context.
//!
//! Every getter registers the name it asks for, so `finish` can report whatever the body holds
//! that nobody asked for as an unknown attribute or block, with a "did you mean" among the
//! names that kind knows. Values convert as HCL's type conversion does for voodu's nil-context
//! decode (a number or bool where a string is wanted becomes its text, `"3"` where a number is
//! wanted becomes 3), and every string passes through `DecodeCx::interpolate`.
//!
//! Invariant: a getter that finds a problem records a diagnostic at the value's location and
//! returns `None`; nothing here stops at the first problem.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use hcl::edit::Span;
use hcl::edit::expr::{Expression, ObjectKey, UnaryOperator};
use hcl::edit::structure::{Attribute, Block, BlockLabel, Body, Structure};
use hcl::edit::template::Element;

use super::super::diagnostic::{Diagnostic, LineIndex};
use super::super::interpolate::{Interpolator, Reference, Resolved};
use super::super::lex::MARK;
use super::super::spec::bounds::show_duration;
use super::sources::LoadEnv;
use crate::model::parse_go_duration;

/// Per-file decoding state: where diagnostics point, and what interpolation resolves against.
pub(crate) struct DecodeCx<'a> {
    pub(crate) path: &'a str,
    /// The marked source text (see `lex`); same lines and columns as the file.
    pub(crate) text: &'a str,
    index: LineIndex<'a>,
    pub(crate) diagnostics: Vec<Diagnostic>,
    pub(crate) warnings: Vec<Diagnostic>,
    pub(crate) interpolator: Interpolator<'a>,
    pub(crate) env: &'a LoadEnv<'a>,
    /// Asset bytes read so far, by sha256 digest.
    pub(crate) blobs: BTreeMap<String, Vec<u8>>,
    /// References met since the last `take_references`, with where they were written.
    references: Vec<(Reference, Diagnostic)>,
    /// Resources declared in this file that failed to decode (their errors are reported), so
    /// references to them are not reported a second time.
    pub(crate) failed: Vec<crate::model::ResourceKey>,
    /// Set once the decode read anything besides the file and the variables (`file()`,
    /// `env_file`, `url()`): what it decoded then depends on more than the file's blob, and
    /// is not cached (`manifest::cache`).
    pub(crate) read_beside: bool,
}

impl<'a> DecodeCx<'a> {
    pub(crate) fn new(
        path: &'a str,
        text: &'a str,
        interpolator: Interpolator<'a>,
        env: &'a LoadEnv<'a>,
    ) -> DecodeCx<'a> {
        DecodeCx {
            path,
            text,
            index: LineIndex::new(text),
            diagnostics: Vec::new(),
            warnings: Vec::new(),
            interpolator,
            env,
            blobs: BTreeMap::new(),
            references: Vec::new(),
            failed: Vec::new(),
            read_beside: false,
        }
    }

    /// Reads `path` (of a `file()` or `env_file`) through the load's sources.
    pub(crate) fn read_file(&mut self, path: &str) -> super::sources::Read {
        self.read_beside = true;
        self.env.read_file(self.path, path)
    }

    /// Fetches a `url()` through the load's fetcher (`None` in validate mode).
    pub(crate) fn fetch(
        &mut self,
        url: &str,
        timeout: Duration,
        stale_ok: bool,
    ) -> Option<Result<Vec<u8>, crate::manifest::UrlError>> {
        self.read_beside = true;
        self.env.fetch(url, timeout, stale_ok)
    }

    /// The references recorded since the last call (one resource's worth).
    pub(crate) fn take_references(&mut self) -> Vec<(Reference, Diagnostic)> {
        std::mem::take(&mut self.references)
    }

    /// The references recorded since the last `take_references`, newest last.
    pub(crate) fn references_since(&self, count: usize) -> &[(Reference, Diagnostic)] {
        self.references.get(count..).unwrap_or_default()
    }

    /// How many references are recorded since the last `take_references`.
    pub(crate) fn reference_count(&self) -> usize {
        self.references.len()
    }

    /// Records a reference made outside a `${…}` (e.g. `depends_on.assets`).
    pub(crate) fn record_reference(&mut self, reference: Reference, span: Option<Range<usize>>) {
        let location = self.location(span);
        self.references.push((reference, location));
    }

    /// Records a problem at `span`: the diagnostic carries this file and the span's line and
    /// column; `message` (a typed error, or text) says what is wrong there.
    pub(crate) fn error(&mut self, span: Option<Range<usize>>, message: impl std::fmt::Display) {
        let diagnostic = self.index.at(self.path, span, message.to_string());
        self.diagnostics.push(diagnostic);
    }

    pub(crate) fn warn(&mut self, span: Option<Range<usize>>, message: impl std::fmt::Display) {
        let diagnostic = self.index.at(self.path, span, message.to_string());
        self.warnings.push(diagnostic);
    }

    /// A location (a diagnostic without a message).
    pub(crate) fn location(&self, span: Option<Range<usize>>) -> Diagnostic {
        self.index.at(self.path, span, String::new())
    }

    /// Resolves the interpolation marks in `raw`, a string decoded from the source at `span`.
    pub(crate) fn interpolate(&mut self, raw: &str, span: Option<Range<usize>>) -> Option<String> {
        if !raw.contains(MARK) {
            return Some(raw.to_owned());
        }
        let mut out = String::with_capacity(raw.len());
        let mut ok = true;
        let mut rest = raw;
        let mut nth = 0;
        while let Some(at) = rest.find(MARK) {
            out.push_str(&rest[..at]);
            let after = &rest[at + MARK.len_utf8()..];
            let (content, tail) = match after
                .strip_prefix('{')
                .and_then(|inner| inner.split_once('}'))
            {
                Some(parts) => parts,
                None => {
                    // The pre-pass only marks `${` with a closing `}`; keep the text as is.
                    out.push('$');
                    rest = after;
                    nth += 1;
                    continue;
                }
            };
            let mark_span = self.nth_mark_span(span.clone(), nth, content.len() + 3);
            match self.interpolator.resolve(content) {
                Ok(Resolved::Text(value)) => out.push_str(&value),
                Ok(Resolved::Reference(reference, literal)) => {
                    out.push_str(&literal);
                    let location = self.location(mark_span);
                    self.references.push((reference, location));
                }
                Err(error) => {
                    self.error(mark_span, error);
                    ok = false;
                }
            }
            rest = tail;
            nth += 1;
        }
        out.push_str(rest);
        ok.then_some(out)
    }

    /// The source span of the `nth` interpolation inside `span`, falling back to `span`.
    fn nth_mark_span(
        &self,
        span: Option<Range<usize>>,
        nth: usize,
        len: usize,
    ) -> Option<Range<usize>> {
        let range = span.clone()?;
        let slice = self.text.get(range.clone())?;
        match slice.match_indices(MARK).nth(nth) {
            Some((offset, _)) => Some(range.start + offset..range.start + offset + len),
            None => span,
        }
    }
}

/// What kind of structure a registered name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Attribute,
    Block,
}

struct Known {
    name: &'static str,
    shape: Shape,
    /// Set for names this body must not hold: why.
    refused: Option<&'static str>,
}

/// Typed access to one body. `prefix` is prepended to field names in messages
/// (`probes.readiness.`), `what` names the body in "unknown attribute … in <what>".
pub(crate) struct Reader<'b> {
    pub(crate) what: String,
    prefix: String,
    body: &'b Body,
    /// Where "missing required field" errors point: the block's header.
    pub(crate) anchor: Option<Range<usize>>,
    known: Vec<Known>,
}

impl<'b> Reader<'b> {
    pub(crate) fn new(
        what: impl Into<String>,
        prefix: impl Into<String>,
        body: &'b Body,
        anchor: Option<Range<usize>>,
    ) -> Reader<'b> {
        Reader {
            what: what.into(),
            prefix: prefix.into(),
            body,
            anchor,
            known: Vec::new(),
        }
    }

    /// A reader for a nested block, its messages prefixed with `<prefix><block>.`.
    pub(crate) fn nested(&self, block: &'b Block, label: &str) -> Reader<'b> {
        let name = block.ident.as_str();
        let shown = if label.is_empty() {
            format!("{}{name}", self.prefix)
        } else {
            format!("{}{name} \"{label}\"", self.prefix)
        };
        Reader::new(
            shown.clone(),
            format!("{shown}."),
            &block.body,
            block.ident.span(),
        )
    }

    /// `prefix + name`, for messages.
    pub(crate) fn field(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn register(&mut self, name: &'static str, shape: Shape) {
        if !self.known.iter().any(|known| known.name == name) {
            self.known.push(Known {
                name,
                shape,
                refused: None,
            });
        }
    }

    /// Names this body knows but must not hold here, with the reason shown when it does.
    pub(crate) fn refuse(&mut self, names: &[&'static str], why: &'static str) {
        for name in names {
            self.known.push(Known {
                name,
                shape: Shape::Attribute,
                refused: Some(why),
            });
        }
    }

    /// The attribute `name`, if the body sets it (registers the name).
    pub(crate) fn attribute(&mut self, name: &'static str) -> Option<&'b Attribute> {
        self.register(name, Shape::Attribute);
        self.body
            .iter()
            .find_map(|structure| match structure {
                Structure::Attribute(attribute) if attribute.key.as_str() == name => {
                    Some(attribute)
                }
                _ => None,
            })
            .filter(|attribute| !matches!(attribute.value, Expression::Null(_)))
    }

    /// True when `name` is missing: not written at all, or written empty. A value that was
    /// written but failed to decode (already reported) does not count as missing, so one
    /// mistake is reported once.
    pub(crate) fn lacks<T: Emptiness>(&self, name: &str, value: &Option<T>) -> bool {
        match value {
            Some(value) => value.is_empty_value(),
            None => self.span_of(name).is_none(),
        }
    }

    /// The span of attribute or block `name`, if present (does not register it).
    pub(crate) fn span_of(&self, name: &str) -> Option<Range<usize>> {
        self.body.iter().find_map(|structure| match structure {
            Structure::Attribute(attribute) if attribute.key.as_str() == name => attribute.span(),
            Structure::Block(block) if block.ident.as_str() == name => block.ident.span(),
            _ => None,
        })
    }

    /// The span of item `index` of list attribute `name`, else of the attribute.
    pub(crate) fn item_span(&self, name: &str, index: usize) -> Option<Range<usize>> {
        self.written(name)
            .and_then(|attribute| match &attribute.value {
                Expression::Array(items) => items.iter().nth(index).and_then(Span::span),
                _ => None,
            })
            .or_else(|| self.span_of(name))
    }

    /// The span of key `key` (as written) of map attribute `name`, else of the attribute.
    pub(crate) fn key_span(&self, name: &str, key: &str) -> Option<Range<usize>> {
        self.written(name)
            .and_then(|attribute| match &attribute.value {
                Expression::Object(object) => {
                    object.iter().find_map(|(object_key, _)| match object_key {
                        ObjectKey::Ident(ident) if ident.as_str() == key => ident.span(),
                        ObjectKey::Expression(Expression::String(text)) if text.as_str() == key => {
                            object_key.span()
                        }
                        _ => None,
                    })
                }
                _ => None,
            })
            .or_else(|| self.span_of(name))
    }

    /// The attribute `name` as written (does not register it).
    fn written(&self, name: &str) -> Option<&'b Attribute> {
        self.body.iter().find_map(|structure| match structure {
            Structure::Attribute(attribute) if attribute.key.as_str() == name => Some(attribute),
            _ => None,
        })
    }

    pub(crate) fn string(&mut self, cx: &mut DecodeCx<'_>, name: &'static str) -> Option<String> {
        let attribute = self.attribute(name)?;
        to_string(cx, &attribute.value, &self.field(name))
    }

    /// A string that must be present and non-empty.
    pub(crate) fn required_string(
        &mut self,
        cx: &mut DecodeCx<'_>,
        name: &'static str,
    ) -> Option<String> {
        let value = self.string(cx, name);
        match &value {
            Some(text) if !text.is_empty() => value,
            Some(_) => {
                let span = self.span_of(name);
                cx.error(span, format!("`{}` must not be empty", self.field(name)));
                None
            }
            None if self.attribute(name).is_none() => {
                cx.error(
                    self.anchor.clone(),
                    format!("{} needs `{}`", self.what, self.field(name)),
                );
                None
            }
            None => None,
        }
    }

    pub(crate) fn int(&mut self, cx: &mut DecodeCx<'_>, name: &'static str) -> Option<i64> {
        let attribute = self.attribute(name)?;
        to_int(cx, &attribute.value, &self.field(name))
    }

    pub(crate) fn bool(&mut self, cx: &mut DecodeCx<'_>, name: &'static str) -> Option<bool> {
        let attribute = self.attribute(name)?;
        let field = self.field(name);
        match &attribute.value {
            Expression::Bool(flag) => Some(**flag),
            other => match to_string(cx, other, &field).as_deref() {
                Some("true") => Some(true),
                Some("false") => Some(false),
                Some(_) => {
                    cx.error(other.span(), format!("`{field}` must be true or false"));
                    None
                }
                None => None,
            },
        }
    }

    /// A Go duration (`"30s"`, `"1m30s"`) of at most `max`, kept as written.
    pub(crate) fn duration(
        &mut self,
        cx: &mut DecodeCx<'_>,
        name: &'static str,
        max: Duration,
    ) -> Option<String> {
        let attribute = self.attribute(name)?;
        let field = self.field(name);
        let text = to_string(cx, &attribute.value, &field)?;
        match parse_go_duration(&text) {
            None => {
                cx.error(
                    attribute.value.span(),
                    format!(
                        "`{field}` must be a duration like \"30s\", \"5m\" or \"1h30m\", got {text:?}"
                    ),
                );
                None
            }
            Some(duration) if duration > max => {
                cx.error(
                    attribute.value.span(),
                    format!(
                        "`{field}` {text:?} is above the limit of {}: write a shorter duration",
                        show_duration(max)
                    ),
                );
                None
            }
            Some(_) => Some(text),
        }
    }

    pub(crate) fn strings(
        &mut self,
        cx: &mut DecodeCx<'_>,
        name: &'static str,
    ) -> Option<Vec<String>> {
        let attribute = self.attribute(name)?;
        to_strings(cx, &attribute.value, &self.field(name))
    }

    pub(crate) fn map(
        &mut self,
        cx: &mut DecodeCx<'_>,
        name: &'static str,
    ) -> Option<BTreeMap<String, String>> {
        let attribute = self.attribute(name)?;
        to_map(cx, &attribute.value, &self.field(name))
    }

    /// Any value as JSON (webhook bodies): objects, lists, strings, numbers, bools.
    pub(crate) fn json(
        &mut self,
        cx: &mut DecodeCx<'_>,
        name: &'static str,
    ) -> Option<serde_json::Value> {
        let attribute = self.attribute(name)?;
        to_json(cx, &attribute.value, &self.field(name))
    }

    /// The single block `name` (registers it). A repeated block or one with labels is an error.
    pub(crate) fn block(&mut self, cx: &mut DecodeCx<'_>, name: &'static str) -> Option<&'b Block> {
        let blocks = self.blocks(name);
        let first = *blocks.first()?;
        for extra in &blocks[1..] {
            cx.error(
                extra.ident.span(),
                format!(
                    "`{}` block is declared twice in {}; merge them into one",
                    self.field(name),
                    self.what
                ),
            );
        }
        if !first.labels.is_empty() {
            cx.error(
                first.labels[0].span(),
                format!("`{}` block takes no label", self.field(name)),
            );
        }
        Some(first)
    }

    /// Every block `name`, in order (registers it).
    pub(crate) fn blocks(&mut self, name: &'static str) -> Vec<&'b Block> {
        self.register(name, Shape::Block);
        self.body
            .iter()
            .filter_map(|structure| match structure {
                Structure::Block(block) if block.ident.as_str() == name => Some(block),
                _ => None,
            })
            .collect()
    }

    /// Reports every attribute and block nobody asked for, and attributes set twice.
    pub(crate) fn finish(self, cx: &mut DecodeCx<'_>) {
        let carried = self.finish_with(cx, false);
        debug_assert!(carried.is_empty(), "nothing is carried unless asked");
    }

    /// As `finish`, but a block nobody asked for is no error: it is returned, in order, with
    /// the known block name within two edits of it (or empty), for the caller to carry as a
    /// plugin-owned block (voodu 2026). Unknown attributes are still errors.
    pub(crate) fn finish_carrying_blocks(self, cx: &mut DecodeCx<'_>) -> Vec<(&'b Block, String)> {
        self.finish_with(cx, true)
    }

    fn finish_with(self, cx: &mut DecodeCx<'_>, carry_blocks: bool) -> Vec<(&'b Block, String)> {
        let mut carried = Vec::new();
        let block_names: Vec<&str> = self
            .known
            .iter()
            .filter(|known| known.refused.is_none() && known.shape == Shape::Block)
            .map(|known| known.name)
            .collect();
        let mut seen: BTreeMap<&str, Option<Range<usize>>> = BTreeMap::new();
        for structure in self.body.iter() {
            if let Structure::Block(block) = structure
                && carry_blocks
                && !self
                    .known
                    .iter()
                    .any(|known| known.name == block.ident.as_str())
            {
                let near = closest(block.ident.as_str(), &block_names).unwrap_or_default();
                carried.push((block, near.to_owned()));
                continue;
            }
            let (name, span, shape) = match structure {
                Structure::Attribute(attribute) => (
                    attribute.key.as_str(),
                    attribute.key.span(),
                    Shape::Attribute,
                ),
                Structure::Block(block) => (block.ident.as_str(), block.ident.span(), Shape::Block),
            };
            // Named in messages only: formatted on the error paths alone.
            let field = || self.field(name);
            match self.known.iter().find(|known| known.name == name) {
                Some(Known {
                    refused: Some(why), ..
                }) => cx.error(
                    span,
                    format!("`{}` is not allowed in {}: {why}", field(), self.what),
                ),
                Some(known) if known.shape != shape => {
                    let hint = match known.shape {
                        Shape::Block => {
                            format!("`{}` is a block: write `{name} {{ … }}`", field())
                        }
                        Shape::Attribute => {
                            format!("`{}` is an attribute: write `{name} = …`", field())
                        }
                    };
                    cx.error(span, hint);
                }
                Some(_) if shape == Shape::Attribute => {
                    if let Some(first) = seen.insert(name, span.clone()) {
                        let (line, _) =
                            first.map_or((0, 0), |first| cx.index.line_col(first.start));
                        cx.error(
                            span,
                            format!(
                                "`{}` is set twice (first on line {line}); keep one",
                                field()
                            ),
                        );
                    }
                }
                Some(_) => {}
                None => {
                    let kind = match shape {
                        Shape::Attribute => "attribute",
                        Shape::Block => "block",
                    };
                    let names: Vec<&str> = self
                        .known
                        .iter()
                        .filter(|known| known.refused.is_none())
                        .map(|known| known.name)
                        .collect();
                    let hint = did_you_mean(name, &names);
                    cx.error(
                        span,
                        format!("unknown {kind} `{}` in {}{hint}", field(), self.what),
                    );
                }
            }
        }
        carried
    }
}

/// Values `Reader::lacks` can call empty.
pub(crate) trait Emptiness {
    fn is_empty_value(&self) -> bool;
}

impl Emptiness for String {
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
}

impl Emptiness for Vec<String> {
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
}

/// A block's labels as text (interpolated), with their spans.
pub(crate) fn labels(cx: &mut DecodeCx<'_>, block: &Block) -> Vec<(String, Option<Range<usize>>)> {
    block
        .labels
        .iter()
        .map(|label| {
            let (text, span) = match label {
                BlockLabel::String(text) => (text.as_str(), label.span()),
                BlockLabel::Ident(ident) => (ident.as_str(), label.span()),
            };
            let resolved = cx.interpolate(text, span.clone()).unwrap_or_default();
            (resolved, span)
        })
        .collect()
}

/// A scalar converted to text, interpolated. `None` (with a diagnostic) for lists, maps,
/// expressions and unresolvable interpolations.
pub(crate) fn to_string(cx: &mut DecodeCx<'_>, value: &Expression, field: &str) -> Option<String> {
    let span = value.span();
    let raw = match value {
        Expression::String(text) => text.as_str().to_owned(),
        Expression::Number(number) => number.to_string(),
        Expression::Bool(flag) => flag.to_string(),
        Expression::Parenthesis(inner) => return to_string(cx, inner.inner(), field),
        Expression::HeredocTemplate(heredoc) => {
            literal_template(cx, heredoc.template.iter(), span.clone(), field)?
        }
        Expression::StringTemplate(template) => {
            literal_template(cx, template.iter(), span.clone(), field)?
        }
        other => {
            cx.error(
                other.span(),
                format!("`{field}` must be a string, got {}", describe(other)),
            );
            return None;
        }
    };
    cx.interpolate(&raw, span)
}

fn literal_template<'t>(
    cx: &mut DecodeCx<'_>,
    elements: impl Iterator<Item = &'t Element>,
    span: Option<Range<usize>>,
    field: &str,
) -> Option<String> {
    let mut text = String::new();
    for element in elements {
        match element {
            Element::Literal(literal) => text.push_str(literal),
            Element::Interpolation(interpolation) => {
                cx.error(
                    interpolation.span().or(span),
                    format!("`{field}`: `${{…}}` holds an expression (a function call or an operator) that manifests do not evaluate; they interpolate only ${{VAR}}, ${{VAR:-default}}, ${{asset.…}} and ${{ref.…}}"),
                );
                return None;
            }
            Element::Directive(directive) => {
                cx.error(
                    directive.span().or(span),
                    format!("`{field}`: template directives (`%{{…}}`) are not supported; manifests interpolate only ${{VAR}}, ${{VAR:-default}}, ${{asset.…}} and ${{ref.…}}"),
                );
                return None;
            }
        }
    }
    Some(text)
}

pub(crate) fn to_int(cx: &mut DecodeCx<'_>, value: &Expression, field: &str) -> Option<i64> {
    let parsed = match value {
        Expression::Number(number) => number.as_i64().or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Expression::UnaryOp(op) if *op.operator.value() == UnaryOperator::Neg => {
            let n = to_int(cx, &op.expr, field)?;
            // The negation of i64::MIN (written as `-"-9223372036854775808"`) does not fit.
            let negated = n.checked_neg();
            if negated.is_none() {
                cx.error(
                    value.span(),
                    format!("`{field}` is out of range: -({n}) does not fit in 64 bits"),
                );
            }
            return negated;
        }
        Expression::Parenthesis(inner) => return to_int(cx, inner.inner(), field),
        Expression::String(_) | Expression::StringTemplate(_) => {
            let text = to_string(cx, value, field)?;
            text.trim().parse::<i64>().ok()
        }
        _ => None,
    };
    if parsed.is_none() {
        cx.error(
            value.span(),
            format!("`{field}` must be a whole number, got {}", describe(value)),
        );
    }
    parsed
}

pub(crate) fn to_strings(
    cx: &mut DecodeCx<'_>,
    value: &Expression,
    field: &str,
) -> Option<Vec<String>> {
    let Expression::Array(items) = value else {
        cx.error(
            value.span(),
            format!(
                "`{field}` must be a list of strings like [\"a\", \"b\"], got {}",
                describe(value)
            ),
        );
        return None;
    };
    let mut values = Vec::new();
    let mut ok = true;
    for item in items.iter() {
        match to_string(cx, item, field) {
            Some(text) => values.push(text),
            None => ok = false,
        }
    }
    ok.then_some(values)
}

pub(crate) fn to_map(
    cx: &mut DecodeCx<'_>,
    value: &Expression,
    field: &str,
) -> Option<BTreeMap<String, String>> {
    let Expression::Object(object) = value else {
        cx.error(
            value.span(),
            format!(
                "`{field}` must be a map like {{ KEY = \"value\" }}, got {}",
                describe(value)
            ),
        );
        return None;
    };
    let mut map = BTreeMap::new();
    let mut ok = true;
    for (key, entry) in object.iter() {
        let key_text = object_key(cx, key, field);
        let entry_field = match &key_text {
            Some((name, _)) => format!("{field}.{name}"),
            None => field.to_owned(),
        };
        let value_text = match entry.expr() {
            Expression::Null(_) => Some(String::new()),
            other => to_string(cx, other, &entry_field),
        };
        match (key_text, value_text) {
            (Some((key_text, span)), Some(value_text)) => {
                if map.insert(key_text.clone(), value_text).is_some() {
                    cx.error(span, format!("`{field}` sets `{key_text}` twice"));
                    ok = false;
                }
            }
            _ => ok = false,
        }
    }
    ok.then_some(map)
}

fn object_key(
    cx: &mut DecodeCx<'_>,
    key: &ObjectKey,
    field: &str,
) -> Option<(String, Option<Range<usize>>)> {
    match key {
        ObjectKey::Ident(ident) => Some((ident.as_str().to_owned(), ident.span())),
        ObjectKey::Expression(expression @ Expression::String(_)) => {
            to_string(cx, expression, field).map(|text| (text, expression.span()))
        }
        ObjectKey::Expression(other) => {
            cx.error(
                other.span(),
                format!("`{field}` keys must be plain names or quoted strings"),
            );
            None
        }
    }
}

pub(crate) fn to_json(
    cx: &mut DecodeCx<'_>,
    value: &Expression,
    field: &str,
) -> Option<serde_json::Value> {
    use serde_json::Value;
    Some(match value {
        Expression::Null(_) => Value::Null,
        Expression::Bool(flag) => Value::Bool(**flag),
        Expression::Number(number) => {
            if let Some(integer) = number.as_i64() {
                Value::from(integer)
            } else {
                number
                    .as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(Value::Null, Value::Number)
            }
        }
        Expression::Array(items) => {
            let mut values = Vec::new();
            let mut ok = true;
            for item in items.iter() {
                match to_json(cx, item, field) {
                    Some(json) => values.push(json),
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::Array(values)
        }
        Expression::Object(object) => {
            let mut map = serde_json::Map::new();
            let mut ok = true;
            for (key, entry) in object.iter() {
                match (object_key(cx, key, field), to_json(cx, entry.expr(), field)) {
                    (Some((key, _)), Some(json)) => {
                        map.insert(key, json);
                    }
                    _ => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::Object(map)
        }
        Expression::Parenthesis(inner) => return to_json(cx, inner.inner(), field),
        other => Value::String(to_string(cx, other, field)?),
    })
}

pub(crate) fn describe(value: &Expression) -> &'static str {
    match value {
        Expression::Null(_) => "null",
        Expression::Bool(_) => "a bool",
        Expression::Number(_) => "a number",
        Expression::String(_) => "a string",
        Expression::Array(_) => "a list",
        Expression::Object(_) => "a map",
        Expression::StringTemplate(_) | Expression::HeredocTemplate(_) => "a template",
        Expression::Variable(_) | Expression::Traversal(_) => {
            "a variable reference (quote it, or write \"${NAME}\" to interpolate)"
        }
        Expression::FuncCall(_) => "a function call",
        _ => "an expression",
    }
}

/// ` (did you mean `x`?)` when a known name is within two edits, else empty.
pub(crate) fn did_you_mean(input: &str, known: &[&str]) -> String {
    closest(input, known)
        .map(|candidate| format!(" (did you mean `{candidate}`?)"))
        .unwrap_or_default()
}

/// The known name within two edits of `input` (fewer for short names), the closest first.
pub(crate) fn closest<'k>(input: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|candidate| (edit_distance(input, candidate), *candidate))
        .filter(|(distance, candidate)| *distance <= 2.min(candidate.len() / 2).max(1))
        .min()
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_only_for_close_names() {
        assert_eq!(
            did_you_mean("replicaz", &["replicas", "image"]),
            " (did you mean `replicas`?)"
        );
        assert_eq!(did_you_mean("zzzzzz", &["replicas", "image"]), "");
        assert_eq!(
            did_you_mean("lb", &["tls", "host"]),
            "",
            "short names need a closer match"
        );
    }
}
