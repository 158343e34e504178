"""FLARE Client API script of this job: the site trainer of the installed surgical_aggregation."""

from surgical_aggregation.flare.client import main

main()
