#!/bin/sh
# The muongen images' entrypoint (installed as /usr/local/bin/muongen-entrypoint).
#
#   muongen-entrypoint train --config demo     -> muongen train --config demo
#   muongen-entrypoint --help                  -> muongen --help
#   muongen-entrypoint python -c '...'         -> python -c '...'   (any other command)
#   muongen-entrypoint jobs/node.sh ...        -> jobs/node.sh ...
#
# It sources env.sh (threads from the HTCondor slot, caches and temp files in the job's
# scratch dir), then replaces itself with the command (exec): the trainer becomes the
# container's main process, so the SIGTERM that docker stop / HTCondor eviction sends
# reaches it directly and it can write its checkpoint.
#
# MUONGEN_BIN overrides the muongen executable (tests use a stand-in).
set -eu

# Verbs of `muongen` (muongen/cli.py VERBS; a test keeps the two in step).
MUONGEN_VERBS="train chain sample export evaluate synth inspect outliers tb-merge compare bench doctor config"

here=$(dirname "$0")
for env_sh in "$here/env.sh" /opt/muongen/container/env.sh; do
    if [ -r "$env_sh" ]; then
        # shellcheck source=container/env.sh
        . "$env_sh"
        break
    fi
done

muongen_bin=${MUONGEN_BIN:-muongen}

if [ "$#" -eq 0 ]; then
    exec "$muongen_bin" --help
fi

case $1 in
    -*) exec "$muongen_bin" "$@" ;;
esac
for verb in $MUONGEN_VERBS; do
    if [ "$1" = "$verb" ]; then
        exec "$muongen_bin" "$@"
    fi
done

if ! command -v "$1" >/dev/null 2>&1; then
    echo "muongen-entrypoint: '$1' is neither a muongen verb ($MUONGEN_VERBS) nor a command" >&2
    exit 127
fi
exec "$@"
