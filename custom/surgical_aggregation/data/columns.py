"""A label file's header, checked before any column becomes a class: every class name a site sends the server (and,
at publication, every other site) starts as one of these columns, so a column is a class only when the site declared
it or it names a finding the vocabulary knows.

Refused, naming the file, the column and the likely intended name: a header that repeats a column (pandas would read
the second as ``Atelectasis.1``), a file separated by something other than commas (it reads as one column), and,
where the label columns are taken from the header rather than listed, a column that is no known finding (a
bookkeeping ``Reviewed``, a misspelt or Latin-plural ``pneumothoraces``). A site declares its own findings with
``data.options.new_classes`` (or an alias file, or by listing ``label_columns``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..core.errors import DatasetFormatError
from ..core.labels import Vocabulary, normal_form

SEPARATORS = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}
CLOSE_MATCH = 0.8  # difflib's ratio above which an unknown column is named as a likely misspelling
# Latin plurals the vocabulary's plural rule does not read (it strips a final s): ending -> the singular's ending
LATIN_PLURALS = (("aces", "ax"), ("ices", "ix"), ("ices", "ex"), ("ae", "a"), ("i", "us"), ("ata", "a"))


def _header_cells(path: Path) -> list[str]:
    """The first row of the CSV at ``path`` as written, repeats kept (pandas reads gzipped and zipped files alike;
    [] when it cannot be read: the reader says why)."""
    try:
        row = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, EOFError, OSError, ValueError):
        return []
    return [str(cell).strip() for cell in row.iloc[0]] if len(row) else []


def header_problem(path: Path, columns: Sequence[str]) -> str | None:
    """What is wrong with the header of the CSV at ``path`` that pandas read as ``columns`` (None when nothing)."""
    if len(columns) == 1:
        for separator, name in SEPARATORS.items():
            if separator in str(columns[0]):
                return (
                    f"{path}: its header is one column {str(columns[0])[:60]!r}: the file looks separated by {name}, "
                    "not commas; save it as a comma-separated CSV"
                )
    seen: dict[str, int] = {}
    for position, cell in enumerate(_header_cells(path), start=1):
        if cell in seen:
            return (
                f"{path}: the header repeats the column {cell!r} (columns {seen[cell]} and {position}): each "
                "finding needs one column; merge or rename them"
            )
        seen[cell] = position
    return None


def likely_names(column: str, vocabulary: Vocabulary) -> list[str]:
    """The known findings ``column`` is probably a spelling of: a Latin plural's singular, or a close misspelling."""
    key = normal_form(column)
    found = []
    for plural, singular in LATIN_PLURALS:
        if key.endswith(plural):
            candidate = key[: -len(plural)] + singular
            if vocabulary.knows(candidate):
                found.append(vocabulary.canonical(candidate))
    keys = {normal_form(name): name for name in vocabulary.findings()}
    found += [keys[match] for match in difflib.get_close_matches(key, list(keys), n=2, cutoff=CLOSE_MATCH)]
    return list(dict.fromkeys(found))


def undeclared_columns(
    columns: Sequence[str],
    vocabulary: Vocabulary,
    new_classes: Sequence[str] | None,
    where: str,
) -> None:
    """Refuse the first of ``columns`` (label columns taken from a file's header) that the vocabulary does not know
    and ``new_classes`` does not declare, naming the file (``where``), the column and the finding it is likely meant
    to be."""
    declared = {normal_form(name) for name in new_classes or ()}
    for column in columns:
        if vocabulary.knows(column) or normal_form(column) in declared:
            continue
        if re.fullmatch(r"Unnamed: \d+", column):  # pandas' name for an empty header cell
            raise DatasetFormatError(
                f"{where}: column {column!r} is a header cell left empty (a table's index written with it?): name "
                "it, remove it, or list the label columns (data.options.label_columns)"
            )
        likely = likely_names(column, vocabulary)
        hint = f" (likely {' or '.join(repr(name) for name in likely)}: rename the column or map it in an alias file)"
        raise DatasetFormatError(
            f"{where}: column {column!r} is not a finding this bundle knows{hint if likely else ''}; a column that is "
            "not a label: list the label columns (data.options.label_columns); a finding of your own: declare it "
            "(data.options.new_classes), and only then does its name leave the site"
        )
