"""What a worker or client is started with, refused in one line: a handler whose module fails as it
is imported, and an AMQP URL pika cannot read (both reached the user as "unexpected")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from switchyard.core.errors import ConfigError
from switchyard.rpc.amqp import connect, redact, url_parameters
from tests.conftest import subprocess_env


def test_a_handler_module_that_raises_at_import_cannot_be_loaded(tmp_path: Path) -> None:
    (tmp_path / "needs_config.py").write_text("raise RuntimeError('PRICING_TABLE is not set')\n")
    run = subprocess.run([sys.executable, "-m", "switchyard", "worker", "--handler", "needs_config:quote",
                          "--pool", "p", "--key", "k"], cwd=tmp_path, env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip() == ("switchyard: error: cannot load handler 'needs_config:quote': importing "
                                  "needs_config raised RuntimeError: PRICING_TABLE is not set")


@pytest.mark.parametrize(("url", "says"), [
    ("amqp://u:secret-pw@127.0.0.1/?no_such_option=1", "Unknown URL parameter: 'no_such_option'"),
    ("amqp://u:secret-pw@127.0.0.1/?heartbeat=often", "Invalid heartbeat value 'often'"),
    ("secret-pw", "IndexError"),
])
def test_an_amqp_url_pika_cannot_read_is_a_config_error(url: str, says: str) -> None:
    """What only pika checks (its query options) is refused before any connection, naming the
    setting and never the password; ``redact`` (used in messages) refuses it alike."""
    for use in (url_parameters, redact, lambda u: connect(u, "test")):
        with pytest.raises(ConfigError, match="SWITCHYARD_AMQP_URL is not an AMQP URL") as caught:
            use(url)
        assert says in str(caught.value) and "secret-pw" not in str(caught.value)
