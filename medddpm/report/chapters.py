"""Which facts function each chapter glues (``notebooks/<chapter>.py``): the registry the tests
check every chapter's quoted names against."""
from __future__ import annotations

from . import anatomy, equivalence, few_step, quality_facts, waiting

CHAPTERS = {
    "09_quality": quality_facts.quality, "10_sampling": quality_facts.quality,
    "11_few_step": few_step.facts, "12_fp8": quality_facts.quality,
    "14_anatomy": anatomy.facts, "15_time_to_result": waiting.facts,
    "16_equivalence": equivalence.facts,
}
