//! Versioned migrations of the state database, applied in order on open.
//!
//! Invariant: migration N is never edited once released; a change is a new migration. The
//! version lives in `PRAGMA user_version`.

/// Each entry moves the schema from version `index` to `index + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the walking skeleton's tables.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    -- One row per commit the agent processed; outcome says whether it reached desired.
    CREATE TABLE commits (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        sha      TEXT NOT NULL,
        outcome  TEXT NOT NULL CHECK (outcome IN ('applied', 'rejected')),
        errors   TEXT,
        seen_at  INTEGER NOT NULL
    );
    -- What the repo declares now, one row per resource.
    CREATE TABLE desired (
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        spec        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        replicas    INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        commit_sha  TEXT NOT NULL,
        PRIMARY KEY (kind, scope, name)
    );
    -- Append-only change log: the reconciler's watch source.
    CREATE TABLE journal (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        op          TEXT NOT NULL CHECK (op IN ('PUT', 'DELETE')),
        generation  INTEGER NOT NULL,
        commit_sha  TEXT NOT NULL
    );
    CREATE TABLE cursor (
        consumer  TEXT PRIMARY KEY,
        seq       INTEGER NOT NULL
    );
    CREATE TABLE releases (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        kind         TEXT NOT NULL,
        scope        TEXT NOT NULL,
        name         TEXT NOT NULL,
        commit_sha   TEXT NOT NULL,
        spec_hash    TEXT NOT NULL,
        snapshot     TEXT NOT NULL,
        phase        TEXT NOT NULL,
        started_at   INTEGER NOT NULL,
        finished_at  INTEGER,
        message      TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX releases_by_key ON releases (kind, scope, name, id);
    CREATE TABLE status (
        kind              TEXT NOT NULL,
        scope             TEXT NOT NULL,
        name              TEXT NOT NULL,
        phase             TEXT NOT NULL,
        message           TEXT NOT NULL DEFAULT '',
        desired_replicas  INTEGER NOT NULL,
        running_replicas  INTEGER NOT NULL,
        spec_hash         TEXT NOT NULL,
        release_id        INTEGER,
        updated_at        INTEGER NOT NULL,
        PRIMARY KEY (kind, scope, name)
    );
    "#,
    // 2: config buckets (`config set`, `${VAR}` and the containers' env) and asset bytes.
    r#"
    -- Host-local key/value buckets: (scope, name) with name '' for the scope-level bucket.
    CREATE TABLE config (
        scope  TEXT NOT NULL,
        name   TEXT NOT NULL,
        key    TEXT NOT NULL,
        value  TEXT NOT NULL,
        PRIMARY KEY (scope, name, key)
    );
    -- Asset file contents by sha256, written with the commit that declares them.
    CREATE TABLE blobs (
        digest  TEXT PRIMARY KEY,
        bytes   BLOB NOT NULL
    );
    "#,
    // 3: rollback provenance and pins (releases and rollback keyed to commits).
    r#"
    -- The release a rollback release was made from (NULL for ordinary rollouts).
    ALTER TABLE releases ADD COLUMN rolled_back_from INTEGER;
    -- A resource the operator rolled back: desired holds the snapshot of release_id, and
    -- commits leave it alone while git still declares git_spec for it.
    CREATE TABLE pins (
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        release_id  INTEGER NOT NULL,
        commit_sha  TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        git_spec    TEXT,
        git_commit  TEXT,
        pinned_at   INTEGER NOT NULL,
        PRIMARY KEY (kind, scope, name)
    );
    "#,
    // 4: what every kind reconciles beyond deployments: release hooks, kind-specific status,
    // job runs, cron schedules, and replica readiness (ingress routes, health gates).
    r#"
    -- Outcome of a release's hooks (pre_command, command, post_command), as JSON by stage.
    ALTER TABLE releases ADD COLUMN hooks TEXT NOT NULL DEFAULT '{}';
    -- Kind-specific status as JSON (init failures, routes, schedule, asset files, …).
    ALTER TABLE status ADD COLUMN detail TEXT NOT NULL DEFAULT '{}';
    -- One row per job run (jobs and cronjob ticks), newest last.
    CREATE TABLE job_runs (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        kind         TEXT NOT NULL,
        scope        TEXT NOT NULL,
        name         TEXT NOT NULL,
        run_id       TEXT NOT NULL,
        spec_hash    TEXT NOT NULL,
        container    TEXT NOT NULL,
        started_at   INTEGER NOT NULL,
        ended_at     INTEGER,
        exit_code    INTEGER,
        status       TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
        error        TEXT NOT NULL DEFAULT '',
        logs_tail    TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX job_runs_by_key ON job_runs (kind, scope, name, id);
    -- A cronjob's schedule position: the last fire time it handled (Unix seconds).
    CREATE TABLE cron_state (
        scope           TEXT NOT NULL,
        name            TEXT NOT NULL,
        schedule        TEXT NOT NULL,
        last_scheduled  INTEGER,
        next_run        INTEGER,
        PRIMARY KEY (scope, name)
    );
    -- Whether each replica is ready (probes, or running long enough), as the agent last saw.
    CREATE TABLE readiness (
        container   TEXT PRIMARY KEY,
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        ready       INTEGER NOT NULL,
        reason      TEXT NOT NULL DEFAULT '',
        address     TEXT NOT NULL DEFAULT '',
        updated_at  INTEGER NOT NULL
    );
    CREATE INDEX readiness_by_key ON readiness (kind, scope, name);
    "#,
    // 5: the autoscaler's replica count, kept beside desired state, never in git.
    r#"
    -- A replica count the autoscaler chose for a deployment with `autoscale {}`; it wins over
    -- the manifest's while the deployment keeps `autoscale`, clamped to its min and max.
    CREATE TABLE replica_overrides (
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        replicas    INTEGER NOT NULL,
        reason      TEXT NOT NULL DEFAULT '',
        updated_at  INTEGER NOT NULL,
        PRIMARY KEY (kind, scope, name)
    );
    "#,
    // 6: a readiness row belongs to one container instance (its id), not to a name that a
    // re-created statefulset pod or a reused replica id takes over.
    r#"
    ALTER TABLE readiness ADD COLUMN container_id TEXT NOT NULL DEFAULT '';
    "#,
    // 7: what goes wrong outside the repo's content: the last fetch of the remote and the last
    // probe of the engine, and the warnings an applied commit was accepted with.
    r#"
    -- One row per watched subject ('fetch', 'engine'): the outcome of its last check. While
    -- it fails, failing_since is when the current streak of failures began.
    CREATE TABLE health (
        subject          TEXT PRIMARY KEY,
        ok               INTEGER NOT NULL,
        error            TEXT NOT NULL DEFAULT '',
        failing_since    INTEGER,
        checked_at       INTEGER NOT NULL,
        last_success_at  INTEGER
    );
    -- `path:line:col` warnings of an applied commit, as JSON diagnostics (NULL: none).
    ALTER TABLE commits ADD COLUMN warnings TEXT;
    "#,
    // 8: incarnations. A resource deleted from git and added again is a new incarnation: its
    // rollbacks never go back to a release of the deleted one. Rows from before count as
    // incarnation 0; a desired row made afresh takes one more than any release of its key.
    r#"
    ALTER TABLE desired ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE releases ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 0;
    "#,
    // 9: typed failure reasons. A failed resource's status says why by cause
    // (`status::FailureReason`), so readers never search the message; NULL when nothing failed.
    r#"
    ALTER TABLE status ADD COLUMN reason TEXT;
    "#,
    // 10: a halted release (failed, left alone until desired state changes) is a state of its
    // own, no longer read from its hooks record: a rollout that failed after touching
    // replicas (the `rollout` record) or a failed `pre_command`/`command`.
    r#"
    ALTER TABLE releases ADD COLUMN halted INTEGER NOT NULL DEFAULT 0;
    UPDATE releases SET halted = 1
     WHERE phase = 'failed' AND json_valid(hooks) AND (
           json_type(hooks, '$.rollout') IS NOT NULL
        OR (json_type(hooks, '$.pre_command') IS NOT NULL
            AND coalesce(json_extract(hooks, '$.pre_command.exit_code'), -1) <> 0)
        OR (json_type(hooks, '$.command') IS NOT NULL
            AND coalesce(json_extract(hooks, '$.command.exit_code'), -1) <> 0));
    "#,
    // 11 (issue 12): deploy trigger files and the activity log. Self-contained: creates its
    // own tables only.
    r#"
    -- One row per trigger file (`.voodu/**/*.yml`) of the last applied commit: the commit
    -- it last fired (or was approved) at and the manifest it applied then; a held commit
    -- (`deploy: manual`) and its approval; why it never fires on this host ('' while it can).
    -- The meta row 'trigger_base' is the last applied commit changed paths are diffed from.
    CREATE TABLE triggers (
        path            TEXT PRIMARY KEY,
        name            TEXT NOT NULL,
        applied_commit  TEXT,
        applied_file    TEXT,
        applied_seq     INTEGER,
        held_commit     TEXT,
        held_file       TEXT,
        held_since      INTEGER,
        approved_by     TEXT,
        approved_at     INTEGER,
        inactive        TEXT NOT NULL DEFAULT ''
    );
    -- Every change the agent made or was asked to make, newest last; kept 30 days.
    -- Config changes hold the key and a keyed digest of the value, never the value.
    CREATE TABLE activity (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        at          INTEGER NOT NULL,
        action      TEXT NOT NULL,
        origin      TEXT NOT NULL,
        actor       TEXT NOT NULL DEFAULT '',
        commit_sha  TEXT NOT NULL DEFAULT '',
        resource    TEXT NOT NULL DEFAULT '',
        outcome     TEXT NOT NULL,
        message     TEXT NOT NULL DEFAULT '',
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX activity_by_time ON activity (at);
    "#,
    // 12 (issue 28): notifications. The outbox holds the events people are told about, each
    // written in the transaction of the change it reports; each sink keeps how far it got.
    r#"
    CREATE TABLE outbox (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        at          INTEGER NOT NULL,
        event       TEXT NOT NULL,
        scope       TEXT NOT NULL DEFAULT '',
        resource    TEXT NOT NULL DEFAULT '',
        commit_sha  TEXT NOT NULL DEFAULT '',
        message     TEXT NOT NULL DEFAULT '',
        data        TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX outbox_by_time ON outbox (at);
    -- One row per configured sink: the last event id it is done with (delivered, filtered
    -- out or expired), its last success and error, and how many events it dropped.
    CREATE TABLE sinks (
        name          TEXT PRIMARY KEY,
        done_id       INTEGER NOT NULL,
        last_success  INTEGER,
        last_error    TEXT NOT NULL DEFAULT '',
        last_error_at INTEGER,
        delivered     INTEGER NOT NULL DEFAULT 0,
        dropped       INTEGER NOT NULL DEFAULT 0
    );
    -- Whether the current failing streak of a subject was announced (fetch.failing,
    -- engine.unreachable), so its end is announced too.
    ALTER TABLE health ADD COLUMN announced INTEGER NOT NULL DEFAULT 0;
    "#,
    // 13 (issue 26): several repositories. Each commit, desired row, deploy trigger, asset
    // blob and activity row belongs to the source (repository) that brought it; '' is the
    // single `--repo` source, and every row from before is its.
    r#"
    ALTER TABLE commits ADD COLUMN source TEXT NOT NULL DEFAULT '';
    CREATE INDEX commits_by_source ON commits (source, seq);
    ALTER TABLE desired ADD COLUMN source TEXT NOT NULL DEFAULT '';
    ALTER TABLE activity ADD COLUMN source TEXT NOT NULL DEFAULT '';
    CREATE TABLE triggers_by_source (
        source          TEXT NOT NULL DEFAULT '',
        path            TEXT NOT NULL,
        name            TEXT NOT NULL,
        applied_commit  TEXT,
        applied_file    TEXT,
        applied_seq     INTEGER,
        held_commit     TEXT,
        held_file       TEXT,
        held_since      INTEGER,
        approved_by     TEXT,
        approved_at     INTEGER,
        inactive        TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (source, path)
    );
    INSERT INTO triggers_by_source (path, name, applied_commit, applied_file, applied_seq,
        held_commit, held_file, held_since, approved_by, approved_at, inactive)
      SELECT path, name, applied_commit, applied_file, applied_seq, held_commit, held_file,
        held_since, approved_by, approved_at, inactive FROM triggers;
    DROP TABLE triggers;
    ALTER TABLE triggers_by_source RENAME TO triggers;
    -- Asset bytes per source: a commit of one source keeps only its own live blobs.
    CREATE TABLE blobs_by_source (
        source  TEXT NOT NULL DEFAULT '',
        digest  TEXT NOT NULL,
        bytes   BLOB NOT NULL,
        PRIMARY KEY (source, digest)
    );
    INSERT INTO blobs_by_source (digest, bytes) SELECT digest, bytes FROM blobs;
    DROP TABLE blobs;
    ALTER TABLE blobs_by_source RENAME TO blobs;
    CREATE INDEX blobs_by_digest ON blobs (digest);
    "#,
    // ---- issue 27: image automation (its own entry, kept last so a merge only renumbers) ----
    // 14: the tags of each followed image repository, scanned once per interval whatever the
    // number of resources following it, with the last scan's error and the registry's
    // Retry-After; and per resource with `image_update`, the tag its policy chose and what
    // committing it did.
    r#"
    CREATE TABLE image_scans (
        repository  TEXT PRIMARY KEY,
        scanned_at  INTEGER NOT NULL,
        tags        TEXT NOT NULL DEFAULT '[]',
        tags_at     INTEGER,
        error       TEXT NOT NULL DEFAULT '',
        not_before  INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE image_updates (
        kind          TEXT NOT NULL,
        scope         TEXT NOT NULL,
        name          TEXT NOT NULL,
        image         TEXT NOT NULL,
        repository    TEXT NOT NULL,
        policy        TEXT NOT NULL,
        mode          TEXT NOT NULL,
        latest        TEXT NOT NULL DEFAULT '',
        checked_at    INTEGER NOT NULL,
        commit_sha    TEXT NOT NULL DEFAULT '',
        commit_error  TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (kind, scope, name)
    );
    "#,
    // ---- end of issue 27 ----
    // ---- issue 47 ----
    // 15: what of a scan's listing was left out (the registry listed more tags or pages than
    // a scan considers), shown beside the scan: the tags of a scan are no longer silently
    // the first 20,000.
    r#"
    ALTER TABLE image_scans ADD COLUMN note TEXT NOT NULL DEFAULT '';
    "#,
    // 16: what one source holds on the host alone, first come (issue 47): ingress hosts,
    // published host ports, named volumes (`store/claims.rs`).
    r#"
    CREATE TABLE claims (
        what     TEXT NOT NULL,
        value    TEXT NOT NULL,
        source   TEXT NOT NULL,
        key      TEXT NOT NULL,
        since    INTEGER NOT NULL,
        adopted  INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (what, value)
    );
    CREATE INDEX claims_by_source ON claims (source);
    "#,
    // 17: a release is exact bytes (issue 48): what each image of a release runs as, resolved
    // once when it starts (`images`, JSON image → `name@sha256:…` or an image id); releases
    // recorded before are `legacy` ("digest unknown") and keep running their tag until the
    // next rollout. Job and cronjob runs resolve once per spec (`run_images`). Digests whose
    // signature was verified, and under which keys (`verified_images`). What a running
    // release's tag names at its registry now (`tag_digests`: a tag that moved).
    r#"
    ALTER TABLE releases ADD COLUMN images TEXT;
    ALTER TABLE releases ADD COLUMN legacy INTEGER NOT NULL DEFAULT 0;
    UPDATE releases SET legacy = 1;
    CREATE TABLE run_images (
        kind        TEXT NOT NULL,
        scope       TEXT NOT NULL,
        name        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        images      TEXT NOT NULL,
        resolved_at INTEGER NOT NULL,
        PRIMARY KEY (kind, scope, name, spec_hash)
    );
    CREATE TABLE verified_images (
        digest      TEXT NOT NULL,
        keys        TEXT NOT NULL,
        verified_at INTEGER NOT NULL,
        PRIMARY KEY (digest, keys)
    );
    CREATE TABLE tag_digests (
        image       TEXT PRIMARY KEY,
        digest      TEXT NOT NULL DEFAULT '',
        error       TEXT NOT NULL DEFAULT '',
        checked_at  INTEGER NOT NULL
    );
    "#,
    // ---- issue 50 ----
    // 18: data runs (`store/backups.rs`): the backups, restores and verifies of a
    // statefulset's claims, each from asked for to ended, with the restic snapshots it took or
    // put back.
    r#"
    CREATE TABLE data_runs (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        kind          TEXT NOT NULL,
        scope         TEXT NOT NULL,
        name          TEXT NOT NULL,
        what          TEXT NOT NULL CHECK (what IN ('backup', 'restore', 'verify')),
        reason        TEXT NOT NULL,
        release_id    INTEGER,
        state         TEXT NOT NULL
                      CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'superseded')),
        ordinal       INTEGER NOT NULL DEFAULT 0,
        step          TEXT NOT NULL DEFAULT '',
        only_ordinal  INTEGER,
        snapshots     TEXT NOT NULL DEFAULT '{}',
        bytes         INTEGER NOT NULL DEFAULT 0,
        message       TEXT NOT NULL DEFAULT '',
        requested_at  INTEGER NOT NULL,
        started_at    INTEGER,
        ended_at      INTEGER
    );
    CREATE INDEX data_runs_by_key ON data_runs (kind, scope, name, id);
    CREATE INDEX data_runs_by_release ON data_runs (release_id);
    CREATE INDEX data_runs_by_state ON data_runs (state);
    "#,
    // ---- issue 52: maintenance ----
    // 19: deployments in maintenance (`store/maintenance.rs`): the ingress answers 503 with a
    // page for their routes while the replicas keep running. `meta.maintenance_version` is
    // bumped by every change, so the running agent notices another process's.
    r#"
    CREATE TABLE maintenance (
        scope        TEXT NOT NULL,
        name         TEXT NOT NULL,
        message      TEXT NOT NULL,
        retry_after  INTEGER NOT NULL,
        since        INTEGER NOT NULL,
        origin       TEXT NOT NULL,
        actor        TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (scope, name)
    );
    "#,
    // ---- issue 52: deploy windows and freezes ----
    // 20: holds and freezes (`store/holds.rs`): per source, the accepted commit a deploy
    // window or a freeze holds (with `approve --now`'s release), and the freezes in force
    // (`target`: a source's name, `''` for the single `--repo` source, `*` for every source).
    r#"
    CREATE TABLE holds (
        source      TEXT PRIMARY KEY,
        sha         TEXT NOT NULL,
        since       INTEGER NOT NULL,
        until       INTEGER,
        reason      TEXT NOT NULL,
        frozen      INTEGER NOT NULL DEFAULT 0,
        released_by TEXT,
        released_at INTEGER
    );
    CREATE TABLE freezes (
        target  TEXT PRIMARY KEY,
        until   INTEGER,
        reason  TEXT NOT NULL,
        by      TEXT NOT NULL DEFAULT '',
        at      INTEGER NOT NULL
    );
    "#,
    // ---- issue 52: branch previews ----
    // 21: branch previews (`store/previews.rs`): one row per preview a source knows.
    r#"
    CREATE TABLE previews (
        source   TEXT NOT NULL,
        slug     TEXT NOT NULL,
        branch   TEXT NOT NULL,
        sha      TEXT NOT NULL,
        state    TEXT NOT NULL CHECK (state IN ('live', 'refused', 'expired')),
        message  TEXT NOT NULL DEFAULT '',
        hosts    TEXT NOT NULL DEFAULT '',
        scopes   TEXT NOT NULL DEFAULT '',
        created  INTEGER NOT NULL,
        pushed   INTEGER NOT NULL,
        expires  INTEGER NOT NULL,
        PRIMARY KEY (source, slug)
    );
    "#,
    // ---- issue 53: the resource timeline ----
    // 22: which sinks delivered each outbox event (`store/outbox.rs`, the timeline's "sent
    // to"); pruned with the outbox.
    r#"
    CREATE TABLE deliveries (
        event_id INTEGER NOT NULL,
        sink     TEXT NOT NULL,
        at       INTEGER NOT NULL,
        PRIMARY KEY (event_id, sink)
    ) WITHOUT ROWID;
    "#,
    // ---- issue 51: progressive delivery ----
    // 23: rollouts (`store/rollouts.rs`): one row per deployment rolling out by `canary {}` or
    // `blue_green {}`: the step, its share, the pause, the last analysis, the requests, and
    // (blue/green) the new release's replicas the router keeps apart.
    r#"
    CREATE TABLE rollouts (
        scope             TEXT NOT NULL,
        name              TEXT NOT NULL,
        release           TEXT NOT NULL,
        strategy          TEXT NOT NULL CHECK (strategy IN ('canary', 'blue_green')),
        step              INTEGER NOT NULL,
        share             INTEGER NOT NULL,
        canary_replicas   INTEGER NOT NULL,
        started           INTEGER NOT NULL,
        paused_until      INTEGER,
        phase             TEXT NOT NULL
                          CHECK (phase IN ('progressing', 'paused', 'promoted', 'aborted')),
        verdict           TEXT NOT NULL DEFAULT '',
        analysis          TEXT NOT NULL DEFAULT 'null',
        promote_requested INTEGER NOT NULL DEFAULT 0,
        abort_requested   INTEGER NOT NULL DEFAULT 0,
        updated           INTEGER NOT NULL,
        green             TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (scope, name)
    );
    "#,
];
