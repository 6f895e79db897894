#!/bin/sh
# The executable of every DAG node (HTCondor runs it inside the container image).
# HTCondor's `apptainer exec` skips the image's %runscript, so go through the entrypoint
# ourselves: it sets threads from the slot and points caches at the job's scratch dir,
# then execs `muongen chain --node ARGS`, keeping SIGTERM (eviction) for the trainer.
set -eu
if [ -x /usr/local/bin/muongen-entrypoint ]; then
    exec /usr/local/bin/muongen-entrypoint chain --node "$@"
fi
exec "${MUONGEN_BIN:-muongen}" chain --node "$@"
