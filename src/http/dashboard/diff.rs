//! A line diff of two release snapshots (pretty JSON), for the resource page's compare view.
//!
//! Invariant: bounded work: the longest common subsequence table is at most [`MAX_CELLS`]
//! cells; larger inputs are shown as "everything removed, everything added" instead of
//! spending time and memory a client chose.

/// Largest `(old lines + 1) × (new lines + 1)` table computed.
const MAX_CELLS: usize = 4_000_000;

/// One line of a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// The lines of `old` and `new` in order, each kept, removed or added (a shortest edit by
/// longest common subsequence).
pub(super) fn lines<'a>(old: &'a str, new: &'a str) -> Vec<Line<'a>> {
    let old: Vec<&str> = old.lines().collect();
    let new: Vec<&str> = new.lines().collect();
    // Common head and tail need no table.
    let head = old
        .iter()
        .zip(&new)
        .take_while(|(left, right)| left == right)
        .count();
    let tail = old[head..]
        .iter()
        .rev()
        .zip(new[head..].iter().rev())
        .take_while(|(left, right)| left == right)
        .count();
    let old_middle = &old[head..old.len() - tail];
    let new_middle = &new[head..new.len() - tail];
    let mut out: Vec<Line<'a>> = old[..head].iter().map(|line| Line::Same(line)).collect();
    let cells = (old_middle.len() + 1).saturating_mul(new_middle.len() + 1);
    if cells > MAX_CELLS {
        out.extend(old_middle.iter().map(|line| Line::Removed(line)));
        out.extend(new_middle.iter().map(|line| Line::Added(line)));
    } else {
        middle(old_middle, new_middle, &mut out);
    }
    out.extend(old[old.len() - tail..].iter().map(|line| Line::Same(line)));
    out
}

fn middle<'a>(old: &[&'a str], new: &[&'a str], out: &mut Vec<Line<'a>>) {
    let width = new.len() + 1;
    // lcs[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut lcs = vec![0u32; (old.len() + 1) * width];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            lcs[i * width + j] = if old[i] == new[j] {
                lcs[(i + 1) * width + j + 1] + 1
            } else {
                lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        if old[i] == new[j] {
            out.push(Line::Same(old[i]));
            i += 1;
            j += 1;
        } else if lcs[(i + 1) * width + j] >= lcs[i * width + j + 1] {
            out.push(Line::Removed(old[i]));
            i += 1;
        } else {
            out.push(Line::Added(new[j]));
            j += 1;
        }
    }
    out.extend(old[i..].iter().map(|line| Line::Removed(line)));
    out.extend(new[j..].iter().map(|line| Line::Added(line)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(diff: &[Line<'_>]) -> String {
        diff.iter()
            .map(|line| match line {
                Line::Same(text) => format!("  {text}\n"),
                Line::Removed(text) => format!("- {text}\n"),
                Line::Added(text) => format!("+ {text}\n"),
            })
            .collect()
    }

    #[test]
    fn changed_lines_are_removed_then_added_between_kept_ones() {
        let old = "{\n  \"image\": \"web:1\",\n  \"replicas\": 2,\n  \"env\": {}\n}";
        let new =
            "{\n  \"image\": \"web:2\",\n  \"replicas\": 2,\n  \"ports\": [80],\n  \"env\": {}\n}";
        expect_test::expect![[r#"
              {
            -   "image": "web:1",
            +   "image": "web:2",
                "replicas": 2,
            +   "ports": [80],
                "env": {}
              }
        "#]]
        .assert_eq(&show(&lines(old, new)));
        assert_eq!(show(&lines("a\nb", "a\nb")), "  a\n  b\n");
        assert_eq!(show(&lines("", "x")), "+ x\n");
    }

    #[test]
    fn inputs_past_the_bound_are_shown_whole_without_a_table() {
        let old: String = (0..2100).map(|n| format!("old {n}\n")).collect();
        let new: String = (0..2100).map(|n| format!("new {n}\n")).collect();
        let diff = lines(&old, &new);
        assert_eq!(diff.len(), 4200);
        assert!(matches!(diff[0], Line::Removed("old 0")));
        assert!(matches!(diff[2100], Line::Added("new 0")));
    }
}
