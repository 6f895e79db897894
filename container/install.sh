#!/bin/sh
# Installs muongen into an image, at build time only: used by the Dockerfile (RUN) and by
# Apptainer.def (%post), so both images hold the same package and the same versions.
#
#   sh container/install.sh cuda|cpu [SOURCE_DIR] [deps|package|all]
#
# deps (needs only SOURCE_DIR/container/ and the lock; the Dockerfile runs it before the
# sources come in, so that layer is reused while only the code changes):
#   cuda: torch comes from the base image (pytorch/pytorch:<torch>-cuda...); it must already
#         be the version pinned in container/requirements.lock, otherwise the build stops (pip
#         would otherwise quietly replace it with a different multi-GB wheel).
#   cpu:  the CPU-only torch wheel of the pinned version, from TORCH_FIND_LINKS (a folder of
#         wheels; nothing else is asked) when that is set, else from TORCH_INDEX_URL (default
#         the PyTorch CPU index).
#   Then every pinned dependency (container/requirements.lock) from pip's index: PyPI, or
#   the mirror that PIP_INDEX_URL / PIP_EXTRA_INDEX_URL name (PIP_CERT: a CA bundle for it).
# package: muongen itself from SOURCE_DIR (no dependency resolution, no build isolation:
#   nothing unpinned comes in), the entrypoint, and a check that what is installed matches
#   the lock. all (default): both.
# Nothing is fetched at run time.
set -eu

variant=${1:?usage: install.sh cuda|cpu [SOURCE_DIR] [deps|package|all]}
src=${2:-/opt/muongen}
phase=${3:-all}
lock=$src/container/requirements.lock
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
torch_links=${TORCH_FIND_LINKS:-}

# Build arguments that were not given arrive as empty variables; pip reads an empty
# PIP_INDEX_URL as an empty URL, so drop them.
[ -n "${PIP_INDEX_URL:-}" ] || unset PIP_INDEX_URL
[ -n "${PIP_EXTRA_INDEX_URL:-}" ] || unset PIP_EXTRA_INDEX_URL
[ -n "${PIP_CERT:-}" ] || unset PIP_CERT

case $phase in
    deps | package | all) ;;
    *)
        echo "install.sh: unknown phase '$phase' (deps, package or all)" >&2
        exit 1
        ;;
esac

install_deps() {
    torch_pin=$(sed -n 's/^torch==//p' "$lock")
    if [ -z "$torch_pin" ]; then
        echo "install.sh: $lock pins no torch version" >&2
        exit 1
    fi
    case $variant in
        cuda)
            have=$(python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || echo none)
            if [ "$have" != "$torch_pin" ]; then
                echo "install.sh: the base image has torch $have, the lock pins torch==$torch_pin;" >&2
                echo "  build from a pytorch/pytorch:$torch_pin-cuda*-cudnn*-runtime base" >&2
                exit 1
            fi
            ;;
        cpu)
            if [ -n "$torch_links" ]; then
                if [ ! -d "$torch_links" ]; then
                    echo "install.sh: TORCH_FIND_LINKS=$torch_links is not a folder here;" >&2
                    echo "  mount it into the build (podman build --volume $torch_links:$torch_links:ro)" >&2
                    exit 1
                fi
                python -m pip install --no-cache-dir --no-deps --no-index \
                    --find-links "$torch_links" "torch==$torch_pin+cpu"
            else
                python -m pip install --no-cache-dir --no-deps --index-url "$torch_index" \
                    "torch==$torch_pin+cpu"
            fi
            ;;
        *)
            echo "install.sh: unknown variant '$variant' (cuda or cpu)" >&2
            exit 1
            ;;
    esac
    python -m pip install --no-cache-dir -r "$lock"
}

install_package() {
    python -m pip install --no-cache-dir --no-deps --no-build-isolation "$src"
    rm -rf "$src/build" "$src"/*.egg-info
    install -m 0755 "$src/container/entrypoint.sh" /usr/local/bin/muongen-entrypoint
    # Build-time self-check: the pins match (MUONGEN_LOCK), torch imports, muongen runs.
    MUONGEN_LOCK=$lock muongen doctor --quick
}

case $phase in
    deps) install_deps ;;
    package) install_package ;;
    all)
        install_deps
        install_package
        ;;
esac
