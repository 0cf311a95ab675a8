# Sourced by the scripts: runs setup (idempotent) and exports the build environment.
_refit_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REFIT_TORCH_CMAKE_PREFIX="$(bash "$_refit_root/scripts/setup.sh" | tail -n 1)"
export REFIT_TORCH_CMAKE_PREFIX
# ccache: paths relative to the checkout, so a fresh clone elsewhere hits the same cache.
export CCACHE_BASEDIR="$_refit_root"
export CCACHE_NOHASHDIR=1
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-include_file_mtime,include_file_ctime,time_macros}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
