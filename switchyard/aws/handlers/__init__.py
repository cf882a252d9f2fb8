"""The Lambda handlers, one module per function: ``functions/<name>.py`` (what Lambda's handler
setting names) only re-exports the one here, so the local runtime of a pip install (``switchyard
local``, ``delay run``, ``invoke``) runs the very same code without the source tree."""
