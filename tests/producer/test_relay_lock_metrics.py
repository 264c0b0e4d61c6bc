"""`--claim lock` counts its retries and failures once their transaction commits: a batch
rolled back (its session ended, a conflict at the commit) is sent again, and must not have
counted them already."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from consumer_kit.core.states import OutboxState
from outbox_producer import Backoff, Relay
from tests.conftest import Db
from tests.producer.test_relay import FlakyTransport, publish_many, row


def count(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0


def test_a_lock_batch_rolled_back_after_its_failure_marks_counts_no_retry(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a lock relay whose send of the one due row fails, and a transaction that ends in
    # an error after the failure was marked in it (the commit that never happens)
    [mid] = publish_many(server_db, 1)
    transport = FlakyTransport()
    transport.fail_next = 1
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock",
                  backoff=Backoff(schedule=(60,), jitter=0.0))
    mark_failure = relay.sender.mark_failure

    def then_lose_the_session(*args: object, **kwargs: object) -> None:
        mark_failure(*args, **kwargs)  # type: ignore[arg-type]
        raise sa.exc.OperationalError("COMMIT", {}, Exception("session ended"))

    monkeypatch.setattr(relay.sender, "mark_failure", then_lose_the_session)
    before = count("ckit_outbox_send_retries_total")
    # When the step fails
    with pytest.raises(sa.exc.OperationalError):
        relay.step()
    # Then the row is as it was (no retry charged) and so is the counter
    r = row(server_db, mid)
    assert (r["state"], r["retry_count"]) == (int(OutboxState.PENDING), 0)
    assert count("ckit_outbox_send_retries_total") == before


def test_committed_retries_and_failures_are_counted_once_in_either_claim_mode(
        db: Db) -> None:
    # Given two rows whose sends always fail, one with a retry left and one without
    claims = ["lease"] + (["lock"] if db.kind != "sqlite" else [])
    for claim in claims:
        [retry] = publish_many(db, 1, max_retries=5)
        last = publish_many_one_left(db)
        transport = FlakyTransport(fails=lambda m: True)
        retries, failed = (count("ckit_outbox_send_retries_total"),
                           count("ckit_outbox_failed_total"))
        # When a relay tries them once
        Relay(db.engine, transport, table=db.names.outbox, claim=claim,
              backoff=Backoff(schedule=(60,), jitter=0.0)).step()
        # Then one retry and one failure are counted, as the rows show
        assert row(db, retry)["state"] == int(OutboxState.PENDING)
        assert row(db, last)["state"] == int(OutboxState.FAILED)
        assert count("ckit_outbox_send_retries_total") == retries + 1, claim
        assert count("ckit_outbox_failed_total") == failed + 1, claim
        with db.engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {db.names.outbox}"))


def publish_many_one_left(db: Db) -> str:
    from outbox_producer import Outbox

    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, max_retries=0)
    with db.engine.begin() as conn:
        return outbox.publish(conn, "T", {"last": 1}, biz_type="last", biz_key="1")
