"""``python -m fabric.cli``: the ``fabric`` command (tests and the cluster supervisor start processes so)."""

import os

from fabric.cli import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
main()
