"""The README stays true to the code: its layout names every module, and no module outgrows a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 620  # past this a module holds more than one job: split it


def _layout_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    development = readme[readme.index("## Development"):]
    blocks = re.findall(r"```\n(.*?)```", development, re.S)
    return next(block for block in blocks if block.startswith("app.py"))


def _listed(block: str) -> set[str]:
    """Paths of the layout block, rebuilt from its indentation: "rag_demo/ui/page.py" and so on."""
    listed, folders = set(), []
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name:
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        folders = folders[:depth]
        path = "/".join([*folders, name.rstrip("/")])
        listed.add(path)
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return listed


def _modules() -> set[str]:
    found = {"app.py"}
    for folder in ("rag_demo", "benchmarks", "scripts"):
        found |= {str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py") if p.name != "__init__.py"
                  or p.parent.name == "rag_demo"}
    return found


def test_the_readme_layout_lists_every_module():
    missing = sorted(_modules() - _listed(_layout_block()))
    assert not missing, f"add these to the README's layout, one line each: {missing}"


def test_the_layout_lists_nothing_that_is_gone():
    listed = {p for p in _listed(_layout_block()) if p.endswith(".py")}
    gone = sorted(p for p in listed if not (ROOT / p).is_file())
    assert not gone, f"the README's layout names files that do not exist: {gone}"


def test_no_module_outgrows_one_job():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in (ROOT / "rag_demo").rglob("*.py")}
    assert max(sizes.values()) <= MAX_MODULE_LINES, {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES}
