"""The names a user chooses among for label tables, in a module that imports nothing (the command line lists them)."""

UNCERTAINTY_POLICIES: tuple[str, ...] = ("zeros", "ones", "ignore")  # how an uncertain (-1) label is read
RECORD_MODES: tuple[str, ...] = ("head", "full", "off")  # what a site keeps of each model exchange (flare.audit)
