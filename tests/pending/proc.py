"""A caller or processor node in its own process, for kills and injected crashes.

``python -m tests.pending.proc caller|processor|server ENDPOINT [--crash-at STEP] [--hold S]``
(processor: one dequeue + apply_response; server: ``PendingQueue.serve`` until it ends); settings
come from the environment (SWITCHYARD_REDIS_URL, SWITCHYARD_PENDING_*). ``--crash-at`` ends the
process with exit code 70 the moment the queue reaches that step (see ``PendingQueue._step``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from switchyard.pending import PendingError, PendingQueue, PendingRequest, RemoteError

CRASH_EXIT = 70


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["caller", "processor", "server"])
    parser.add_argument("endpoint")
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--hold", type=float, default=0.0, help="processor: seconds of work per request")
    parser.add_argument("--pickup-timeout", type=float)
    args = parser.parse_args()

    def on_step(name: str) -> None:
        if name == args.crash_at:
            os._exit(CRASH_EXIT)

    with PendingQueue(on_step=on_step) as queue:
        print(json.dumps({"ready": queue.node_id}), flush=True)
        if args.role == "caller":
            try:
                body = queue.queue_and_wait(args.endpoint, {"pid": os.getpid()},
                                            pickup_timeout=args.pickup_timeout).body
                print(json.dumps({"response": body}), flush=True)
            except (PendingError, RemoteError) as exc:
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
            return 0

        def handle(request: PendingRequest) -> dict:
            print(json.dumps({"taken": request.id}), flush=True)
            deadline = time.monotonic() + args.hold
            while time.monotonic() < deadline and not request.cancel.is_cancelled():
                time.sleep(0.05)  # pace: the service holds its request (until cancelled)
            return {"answered_by": os.getpid()}

        if args.role == "server":
            queue.serve(args.endpoint, handle)
            return 0
        request = None
        while request is None:
            request = queue.dequeue(args.endpoint, 5)
        delivery = queue.apply_response(request, handle(request))
        print(json.dumps({"delivery": delivery.value}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
