"""The peer benchmark of issue 17: consumer-kit side by side with the Python outbox packages a
team would pick instead, in one run, on the same MariaDB and PostgreSQL servers.

    python -m bench.peers [--quick] [--databases mysql,postgresql] [--peers all]

See bench/peers/README.md for what each measure means and what the figures say.
"""
