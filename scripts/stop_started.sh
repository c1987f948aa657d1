# Sourced by the test scripts: the machine's PostgreSQL, when the bootstrap started it
# for this run, is stopped when the run ends, however it ends (the exit status is kept:
# the trap does not exit).
stop_what_bootstrap_started() {
  local mark="${TMPDIR:-/tmp}/msgsafe-started-postgres"
  if [ -f "$mark" ]; then
    echo "== stopping the PostgreSQL the bootstrap started"
    pg_ctlcluster --skip-systemctl-redirect "$(cat "$mark")" main stop >/dev/null 2>&1 || true
    rm -f "$mark"
  fi
}
trap stop_what_bootstrap_started EXIT
