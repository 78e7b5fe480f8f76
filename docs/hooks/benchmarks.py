"""MkDocs hook: the site's "Benchmarks" page is ``bench/README.md`` itself, read when the
site is built - the figures and the commands that made them live in one file, beside the
scripts, and the site shows that file rather than a copy that could drift from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

BENCH = Path(__file__).resolve().parents[2] / "bench" / "README.md"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "benchmarks.md", content=BENCH.read_text("utf-8")))
    return files
