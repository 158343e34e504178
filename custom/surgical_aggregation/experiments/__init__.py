"""The papers' harness: grids of settings, the runner (federations in FLARE's simulator, baselines without
it), evaluation by class name, and the summary's statistics and figures. Hospitals never need it."""
