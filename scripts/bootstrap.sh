#!/usr/bin/env bash
# Installs what msgsafe's demo and test suite need on a fresh machine, idempotently:
# the package with its extras, Debian's rabbitmq-server, Java for Spark, and a running
# PostgreSQL for the transactional-outbox tests. Brokers themselves are started (on
# loopback, on free ports) by the demo and by the test fixtures, and stopped by them.
#
# Python packages go into this checkout's own virtual environment, `.venv` (made here when
# missing), never into the machine's interpreter: an editable install there would repoint
# every other checkout's `import msgsafe` at this one. The other scripts run inside it
# (`scripts/venv.sh`); so can you: `. .venv/bin/activate`.
#
# The install runs only when it would change something: when the venv's `msgsafe` does not
# resolve to this checkout, or pyproject.toml changed since the last install of these
# extras (the stamp in .venv/msgsafe-installed). A `.venv` that is not this checkout's own
# (a symlink to another checkout's) is used as it is and never installed into: that would
# repoint the other checkout's `import msgsafe` at this one. scripts/venv.sh puts this
# checkout first on PYTHONPATH instead.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh

log() { printf '[bootstrap] %s\n' "$*"; }
want_apt=()

need_root_for_apt() {
  if [ "$(id -u)" != 0 ]; then
    log "missing system packages: ${want_apt[*]}; run as root or install them: apt-get install -y ${want_apt[*]}"
    exit 1
  fi
}

mode="${1:-all}"
case "$mode" in
  demo) extras="kafka,rabbitmq,amqp10,demo" ;;
  docs) extras="docs" ;;
  *) extras="all,dev,docs" ;;  # fast and all: the docs build is part of the fast tier
esac

py=.venv/bin/python
if ! msgsafe_venv_is_own; then
  log ".venv is $(cd .venv && pwd -P), not this checkout's own: nothing installed into it (this checkout is imported through PYTHONPATH)"
  [ -x "$py" ] || { log "no python in $(cd .venv && pwd -P)/bin"; exit 1; }
else
  if [ ! -x "$py" ]; then
    log "python3 -m venv .venv"
    python3 -m venv .venv
  fi
  # Where the venv itself imports msgsafe from: isolated (-I), so neither the current
  # directory nor PYTHONPATH answers for it.
  resolved="$("$py" -I -c 'import importlib.util, os; s = importlib.util.find_spec("msgsafe"); print(os.path.realpath(s.origin) if s and s.origin else "")' 2>/dev/null || true)"
  stamp=.venv/msgsafe-installed
  pyproject="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  # Extras installed before with this pyproject.toml; all,dev,docs holds every other set.
  if [ "$resolved" = "$(pwd -P)/msgsafe/__init__.py" ] && [ -f "$stamp" ] \
      && grep -qxE "$pyproject ($extras|all,dev,docs)" "$stamp"; then
    log "msgsafe[$extras] already installed from this checkout into .venv"
  else
    log "pip install -e .[$extras] (into .venv)"
    "$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e ".[$extras]"
    { grep -s "^$pyproject " "$stamp" || true; echo "$pyproject $extras"; } > "$stamp.new"
    mv "$stamp.new" "$stamp"
  fi
fi

if [ "$mode" = all ]; then
  command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || want_apt+=(rabbitmq-server)
  command -v java >/dev/null 2>&1 || want_apt+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || want_apt+=(maven)
  command -v pg_ctlcluster >/dev/null 2>&1 || want_apt+=(postgresql)
  # PgBouncer for the outbox's tests behind a pooler (msgsafe cluster up postgres --pooler).
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || want_apt+=(pgbouncer)
  command -v ip >/dev/null 2>&1 || want_apt+=(iproute2)
  command -v openssl >/dev/null 2>&1 || want_apt+=(openssl)
  if [ ${#want_apt[@]} -gt 0 ]; then
    need_root_for_apt
    log "apt-get install -y ${want_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want_apt[@]}" >/dev/null
  fi
  # Apache Kafka, ActiveMQ Artemis, Qpid Broker-J and Apicurio Registry from Maven Central,
  # once, into the cache (~/.cache/msgsafe/brokers or $MSGSAFE_CACHE); later runs reuse them.
  log "broker jars (msgsafe cluster fetch)"
  for kind in kafka artemis qpid registry; do "$py" -m msgsafe cluster fetch "$kind"; done
  # Spark's own Kafka sink (spark-sql-kafka-0-10 and its runtime jars) for spark.jars:
  # the Spark tests and benchmark compare msgsafe's sink with it.
  log "Spark Kafka sink jars"
  "$py" -m tests.support.spark_kafka >/dev/null
  pgver="$(ls /etc/postgresql | head -n1)"
  # The transactional-outbox tests connect to 127.0.0.1 without a password; a fresh
  # Debian cluster asks for one (scram), so trust loopback for this test machine.
  hba="/etc/postgresql/$pgver/main/pg_hba.conf"
  if [ -w "$hba" ] && ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$pgver" main reload 2>/dev/null || true
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    log "starting PostgreSQL"
    # Marked, so that scripts/test.sh stops what it started (and nothing it did not).
    # Started with only stdin, stdout and stderr: the server outlives this script and
    # would otherwise keep every descriptor it inherited open (a caller's flock lock,
    # a pipe a CI runner reads to its end).
    (
      for fd in /proc/$BASHPID/fd/*; do
        fd="${fd##*/}"
        [ "$fd" -gt 2 ] && eval "exec $fd>&-"
      done
      pg_ctlcluster --skip-systemctl-redirect "$pgver" main start
    ) && echo "$pgver" > "${TMPDIR:-/tmp}/msgsafe-started-postgres" || true
  fi
fi
