"""The image modality: chest X-ray folder layouts, decoding, the preprocessing cache, transforms,
the embedded generated datasets and the DenseNet121 with a named head."""
