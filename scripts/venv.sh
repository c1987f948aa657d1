# Sourced by the other scripts after `scripts/bootstrap.sh`: runs the rest inside this
# checkout's `.venv`, so `python3`, `msgsafe` and every child process the tests start
# use the packages the bootstrap installed there.
VIRTUAL_ENV="$(pwd)/.venv"
export VIRTUAL_ENV
export PATH="$VIRTUAL_ENV/bin:$PATH"
unset PYTHONHOME
