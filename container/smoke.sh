#!/usr/bin/env bash
# The CPU image built from this checkout and run for real, with no network inside:
#
#   container/smoke.sh                 # podman, else docker; builds localhost/muongen:smoke
#   .venv/bin/python -m pytest -m container tests/container   # the same, as a pytest
#
# Steps (each prints ok/FAIL, the command it ran and its time; the first failure stops it):
#   build   the image (VARIANT=cpu); its build time and size are printed
#   doctor  `muongen doctor` through the entrypoint
#   demo    the demo for 20 steps as a non-root user into a bind-mounted folder
#   resume  a second container continues that run with `--resume auto` to step 40
#   synth   synthetic input files for one grid range, into a bind mount
#   evict   a grid node (jobs/node.sh through the entrypoint) training that range gets
#           `stop` (SIGTERM): it must checkpoint and exit 85 (restart me)
#   node    the node run again in a new container: it resumes from its own checkpoint,
#           trains to the end of the range and leaves <range>.pt/.json and receipt.json
#
# Settings (environment):
#   ENGINE=podman|docker          default: podman where installed, else docker
#   IMAGE=localhost/muongen:smoke the tag built and run; SKIP_BUILD=1 runs it as it is
#   CPU_IMAGE                     the base (Dockerfile default: python:3.11-slim)
#   TORCH_FIND_LINKS=DIR          the CPU torch wheel from this folder (podman mounts it)
#   CA_BUNDLE=FILE                mounted over the build's /etc/ssl/certs/ca-certificates.crt
#                                 and given to pip as PIP_CERT (podman; for a TLS-intercepting
#                                 proxy or a private mirror)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL   passed to the build where set
#   BUILD_FLAGS                   more flags for `build` (word-split)
#   WORK=DIR                      where the bind-mounted folders go (default: a new temp dir,
#                                 removed after a pass, kept after a failure)
# As root the containers run as uid:gid 4242:4242 (a user the image does not know, as
# `--user "$(id -u):$(id -g)"` is on a laptop); rootless podman gets `--userns keep-id`.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
engine=${ENGINE:-}
if [ -z "$engine" ]; then
    if command -v podman >/dev/null 2>&1; then
        engine=podman
    elif command -v docker >/dev/null 2>&1; then
        engine=docker
    else
        echo "smoke.sh: neither podman nor docker is installed" >&2
        exit 2
    fi
fi
image=${IMAGE:-localhost/muongen:smoke}
range=0000000-0000999
node_name=muongen-smoke-node-$$

if [ -n "${WORK:-}" ]; then
    work=$WORK
    mkdir -p "$work"
    keep_work=1
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/muongen-smoke.XXXXXX")
    keep_work=0
fi

user_flags=()
if [ "$(id -u)" -eq 0 ]; then
    run_user=4242:4242
else
    run_user="$(id -u):$(id -g)"
    if [ "$engine" = podman ]; then
        user_flags+=(--userns keep-id)
    fi
fi
user_flags+=(--user "$run_user")

current=setup
started=$(date +%s)
finish() {
    local rc=$?
    "$engine" rm -f "$node_name" >/dev/null 2>&1 || :
    if [ "$rc" -ne 0 ]; then
        echo "FAIL  $current (exit $rc); bind-mounted folders kept in $work"
    elif [ "$keep_work" -eq 0 ]; then
        rm -rf "$work"
    fi
    exit "$rc"
}
trap finish EXIT

step() {
    current=$1
    step_started=$(date +%s)
    echo
    echo "== $1: $2"
}
ok() {
    echo "ok    $current ($(($(date +%s) - step_started)) s)${1:+: $1}"
}
fail() {
    echo "$current: $1" >&2
    exit 1
}
show() {
    # print a command (quoted as a shell would need it), then run it
    printf '$'
    printf ' %q' "$@"
    printf '\n'
    "$@"
}

# ---- build ---------------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    step build "the CPU image from $repo"
    build=("$engine" build --build-arg VARIANT=cpu -t "$image")
    if [ "$engine" = podman ]; then
        # docker format keeps the HEALTHCHECK; host network as docker build has it
        build+=(--format docker --network host)
    fi
    if [ -n "${CPU_IMAGE:-}" ]; then
        build+=(--build-arg "CPU_IMAGE=$CPU_IMAGE")
    fi
    if [ -n "${TORCH_FIND_LINKS:-}" ]; then
        [ "$engine" = podman ] || fail "TORCH_FIND_LINKS needs podman (docker build cannot mount a folder)"
        build+=(--volume "$TORCH_FIND_LINKS:$TORCH_FIND_LINKS:ro" --build-arg "TORCH_FIND_LINKS=$TORCH_FIND_LINKS")
    fi
    if [ -n "${CA_BUNDLE:-}" ]; then
        [ "$engine" = podman ] || fail "CA_BUNDLE needs podman (docker build cannot mount a file)"
        build+=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"
            --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
    fi
    for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
        if [ -n "${!var:-}" ]; then
            build+=(--build-arg "$var=${!var}")
        fi
    done
    # shellcheck disable=SC2206  # BUILD_FLAGS is a list of flags, split on purpose
    build+=(${BUILD_FLAGS:-} "$repo")
    show "${build[@]}"
    ok "build time $(($(date +%s) - step_started)) s"
fi
size=$("$engine" image inspect --format '{{.Size}}' "$image")
echo "image $image: $((size / 1000000)) MB"

run=("$engine" run --rm --network none)

# ---- doctor ---------------------------------------------------------------------------------
step doctor "muongen doctor inside the image, no network"
out=$(show "${run[@]}" "$image" doctor 2>&1) || { echo "$out"; fail "muongen doctor failed"; }
echo "$out"
grep -q "torch" <<<"$out" || fail "doctor did not report torch"
ok

# ---- demo -----------------------------------------------------------------------------------
ws=$work/workspace
mkdir -p "$ws"
if [ "$(id -u)" -eq 0 ]; then
    chown "$run_user" "$ws"
fi
step demo "the demo for 20 steps as $run_user into a bind-mounted /workspace"
show "${run[@]}" "${user_flags[@]}" -v "$ws:/workspace" "$image" \
    train --config demo --max-steps 20 --out runs/demo
ckpt=$ws/runs/demo/checkpoints/step-000000020
[ -s "$ckpt.pt" ] && [ -s "$ckpt.json" ] || fail "no checkpoint $ckpt.pt/.json"
owner=$(stat -c %u:%g "$ckpt.pt")
[ "$owner" = "$run_user" ] || fail "$ckpt.pt belongs to $owner, not $run_user"
ls -l "$ws/runs/demo" "$ws/runs/demo/checkpoints"
ok "step-000000020.pt/.json owned by $owner"

# ---- resume ---------------------------------------------------------------------------------
step resume "a second container continues the demo run with --resume auto to step 40"
out=$(show "${run[@]}" "${user_flags[@]}" -v "$ws:/workspace" "$image" \
    train --config demo --max-steps 40 --out runs/demo --resume auto 2>&1) \
    || { echo "$out"; fail "the resumed run failed"; }
echo "$out"
grep -q "resumed from .*step-000000020.* at step 20" <<<"$out" || fail "it did not resume at step 20"
[ -s "$ws/runs/demo/checkpoints/step-000000040.json" ] || fail "no checkpoint at step 40"
ok "resumed at step 20, checkpoint at step 40"

# ---- a grid node ----------------------------------------------------------------------------
data=$work/data
scratch=$work/scratch
mkdir -p "$data" "$scratch"
if [ "$(id -u)" -eq 0 ]; then
    chown "$run_user" "$data" "$scratch"
fi
step synth "synthetic input files for range $range, into a bind mount"
show "${run[@]}" "${user_flags[@]}" -v "$data:/data" "$image" \
    synth --out /data --ranges --files 2 --events-per-file 8000 --mix rich
ls "$data/$range"
ok

node=(/opt/muongen/jobs/node.sh --range "$range" --data "/data/$range/*.parquet"
    --preset demo --set train.log_every=2)
node_mounts=(-v "$data:/data:ro" -v "$scratch:/scratch" -e _CONDOR_SCRATCH_DIR=/scratch
    -w /scratch)

step evict "SIGTERM ($engine stop) while the node trains: a checkpoint and exit 85"
show "$engine" run -d --name "$node_name" --network none "${user_flags[@]}" "${node_mounts[@]}" \
    "$image" "${node[@]}" >/dev/null
for _ in $(seq 600); do
    if "$engine" logs "$node_name" 2>&1 | grep -Eq '(^| )step [1-9]'; then
        break
    fi
    state=$("$engine" inspect --format '{{.State.Status}}' "$node_name")
    [ "$state" = running ] || { "$engine" logs "$node_name"; fail "the node stopped early"; }
    sleep 0.5
done
show "$engine" stop -t 120 "$node_name" >/dev/null
code=$("$engine" wait "$node_name" 2>/dev/null || "$engine" inspect --format '{{.State.ExitCode}}' "$node_name")
"$engine" logs "$node_name" 2>&1 | tail -n 8
"$engine" rm "$node_name" >/dev/null
[ "$code" = 85 ] || fail "exit code $code after SIGTERM, not 85"
own=$(find "$scratch/run-$range/checkpoints" -name 'step-*.json' | sort | tail -n 1)
[ -n "$own" ] || fail "no self-checkpoint in $scratch/run-$range/checkpoints"
ok "exit 85, self-checkpoint $(basename "$own" .json)"

step node "the node again in a new container: resumes, finishes the range, leaves its receipt"
out=$(show "${run[@]}" "${user_flags[@]}" "${node_mounts[@]}" "$image" "${node[@]}" 2>&1) \
    || { echo "$out"; fail "the restarted node failed"; }
echo "$out" | tail -n 8
grep -q "resuming from its own checkpoint" <<<"$out" || fail "the node did not resume"
for f in "$range.pt" "$range.json" receipt.json; do
    [ -s "$scratch/$f" ] || fail "the node left no $f"
done
cmp -s "$scratch/receipt.json" "$scratch/$range.json" || fail "receipt.json is not the manifest"
cat "$scratch/receipt.json"
echo
ok "$range.pt/.json and receipt.json in the scratch dir"

echo
echo "smoke: all steps passed with $engine in $(($(date +%s) - started)) s; image $image $((size / 1000000)) MB"
