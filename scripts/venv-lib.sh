# Sourced by scripts/bootstrap.sh, kfp-oldest-venv.sh, kserve-storage-venv.sh and client-venvs.sh: how a virtual
# environment is created and filled. uv (pinned in requirements/test.lock, installed into .venv by bootstrap.sh)
# installs the pinned sets several times faster than pip; pip is the fallback only where no uv is found.

# The uv to use: $UV, else .venv's, else one on PATH; empty when there is none.
find_uv() {
  if [ -n "${UV:-}" ]; then echo "$UV"
  elif [ -x .venv/bin/uv ]; then echo "$PWD/.venv/bin/uv"
  elif command -v uv >/dev/null 2>&1; then command -v uv
  fi
  return 0
}

# Where torch's CPU wheel comes from, as installer options: pip's find-links directory where it holds a torch wheel
# (machines with a local wheel directory), else the PyTorch CPU index.
torch_source() {
  local links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
  if [ -n "$links" ] && compgen -G "$links/torch-*.whl" >/dev/null; then
    echo "--find-links $links"
  else
    echo "--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match"
  fi
}

# The wheels PYTHON's ensurepip seeds a new venv with (pip, setuptools), space-separated; empty where the build
# ships none (Debian's python3 keeps them elsewhere).
seed_wheels() {
  "$1" -c 'import ensurepip, pathlib
print(" ".join(str(p) for p in sorted((pathlib.Path(ensurepip.__file__).parent / "_bundled").glob("*.whl"))))' \
    2>/dev/null || true
}

# make_venv PYTHON VENV ARGS...: create VENV with PYTHON's venv module and install ARGS (requirements options) into
# it with uv, or pip where no uv is found. The venv holds what `python -m venv` gives (pip and setuptools as
# ensurepip seeds them): with uv, the same bundled wheels are installed by uv, which takes a fraction of a second
# where ensurepip takes 5-25 s on a busy 2-core machine. pip's "Location ... ignored" warnings about absent local
# index directories are dropped. Returns non-zero on failure.
make_venv() {
  local py=$1 venv=$2; shift 2
  local uv wheels
  uv=$(find_uv)
  wheels=$([ -n "$uv" ] && seed_wheels "$py")
  if [ -n "$wheels" ]; then
    "$py" -m venv --without-pip "$venv" >&2 || return 1
    # shellcheck disable=SC2086  # one path per wheel
    "$uv" pip install --quiet --python "$venv/bin/python" --no-deps $wheels >&2 || return 1
  else
    "$py" -m venv "$venv" >&2 || return 1
  fi
  if [ -n "$uv" ]; then
    "$uv" pip install --quiet --python "$venv/bin/python" "$@" >&2
  else
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
      2> >(grep -v '^WARNING: Location' >&2) >&2
  fi
}
