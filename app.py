#!/usr/bin/env python3
"""CDK entry point: `python app.py` (or `cdk synth`) writes the CloudFormation templates to cdk.out/.

Thin on purpose: no AWS calls, no credentials needed. The stack is defined in stacks/.
"""

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from stacks.application import build_app, stacks_of
from stacks.config import ConfigError

if __name__ == "__main__":
    # Under the cdk CLI, CDK_OUTDIR says where to write; run directly, write to ./cdk.out.
    outdir = None if os.environ.get("CDK_OUTDIR") else "cdk.out"
    try:
        app, _ = build_app(outdir=outdir)
        assembly = app.synth()
    except ConfigError as exc:  # a context value or a missing layer: one line, not a traceback
        sys.exit(f"switchyard: error: {exc}")
    if outdir:
        names = ", ".join(stack.stack_name for stack in stacks_of(app))
        print(f"synthesized {names} to {assembly.directory}", file=sys.stderr)
