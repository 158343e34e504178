"""A site's work: its config and the profiles that author it, its data, the training loops, the trainer (and the
helper ranks of a site training on several GPUs), and the model files it writes. No FLARE here: the client script
in ``flare/`` and the experiments' baselines both drive the trainer."""
