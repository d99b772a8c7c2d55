"""docs/GUIDE.md's Python snippet, run as written in a fresh interpreter."""

import pathlib
import re
import subprocess
import sys

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"


def test_the_guides_python_snippet_runs_as_written():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert blocks, "GUIDE.md has no python block"
    out = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "reply 42", out.stdout
