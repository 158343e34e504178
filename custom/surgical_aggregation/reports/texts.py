"""How a CSV of reports becomes the texts the sentence encoder embeds: the one definition of it.

The report loaders, ``predict`` and the exported MONAI Bundle read reports through this module; the bundle carries a
copy of this file (``scripts/texts.py``), which is why it imports nothing but pandas.
"""

from __future__ import annotations

import pandas as pd

# Only an empty cell is missing: "NA" or "None" in a report is a word of it.
CSV_OPTIONS = {"keep_default_na": False, "na_values": [""]}
ID_COLUMN = "report_id"
NO_TEXT = "no text"  # why a report is not scored: its text is empty


def report_rows(frame: pd.DataFrame, text_column: str) -> pd.DataFrame:
    """``report_id`` (the CSV's, else the row number) and the text with its whitespace collapsed."""
    text = frame[text_column].fillna("").astype(str).str.split().str.join(" ")
    ids = frame[ID_COLUMN].astype(str) if ID_COLUMN in frame.columns else pd.Series(range(len(frame))).astype(str)
    return pd.DataFrame({ID_COLUMN: ids, "text": text})
