"""The kafka-python drop-in warns where kafka-python does: the same script, once with
``from kafka import KafkaProducer`` and once with the drop-in, run with ``-W default``,
prints the same DeprecationWarnings attributed to the same places (a producer made at a
script's top level and one made in a function). No broker: kafka-python 3's constructor
fails to bootstrap after it warned, which the script catches; the drop-in connects
nowhere in its constructor."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.support.commands import run_python

SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    if sys.argv[1] == "real":
        from kafka import KafkaProducer
    else:
        from msgsafe.compat.kafka_python import KafkaProducer

    SETTINGS = dict(
        bootstrap_servers="127.0.0.1:1",
        value_serializer=lambda v: json.dumps(v).encode(),
        key_serializer=str.encode,
        request_timeout_ms=1000,
        api_version_auto_timeout_ms=500,
    )


    def make():
        try:
            producer = KafkaProducer(**SETTINGS)
        except Exception:  # kafka-python 3: no broker to bootstrap from
            return
        producer.close(timeout=1)


    try:
        top = KafkaProducer(**SETTINGS)
    except Exception:
        top = None
    if top is not None:
        top.close(timeout=1)
    make()
    print("done")
    """
)

_WARNING = re.compile(r"^(\S+:\d+): (\w*Warning): (.*)$")


def _deprecations(stderr: str) -> list[str]:
    """Each DeprecationWarning line as ``place: message``, in order."""
    found = []
    for line in stderr.splitlines():
        match = _WARNING.match(line)
        if match and match.group(2) == "DeprecationWarning":
            found.append(f"{match.group(1)}: {match.group(3)}")
    return found


def test_the_drop_in_warns_as_kafka_python_does(tmp_path: Path) -> None:
    script = tmp_path / "producer.py"
    script.write_text(SCRIPT)
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    runs = {
        which: run_python(
            "-W", "default", str(script), which, label=f"producer.py {which}", env=env
        )
        for which in ("real", "drop-in")
    }
    for which, run in runs.items():
        assert run.code == 0 and "done" in run.stdout, f"{which}: {run.stderr}"
    real = _deprecations(runs["real"].stderr)
    assert any("does not implement kafka.serializer.Serializer" in w for w in real), real
    assert _deprecations(runs["drop-in"].stderr) == real
