"""The fault runner (`python bench/faults.py`): the whole system as separate processes on
services of its own, faults on a seeded schedule, then checks that nothing was lost or doubled.

One idea per module: `services` (the run's own Redis, RocketMQ), `mariadb` (its own MariaDB),
`postgres` (its own PostgreSQL instead, `--db postgresql`), `processes` (the producer, relays,
consumers and receipt applier, supervised), `schedule` (the seeded fault plan), `inject`
(carrying one fault out), `timeline` (samples and the PNG), `checks` (counts and the verdict),
`settle` (drain and reconcile rounds), `report` (text and JSON), `scenario` (one run from start
to end). `app` and `producer` are what the child processes run; `world` names the databases,
tables and topic; `kit` is the only module importing consumer-kit.
"""
