"""The names a user chooses among for label tables, in a module that imports nothing (the command line lists them)."""

UNCERTAINTY_POLICIES: tuple[str, ...] = ("zeros", "ones", "ignore")  # how an uncertain (-1) label is read
