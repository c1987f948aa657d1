"""``msgsafe cluster`` without starting a broker: what ``up kafka`` says about Kafka's own
command-line tools, the ``fetch kafka-tools`` kind and its pom. Nothing here runs Maven
or a JVM: the cluster's ``start`` and the fetch are replaced where a command would."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ElementTree
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from msgsafe.cli import app
from msgsafe.cluster import kafka
from msgsafe.cluster.kafka import VERSION, KafkaCluster
from tests.support.commands import msgsafe

_POM = "{http://maven.apache.org/POM/4.0.0}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("MSGSAFE_CACHE", str(root))
    return root


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``up`` goes through every step but starting the JVMs."""

    def start(self: KafkaCluster, timeout: float | None = None) -> None:
        return None

    monkeypatch.setattr(KafkaCluster, "start", start)


@pytest.mark.usefixtures("no_start")
def test_up_kafka_prints_how_to_run_kafkas_own_tools_on_stderr(tmp_path: Path, cache: Path) -> None:
    result = CliRunner().invoke(
        app, ["cluster", "up", "kafka", "--dir", str(tmp_path / "k"), "--base-port", "45100"]
    )
    assert result.exit_code == 0, result.output
    classpath = f"'{cache}/kafka-tools-{VERSION}/lib/*'"
    bootstrap = "--bootstrap-server 127.0.0.1:45100,127.0.0.1:45101,127.0.0.1:45102"
    assert "run `msgsafe cluster fetch kafka-tools` once" in result.stderr
    assert (
        f"java -cp {classpath} org.apache.kafka.tools.consumer.ConsoleConsumer {bootstrap} "
        "--topic TOPIC --from-beginning"
    ) in result.stderr
    assert f"java -cp {classpath} org.apache.kafka.tools.TopicCommand {bootstrap} --list" in (
        result.stderr
    )
    assert "kafka-tools" not in result.stdout  # stdout: the cluster's table only


@pytest.mark.usefixtures("no_start")
def test_up_kafka_json_has_a_tools_field_and_nothing_on_stderr(tmp_path: Path, cache: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["cluster", "up", "kafka", "--dir", str(tmp_path / "k"), "--base-port", "45200", "--json"],
    )
    assert result.exit_code == 0, result.output
    tools = json.loads(result.stdout)["tools"]
    assert tools["fetch"] == "msgsafe cluster fetch kafka-tools"
    assert tools["classpath"] == f"{cache}/kafka-tools-{VERSION}/lib/*"
    commands = tools["commands"]
    assert "org.apache.kafka.tools.consumer.ConsoleConsumer" in commands["console_consumer"]
    assert "127.0.0.1:45200" in commands["topics"]
    assert "kafka-tools" not in result.stderr


def test_fetch_kafka_tools_resolves_the_tools_pom(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fetch_lib(name: str, required: list[str], **named: str) -> Path:
        calls.append((name, required, named))
        return Path("/nowhere")

    monkeypatch.setattr(kafka.maven, "fetch_lib", fetch_lib)
    result = CliRunner().invoke(app, ["cluster", "fetch", "kafka-tools"])
    assert result.exit_code == 0, result.output
    assert "kafka-tools: ready" in result.stdout
    assert calls == [
        (
            f"kafka-tools-{VERSION}",
            [f"kafka-tools-{VERSION}.jar"],
            {"what": "Kafka tools", "kind": "kafka-tools", "m2": "org/apache/kafka"},
        )
    ]


def _pom(name: str) -> ElementTree.Element:
    pom = resources.files("msgsafe.cluster") / "poms" / f"{name}.xml"
    assert pom.is_file(), f"no pom {name}.xml"
    return ElementTree.fromstring(pom.read_text())


def test_the_tools_pom_pins_kafka_tools_of_the_brokers_version() -> None:
    tools, broker = _pom(f"kafka-tools-{VERSION}"), _pom(f"kafka-{VERSION}")
    assert tools.findtext(f"{_POM}properties/{_POM}kafka.version") == VERSION
    # The same slf4j binding into the broker's Log4j 2, at the same version.
    assert tools.findtext(f"{_POM}properties/{_POM}log4j.version") == broker.findtext(
        f"{_POM}properties/{_POM}log4j.version"
    )
    dependencies = {
        (d.findtext(f"{_POM}groupId"), d.findtext(f"{_POM}artifactId")): d.findtext(
            f"{_POM}version"
        )
        for d in tools.iter(f"{_POM}dependency")
    }
    assert dependencies == {
        ("org.apache.kafka", "kafka-tools"): "${kafka.version}",
        ("org.apache.logging.log4j", "log4j-slf4j-impl"): "${log4j.version}",
    }
    # maven.fetch_lib reads DIR/lib: the pom copies every jar there, as the broker's does.
    out_dir = f".//{_POM}plugin/{_POM}configuration/{_POM}outputDirectory"
    assert tools.findtext(out_dir) == broker.findtext(out_dir) == "${cache}/lib"


def test_a_first_fetch_says_what_it_fetches_into_a_pipe(tmp_path: Path) -> None:
    """A first `cluster up kafka` spends a minute fetching jars: with stderr a pipe (no
    spinner) each step is a line, so the command never looks stuck. A stand-in `mvn` on
    PATH (a real fetch needs Maven Central) writes the pom's jar."""
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -Dcache=*) d="${a#-Dcache=}";; esac; done\n'
        'mkdir -p "$d/lib" && python3 -c "import zipfile,sys; '
        "zipfile.ZipFile(sys.argv[1], 'w').writestr('x', 'y')\" "
        f'"$d/lib/kafka-tools-{VERSION}.jar"\n'
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{fake.parent}:{os.environ['PATH']}",
        "MSGSAFE_CACHE": str(tmp_path / "cache"),
    }
    result = msgsafe("cluster", "fetch", "kafka-tools", env=env)
    assert result.code == 0, result.stderr
    assert f"fetching kafka-tools: fetching kafka-tools-{VERSION} from Maven Central" in (
        result.stderr
    ), result.stderr
    assert f"fetched kafka-tools-{VERSION}:" in result.stderr, result.stderr
