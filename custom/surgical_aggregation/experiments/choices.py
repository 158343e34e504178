"""The names a user chooses among for the experiment grids: controls, variants, engines, head features.

This module imports nothing, so the command line lists the choices without loading torch or pandas; the grids and
the runner use these names.
"""

MISSING, ABSENT = "missing", "absent"
CONTROLS = (MISSING, ABSENT)  # a site's unlabelled findings: in its images (as in real data), or left out (control)
FULL, HEAD_ONLY = "full", "head_only"
VARIANTS = (FULL, HEAD_ONLY)  # train the whole network, or only the heads on frozen features
GLYPHS, BACKBONE = "glyphs", "backbone"
HEAD_FEATURES = (GLYPHS, BACKBONE)  # what the head-only variant reads the images with
FLARE_ENGINE, INPROCESS = "flare", "inprocess"
ENGINES = (FLARE_ENGINE, INPROCESS)  # where a full-network federation runs: FLARE's simulator, or this process
