#!/bin/sh
# Written by voodu-agent's postgres expansion; do not edit (every apply writes it again).
#
# Role-aware entrypoint of a postgres statefulset pod. The pod whose VOODU_REPLICA_ORDINAL
# equals PG_PRIMARY_ORDINAL (the resource's config bucket; 0 when unset) is the primary. Any
# other pod is a streaming standby: on its first boot it clones the primary with
# pg_basebackup, then it always starts in recovery, following the primary named
# <PG_NAME>-<primary ordinal><PG_SCOPE_SUFFIX>. Arguments are passed on to postgres
# (`-c name=value` from pg_config).
set -eu

PGDATA="${PGDATA:-/var/lib/postgresql/data/pgdata}"
export PGDATA
port="${PGPORT:-5432}"
ordinal="${VOODU_REPLICA_ORDINAL:-0}"
primary="${PG_PRIMARY_ORDINAL:-0}"
auto_conf="$PGDATA/postgresql.auto.conf"

say() { echo "voodu-postgres: $*" >&2; }

# WAL the primary keeps for a standby that falls behind (no replication slots, so an
# abandoned standby cannot make WAL grow without end): wal_keep_size from postgres 13 on.
major=$(postgres --version 2>/dev/null | sed -n 's/^[^0-9]*\([0-9][0-9]*\).*/\1/p')
if [ "${major:-0}" -ge 13 ]; then
    keep="wal_keep_size=1GB"
else
    keep="wal_keep_segments=64"
fi

# Drops every primary_conninfo line from postgresql.auto.conf (read last by postgres).
forget_primary() {
    if [ -f "$auto_conf" ]; then
        sed -i '/^primary_conninfo[[:space:]]*=/d' "$auto_conf"
    fi
}

if [ "$ordinal" = "$primary" ]; then
    say "pod $ordinal is the primary"
    # A pod promoted from standby keeps no pointer to its old primary.
    forget_primary
else
    host="${PG_NAME:?PG_NAME is not set}-${primary}${PG_SCOPE_SUFFIX:-.voodu}"
    user="${PG_REPLICATION_USER:?PG_REPLICATION_USER is not set}"
    password="${POSTGRES_REPLICATION_PASSWORD:?POSTGRES_REPLICATION_PASSWORD is not in the config bucket}"
    # Set before a clone starts and removed once it is complete: found at boot, it means a
    # clone was cut short (a restart, the host going down) and its half-copied data is wiped.
    marker="$(dirname "$PGDATA")/.voodu-basebackup-incomplete"
    mkdir -p "$(dirname "$PGDATA")"
    if [ -f "$marker" ]; then
        say "pod $ordinal: an earlier clone of the primary was cut short; cloning again"
        # When PGDATA is the volume's mount point only its contents can go, which is enough.
        rm -rf "$PGDATA" 2>/dev/null || true
    fi
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        say "pod $ordinal is a standby: waiting for the primary $host:$port"
        tries=0
        until pg_isready -h "$host" -p "$port" -t 5 >/dev/null 2>&1; do
            tries=$((tries + 1))
            if [ "$tries" -ge 60 ]; then
                say "the primary $host:$port did not answer in 60 tries; giving up (the pod is started again)"
                exit 1
            fi
            sleep 5
        done
        touch "$marker"
        say "cloning $host:$port into $PGDATA as $user"
        if ! PGPASSWORD="$password" pg_basebackup -h "$host" -p "$port" -U "$user" \
            -D "$PGDATA" -X stream; then
            say "pg_basebackup failed; the next boot wipes the partial copy and clones again"
            exit 1
        fi
        touch "$PGDATA/standby.signal"
        rm -f "$marker"
        say "clone complete; starting as a standby"
    elif [ ! -f "$PGDATA/standby.signal" ]; then
        # This data was last run by a primary (PG_PRIMARY_ORDINAL moved after a failover, or
        # an old volume came back): starting it would make a second primary.
        say "pod $ordinal should be a standby of pod $primary, but its data was last used by a primary."
        say "Refusing to start, so that two primaries never run at once. Either rejoin it with"
        say "pg_rewind against $host, then create $PGDATA/standby.signal; or remove this pod's"
        say "container and its data volume, and it is cloned from the primary again."
        exit 1
    fi
    # Where to stream from, written at every boot so a changed PG_PRIMARY_ORDINAL is followed.
    # postgresql.conf quoting: a single quote is doubled.
    quoted=$(printf '%s' "$password" | sed "s/'/''/g")
    forget_primary
    printf "primary_conninfo = 'host=%s port=%s user=%s password=%s application_name=%s'\n" \
        "$host" "$port" "$user" "$quoted" "${PG_NAME}-${ordinal}" >>"$auto_conf"
fi

exec docker-entrypoint.sh postgres -p "$port" -c "$keep" "$@"
