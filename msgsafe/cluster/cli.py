"""``msgsafe cluster``: start, inspect, break and stop real local brokers.

Generic over :data:`msgsafe.cluster.KINDS`: every command goes through
:func:`msgsafe.cluster.create` / :func:`msgsafe.cluster.load` and the
:class:`~msgsafe.cluster.base.LocalCluster` interface, so a new launcher needs no change
here. ``up`` starts detached nodes and writes ``DIR/cluster.json``; every other command
finds the cluster again through that file.

Output: results on stdout (``--json``: one JSON object), progress on stderr. Exit codes:
0 done, 2 bad usage (also a kind that is not in :data:`~msgsafe.cluster.KINDS`), 3 a
:class:`~msgsafe.cluster.base.ClusterError` (one red line, the detail such as a node's
log tail below it, never a traceback).

``up`` records the cluster's directory in ``$XDG_STATE_HOME/msgsafe/clusters``
(:func:`known_dirs`): ``msgsafe doctor`` finds a RabbitMQ cluster's management API
there from the URL alone.

``fetch`` also installs what no launcher needs but users ask for (:data:`EXTRAS`):
``kafka-tools``, Kafka's own command-line tools. When a cluster's ``describe()`` has a
``tools`` object (``what``, ``fetch``, ``commands``: how to run such tools against it),
``up`` prints it on stderr (with ``--json`` it is in the JSON only).

Constructor options every launcher accepts (used by ``up``): ``nodes``, ``dir``,
``base_port``, ``detached``.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import platformdirs
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from msgsafe._help import reflow_help
from msgsafe.cluster import KINDS, create, launcher, load
from msgsafe.cluster._process import pid_alive
from msgsafe.cluster.base import STATE_FILE, ClusterError, LocalCluster, NodeInfo

__all__ = ["app", "known_dirs", "main"]

#: Exit code of a command that could not do its work (a ClusterError).
EXIT_ERROR = 3

#: What ``fetch`` installs besides the kinds' own needs: name -> "module:function" (no
#: argument), imported on first use.
EXTRAS: dict[str, str] = {"kafka-tools": "msgsafe.cluster.kafka:fetch_tools"}

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    name="cluster",
    help=(
        "Real brokers on 127.0.0.1 for tests and demos: "
        f"{', '.join(sorted(KINDS))}.\n\n"
        "Exit codes: 0 ok; 2 bad usage; 3 the cluster could not be started, found or driven."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DirOption = Annotated[
    Path, typer.Option("--dir", help="The cluster's directory (data, logs, cluster.json).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
NodeArg = Annotated[str, typer.Argument(help="Node index (0, 1, ...) or name (kafka-0).")]


def _choice(value: str, known: Sequence[str]) -> str:
    """``value`` when it is one of ``known``; else a usage error (exit 2, as for click's
    own) naming every one."""
    if value not in known:
        raise typer.BadParameter(f"unknown kind {value!r} (known: {', '.join(known)})")
    return value


def _kind(value: str) -> str:
    return _choice(value, sorted(KINDS))


def _fetchable(value: str) -> str:
    return _choice(value, ["all", *sorted(KINDS), *sorted(EXTRAS)])


def _fail(exc: BaseException) -> NoReturn:
    first, _, rest = str(exc).partition("\n")
    err.print(f"[bold red]error:[/bold red] [red]{escape(first)}[/red]")
    if rest:
        err.print(escape(rest), style="dim")
    raise typer.Exit(EXIT_ERROR)


@contextmanager
def _errors() -> Iterator[None]:
    """Turn a ClusterError (or a launcher module that is not there) into exit code 3."""
    try:
        yield
    except ClusterError as exc:
        _fail(exc)
    except ImportError as exc:
        _fail(ClusterError(f"this launcher cannot be loaded: {exc}"))


class _ProgressHandler(logging.Handler):
    """Shows the launchers' INFO log lines as the progress line's text."""

    def __init__(self, update: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._update = update

    def emit(self, record: logging.LogRecord) -> None:
        self._update(record.getMessage())


@contextmanager
def _progress(what: str, *, quiet: bool = False) -> Iterator[None]:
    """A spinner with elapsed time on stderr while ``what`` runs; its text follows the
    launcher's log (``msgsafe.cluster`` at INFO)."""
    if quiet:
        yield
        return
    cluster_log = logging.getLogger("msgsafe.cluster")
    if not err.is_terminal:
        # No spinner in a pipe or a CI log: each step is a line of its own (a first
        # Kafka start spends a minute fetching its jars, and must not look stuck).
        with _logged_to(cluster_log, _ProgressHandler(lambda text: _line(what, text))):
            yield
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(escape(what))
        handler = _ProgressHandler(
            lambda text: progress.update(task, description=escape(f"{what}: {text}"))
        )
        with _logged_to(cluster_log, handler):
            yield


def _line(what: str, text: str) -> None:
    err.print(f"{what}: {text}", markup=False, highlight=False)


@contextmanager
def _logged_to(logger: logging.Logger, handler: logging.Handler) -> Iterator[None]:
    """``logger``'s INFO records go to ``handler`` alone while the block runs."""
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # The progress shows these records; the root handler would print them again.
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _index_file() -> Path:
    """Where ``up`` records the directories of the clusters it started (one per line):
    ``$XDG_STATE_HOME/msgsafe/clusters`` (default ``~/.local/state``)."""
    return platformdirs.user_state_path("msgsafe") / "clusters"


def known_dirs() -> list[Path]:
    """The directories of the clusters ``up`` started that still hold a cluster.json,
    newest first (what ``msgsafe doctor`` searches for a URL's cluster)."""
    try:
        lines = _index_file().read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    dirs = [Path(line) for line in reversed(lines) if line.strip()]
    return [d for d in dict.fromkeys(dirs) if (d / STATE_FILE).is_file()]


def _remember(dir: Path) -> None:
    """Add ``dir`` to the index of started clusters (dropping those that are gone); an
    index that cannot be written only loses this convenience."""
    kept = [d for d in reversed(known_dirs()) if d != dir.resolve()]
    index = _index_file()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text("".join(f"{d}\n" for d in [*kept, dir.resolve()]), encoding="utf-8")
    except OSError as exc:
        logging.getLogger("msgsafe.cluster").warning("cannot record %s in %s: %s", dir, index, exc)


def _show(cluster: LocalCluster, as_json: bool) -> dict[str, Any]:
    """Print what ``cluster.describe()`` says (a table, or its JSON); returns it."""
    described = cluster.describe()
    if as_json:
        print(json.dumps(described))
        return described
    table = Table(title=f"{described['kind']} in {described['dir']}", title_justify="left")
    for column in ("node", "pid", "port", "running", "role"):
        table.add_column(column)
    for node in described["nodes"]:
        table.add_row(
            node["name"],
            str(node["pid"] or "-"),
            f"{node['host']}:{node['port']}",
            "[green]yes[/green]" if node["running"] else "[red]no[/red]",
            node["role"] or "-",
        )
    out.print(table)
    out.print(f"url: {escape(described['url'])}")
    tls = described.get("tls")
    if tls:
        out.print(f"tls url: {escape(tls['url'])}")
        out.print(f"tls files: {escape(str(Path(tls['ca']).parent))} (ca.pem, client.pem, ...)")
    pooled = described.get("pooler")
    if pooled:
        out.print(f"pooler url ({pooled['mode']} pooling): {escape(pooled['url'])}")
    return described


def _print_tools(tools: dict[str, Any]) -> None:
    """The ``tools`` of a cluster's description: ``what`` they are, the ``fetch`` command
    that installs them and the ``commands`` that run them against the cluster."""
    # On stderr: stdout stays the cluster's description, for scripts that read it.
    err.print(
        f"{tools['what']} are not fetched with the broker: run `{tools['fetch']}` once, "
        "then for example",
        markup=False,
    )
    for command in tools.get("commands", {}).values():
        err.print(f"  {command}", markup=False)


def _node_index(cluster: LocalCluster, node: str) -> int:
    names = [info.name for info in cluster.nodes()]
    if node.isdigit() and int(node) < len(names):
        return int(node)
    if node in names:
        return names.index(node)
    raise ClusterError(f"no node {node!r} (nodes: {', '.join(names)} or 0..{len(names) - 1})")


@app.command()
def up(
    kind: Annotated[
        str, typer.Argument(help=f"One of: {', '.join(sorted(KINDS))}.", callback=_kind)
    ],
    dir: DirOption,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="How many nodes.")] = None,
    base_port: Annotated[
        int | None, typer.Option("--base-port", help="First port (free ports if omitted).")
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help=(
                "Also TLS listeners that require a client certificate; the CA, server, "
                "client and expired certificates are written to DIR/tls (paths in --json)."
            ),
        ),
    ] = False,
    pooler: Annotated[
        bool,
        typer.Option(
            "--pooler",
            help=(
                "postgres: also PgBouncer in transaction pooling mode in front of the "
                "primary (its URL is printed; down stops it)."
            ),
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Start a cluster whose nodes keep running after this command (until down).

    A DIR that holds a stopped cluster is started again with its data and ports. For
    kafka, the commands that run Kafka's own tools (kafka-topics, the console consumer)
    against it follow on stderr; with --json they are its "tools" object. RabbitMQ nodes
    run the management API (for msgsafe doctor: the command follows on stderr; with
    --json, "management")."""
    with _errors():
        cluster: LocalCluster
        if (dir / STATE_FILE).exists():
            cluster = load(dir)
            if any(info.running for info in cluster.nodes()):
                raise ClusterError(
                    f"a {cluster.kind} cluster already runs in {dir}: "
                    f"`msgsafe cluster down --dir {dir}`"
                )
            if cluster.kind != kind or nodes is not None or base_port is not None or tls or pooler:
                raise ClusterError(
                    f"{dir} already holds a {cluster.kind} cluster: start it again with "
                    f"`msgsafe cluster up {cluster.kind} --dir {dir}`, or use a new --dir"
                )
        else:
            options: dict[str, Any] = {"dir": dir, "detached": True}
            if nodes is not None:
                options["nodes"] = nodes
            if base_port is not None:
                options["base_port"] = base_port
            if tls:
                if not launcher(kind).supports_tls:
                    known = ", ".join(k for k in sorted(KINDS) if launcher(k).supports_tls)
                    raise ClusterError(f"{kind} has no --tls (kinds with TLS: {known})")
                options["tls"] = True
            if pooler:
                if not launcher(kind).supports_pooler:
                    known = ", ".join(k for k in sorted(KINDS) if launcher(k).supports_pooler)
                    raise ClusterError(f"{kind} has no --pooler (kinds with a pooler: {known})")
                options["pooler"] = True
            options.update(launcher(kind).up_options)
            dir.mkdir(parents=True, exist_ok=True)
            cluster = create(kind, **options)
        started = time.monotonic()
        with _progress(f"starting {kind}", quiet=as_json):
            cluster.start()
        cluster.save_state()
        _remember(dir)
        if not as_json:
            err.print(f"{kind} up in {time.monotonic() - started:.1f} s")
        described = _show(cluster, as_json)
        tools = described.get("tools")
        if tools and not as_json:
            _print_tools(tools)
        management = described.get("management")
        if management and not as_json:
            # doctor finds the management API from the URL (this cluster is recorded).
            err.print(
                f"doctor: msgsafe doctor {described['url']} (it finds the management API "
                f"{management[0]} in {dir})",
                markup=False,
                highlight=False,
            )


@app.command()
def status(dir: DirOption, as_json: JsonOption = False) -> None:
    """Show the nodes of the cluster in DIR: pid, port, running, role."""
    with _errors():
        _show(load(dir), as_json)


@app.command()
def down(
    dir: DirOption,
    delete: Annotated[
        bool,
        typer.Option(
            "--delete",
            help=(
                "Also remove DIR with the cluster's data and logs (and data it keeps "
                "elsewhere): it cannot be started again."
            ),
        ),
    ] = False,
) -> None:
    """Stop every node of the cluster in DIR and check that no process is left."""
    with _errors():
        cluster = load(dir)
        before = [info.pid for info in cluster.nodes() if info.pid is not None]
        pooled = cluster.describe().get("pooler") if cluster.supports_pooler else None
        with _progress(f"stopping {cluster.kind}"):
            cluster.stop()
        left = [pid for pid in before if pid_alive(pid)]
        if pooled and pooled["pid"] is not None and pid_alive(pooled["pid"]):
            left.append(pooled["pid"])
        if left:
            raise ClusterError(f"processes still running after down: {left}")
        if delete:
            cluster.delete_data()
            out.print(
                f"{cluster.kind} in {dir}: {len(before)} node(s) stopped, none left running; "
                "its data deleted"
            )
            return
        cluster.save_state()
        out.print(f"{cluster.kind} in {dir}: {len(before)} node(s) stopped, none left running")


def _drive(verb: str, action: Callable[[LocalCluster, int], None], node: str, dir: Path) -> None:
    """Run ``action`` on ``node`` of the cluster in ``dir``, with progress on stderr, and
    print the node's state, then that of any other node the verb changed."""
    cluster = load(dir)
    index = _node_index(cluster, node)
    before = [(n.running, n.role) for n in cluster.nodes()]
    with _progress(f"{verb} {cluster.nodes()[index].name}"):
        action(cluster, index)
    cluster.save_state()
    after = cluster.nodes()
    # The named node, then any other the verb had to change (a Kafka restart brings
    # back enough of the KRaft quorum with it, a RabbitMQ restart its stopped peers
    # when all of them are down).
    others = [i for i, n in enumerate(after) if (n.running, n.role) != before[i]]
    for i in [index, *(i for i in others if i != index)]:
        info = after[i]
        also = "" if i == index else "also "
        out.print(
            f"{also}{info.name}: {'running' if info.running else 'not running'}"
            f" (pid {info.pid or '-'}, role {info.role or '-'})"
        )


def _node_command(
    verb: str, action: Callable[[LocalCluster, int], None]
) -> Callable[[str, Path], None]:
    def command(node: NodeArg, dir: DirOption) -> None:
        with _errors():
            _drive(verb, action, node, dir)

    command.__doc__ = {
        "kill": "SIGKILL one node (its data stays, as after a crash).",
        "pause": "SIGSTOP one node: its sockets stay open, it answers nothing.",
        "resume": "SIGCONT a paused node.",
        "promote": "Make a standby the primary (postgres; the primary must be down).",
    }[verb]
    return command


app.command(name="kill")(_node_command("kill", lambda c, n: c.kill(n)))


@app.command(name="restart")
def restart(
    node: NodeArg,
    dir: DirOption,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Restart a running node: kill it first (an outage of that node)."
        ),
    ] = False,
) -> None:
    """Start a stopped node again on its ports with its data; wait until it serves.

    A running node is refused (exit 3) unless --force: it would be killed first, an
    outage (a paused one is restarted). Other nodes the restart needs come back with it
    (RabbitMQ: when every other node is down too, they start together, since a node
    waits at boot for its peers)."""
    with _errors():
        if not force:
            cluster = load(dir)
            info = cluster.nodes()[_node_index(cluster, node)]
            if _serving(info):
                raise ClusterError(
                    f"{info.name} is running (pid {info.pid or '-'}): restarting it kills it "
                    f"first, an outage of that node; `msgsafe cluster restart {node} --dir "
                    f"{dir} --force` to do it anyway"
                )
        _drive("restart", _restart, node, dir)


def _serving(info: NodeInfo) -> bool:
    """A node that runs and is not paused: restarting it is an outage."""
    return info.running and info.role != "paused"


def _restart(cluster: LocalCluster, node: int) -> None:
    if _serving(cluster.nodes()[node]):  # --force
        cluster.kill(node)
    cluster.restart(node)


app.command(name="pause")(_node_command("pause", lambda c, n: c.pause(n)))
app.command(name="resume")(_node_command("resume", lambda c, n: c.resume(n)))


def _promote(cluster: LocalCluster, node: int) -> None:
    # Only kinds with a manual fail-over have it (postgres); the others fail over alone.
    promote: Callable[[int], None] | None = getattr(cluster, "promote", None)
    if promote is None:
        raise ClusterError(f"{cluster.kind} has no promote: its nodes fail over by themselves")
    promote(node)


app.command(name="promote")(_node_command("promote", _promote))


def _fetch(name: str) -> None:
    """Install what ``name`` (a kind or one of :data:`EXTRAS`) needs."""
    if name in EXTRAS:
        module, _, function = EXTRAS[name].partition(":")
        install: Callable[[], None] = getattr(importlib.import_module(module), function)
        install()
    else:
        launcher(name).fetch()


@app.command()
def fetch(
    kind: Annotated[
        str,
        typer.Argument(
            help=f"all (every kind), one of: {', '.join(sorted(KINDS))}; or "
            f"{', '.join(sorted(EXTRAS))} (Kafka's own command-line tools).",
            callback=_fetchable,
        ),
    ],
) -> None:
    """Install what a kind needs once (jars from Maven Central into the cache)."""
    kinds = sorted(KINDS) if kind == "all" else [kind]
    failed = 0
    for name in kinds:
        started = time.monotonic()
        try:
            with _progress(f"fetching {name}"):
                _fetch(name)
        except (ClusterError, ImportError) as exc:
            failed += 1
            first = str(exc).partition("\n")[0]
            err.print(f"[bold red]error:[/bold red] [red]{escape(name)}: {escape(first)}[/red]")
            continue
        out.print(f"{name}: ready ({time.monotonic() - started:.1f} s)")
    if failed:
        raise typer.Exit(EXIT_ERROR)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m msgsafe.cluster.cli``, the same commands as ``msgsafe cluster``."""
    # Library loggers stay quiet unless something is wrong; progress shows INFO lines.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    reflow_help(app)
    app(args=None if argv is None else list(argv), prog_name="msgsafe cluster")


if __name__ == "__main__":
    main()
