# Sourced by the other scripts after `scripts/bootstrap.sh`: runs the rest inside this
# checkout's `.venv`, so `python3`, `msgsafe` and every child process the tests start
# use the packages the bootstrap installed there.
#
# A `.venv` that is not this checkout's own (a symlink to another checkout's venv, whose
# editable install points at that checkout) gets nothing installed by the bootstrap; this
# checkout goes first on PYTHONPATH instead, so it is still this checkout's msgsafe that
# every process imports.

# True when .venv is missing (the bootstrap makes it) or lies inside this checkout.
msgsafe_venv_is_own() {
  [ -L .venv ] && return 1
  [ -e .venv ] || return 0
  case "$(cd .venv && pwd -P)/" in
    "$(pwd -P)/"*) return 0 ;;
    *) return 1 ;;
  esac
}

VIRTUAL_ENV="$(pwd)/.venv"
export VIRTUAL_ENV
export PATH="$VIRTUAL_ENV/bin:$PATH"
unset PYTHONHOME
if ! msgsafe_venv_is_own; then
  PYTHONPATH="$(pwd -P)${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi
