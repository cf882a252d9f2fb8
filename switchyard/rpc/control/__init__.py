"""The control plane of a pool: its four handlers (orphans, dead letters, activity, the reconciler),
the topology it declares, and the broker access it needs (management API, confirming publisher,
Amazon MQ events). ``switchyard.rpc.service`` wires them to one pool's store, broker and driver.
"""
