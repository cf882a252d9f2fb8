"""The slotted RPC client (the slotted client design): ``RpcClient`` calls one pool's workers by key.

``rpc_client`` is the caller's side (``async_client`` the same for asyncio), ``io_loop`` the I/O
thread, ``requests`` a request's checks and encoding, ``response`` what a call resolves to, ``slots``
the table of calls in flight, ``resend`` what a lost connection does to them.
"""

from switchyard.rpc.client.async_client import AsyncRpcClient
from switchyard.rpc.client.response import ClientStats, Response
from switchyard.rpc.client.rpc_client import RpcClient

__all__ = ["AsyncRpcClient", "ClientStats", "Response", "RpcClient"]
