"""``python -m surgical_aggregation.core.checks docs/server-checks.md``: rewrite the page's tables from the registry."""

import sys
from pathlib import Path

from surgical_aggregation.core.checks import document_checks

document = Path(sys.argv[1])
document.write_text(document_checks(document.read_text()))
