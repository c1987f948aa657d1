"""python-qpid-proton's tests of ``proton.utils.BlockingConnection``
(``python/tests/proton_tests/utils.py``, Apache-2.0), against
:class:`msgsafe.compat.proton.BlockingConnection`.

The tests start their own in-process AMQP 1.0 server (an echo server on a free port):
no broker is started for them.
"""

from __future__ import annotations

from tests.thirdparty.suites.model import Suite

SUITE = Suite(
    name="proton",
    broker="none",
    repo="apache/qpid-proton",
    commit="2ea507cadd5fc9eb672f3850764eb1070081eb5a",  # 0.40.0, as installed
    test_files=("python/tests/proton_tests/utils.py",),
    # NOTE: the package's own __init__ imports every test module; an empty one is written.
    support=("python/tests/proton_tests/common.py",),
    # NOTE: both tests use the default SASL (ANONYMOUS), not Cyrus: run them where the
    # installed proton has no extended SASL (the wheel's), as they would skip otherwise.
    edits=(
        (
            "    def test_request_response(self):\n        ensureCanTestExtendedSASL()\n",
            "    def test_request_response(self):\n",
        ),
        (
            "    def test_connection_properties(self):\n        ensureCanTestExtendedSASL()\n",
            "    def test_connection_properties(self):\n",
        ),
    ),
    swap=(
        (
            "from proton.utils import SyncRequestResponse, BlockingConnection\n",
            "from proton.utils import SyncRequestResponse\n"
            "from msgsafe.compat.proton import BlockingConnection\n",
        ),
    ),
    set_aside={},
    intended={
        "SyncRequestResponseTest::test_request_response": "SyncRequestResponse needs "
        "reply_to and correlation_id on the request, which msgsafe's AMQP 1.0 adapter does "
        "not carry (body, id and properties only; docs/migration.md): no reply comes",
    },
)
