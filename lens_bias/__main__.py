"""``python -m lens_bias ...`` is the ``lens-bias`` command."""

from lens_bias.cli import main

raise SystemExit(main())
