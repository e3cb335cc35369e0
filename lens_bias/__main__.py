"""``python -m lens_bias ...`` is the ``lens-bias`` command."""

from .cli import main

raise SystemExit(main())
