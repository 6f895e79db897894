#!/bin/sh
# The FINAL node of a sweep (inside the container image): rank every evaluation that came
# back into a leaderboard.
#
#   compare.sh metrics --out board
#
# metrics/ is the DAG directory's folder of metrics/<member>/metrics.json plus members.json;
# a member without metrics.json (its chain or evaluation failed) is a failed row.
set -eu
muongen=${MUONGEN_BIN:-muongen}
if [ -x /usr/local/bin/muongen-entrypoint ]; then
    exec /usr/local/bin/muongen-entrypoint "$muongen" compare "$@"
fi
exec "$muongen" compare "$@"
