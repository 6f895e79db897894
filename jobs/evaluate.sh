#!/bin/sh
# The evaluate node of a sweep member (HTCondor runs it inside the container image, after
# the member's chain): score the member's last checkpoint on held-out data.
#
#   evaluate.sh --checkpoint <range>.json --data URL --events N
#
# runs `muongen evaluate ARGS --out eval`, then leaves eval/metrics.json at the top of the
# scratch dir twice: metrics.json (HTCondor publishes it next to the member's checkpoints)
# and metrics-receipt.json (sent back to the access point for the compare node). A failed
# evaluation exits with muongen's status, so DAGMan retries it (never after 2: a user error).
set -eu
muongen=${MUONGEN_BIN:-muongen}
if [ -x /usr/local/bin/muongen-entrypoint ]; then
    # the entrypoint sets threads and caches from the slot, then runs the command
    set -- /usr/local/bin/muongen-entrypoint "$muongen" evaluate "$@" --out eval
else
    set -- "$muongen" evaluate "$@" --out eval
fi
"$@"
if [ ! -s eval/metrics.json ]; then
    echo "evaluate.sh: muongen evaluate exited 0 but wrote no eval/metrics.json" >&2
    exit 1
fi
cp eval/metrics.json metrics.json
cp eval/metrics.json metrics-receipt.json
