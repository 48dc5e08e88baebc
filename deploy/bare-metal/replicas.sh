#!/usr/bin/env bash
# The replicas of one node, without systemd: N servers of P GPUs each on ports BASE+1 .. BASE+N, restarted when
# they exit, all stopped on Ctrl-C or SIGTERM. Run it on every node, then the gateway once:
#   smg launch --host 0.0.0.0 --port 8000 --policy cache_aware --worker-urls http://node1:8001 http://node1:8002 ...
# (on one machine, `diffuserve serve MODEL --replicas N --gateway smg` does both).
#   deploy/bare-metal/replicas.sh MODEL [N=2] [P=1] [BASE=8000] [extra diffuserve serve flags...]
set -euo pipefail
model=${1:?usage: replicas.sh MODEL [N] [P] [BASE] [flags...]}
n=${2:-2}
p=${3:-1}
base=${4:-8000}
shift $(( $# < 4 ? $# : 4 ))
pids=()
stopping=0

stop_all() {
  stopping=1
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait
}
trap stop_all INT TERM

replica() {  # replica INDEX: restart the server whenever it exits, until this script is told to stop
  local i=$1 first=$(( $1 * p ))
  shift
  local gpus
  gpus=$(seq -s, "$first" $(( first + p - 1 )))
  while [ "$stopping" = 0 ]; do
    CUDA_VISIBLE_DEVICES=$gpus diffuserve serve "$model" --host 0.0.0.0 --port $(( base + 1 + i )) \
      --tensor-parallel-size "$p" "$@" &
    wait $! || echo "replica $i exited with code $?; restarting" >&2
    sleep 2
  done
}

for (( i = 0; i < n; i++ )); do
  ( trap 'kill -TERM $(jobs -p) 2>/dev/null; exit 0' TERM; replica "$i" "$@" ) &
  pids+=($!)
done
for (( i = 0; i < n; i++ )); do
  until curl -sf "http://127.0.0.1:$(( base + 1 + i ))/health" >/dev/null; do sleep 1; done
  echo "replica $i ready on port $(( base + 1 + i ))"
done
wait
