"""The delay scheduler (after Chronos): Kafka in, Postgres underneath, Kafka out at the deadline.

The face holds what an application uses without a connection: the settings, the protocol's data and
the errors. The service (``switchyard.delay.service``) and its adapters (``store``: Postgres,
``publisher``: Kafka) are imported where they run, so importing this package loads no driver.
"""

from switchyard.core.errors import deprecated_aliases
from switchyard.delay.errors import (
    BrokerError,
    BrokerUnavailableError,
    DelayError,
    InvalidMessageError,
    MessageRefusedError,
    StoreError,
    StoreUnavailableError,
    TransientStoreError,
    UnstorableMessageError,
)
from switchyard.delay.model import (
    DEADLINE_HEADER,
    MESSAGE_ID_HEADER,
    DelayedMessage,
    DropReason,
    EnqueueOutcome,
    FireOutcome,
    InputRecord,
    SweepOutcome,
)
from switchyard.delay.settings import OUTPUT_CONSUMER_SETTINGS, DelaySettings

__all__ = [
    "DEADLINE_HEADER",
    "MESSAGE_ID_HEADER",
    "OUTPUT_CONSUMER_SETTINGS",
    "BrokerError",
    "BrokerUnavailableError",
    "DelayError",
    "DelaySettings",
    "DelayedMessage",
    "DropReason",
    "EnqueueOutcome",
    "FireOutcome",
    "InputRecord",
    "InvalidMessageError",
    "MessageRefusedError",
    "StoreError",
    "StoreUnavailableError",
    "SweepOutcome",
    "TransientStoreError",
    "UnstorableMessageError",
]

# The names before the error tree had one name per role (CHANGELOG.md), for one version.
__getattr__ = deprecated_aliases(__name__, {"PublishError": BrokerError,
                                            "PublisherUnavailableError": BrokerUnavailableError})
