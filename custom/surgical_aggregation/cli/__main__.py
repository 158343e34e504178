"""``python -m surgical_aggregation.cli``, as before the command line became a package."""

from . import main

raise SystemExit(main())
