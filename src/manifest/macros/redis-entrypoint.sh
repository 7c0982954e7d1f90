#!/bin/sh
# Written by voodu-agent's redis expansion; do not edit (every apply writes it again).
#
# Role-aware entrypoint of a redis statefulset pod. The pod whose VOODU_REPLICA_ORDINAL
# equals REDIS_MASTER_ORDINAL (the resource's config bucket; 0 when unset) is the master;
# every other pod replicates it from <REDIS_NAME>-<master ordinal><REDIS_SCOPE_SUFFIX>. Each
# pod announces its own such name, so replicas and sentinels know pods by name, not by an
# address that changes when a container is recreated.
set -eu

ordinal="${VOODU_REPLICA_ORDINAL:-0}"
master="${REDIS_MASTER_ORDINAL:-0}"
name="${REDIS_NAME:?REDIS_NAME is not set}"
suffix="${REDIS_SCOPE_SUFFIX:-.voodu}"

set -- /etc/redis/redis.conf --replica-announce-ip "${name}-${ordinal}${suffix}" "$@"
if [ -n "${REDIS_PASSWORD:-}" ]; then
    set -- "$@" --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD"
fi

if [ "$ordinal" = "$master" ]; then
    echo "voodu-redis: pod $ordinal is the master" >&2
    exec redis-server "$@"
fi
host="${name}-${master}${suffix}"
echo "voodu-redis: pod $ordinal replicates $host:6379" >&2
exec redis-server "$@" --replicaof "$host" 6379
