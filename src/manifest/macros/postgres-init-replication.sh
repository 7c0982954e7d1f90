#!/bin/sh
# Written by voodu-agent's postgres expansion; do not edit (every apply writes it again).
#
# Run once, by the postgres image's entrypoint, right after initdb on the primary: creates the
# role standbys stream with and lets it connect for replication. Standbys never run it: they
# clone the primary, this role and pg_hba.conf included. It is sourced by that entrypoint, so
# it never calls `exit`.
voodu_repl_user="${PG_REPLICATION_USER:-replicator}"
voodu_repl_password=$(printf '%s' "${POSTGRES_REPLICATION_PASSWORD:?POSTGRES_REPLICATION_PASSWORD is not in the config bucket}" | sed "s/'/''/g")
echo "voodu-postgres: creating the replication role $voodu_repl_user" >&2
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
CREATE ROLE "$voodu_repl_user" WITH REPLICATION LOGIN PASSWORD '$voodu_repl_password';
SQL
# md5 also accepts a SCRAM password (postgres 14+ hashes with SCRAM by default).
printf '\n# voodu-agent: standbys stream as %s\nhost replication %s all md5\n' \
    "$voodu_repl_user" "$voodu_repl_user" >>"$PGDATA/pg_hba.conf"
