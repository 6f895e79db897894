# shellcheck shell=sh
# Sourced, never executed: sets up threads and writable caches for a muongen job.
#
# Used by container/entrypoint.sh (docker run, apptainer run) and by the Apptainer image's
# %environment, because HTCondor starts a container job with `apptainer exec <image>
# <executable>`, which skips %runscript. It only ever fills in variables that are unset, so
# a value the user (or HTCondor) exported always wins, and sourcing it twice is harmless.
#
# Threads: HTCondor exports OMP_NUM_THREADS, MKL_NUM_THREADS, ... = the slot's provisioned
# CPUs (STARTER_NUM_THREADS_ENV_VARS). Where it did not (an older or reconfigured execute
# point), the slot's `Cpus` is read from the machine ad ($_CONDOR_MACHINE_AD, or .machine.ad
# in the scratch dir). Outside HTCondor nothing is set and torch picks its own default.
#
# Scratch: under HTCondor, $_CONDOR_SCRATCH_DIR is the one place that is surely writable
# and cleaned up after the job (HOME may be read-only or shared), so temp files and the
# caches of torch.compile, Triton, CUDA's JIT and matplotlib go there.

_mg_threads=${OMP_NUM_THREADS:-}
if [ -z "$_mg_threads" ]; then
    _mg_ad=${_CONDOR_MACHINE_AD:-}
    if [ -z "$_mg_ad" ] && [ -n "${_CONDOR_SCRATCH_DIR:-}" ]; then
        _mg_ad=$_CONDOR_SCRATCH_DIR/.machine.ad
    fi
    if [ -n "$_mg_ad" ] && [ -r "$_mg_ad" ]; then
        # ClassAd line `Cpus = 4` (attribute names are case-insensitive)
        _mg_threads=$(sed -n 's/^[Cc][Pp][Uu][Ss][[:space:]]*=[[:space:]]*\([0-9][0-9]*\)[[:space:]]*$/\1/p' "$_mg_ad" | head -n 1)
    fi
    case $_mg_threads in
        '' | 0 | *[!0-9]*) _mg_threads= ;;
        *) export OMP_NUM_THREADS="$_mg_threads" ;;
    esac
fi
case $_mg_threads in
    '' | *[!0-9]*) _mg_threads= ;; # e.g. a nested OpenMP list "4,2": not for the BLAS libraries
esac
if [ -n "$_mg_threads" ]; then
    # The BLAS libraries follow OpenMP unless told otherwise.
    : "${MKL_NUM_THREADS:=$_mg_threads}" "${OPENBLAS_NUM_THREADS:=$_mg_threads}"
    : "${NUMEXPR_NUM_THREADS:=$_mg_threads}"
    export MKL_NUM_THREADS OPENBLAS_NUM_THREADS NUMEXPR_NUM_THREADS
fi

_mg_scratch=${_CONDOR_SCRATCH_DIR:-}
if [ -n "$_mg_scratch" ] && [ -d "$_mg_scratch" ] && [ -w "$_mg_scratch" ]; then
    : "${TMPDIR:=$_mg_scratch/tmp}"
    : "${XDG_CACHE_HOME:=$_mg_scratch/.cache}"
    : "${TORCHINDUCTOR_CACHE_DIR:=$XDG_CACHE_HOME/torchinductor}"
    : "${TRITON_CACHE_DIR:=$XDG_CACHE_HOME/triton}"
    : "${CUDA_CACHE_PATH:=$XDG_CACHE_HOME/nv}"
    : "${MPLCONFIGDIR:=$XDG_CACHE_HOME/matplotlib}"
    export TMPDIR XDG_CACHE_HOME TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR CUDA_CACHE_PATH MPLCONFIGDIR
    mkdir -p "$TMPDIR" "$XDG_CACHE_HOME" "$MPLCONFIGDIR" 2>/dev/null || :
    if [ -z "${HOME:-}" ] || [ ! -w "${HOME:-/nonexistent}" ]; then
        # Tools that write to ~ (pip, fsspec, ...) need a writable HOME.
        export HOME="$_mg_scratch"
    fi
fi
unset _mg_threads _mg_ad _mg_scratch
