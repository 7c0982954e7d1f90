#!/bin/sh
# Written by voodu-agent's redis expansion; do not edit (every apply writes it again).
#
# Entrypoint of a redis sentinel pod (`redis { sentinel { monitor = "scope/name" } }`): writes
# the sentinel config from the environment, then runs redis in sentinel mode. It watches the
# master of the monitored redis, <VOODU_MONITOR_NAME>-<REDIS_MASTER_ORDINAL>.<scope>.voodu
# (REDIS_MASTER_ORDINAL and REDIS_PASSWORD come from the monitored resource's config bucket,
# through env_from), with a quorum of a majority of VOODU_REDIS_REPLICAS sentinels.
set -eu

monitored="${VOODU_MONITOR_NAME:?VOODU_MONITOR_NAME is not set}"
monitored_scope="${VOODU_MONITOR_SCOPE:-}"
replicas="${VOODU_REDIS_REPLICAS:-3}"
master="${REDIS_MASTER_ORDINAL:-0}"
quorum=$((replicas / 2 + 1))
if [ -n "$monitored_scope" ]; then
    host="${monitored}-${master}.${monitored_scope}.voodu"
else
    host="${monitored}-${master}.voodu"
fi
self="${REDIS_NAME:?REDIS_NAME is not set}-${VOODU_REPLICA_ORDINAL:-0}${REDIS_SCOPE_SUFFIX:-.voodu}"

state=/var/lib/sentinel
conf="$state/sentinel.conf"
mkdir -p "$state" /etc/sentinel/conf.d

# What sentinel learnt on earlier boots (its id, peers, replicas, epochs) is kept, so a
# sentinel that starts while the master is down still knows the quorum; everything else is
# written again from the environment.
kept=""
if [ -s "$conf" ]; then
    kept=$(grep -E '^(sentinel (myid|known-sentinel|known-replica|config-epoch|leader-epoch)|current-epoch) ' "$conf" || true)
fi
{
    echo "port 26379"
    echo "dir $state"
    echo "sentinel resolve-hostnames yes"
    echo "sentinel announce-hostnames yes"
    echo "sentinel announce-ip $self"
    echo "sentinel monitor voodu-master $host 6379 $quorum"
    echo "sentinel down-after-milliseconds voodu-master 5000"
    echo "sentinel failover-timeout voodu-master 30000"
    echo "sentinel parallel-syncs voodu-master 1"
    if [ -n "${REDIS_PASSWORD:-}" ]; then
        echo "sentinel auth-pass voodu-master $REDIS_PASSWORD"
    fi
    echo "include /etc/sentinel/conf.d/*.conf"
    if [ -n "$kept" ]; then
        printf '%s\n' "$kept"
    fi
} >"$conf.new"
mv "$conf.new" "$conf"

echo "voodu-sentinel: watching $host:6379 (quorum $quorum of $replicas)" >&2
exec redis-server "$conf" --sentinel
