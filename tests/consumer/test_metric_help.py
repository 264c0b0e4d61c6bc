"""The consumer counters' help texts say what the counts and the processed rows show."""

from __future__ import annotations

from consumer_kit import metrics
from consumer_kit.core.schema.tables import ProcessedStatus
from consumer_kit.outcome import Outcome
from consumer_kit.pipeline import _OUTCOME_COUNTERS


def test_the_dead_letter_counter_names_the_status_its_processed_rows_get() -> None:
    # A dead-lettered message's processed row is DEAD_LETTERED (seen live: 62 dead letters,
    # 62 DEAD_LETTERED rows, no FAILED one among them); the help said "recorded FAILED"
    help_text = metrics.DEAD_LETTERED._documentation
    assert ProcessedStatus.DEAD_LETTERED.value in help_text
    assert "recorded FAILED" not in help_text


def test_the_retry_counter_does_not_claim_the_busy_deliveries() -> None:
    # Busy deliveries are answered RECONSUME_LATER too, but counted in ckit_busy only: the help
    # of ckit_retried must not say it counts every RECONSUME_LATER
    assert _OUTCOME_COUNTERS[Outcome.BUSY] is metrics.BUSY
    assert metrics.RETRIED._documentation != "Deliveries answered RECONSUME_LATER"
    assert "ckit_busy" in metrics.RETRIED._documentation
