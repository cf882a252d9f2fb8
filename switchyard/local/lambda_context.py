"""A Lambda context for handlers run locally by the event-source bridges (MSK, RabbitMQ)."""

from __future__ import annotations

import threading
import time
import uuid


class FakeLambdaContext:
    """What handlers (and Powertools) read from a Lambda context; time runs out at the timeout or on stop.

    On stop the remaining time drops to ``stop_grace_ms`` and counts down from there: a handler that
    stops working when its time runs short (the delay fire loop) then settles what it holds, as at
    the end of a Lambda invocation, instead of leaving it for failure detection.
    """

    def __init__(self, function_name: str, timeout_ms: int, stop: threading.Event | None = None,
                 stop_grace_ms: int = 0) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{function_name}"
        self.memory_limit_in_mb = 1024
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_ms / 1000
        self._stop = stop
        self._stop_grace_s = stop_grace_ms / 1000
        self._stopped = False

    def get_remaining_time_in_millis(self) -> int:
        now = time.monotonic()
        if not self._stopped and self._stop is not None and self._stop.is_set():
            self._stopped = True
            self._deadline = min(self._deadline, now + self._stop_grace_s)
        return max(0, int((self._deadline - now) * 1000))
