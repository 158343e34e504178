"""The names a user chooses among for chest X-ray images: folder layouts, generated datasets, policies, the model.

This module imports nothing, so the command line lists the choices without loading torch or pandas; the
modules that implement them build their registries from these names (a test keeps them in step).
"""

NIH, CHEXPERT, MIMIC, CSV = "nih", "chexpert", "mimic", "csv"
PUBLIC_KINDS: tuple[str, ...] = ("padchest", "vindr", "google-nih", "rsna", "siim")  # label rows only, real files
LAYOUT_KINDS: tuple[str, ...] = (NIH, CHEXPERT, MIMIC, CSV, *PUBLIC_KINDS)  # the folder layouts the bundle reads
GENERATED_KINDS: tuple[str, ...] = (NIH, CHEXPERT, MIMIC, *PUBLIC_KINDS)  # the embedded datasets it can generate
KINDS = LAYOUT_KINDS  # the data kinds of this modality (modalities)
# How a generated image's findings its layout does not label are drawn (``embedded.co_occurrence``): from a row of the
# file that labels them agreeing on the 7 findings NIH and CheXpert share (the default), or from one PadChest row
# agreeing on every finding the image's layout labels (real co-occurrence across both vocabularies)
SHARED_ROWS, PADCHEST_ROWS = "shared", "padchest"
CO_OCCURRENCES: tuple[str, ...] = (SHARED_ROWS, PADCHEST_ROWS)
ON_ERROR_POLICIES: tuple[str, ...] = ("error", "skip")  # an unreadable image: stop, or leave it out and say so
ARCHITECTURE = "densenet121"  # the modality's model family, as a model file records it
# The networks a job may train (a site config's ``network``; a model file's preprocessing records one that is not
# the first): the papers' DenseNet121, and a DenseNet of the same layout small enough to run the bundle's wiring in
# tests and smoke runs in seconds (what it learns says nothing about the method).
DENSENET121, SMOKE_DENSENET = "densenet121", "densenet-smoke"
# MONAI ``DenseNet`` arguments of each: DenseNet121's own (MONAI's ``DenseNet121`` defaults), and the smoke network's
# (26,992 parameters and 32 features before the head, against DenseNet121's 6.95 M and 1,024)
NETWORK_ARGUMENTS: dict[str, dict] = {
    DENSENET121: {"init_features": 64, "growth_rate": 32, "block_config": (6, 12, 24, 16), "bn_size": 4},
    SMOKE_DENSENET: {"init_features": 16, "growth_rate": 8, "block_config": (2, 2, 2, 2), "bn_size": 4},
}
NETWORKS: tuple[str, ...] = tuple(NETWORK_ARGUMENTS)
NETWORK_KEY = "network"  # the setting, and the preprocessing entry of a model file
