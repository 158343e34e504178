"""Report labelling (seed 004): report tables, sentence embeddings, the MLP and its training."""
