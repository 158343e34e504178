"""Report labelling (the report-labelling paper): report tables, sentence embeddings, the MLP."""
