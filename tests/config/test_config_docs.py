"""docs/config.md is generated from the field table and must stay in sync with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from recserve.config import config_fields
from recserve.config.docs import render_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_docs_config_md_is_in_sync_with_the_field_table() -> None:
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == render_markdown(), (
        "docs/config.md is stale; regenerate it: python -m recserve.config --markdown > docs/config.md"
    )


def test_every_field_has_a_row_a_status_and_a_doc() -> None:
    markdown = render_markdown()
    for field in config_fields():
        assert f"| `{field.name}`" in markdown
        assert field.status in ("honoured", "mapped", "advisory")
        assert field.doc.endswith(".")


def test_command_line_prints_the_markdown_and_checks_files() -> None:
    run = [sys.executable, "-m", "recserve.config"]
    printed = subprocess.run([*run, "--markdown"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert printed.stdout == render_markdown()
    checked = subprocess.run([*run, "--check", "configs/redis_store.json"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert checked.returncode == 0 and '"redis_password": "***"' in checked.stdout
    assert "change-me" not in checked.stdout
    bad = subprocess.run([*run, "--check", "configs/absent.json"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert (bad.returncode, bad.stderr) == (
        2, "configs/absent.json: cannot read config file 'configs/absent.json': No such file or directory\n",
    )
