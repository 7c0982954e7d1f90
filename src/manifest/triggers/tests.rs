//! Trigger files: parsing with exact diagnostics, and the firing decision, from tables.

use super::*;
use crate::model::{CommitSha, HostSelection};

fn sha(n: u32) -> CommitSha {
    CommitSha::new(format!("{n:040x}"))
}

/// Parses `text` as `.voodu/api.yml`: the trigger's summary, or its diagnostics one a line.
fn parsed(text: &str) -> String {
    match parse(".voodu/api.yml", text.as_bytes()) {
        Ok(trigger) => format!(
            "name={} branches={:?} tags={:?} paths={:?} file={} manual={} at {}:{}",
            trigger.name,
            trigger.branches,
            trigger.tags,
            trigger.paths,
            trigger.apply_file,
            trigger.manual,
            trigger.apply_file_line,
            trigger.apply_file_col
        ),
        Err(diagnostics) => diagnostics
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

#[test]
fn valid_trigger_files_parse() {
    for (text, expected) in [
        (
            "name: PWA\non:\n  push:\n    branches: [main]\napply:\n  file: .voodu/pwa.hcl\n",
            "name=PWA branches=[\"main\"] tags=[] paths=[] file=.voodu/pwa.hcl manual=false at 6:9",
        ),
        (
            // The name defaults to the file's base name; `./` is dropped; block lists work.
            "on:\n  push:\n    branches:\n      - main\n      - 'release-*'\n    paths: [\"apps/api/**\"]\napply:\n  file: ./apps/api/voodu.hcl\ndeploy: manual\n",
            "name=api branches=[\"main\", \"release-*\"] tags=[] paths=[\"apps/api/**\"] file=apps/api/voodu.hcl manual=true at 8:9",
        ),
        (
            "on: {push: {tags: ['v*']}}\napply: {file: voodu.hcl}\ndeploy: auto\n",
            "name=api branches=[] tags=[\"v*\"] paths=[] file=voodu.hcl manual=false at 2:15",
        ),
    ] {
        assert_eq!(parsed(text), expected, "{text}");
    }
}

#[test]
fn mistakes_are_reported_at_their_position() {
    for (text, expected) in [
        // voodu refuses `branch:` so a typo never makes a trigger that never fires.
        (
            "on:\n  push:\n    branch: [main]\napply:\n  file: voodu.hcl\n",
            ".voodu/api.yml:3:5: unknown key \"branch\" in on.push (known: branches, tags, paths) (did you mean `branches`?)\n.voodu/api.yml:2:3: on.push needs branches or tags: a trigger that matches nothing never fires",
        ),
        (
            "on:\n  push:\n    branches: [main]\n",
            ".voodu/api.yml:1:1: apply.file is required: it names the manifest to apply",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: '   '\n",
            ".voodu/api.yml:5:9: apply.file is required: it names the manifest to apply",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: /etc/passwd\n",
            ".voodu/api.yml:5:9: apply.file \"/etc/passwd\" must be relative to the repository root",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: ../../etc/passwd\n",
            ".voodu/api.yml:5:9: apply.file \"../../etc/passwd\" escapes the repository",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: apps//x.hcl\n",
            ".voodu/api.yml:5:9: apply.file \"apps//x.hcl\" must be a plain path",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: app.json\n",
            ".voodu/api.yml:5:9: apply.file \"app.json\": JSON manifests are not supported by the agent; name an HCL manifest",
        ),
        (
            "on:\n  push:\n    paths: ['**']\napply:\n  file: voodu.hcl\n",
            ".voodu/api.yml:2:3: on.push needs branches or tags: a trigger that matches nothing never fires",
        ),
        (
            "on:\n  push:\n    branches: main\napply:\n  file: voodu.hcl\n",
            ".voodu/api.yml:3:15: on.push.branches must be a list, as in GitHub Actions: write [main]\n.voodu/api.yml:2:3: on.push needs branches or tags: a trigger that matches nothing never fires",
        ),
        (
            "on:\n  push:\n    branches: [main]\n    paths: ['!docs/**', 'apps/[x']\napply:\n  file: voodu.hcl\n",
            ".voodu/api.yml:4:13: \"!docs/**\": negated patterns (`!…`) are not supported (voodu would match the `!` literally, so it would never match)\n.voodu/api.yml:4:25: \"apps/[x\" has a `[` without its `]`",
        ),
        (
            "on:\n  push:\n    branches: [main]\napply:\n  file: voodu.hcl\ndeploy: later\n",
            ".voodu/api.yml:6:9: deploy must be \"manual\" (held until `voodu-agent approve`) or \"auto\", not \"later\"",
        ),
        (
            "on:\n  pull_request:\n    branches: [main]\napply:\n  file: voodu.hcl\njobs: {}\n",
            ".voodu/api.yml:6:1: unknown key \"jobs\" in the trigger file (known: name, on, apply, deploy, window)\n.voodu/api.yml:2:3: unknown key \"pull_request\" in on (known: push)\n.voodu/api.yml:1:1: on.push needs branches or tags: a trigger that matches nothing never fires",
        ),
        (
            "- a\n- b\n",
            ".voodu/api.yml:1:1: a trigger file is a mapping (name, on, apply, deploy), not a list",
        ),
        (
            "",
            ".voodu/api.yml:1:1: empty trigger file: it needs `on.push.branches` and `apply.file`",
        ),
        (
            "on: [\n",
            ".voodu/api.yml:2:1: not valid YAML: while parsing a node, did not find expected node content",
        ),
    ] {
        assert_eq!(parsed(text), expected, "{text}");
    }
}

#[test]
fn input_is_bounded() {
    let big = format!("name: x\n# {}\n", "y".repeat(MAX_TRIGGER_FILE_BYTES));
    assert_eq!(
        parsed(&big),
        format!(
            ".voodu/api.yml:1:1: trigger file is {} bytes; at most 65536 are read",
            big.len()
        )
    );
    let many: Vec<SourceFile> = (0..=MAX_TRIGGER_FILES)
        .map(|n| SourceFile {
            path: format!(".voodu/t{n:02}.yml"),
            contents: b"on: {push: {branches: [main]}}\napply: {file: a.hcl}\n".to_vec(),
        })
        .collect();
    let errors = parse_all(&many).err().unwrap_or_default();
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            ".voodu/t20.yml:1:1: more than 20 trigger files under .voodu/ (21 found); voodu reads at most 20: merge or remove some"
        ]
    );
    assert_eq!(
        parse_all(&many[..MAX_TRIGGER_FILES]).map(|all| all.len()),
        Ok(20)
    );
}

#[test]
fn trigger_files_are_yml_under_the_root_voodu_dir() {
    use crate::model::is_trigger_path;
    for path in [
        ".voodu/pwa.yml",
        ".voodu/deploy/api.yaml",
        ".voodu/a/b/c.YML",
    ] {
        assert!(is_trigger_path(path), "{path}");
    }
    for path in [
        ".voodu/pwa.hcl",
        ".voodu",
        "voodu.yml",
        ".github/ci.yml",
        "src/.voodu/x.yml",
        ".voodu/.yml",
    ] {
        assert!(!is_trigger_path(path), "{path}");
    }
}

/// A trigger from a compact description: branches, paths, file, manual.
fn trigger(path: &str, branches: &[&str], paths: &[&str], file: &str, manual: bool) -> Trigger {
    let list = |items: &[&str]| {
        items
            .iter()
            .map(|item| format!("'{item}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = format!(
        "on:\n  push:\n    branches: [{}]\n    tags: ['v*']\n{}apply:\n  file: {file}\n{}",
        list(branches),
        if paths.is_empty() {
            String::new()
        } else {
            format!("    paths: [{}]\n", list(paths))
        },
        if manual { "deploy: manual\n" } else { "" }
    );
    parse(path, text.as_bytes()).unwrap_or_else(|errors| panic!("{errors:?}"))
}

fn api() -> Trigger {
    trigger(
        ".voodu/api.yml",
        &["main"],
        &["apps/api/**"],
        "apps/api/voodu.hcl",
        false,
    )
}

fn web() -> Trigger {
    trigger(
        ".voodu/web.yml",
        &["main"],
        &["apps/web/**"],
        "apps/web/voodu.hcl",
        false,
    )
}

/// Decides commit `n` with `changed` (None: unknown) on branch main.
fn at(
    triggers: &[Trigger],
    previous: &[TriggerState],
    n: u32,
    changed: Option<&[&str]>,
) -> Decision {
    let changed: Option<Vec<String>> =
        changed.map(|paths| paths.iter().map(|p| (*p).to_owned()).collect());
    decide(
        triggers,
        previous,
        &Situation {
            branch: "main",
            commit: &sha(n),
            changed: changed.as_deref(),
            watched: &[],
            hosts: &HostSelection::every_host(),
            now: 1000 + i64::from(n),
        },
    )
}

/// Decides commit 1 on branch main, nothing known of its changes and no earlier state,
/// with `watched` (`--path`) and `hosts`.
fn first_commit(triggers: &[Trigger], watched: &[String], hosts: &HostSelection) -> Decision {
    decide(
        triggers,
        &[],
        &Situation {
            branch: "main",
            commit: &sha(1),
            changed: None,
            watched,
            hosts,
            now: 0,
        },
    )
}

/// `file@commit` for each file of desired state.
fn files(decision: &Decision) -> Vec<String> {
    decision
        .files
        .iter()
        .map(|(file, commit, _)| format!("{file}@{}", commit.as_str().trim_start_matches('0')))
        .collect()
}

fn verdicts(decision: &Decision) -> Vec<String> {
    decision
        .outcomes
        .iter()
        .map(|outcome| format!("{}: {:?}", outcome.name, outcome.verdict))
        .collect()
}

#[test]
fn the_first_commit_fires_every_trigger_then_paths_decide() {
    let triggers = [api(), web()];
    let first = at(&triggers, &[], 1, Some(&["README.md"]));
    assert_eq!(
        verdicts(&first),
        ["api: Fired { first: true }", "web: Fired { first: true }"]
    );
    assert_eq!(
        files(&first),
        ["apps/api/voodu.hcl@1", "apps/web/voodu.hcl@1"]
    );

    // A commit touching apps/api only: api fires at 2, web keeps its file at 1.
    let second = at(&triggers, &first.states, 2, Some(&["apps/api/main.go"]));
    assert_eq!(
        verdicts(&second),
        ["api: Fired { first: false }", "web: Skipped"]
    );
    assert_eq!(
        files(&second),
        ["apps/api/voodu.hcl@2", "apps/web/voodu.hcl@1"]
    );

    // One touching only apps/web: api's resources stay at 2, never pruned.
    let third = at(&triggers, &second.states, 3, Some(&["apps/web/index.html"]));
    assert_eq!(
        verdicts(&third),
        ["api: Skipped", "web: Fired { first: false }"]
    );
    assert_eq!(
        files(&third),
        ["apps/api/voodu.hcl@2", "apps/web/voodu.hcl@3"]
    );

    // Unrelated history (a force-push): every trigger fires.
    let forced = at(&triggers, &third.states, 4, None);
    assert_eq!(
        files(&forced),
        ["apps/api/voodu.hcl@4", "apps/web/voodu.hcl@4"]
    );
}

#[test]
fn a_manual_trigger_is_held_until_approved_and_a_newer_push_replaces_the_hold() {
    let manual = trigger(
        ".voodu/api.yml",
        &["main"],
        &["apps/api/**"],
        "apps/api/voodu.hcl",
        true,
    );
    let triggers = [manual, web()];
    let first = at(&triggers, &[], 1, None);
    assert_eq!(
        verdicts(&first),
        ["api: Held { replaced: None }", "web: Fired { first: true }"]
    );
    assert_eq!(files(&first), ["apps/web/voodu.hcl@1"]);

    let second = at(&triggers, &first.states, 2, Some(&["apps/api/x"]));
    assert_eq!(
        verdicts(&second),
        [
            format!(
                "api: Held {{ replaced: Some(CommitSha({:?})) }}",
                sha(1).as_str()
            ),
            "web: Skipped".to_owned()
        ]
    );
    assert_eq!(second.outcomes[0].held, Some(sha(2)));

    // Not touched again: still held at 2.
    let third = at(&triggers, &second.states, 3, Some(&["apps/web/x"]));
    assert_eq!(third.outcomes[0].verdict, Verdict::Skipped);
    assert_eq!(third.outcomes[0].held, Some(sha(2)));

    // Approved: applied at 2 (its own commit) while the branch is at 3.
    let mut approved = third.states.clone();
    if let Some(held) = approved[0].held.as_mut() {
        held.approval = Some(Approval {
            by: "ops".into(),
            at: 5,
        });
    }
    let fourth = at(&triggers, &approved, 3, Some(&[]));
    assert_eq!(
        verdicts(&fourth)[0],
        format!(
            "api: Approved {{ commit: CommitSha({:?}), by: \"ops\" }}",
            sha(2).as_str()
        )
    );
    assert_eq!(
        files(&fourth),
        ["apps/api/voodu.hcl@2", "apps/web/voodu.hcl@3"]
    );
    assert_eq!(fourth.states[0].held, None);

    // An approval a newer push overtakes is dropped with the hold it approved.
    let mut racing = second.states.clone();
    if let Some(held) = racing[0].held.as_mut() {
        held.approval = Some(Approval {
            by: "ops".into(),
            at: 5,
        });
    }
    let overtaken = at(&triggers, &racing, 4, Some(&["apps/api/y"]));
    assert!(matches!(
        overtaken.outcomes[0].verdict,
        Verdict::Held { .. }
    ));
    assert_eq!(
        overtaken.states[0]
            .held
            .as_ref()
            .map(|held| held.approval.clone()),
        Some(None)
    );
    assert_eq!(files(&overtaken), ["apps/web/voodu.hcl@1"]);
}

#[test]
fn re_deciding_an_applied_commit_changes_nothing() {
    // A config change re-loads the same commit: nothing is held again or re-sequenced.
    let manual = trigger(".voodu/api.yml", &["main"], &[], "apps/api/voodu.hcl", true);
    let triggers = [manual, web()];
    let mut states = at(&triggers, &[], 1, None).states;
    if let Some(held) = states[0].held.as_mut() {
        held.approval = Some(Approval {
            by: String::new(),
            at: 1,
        });
    }
    let approved = at(&triggers, &states, 1, Some(&[]));
    let again = at(&triggers, &approved.states, 1, Some(&[]));
    assert_eq!(again.states, approved.states);
    assert_eq!(again.outcomes[0].held, None);
}

#[test]
fn inactive_triggers_contribute_nothing_and_say_why() -> Result<(), String> {
    let release = trigger(".voodu/rel.yml", &["release-*"], &[], "rel.hcl", false);
    let tags_only = parse(
        ".voodu/prod.yml",
        b"on: {push: {tags: ['v*']}}\napply: {file: prod.hcl}\n",
    )
    .unwrap_or_else(|errors| panic!("{errors:?}"));
    let decision = at(&[tags_only, release, web()], &[], 1, None);
    assert_eq!(
        verdicts(&decision),
        [
            "prod: Inactive(\"on.push has only tags (v*); the agent tracks branch main and never sees a tag push\")",
            "rel: Inactive(\"on.push.branches [release-*] does not match the tracked branch main\")",
            "web: Fired { first: true }",
        ]
    );
    assert_eq!(files(&decision), ["apps/web/voodu.hcl@1"]);
    // Outside --path.
    let watched = ["hosts/web-1".to_owned()];
    let outside = first_commit(&[web()], &watched, &HostSelection::every_host());
    assert_eq!(
        outside.outcomes[0].verdict,
        Verdict::Inactive("apply.file apps/web/voodu.hcl is outside --path hosts/web-1".into())
    );
    // Another host's file (a fleet): inactive here, with both names.
    let mut other = web();
    other.apply_file = "hosts/web-2/voodu.hcl".to_owned();
    let web1 = HostSelection::for_host("web-1", &[]).map_err(|error| error.to_string())?;
    let elsewhere = first_commit(&[other.clone()], &[], &web1);
    assert_eq!(
        elsewhere.outcomes[0].verdict,
        Verdict::Inactive("apply.file hosts/web-2/voodu.hcl is addressed to host web-2 (hosts/web-2/); this agent is host web-1".into())
    );
    assert!(elsewhere.files.is_empty());
    // Its own host applies it.
    let web2 = HostSelection::for_host("web-2", &[]).map_err(|error| error.to_string())?;
    let mine = first_commit(&[other], &[], &web2);
    assert_eq!(files(&mine), ["hosts/web-2/voodu.hcl@1"]);
    Ok(())
}

#[test]
fn a_file_named_by_two_triggers_is_read_at_the_newest_firing_and_deleted_triggers_prune() {
    let a = trigger(".voodu/a.yml", &["main"], &["a/**"], "voodu.hcl", false);
    let b = trigger(".voodu/b.yml", &["main"], &["b/**"], "voodu.hcl", false);
    let first = at(&[a.clone(), b.clone()], &[], 1, None);
    assert_eq!(files(&first), ["voodu.hcl@1"]);
    let second = at(&[a.clone(), b.clone()], &first.states, 2, Some(&["b/x"]));
    assert_eq!(files(&second), ["voodu.hcl@2"]);
    let third = at(&[a.clone(), b], &second.states, 3, Some(&["a/x"]));
    assert_eq!(files(&third), ["voodu.hcl@3"]);
    assert_eq!(third.files[0].2, ".voodu/a.yml");
    // b.yml deleted: remembered, reported as removed; a still holds the file.
    let fourth = at(&[a], &third.states, 4, Some(&[".voodu/b.yml"]));
    assert_eq!(
        fourth
            .removed
            .iter()
            .map(|state| state.path.as_str())
            .collect::<Vec<_>>(),
        [".voodu/b.yml"]
    );
    assert_eq!(files(&fourth), ["voodu.hcl@3"]);
    let none = at(&[], &fourth.states, 5, Some(&[".voodu/a.yml"]));
    assert!(none.files.is_empty());
}

#[test]
fn a_window_key_holds_the_firings_of_its_trigger_only() {
    let text = "on:\n  push:\n    branches: [main]\n    paths: [\"apps/api/**\"]\napply:\n  file: apps/api/voodu.hcl\nwindow:\n  - name: lunch\n    kind: deny\n    schedule: \"0 12 * * *\"\n    timezone: Europe/Berlin\n    duration: 1h\n";
    let windowed =
        parse(".voodu/api.yml", text.as_bytes()).unwrap_or_else(|errors| panic!("{errors:?}"));
    assert_eq!(windowed.windows.len(), 1);
    assert_eq!(windowed.windows[0].name, ".voodu/api.yml: lunch");
    assert!(!windowed.windows[0].allow);
    let triggers = [windowed, web()];
    let first = at(&triggers, &[], 1, Some(&["README.md"]));
    // Both fire; only api's rules go with the firing.
    let windows = first.firing_windows();
    assert_eq!(windows.len(), 1);
    assert_eq!(windows[0][0].name, ".voodu/api.yml: lunch");
    // Skipped, it brings no window.
    let second = at(&triggers, &first.states, 2, Some(&["apps/web/index.html"]));
    assert!(second.firing_windows().is_empty());
}

#[test]
fn window_mistakes_are_reported_at_their_position() {
    let base = "on:\n  push:\n    branches: [main]\napply:\n  file: voodu.hcl\n";
    for (window, expected) in [
        (
            "window:\n  - kind: sometimes\n    schedule: \"0 9 * * *\"\n    duration: 1h\n",
            ".voodu/api.yml:7:5: window kind \"sometimes\": write \"allow\"",
        ),
        (
            "window:\n  - kind: allow\n    schedule: \"0 9 * * *\"\n    duration: 1h\n    colour: red\n",
            ".voodu/api.yml:10:5: unknown key \"colour\" in window",
        ),
        (
            "window: allow 0 9 * * * 1h\n",
            ".voodu/api.yml:6:9: window must be a list",
        ),
        (
            "window:\n  - kind: allow\n    schedule: \"0 9 * * *\"\n    duration: forever\n",
            ".voodu/api.yml:7:5: window duration \"forever\"",
        ),
    ] {
        let got = parsed(&format!("{base}{window}"));
        assert!(got.starts_with(expected), "{window}: {got}");
    }
}
