//! Checks every kind's decoder shares: each item of a list, a number's upper bound, and a
//! long name shortened for a message.

use std::ops::Range;

use super::super::reader::{DecodeCx, Reader};

/// Every item of list `name` through `check`, reported at the item: `check`'s error says
/// what is wrong, the diagnostic adds where (the field, its index, `path:line:col`).
pub(super) fn check_items<E: std::fmt::Display>(
    cx: &mut DecodeCx<'_>,
    r: &Reader<'_>,
    name: &str,
    items: &[String],
    check: impl Fn(&str) -> Result<(), E>,
) {
    for (index, item) in items.iter().enumerate() {
        if let Err(problem) = check(item) {
            cx.error(
                r.item_span(name, index),
                format!("`{}[{index}]` {item:?}: {problem}", r.field(name)),
            );
        }
    }
}

/// Reports `value` above `max` at `span`; `what_to_do` follows the bound.
pub(super) fn check_at_most(
    cx: &mut DecodeCx<'_>,
    span: Option<Range<usize>>,
    field: &str,
    value: i64,
    max: i64,
    what_to_do: &str,
) {
    if value > max {
        cx.error(
            span,
            format!("`{field}` is {value}, above the limit of {max} {what_to_do}"),
        );
    }
}

/// The first 32 characters of a name too long to quote whole.
pub(super) fn truncated(name: &str) -> String {
    name.chars().take(32).collect()
}
