"""The worked examples in the package's docstrings still hold."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rag_demo"
MODULES = sorted(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                 if p.name not in ("__init__.py", "__main__.py") and ">>>" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    results = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert results.attempted and results.failed == 0
