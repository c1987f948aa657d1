#!/usr/bin/env bash
# The full test suite: lint, format, types, then every test (unit, contract, integration
# against real brokers the fixtures start on loopback, chaos).
#
#   bash scripts/test.sh                  everything (what CI runs)
#   bash scripts/test.sh PATH...          only those paths (files, folders, file::test);
#                                         the fixtures start only the brokers they use
#   bash scripts/test.sh --fast           the fast tier: pip extras only, no system
#                                         packages, and no broker, JVM or database is
#                                         started (a test that tries fails); unit tests
#                                         and the contract suite on the memory adapter,
#                                         but not those marked slow
#   bash scripts/test.sh --fast PATH...   the fast tier, only those paths
#
# With PATHs, lint and types are skipped (run them with `make lint`). Arguments that are
# not paths (-k EXPR, -x, ...) go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."

# The machine's PostgreSQL, when the bootstrap started it, is stopped when the run ends.
source scripts/stop_started.sh

fast=0
if [ "${1:-}" = --fast ]; then
  fast=1
  shift
fi
paths=0
for arg in "$@"; do
  case "$arg" in
    -*) ;;
    *) [ -e "${arg%%::*}" ] && paths=1 ;;
  esac
done

if [ $fast -eq 1 ]; then
  bash scripts/bootstrap.sh fast || exit 1
  . scripts/venv.sh
  export MSGSAFE_TEST_TIER=fast
  # The fast tier mostly waits (timeouts, backoffs, fsync): four workers on two cores
  # bring it from about 190 s to about 80 s.
  if [ $paths -eq 0 ]; then
    # The slow unit tests (work at scale) run in the full suite, or by path.
    set -- -n 4 -m "not integration and not chaos and not slow" tests/unit tests/contract "$@"
  else
    set -- -m "not integration and not chaos" "$@"
  fi
else
  bash scripts/bootstrap.sh all || exit 1
  . scripts/venv.sh
fi

if [ $paths -eq 0 ]; then
  echo "== ruff"; python3 -m ruff check msgsafe tests benchmarks examples || exit 1
  echo "== ruff format --check"; python3 -m ruff format --check msgsafe tests benchmarks examples || exit 1
  echo "== mypy --strict"; python3 -m mypy || exit 1
  echo "== mypy tests (looser profile: pyproject.toml)"; python3 -m mypy tests || exit 1
fi
if [ $fast -eq 0 ] && [ $paths -eq 0 ]; then
  # Everything: the tests without a broker first, four workers on two cores (they mostly
  # wait), then the ones against real brokers one at a time (they start clusters and
  # break them; two at once on two cores would race each other's timeouts).
  echo "== pytest: tests without a broker (4 workers)"
  python3 -m pytest -ra --durations=10 -n 4 -m "not integration and not chaos" tests "$@"
  first=$?
  [ $first -eq 5 ] && { echo "no tests were collected"; exit 1; }
  # The broker tests run as two pytest processes at once, one lane each (tests/conftest.py
  # says which module goes where): most of their time is spent waiting on elections,
  # timeouts and restarts, not on the CPU, so two lanes nearly halve the wall time.
  echo "== pytest: integration and chaos, against real brokers (lanes kafka and other at once)"
  logs="${TMPDIR:-/tmp}/msgsafe-test-lanes"
  rm -rf "$logs" && mkdir -p "$logs"
  run_lane() {
    local lane=$1
    shift
    python3 -m pytest -ra --durations=40 --durations-min=10 -m "integration or chaos" \
      --lane "$lane" --basetemp "$logs/tmp-$lane" --junitxml "$logs/$lane.xml" tests "$@" 2>&1 \
      | tee "$logs/$lane.log" | sed -u "s/^/[$lane] /"
    echo "${PIPESTATUS[0]}" > "$logs/$lane.rc"
  }
  # Every 30 s: the load and the busiest processes, for a run that was slow or timed out
  # (both lanes share two cores with the brokers they start).
  (
    while sleep 30; do
      {
        echo "-- $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
        top -b -n 2 -d 1 -o %CPU | awk '/^top -/ {frame++} frame == 2 && $1 ~ /^[0-9]+$/' \
          | head -n 6 | while read -r pid _ _ _ _ _ _ _ cpu _; do
            echo "   $cpu% $pid $(tr '\0' ' ' < "/proc/$pid/cmdline" | rev | cut -c1-110 | rev)"
          done
      } >> "$logs/load.log" 2>/dev/null
    done
  ) &
  sampler=$!
  run_lane kafka "$@" &
  kafka_pid=$!
  run_lane other "$@"
  wait $kafka_pid
  kill $sampler 2>/dev/null
  echo "== the five busiest moments (1-minute load; every 30 s in $logs/load.log)"
  grep '^-- ' "$logs/load.log" | sort -k4 -n -r | head -n 5
  rc=0
  # A failing lane is reported last: its lines end the output, where a reader of only
  # its tail looks.
  for lane in $(for l in kafka other; do echo "$(cat "$logs/$l.rc" 2>/dev/null || echo 1) $l"; done \
      | sort -n | cut -d' ' -f2); do
    lane_rc=$(cat "$logs/$lane.rc" 2>/dev/null || echo 1)
    echo "== lane $lane: exit $lane_rc (full output: $logs/$lane.log)"
    sed -n '/short test summary info/,$p' "$logs/$lane.log"
    if grep -q 'Fatal Python error: ' "$logs/$lane.log"; then
      # The process died (a C library aborted, ...): the test it was in and where.
      grep -m 1 'Fatal Python error: ' "$logs/$lane.log" | cut -c1-200
      sed -n '/^Current thread/,/^$/p' "$logs/$lane.log" | grep -v '/site-packages/_pytest/\|/site-packages/pluggy/' \
        | head -n 12 | cut -c1-200
    fi
    tail -n 1 "$logs/$lane.log"
    [ "$lane_rc" -eq 5 ] && { echo "no tests were collected in lane $lane"; lane_rc=1; }
    [ "$lane_rc" -ne 0 ] && rc=$lane_rc
  done
  [ $first -ne 0 ] && exit $first
  exit $rc
fi
echo "== pytest"
python3 -m pytest -ra --durations=15 "$@"
rc=$?
# Exit 5 means no test was collected: that is a failure of the suite, not a pass.
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
