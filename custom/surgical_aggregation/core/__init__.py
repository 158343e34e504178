"""The federation's correctness, with no FLARE and no I/O: finding names, named head rows,
surgical aggregation and what each comparator of the papers changes."""
