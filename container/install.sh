#!/bin/sh
# Installs muongen into an image, at build time only: used by the Dockerfile (RUN) and by
# Apptainer.def (%post), so both images hold the same package and the same versions.
#
#   sh container/install.sh cuda|cpu [SOURCE_DIR]
#
# cuda: torch comes from the base image (pytorch/pytorch:<torch>-cuda...); it must already be
#       the version pinned in container/requirements.lock, otherwise the build stops (pip
#       would otherwise quietly replace it with a different multi-GB wheel).
# cpu:  torch is the CPU-only wheel of the pinned version from the PyTorch CPU index.
# Then every pinned dependency (container/requirements.lock) and muongen itself from
# SOURCE_DIR (no dependency resolution, no build isolation: nothing unpinned comes in),
# and a check that what is installed matches the lock. Nothing is fetched at run time.
set -eu

variant=${1:?usage: install.sh cuda|cpu [SOURCE_DIR]}
src=${2:-/opt/muongen}
lock=$src/container/requirements.lock
cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

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
        python -m pip install --no-cache-dir --no-deps --index-url "$cpu_index" "torch==$torch_pin+cpu"
        ;;
    *)
        echo "install.sh: unknown variant '$variant' (cuda or cpu)" >&2
        exit 1
        ;;
esac

python -m pip install --no-cache-dir -r "$lock"
python -m pip install --no-cache-dir --no-deps --no-build-isolation "$src"
rm -rf "$src/build" "$src"/*.egg-info
install -m 0755 "$src/container/entrypoint.sh" /usr/local/bin/muongen-entrypoint

# Build-time self-check: the pins match (MUONGEN_LOCK), torch imports, muongen runs.
MUONGEN_LOCK=$lock muongen doctor --quick
