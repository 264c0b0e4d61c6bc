"""Everything the fault runner takes from consumer-kit, in one module.

The runner drives the product through its command line (`python -m consumer_kit.cli.main`) and
its public API; the package layout is changing, so when a name moves only this file changes.
"""

from __future__ import annotations

import re
import sys

from bench.common import machine_facts
from consumer_kit import ConsumerApp, Message
from consumer_kit.transports import open_transport
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from outbox_producer import Dispatcher, Outbox, OutboxState, receipt_topic

#: the command line (`ckit`'s own entry point, so the spawned process uses this checkout through
#: PYTHONPATH), with the `consumer_kit.cli` logger at DEBUG: the CLI turns an unexpected error
#: into one line and logs its traceback at DEBUG, which a fault run needs in the role's log
CLI = (sys.executable, "-c",
       "import logging, sys; logging.getLogger('consumer_kit.cli').setLevel(logging.DEBUG); "
       "from consumer_kit.cli.main import main; sys.argv[0] = 'ckit'; main()")

#: the default table names that `ckit db init` creates (schema/columns.md)
OUTBOX_TABLE = "ckit_outbox"
PROCESSED_TABLE = "ckit_processed"
#: the receipt applier's subcommand (`ckit acks` before the receipts were made durable)
RECEIPTS_COMMAND = "receipts"
#: how `ckit outbox retry` names one row by its id (a bare number could also be a biz key)
ROW_TARGET = "id:{}"
#: the ckit_id property: the outbox message id on every message (and dead letter)
PROP_ID = "ckit_id"

#: outbox states by code, and the reverse
STATE_NAMES = {int(s): s.name for s in OutboxState}
CONSUMED = int(OutboxState.CONSUMED)
SENT = int(OutboxState.SENT)

_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")


def mask(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`.

    >>> mask("mysql+pymysql://ckit:secret@127.0.0.1/db")
    'mysql+pymysql://ckit:***@127.0.0.1/db'
    """
    return _PASSWORD.sub(r"\1***@", text)


__all__ = [
    "CLI",
    "CONSUMED",
    "OUTBOX_TABLE",
    "PROCESSED_TABLE",
    "PROP_ID",
    "RECEIPTS_COMMAND",
    "ROW_TARGET",
    "SENT",
    "STATE_NAMES",
    "ConsumerApp",
    "Dispatcher",
    "Message",
    "Outbox",
    "OutboxState",
    "RocketMQ5Transport",
    "machine_facts",
    "mask",
    "open_transport",
    "receipt_topic",
]
