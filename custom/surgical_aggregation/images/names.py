"""The names a user chooses among for chest X-ray images: folder layouts, generated datasets, policies, the model.

This module imports nothing, so the command line lists the choices without loading torch or pandas; the
modules that implement them build their registries from these names (a test keeps them in step).
"""

NIH, CHEXPERT, MIMIC, CSV = "nih", "chexpert", "mimic", "csv"
PUBLIC_KINDS: tuple[str, ...] = ("padchest", "vindr", "google-nih", "rsna", "siim")  # label rows only, real files
LAYOUT_KINDS: tuple[str, ...] = (NIH, CHEXPERT, MIMIC, CSV, *PUBLIC_KINDS)  # the folder layouts the bundle reads
GENERATED_KINDS: tuple[str, ...] = (NIH, CHEXPERT, MIMIC, *PUBLIC_KINDS)  # the embedded datasets it can generate
KINDS = LAYOUT_KINDS  # the data kinds of this modality (modalities)
ON_ERROR_POLICIES: tuple[str, ...] = ("error", "skip")  # an unreadable image: stop, or leave it out and say so
ARCHITECTURE = "densenet121"
