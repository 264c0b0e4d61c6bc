"""The outbox state machine: the states, who may move a row from where to where, in one table.

Every writer of the outbox (the dispatcher and the relay, the receipt applier, the operator
commands, the reconciler) changes a row's state only through `consumer_kit.core.transitions.cas`,
which takes one `Transition` of `TRANSITIONS` and guards its UPDATE with the transition's source
states. So the answer to "who may move a row out of SENT?" is `leaving(OutboxState.SENT)`.
See docs/architecture.md, "The outbox state machine".
"""

from __future__ import annotations

import dataclasses
import enum

from consumer_kit.core.errors import ConfigError


class OutboxState(enum.IntEnum):
    """States of an outbox row. The numbers are fixed: they are stored and documented in the DDL."""

    PENDING = 0
    SENDING = 1
    SENT = 2
    CONSUMED = 3
    FAILED = 4
    REJECTED = 5
    SUSPENDED = 6

    @classmethod
    def parse(cls, value: str | int) -> OutboxState:
        """Parse a state by name (any case) or code.

        Raises:
            ConfigError: unknown name or code (the message lists the valid ones).
        """
        try:
            if isinstance(value, int) or str(value).isdigit():
                return cls(int(value))
            return cls[str(value).upper()]
        except (KeyError, ValueError):
            valid = ", ".join(f"{s.value}={s.name}" for s in cls)
            raise ConfigError(f"unknown outbox state {value!r} (valid: {valid})") from None


#: What each state means (rendered into the DDL header and the docs).
MEANINGS: dict[OutboxState, str] = {
    OutboxState.PENDING: "committed, not yet sent (or re-queued)",
    OutboxState.SENDING: "claimed by a dispatcher/relay under a send lease",
    OutboxState.SENT: "the broker accepted it; waiting for the consumer groups' receipts",
    OutboxState.CONSUMED: "every expected consumer group sent a consumed receipt (terminal)",
    OutboxState.FAILED: "send retries exhausted; slow retry or an operator",
    OutboxState.REJECTED: "a consumer group refused it (terminal until an operator acts)",
    OutboxState.SUSPENDED: "held by an operator",
}

#: Not terminal: a receipt may still move a row out of these, and they make up the backlog.
OPEN_STATES: tuple[OutboxState, ...] = (
    OutboxState.PENDING, OutboxState.SENDING, OutboxState.SENT, OutboxState.FAILED,
    OutboxState.SUSPENDED,
)
#: Terminal until an operator acts (but a REJECTED row whose groups all consume a later delivery
#: becomes CONSUMED: `consume_rejected`); `ckit outbox archive` moves them out of the table.
TERMINAL_STATES: tuple[OutboxState, ...] = (OutboxState.CONSUMED, OutboxState.REJECTED)

STATE_COMMENT = ", ".join(f"{s.value} {s.name}" for s in OutboxState)


class Actor(str, enum.Enum):
    """Who writes an outbox row."""

    PRODUCER = "producer"      # Outbox.publish: inserts PENDING rows (no transition)
    SENDER = "sender"          # the after-commit dispatcher and the relay
    RECEIPTS = "receipts"      # the receipt applier (consumer groups' answers)
    OPERATOR = "operator"      # ckit outbox retry/suspend/resume
    RECONCILER = "reconciler"  # ckit reconcile


S = OutboxState


@dataclasses.dataclass(frozen=True)
class Transition:
    """One allowed move: `name` by `actor` from any of `sources` to `target`.

    `forced` are further sources allowed only when the caller says `force` (an operator's
    `--force`).
    """

    name: str
    actor: Actor
    sources: tuple[OutboxState, ...]
    target: OutboxState
    forced: tuple[OutboxState, ...] = ()
    meaning: str = ""

    def allowed_from(self, *, force: bool = False) -> tuple[OutboxState, ...]:
        """The source states this transition accepts (with `forced` ones when `force`)."""
        return (*self.sources, *self.forced) if force else self.sources


TRANSITIONS: tuple[Transition, ...] = (
    Transition("claim", Actor.SENDER, (S.PENDING,), S.SENDING,
               meaning="a relay or the dispatcher takes a due row under a send lease"),
    Transition("reclaim", Actor.SENDER, (S.SENDING,), S.SENDING,
               meaning="a send lease expired: another sender takes the row over"),
    Transition("claim_failed", Actor.SENDER, (S.FAILED,), S.SENDING,
               meaning="slow retry of a FAILED row (relay --retry-failed-after)"),
    Transition("mark_sent", Actor.SENDER, (S.SENDING,), S.SENT,
               meaning="the broker accepted the message"),
    Transition("retry_later", Actor.SENDER, (S.SENDING,), S.PENDING,
               meaning="the send failed: retry_count + 1, due after the back-off"),
    Transition("give_up", Actor.SENDER, (S.SENDING,), S.FAILED,
               meaning="retries exhausted (or the message can never be sent)"),
    Transition("release", Actor.SENDER, (S.SENDING,), S.PENDING,
               meaning="a broker outage stopped the batch: unsent rows back, no retry counted"),
    Transition("release_failed", Actor.SENDER, (S.SENDING,), S.FAILED,
               meaning="a row the slow retry took from FAILED left unsent (an outage, the "
                       "send window's end): back to FAILED as it was, no retry counted"),
    Transition("send_locked", Actor.SENDER, (S.PENDING, S.FAILED, S.SENDING), S.SENT,
               meaning="a relay with --claim lock sent a due row it held locked (claim and "
                       "mark in one UPDATE)"),
    Transition("retry_locked", Actor.SENDER, (S.PENDING, S.FAILED, S.SENDING), S.PENDING,
               meaning="--claim lock: the send failed: retry_count + 1, due after the back-off"),
    Transition("give_up_locked", Actor.SENDER, (S.PENDING, S.FAILED, S.SENDING), S.FAILED,
               meaning="--claim lock: retries exhausted (or the message can never be sent)"),
    Transition("consume", Actor.RECEIPTS, OPEN_STATES, S.CONSUMED,
               meaning="every expected group sent a consumed receipt (may beat mark_sent)"),
    Transition("reject", Actor.RECEIPTS, OPEN_STATES, S.REJECTED,
               meaning="a group sent a rejected receipt"),
    Transition("consume_rejected", Actor.RECEIPTS, (S.REJECTED,), S.CONSUMED,
               meaning="the groups that rejected it consumed a later delivery (a re-send after "
                       "ckit outbox retry re-runs a failed message): every expected group "
                       "consumed it"),
    Transition("retry", Actor.OPERATOR, (S.FAILED, S.SUSPENDED, S.REJECTED), S.PENDING,
               forced=(S.SENT, S.CONSUMED),
               meaning="ckit outbox retry: re-send from scratch (SENT, CONSUMED with --force)"),
    Transition("suspend", Actor.OPERATOR, (S.PENDING, S.FAILED, S.SENDING), S.SUSPENDED,
               meaning="ckit outbox suspend (a SENDING row only once its lease expired)"),
    Transition("resume", Actor.OPERATOR, (S.SUSPENDED,), S.PENDING,
               meaning="ckit outbox resume"),
    Transition("repair_receipt_lost", Actor.RECONCILER, (S.SENT,), S.CONSUMED,
               meaning="processed in every expected group, receipt lost"),
    Transition("repair_rejected", Actor.RECONCILER, (S.SENT,), S.REJECTED,
               meaning="a group's processed row is FAILED"),
    Transition("repair_resend", Actor.RECONCILER, (S.SENT,), S.PENDING,
               meaning="not consumed, retries left: re-send (consumers dedupe)"),
    Transition("repair_exhausted", Actor.RECONCILER, (S.SENT,), S.FAILED,
               meaning="not consumed, retries exhausted"),
    Transition("repair_stuck_sending", Actor.RECONCILER, (S.SENDING,), S.PENDING,
               meaning="a send lease long expired"),
)

_BY_NAME = {t.name: t for t in TRANSITIONS}


def transition(name: str) -> Transition:
    """The transition called `name`.

    Raises:
        KeyError: no such transition (a programming error).
    """
    return _BY_NAME[name]


def leaving(state: OutboxState) -> list[Transition]:
    """Every transition that may move a row out of `state` (forced ones included).

    >>> sorted({t.actor.value for t in leaving(OutboxState.SENT)})
    ['operator', 'receipts', 'reconciler']
    """
    return [t for t in TRANSITIONS if state in t.allowed_from(force=True) and t.target != state]


def allowed(source: OutboxState, target: OutboxState, *, actor: Actor | None = None) -> bool:
    """True when some transition (of `actor`, when given) moves `source` to `target`."""
    return any(source in t.allowed_from(force=True) and t.target == target
               and (actor is None or t.actor == actor) for t in TRANSITIONS)
