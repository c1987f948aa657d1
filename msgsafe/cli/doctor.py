"""``msgsafe doctor URL [DESTINATION...]``: names each broker setting that the failure
stories show can lose acknowledged messages, with the fix. The exit code is the worst
finding's: 0 fine, 4 something could not be checked, 5 warning, 6 a setting that loses
messages (3: the broker could not be reached). A RabbitMQ URL of a ``msgsafe cluster
up`` cluster needs no ``--management``: doctor reads the cluster's own (``--cluster DIR``,
or the clusters ``up`` recorded). ``--outbox STORE`` (a ``postgresql://``
URL or a SQLite file) adds the outbox store's own findings (:mod:`msgsafe.checks.store`).
``--schema-registry URL`` adds each destination's subject compatibility mode
(:func:`msgsafe.schemas.compatibility`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from msgsafe.checks import doctor_findings
from msgsafe.checks.findings import STORIES, Finding, Severity
from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    out,
    print_json,
    translate_errors,
    url_param,
)
from msgsafe.endpoints import BrokerUrl, parse_url, traits

__all__ = ["doctor", "exit_code"]

_STYLE = {
    Severity.OK: "green",
    Severity.INFO: "cyan",
    Severity.UNKNOWN: "yellow",
    Severity.WARNING: "bold yellow",
    Severity.CRITICAL: "bold red",
}


def doctor(
    url: Annotated[
        str,
        typer.Argument(
            help=f"Broker URL (amqp://, kafka://, amqp10://). {URL_FORMS}", callback=url_param
        ),
    ],
    destinations: Annotated[
        list[str] | None,
        typer.Argument(help="Queues/topics to check (default: every one the broker lists)."),
    ] = None,
    management: Annotated[
        str | None,
        typer.Option(
            help="RabbitMQ management API base URL (default: the one of the `msgsafe "
            "cluster up` cluster the URL names, else http://HOST:15672). " + URL_FORMS,
            callback=url_param,
        ),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            "--cluster",
            help="The directory of a `msgsafe cluster up` RabbitMQ cluster: use its "
            "management API (found without it when `cluster up` recorded the cluster).",
        ),
    ] = None,
    outbox: Annotated[
        str | None,
        typer.Option(
            help="The producers' outbox too: a postgresql:// URL (server settings, "
            f"replication) or a SQLite file (its filesystem). {URL_FORMS}"
        ),
    ] = None,
    schema_registry: Annotated[
        str | None,
        typer.Option(
            "--schema-registry",
            help="A schema registry's Confluent API URL: report each destination's "
            "subject (DEST-value) compatibility mode.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print findings as JSON.")] = False,
) -> None:
    """Check the broker's settings against the failure stories; name each risky one and
    its fix.

    Exit 0 fine, 4 a setting could not be checked, 5 warning, 6 a setting that loses
    acknowledged messages, 3 the broker could not be reached.
    """
    names = list(destinations or [])
    with translate_errors(as_json=as_json):
        broker = parse_url(url)
        if traits(broker.protocol).management_api and management is None:
            management = _cluster_management(broker, cluster, as_json)
        findings = doctor_findings(broker, names, management)
        if outbox is not None:
            from msgsafe.checks.store import check_store
            from msgsafe.cli.outbox_forward import store_spec

            findings += check_store(store_spec(outbox))
        if schema_registry is not None:
            findings += _check_subjects(schema_registry, names)
    code = exit_code(findings)
    if as_json:
        print_json(
            {
                "broker": broker.redacted(),
                "worst": max((f.severity for f in findings), default=Severity.OK).name.lower(),
                "exit_code": int(code),
                "findings": [f.as_dict() for f in findings],
            }
        )
    else:
        _print(broker.redacted(), findings)
    exit_with(code)


def _cluster_management(broker: BrokerUrl, cluster: Path | None, as_json: bool) -> str | None:
    """The management API of the ``msgsafe cluster up`` cluster whose node the URL's
    first host is: the one in ``cluster`` (a usage error when it has none), else one of
    the clusters ``up`` recorded; None when no such cluster runs."""
    from msgsafe.cluster.cli import known_dirs
    from msgsafe.cluster.rabbitmq import management_url_for

    first = broker.endpoints[0]
    found = management_url_for(first.host, first.port, [cluster] if cluster else known_dirs())
    if found is None:
        if cluster is not None:
            raise typer.BadParameter(
                f"no running node with the management API on {first} in {cluster}",
                param_hint="--cluster",
            )
        return None
    folder, api = found
    if not as_json:
        err.print(f"management API: {api} (the cluster in {folder})", markup=False)
    return api


def exit_code(findings: list[Finding]) -> ExitCode:
    """The exit code of the worst finding."""
    worst = max((f.severity for f in findings), default=Severity.OK)
    return {
        Severity.OK: ExitCode.OK,
        Severity.INFO: ExitCode.OK,
        Severity.UNKNOWN: ExitCode.UNKNOWN,
        Severity.WARNING: ExitCode.WARNING,
        Severity.CRITICAL: ExitCode.CRITICAL,
    }[worst]


def _check_subjects(registry: str, names: list[str]) -> list[Finding]:
    """Each destination's value subject's compatibility mode on ``registry`` (the
    subject's own, or the registry's default, said so); the global mode without names."""
    from msgsafe.errors import SchemaRegistryUnavailable
    from msgsafe.schemas import compatibility

    findings = []
    subjects: list[str | None] = [f"{name}-value" for name in names]
    for subject in subjects or [None]:
        what = f"subject {subject}" if subject else "schema registry"
        try:
            mode = compatibility(registry, subject)
        except SchemaRegistryUnavailable as exc:
            findings.append(Finding(Severity.UNKNOWN, what, "compatibility", "unknown", str(exc)))
            continue
        severity = Severity.INFO
        why = ""
        if mode.split(" ")[0] == "NONE":
            severity = Severity.WARNING
            why = (
                "any schema is accepted: a consumer may meet records it cannot read, "
                "stored messages included"
            )
        fix = "set BACKWARD (or stricter) on the subject" if why else ""
        findings.append(Finding(severity, what, "compatibility", mode, why, fix))
    return findings


def _print(broker: str, findings: list[Finding]) -> None:
    ordered = sorted(findings, key=lambda f: -f.severity)
    table = Table(title=escape(f"msgsafe doctor — {broker}"))
    for column in ("#", "severity", "subject", "setting", "value"):
        table.add_column(column, overflow="fold")
    for number, f in enumerate(ordered, start=1):
        style = _STYLE[f.severity]
        table.add_row(
            str(number),
            f"[{style}]{f.severity.name.lower()}[/]",
            escape(f.subject),
            escape(f.setting),
            escape(f.value),
        )
    out.print(table)
    for number, f in enumerate(ordered, start=1):
        if not (f.why or f.fix):
            continue
        style = _STYLE[f.severity]
        out.print(f"[{style}]{number}. {escape(f.subject)} · {escape(f.setting)}[/]")
        if f.why:
            out.print(f"   why: {f.why}", markup=False)
        if f.story:
            out.print(f"   story: {STORIES[f.story]}", markup=False)
        if f.fix:
            out.print(f"   fix: {f.fix}", markup=False)
    worst = max((f.severity for f in findings), default=Severity.OK)
    out.print(f"worst finding: [{_STYLE[worst]}]{worst.name.lower()}[/]")
