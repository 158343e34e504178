"""``python -m surgical_aggregation`` runs the command line."""

from .cli import main

raise SystemExit(main())
