"""Which facts function each chapter glues (``notebooks/<chapter>.py``): the registry the tests
check every chapter's quoted names against."""
from __future__ import annotations

from . import anatomy, equivalence, waiting

CHAPTERS = {
    "14_anatomy": anatomy.facts, "15_time_to_result": waiting.facts,
    "16_equivalence": equivalence.facts,
}
