"""docs/api.md is generated from the docstrings (``python -m scripts.api_docs``): a changed signature
or docstring of a public name changes the page in the same commit."""

from __future__ import annotations

from scripts import api_docs
from tests.conftest import ROOT


def test_the_api_page_is_generated_from_the_docstrings() -> None:
    assert (ROOT / api_docs.PAGE).read_text() == api_docs.render(), \
        "docs/api.md differs from the docstrings: python -m scripts.api_docs"


def test_every_public_name_is_on_the_page() -> None:
    import importlib

    page = (ROOT / api_docs.PAGE).read_text()
    for module in api_docs.MODULES:
        for name in importlib.import_module(module).__all__:
            assert f"`{module}.{name}`" in page or f"- `{name}` = " in page, f"{module}.{name}"


def test_a_changed_docstring_shows() -> None:
    from switchyard.rpc.client.async_client import AsyncRpcClient

    before = api_docs.render()
    original = AsyncRpcClient.call.__doc__
    AsyncRpcClient.call.__doc__ = "Changed."
    try:
        assert api_docs.render() != before and "Changed." in api_docs.render()
    finally:
        AsyncRpcClient.call.__doc__ = original
