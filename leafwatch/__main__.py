"""``python -m leafwatch``: the same as the ``leafwatch`` command."""

from .cli import main

raise SystemExit(main())
