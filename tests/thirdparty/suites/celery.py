"""Celery's integration tests of task publishing (BSD-3-Clause), with the app's publishing
through :func:`msgsafe.compat.celery.install`.

Celery has no client class to swap: on the wrapper side every test's app and the session
worker's app get ``install(app)`` from an autouse fixture the swap adds to the test
module (below); everything else, the worker included, is Celery's. Both sides run
against the one-node RabbitMQ the harness starts, with the ``rpc://`` result backend
(no Redis is started: the tests that need one skip themselves).
"""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

#: Celery's conftest reads the broker from TEST_BROKER at import; the module global is
#: what its ``celery_config`` fixture returns, so the test module sets it.
_BROKER = "from .conftest import TEST_BACKEND, get_active_redis_channels, get_redis_connection\n"

_INSTALL = '''import pytest


@pytest.fixture(autouse=True)
def _msgsafe_publishing(app, celery_session_app, tmp_path_factory):
    """The harness: this test's app and the session worker's through msgsafe."""
    from msgsafe.compat import celery as msgsafe_celery

    function_app = None
    for each in (celery_session_app, app):
        if msgsafe_celery.installed(each) is None:
            outbox = tmp_path_factory.mktemp("outbox") / "outbox.sqlite3"
            publisher = msgsafe_celery.install(each, outbox=outbox)
            if each is app and app is not celery_session_app:
                function_app = publisher
    yield
    if function_app is not None:
        function_app.uninstall()
'''

SUITE = Suite(
    name="celery",
    broker="rabbitmq",
    repo="celery/celery",
    commit="5dc781f0bd5f36186bfcc74e0a4f9f654452c69b",
    test_files=("t/integration/test_tasks.py",),
    support=(
        "t/integration/__init__.py",
        "t/integration/conftest.py",
        "t/integration/tasks.py",
    ),
    edits=(
        (
            _BROKER,
            _BROKER
            + "from . import conftest as _harness_conftest\n"
            + '_harness_conftest.TEST_BROKER = "pyamqp://guest:guest@{address}//"\n',
        ),
    ),
    swap=(("import pytest\n", _INSTALL),),
    set_aside={},
    intended={
        "test_task_replacement::test_replaced_task_nesting_level_0": (
            "delay() returns once the broker confirmed; the session worker (in the same "
            "process) has received the task by then, and the test resets the flag its "
            "task_received handler set only after delay() returned"
        ),
    },
    env={"TEST_BACKEND": "rpc://"},
    pytest_args=(
        "-p",
        "celery.contrib.pytest",
        "-o",
        "python_classes=test_*",
        "-W",
        "ignore::pytest.PytestUnknownMarkWarning",
    ),
)
