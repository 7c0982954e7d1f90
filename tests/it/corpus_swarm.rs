//! `plan --runtime swarm` on voodu's example corpora (issue 16, acceptance 4), read in place
//! from `../shared/corpus`: for every set, which resources map to Docker Swarm fully, which
//! with notes, which do not (and why). The whole table is a snapshot
//! (`tests/it/swarm_corpus.txt`; `UPDATE_EXPECT=1` rewrites it after a deliberate change),
//! printed with `--nocapture`.
//!
//! Each set is loaded as `corpus.rs` loads it (every undefined `${VAR}` supplied, `url()`
//! answered by a stub: this machine has no network) and planned with the functions
//! `plan --runtime swarm` uses (`plan_all`, `swarm_gaps`, `swarm_notes`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use voodu_agent::reconcile::plan::{plan_all, swarm_gaps, swarm_notes};

use crate::support::TestResult;

fn root() -> PathBuf {
    crate::support::corpus_root()
}

/// Every directory of both corpora that holds manifest files, relative to the corpus root.
fn sets(root: &Path) -> TestResult<Vec<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else if path
                .extension()
                .is_some_and(|extension| extension == "hcl" || extension == "voodu")
            {
                let parent = path.parent().unwrap_or(root);
                out.insert(
                    parent
                        .strip_prefix(root)
                        .unwrap_or(parent)
                        .display()
                        .to_string(),
                );
            }
        }
        Ok(())
    }
    let mut sets = BTreeSet::new();
    for corpus in ["voodu-examples", "voodu-examples-new"] {
        walk(root, &root.join(corpus), &mut sets)?;
    }
    // A directory that is the parent of another set is planned with it (`--path` reads
    // everything below): keep the leaves and the top-level sets of the old corpus.
    Ok(sets.into_iter().collect())
}

/// One line per set: how its resources map, each resource with what does not map or the
/// notes of how it runs differently, as `plan --runtime swarm` computes them.
fn plan_set(dir: &Path) -> TestResult<Vec<String>> {
    let manifest = match crate::corpus::load_set(dir)? {
        Ok(manifest) => manifest,
        Err(diagnostics) => {
            let first = diagnostics
                .0
                .first()
                .map(ToString::to_string)
                .unwrap_or_default();
            return Ok(vec![format!(
                "  does not load (not a Swarm question): {first}"
            )]);
        }
    };
    let plans = plan_all(
        &manifest,
        &Default::default(),
        &Default::default(),
        &Default::default(),
    );
    let (mut fully, mut noted, mut gapped) = (0, 0, 0);
    let mut lines = Vec::new();
    for plan in &plans {
        let Some(resource) = manifest
            .resources
            .iter()
            .find(|resource| resource.key == plan.key)
        else {
            continue;
        };
        let gaps = swarm_gaps(&resource.spec);
        let notes = swarm_notes(&resource.spec);
        if let Some(failure) = &plan.failure {
            lines.push(format!("  ! {}: fails on any runtime: {failure}", plan.key));
        } else if !gaps.is_empty() {
            gapped += 1;
            lines.push(format!(
                "  - {}: does not map: {}",
                plan.key,
                gaps.join("; ")
            ));
        } else if !notes.is_empty() {
            noted += 1;
            lines.push(format!(
                "  + {}: maps with notes: {}",
                plan.key,
                notes.join("; ")
            ));
        } else {
            fully += 1;
            lines.push(format!("  = {}: maps fully", plan.key));
        }
    }
    lines.insert(
        0,
        format!("  {fully} map fully, {noted} with notes, {gapped} do not map"),
    );
    Ok(lines)
}

#[cfg_attr(
    voodu_corpus_missing,
    ignore = "needs voodu's corpus (../shared/corpus beside the checkout, or VOODU_CORPUS_DIR): scripts/test says how"
)]
#[test]
fn plan_runtime_swarm_says_what_of_the_corpus_maps() -> TestResult {
    let root = root();
    if !root.is_dir() {
        return Err(format!(
            "{} not found: the corpus lives beside the checkout",
            root.display()
        )
        .into());
    }
    let mut table = String::new();
    let (mut fully, mut notes, mut gaps) = (0, 0, 0);
    for set in sets(&root)? {
        table.push_str(&format!("{set}\n"));
        for line in plan_set(&root.join(&set))? {
            match line.trim_start().chars().next() {
                Some('=') => fully += 1,
                Some('+') => notes += 1,
                Some('-') => gaps += 1,
                _ => {}
            }
            table.push_str(&line);
            table.push('\n');
        }
    }
    table.push_str(&format!(
        "\ntotal: {fully} resources map fully, {notes} map with notes, {gaps} do not map\n"
    ));
    println!("{table}");
    expect_test::expect_file!["swarm_corpus.txt"].assert_eq(&table);
    Ok(())
}
