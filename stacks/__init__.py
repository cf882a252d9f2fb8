"""CDK infrastructure for Switchyard. Only CDK code lives here; the runtime code is in switchyard/."""
