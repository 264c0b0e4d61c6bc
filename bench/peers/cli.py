"""The coordinator: installs the peers, runs every measure of every peer on every database in one
run, prints one table per database, the summary table of issue 17 and what is unfair about it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

import sqlalchemy as sa

from bench.common import load_average, machine_facts
from bench.peers import catalog, jobs, report, venvs
from consumer_kit.core.urls import mask_url

DEFAULT_MYSQL = os.environ.get("CKIT_TEST_MYSQL_URL",
                               "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test")
DEFAULT_PG = os.environ.get("CKIT_TEST_PG_URL",
                            "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_bench")
DEFAULT_REDIS = os.environ.get("CKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SHORT = {"consumer-kit": "ck", "txoutbox": "tx", "faststream-outbox": "fs",
         "django-outbox-pattern": "dop", "django-jaiminho": "jm"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--databases", default="mysql,postgresql", help="mysql,postgresql")
    p.add_argument("--peers", default="all", help="comma list of peer names, or all")
    p.add_argument("--measures", default="publish,drain,dedupe")
    p.add_argument("--tx", type=int, default=1000,
                   help="publish: transactions of each variant per run")
    p.add_argument("--runs", type=int, default=3, help="publish and dedupe runs (medians)")
    p.add_argument("--drain-rows", type=int, default=50_000)
    p.add_argument("--drain-runs", type=int, default=3)
    p.add_argument("--drain-budget", type=float, default=12.0,
                   help="seconds one drain run may take before its backlog is cut to fit")
    p.add_argument("--dedupe-messages", type=int, default=1000,
                   help="dedupe: messages of each variant per run")
    p.add_argument("--duplicates", type=int, default=2000)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny counts, one run, one drain setting (a minute or two)")
    p.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    p.add_argument("--pg-url", default=DEFAULT_PG)
    p.add_argument("--database", default="ckit_bench",
                   help="database name used on both servers (the URLs' own is replaced)")
    p.add_argument("--redis-url", default=DEFAULT_REDIS)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per runner")
    p.add_argument("--json", help="also write every runner's raw result to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.tx, args.runs, args.drain_rows, args.drain_runs = 50, 1, 1000, 1
        args.drain_budget, args.dedupe_messages, args.duplicates = 2.0, 50, 50
    return args


def database_urls(args: argparse.Namespace) -> dict[str, str]:
    """The servers that answer, by kind; a missing one is reported and skipped."""
    urls = {"mysql": args.mysql_url, "postgresql": args.pg_url}
    out = {}
    for kind in (k.strip() for k in args.databases.split(",") if k.strip()):
        if kind not in urls:
            raise SystemExit(f"unknown database {kind!r}: use mysql and/or postgresql")
        url = sa.engine.make_url(urls[kind]).set(database=args.database)
        text = url.render_as_string(hide_password=False)
        engine = sa.create_engine(text)
        try:
            with engine.connect():
                out[kind] = text
        except Exception as exc:
            hint = " (bash scripts/postgres.sh starts one)" if kind == "postgresql" else ""
            print(f"{kind}: {mask_url(text)} does not answer{hint}: "
                  f"{str(exc).splitlines()[0]} - skipped", file=sys.stderr)
        finally:
            engine.dispose()
    if not out:
        raise SystemExit("no database answers: nothing to measure")
    return out


def job_for(args: argparse.Namespace, peer: catalog.Peer, measure: str, db: str, url: str,
            tag: str) -> dict[str, Any]:
    job: dict[str, Any] = {"measure": measure, "db": db, "url": url,
                           "prefix": f"bench_{tag}_{SHORT[peer.name]}_{measure[:3]}"}
    if measure == "publish":
        job.update(n=args.tx, runs=args.runs)
    elif measure == "drain":
        settings = peer.drain[db][:1] if args.quick else peer.drain[db]
        job.update(settings=settings, rows=args.drain_rows, runs=args.drain_runs,
                   budget=args.drain_budget,
                   sweep_rows=min(peer.sweep_rows, args.drain_rows, 1000 if args.quick
                                  else peer.sweep_rows))
    else:
        job.update(n=args.dedupe_messages, runs=args.runs, duplicates=args.duplicates,
                   redis=args.redis_url)
    return job


def plan(args: argparse.Namespace, peers: list[catalog.Peer], urls: dict[str, str],
         tag: str) -> list[tuple[catalog.Peer, str, dict[str, Any]]]:
    """Every (peer, label, job): per database, per measure, consumer-kit first."""
    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    out = []
    for db, url in urls.items():
        for measure in measures:
            for peer in peers:
                if db not in peer.databases or (measure == "dedupe" and not peer.dedupe):
                    continue
                job = job_for(args, peer, measure, db, url, tag)
                if measure == "publish":
                    for i, (label, extra) in enumerate(peer.publish.items()):
                        out.append((peer, label, {**job, **extra,
                                                  "prefix": f"{job['prefix']}{i}"}))
                else:
                    out.append((peer, peer.name, job))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    peers = catalog.by_name(args.peers)
    urls = database_urls(args)
    if "dedupe" in args.measures:
        import redis

        try:
            redis.Redis.from_url(args.redis_url, socket_timeout=2).ping()
        except redis.RedisError as exc:
            raise SystemExit(f"redis {mask_url(args.redis_url)} does not answer ({exc}): start "
                             "it (scripts/setup.sh) or leave dedupe out (--measures "
                             "publish,drain)") from None
    setup_log: list[str] = []
    pythons = {p.name: venvs.ensure(p, setup_log) for p in peers}
    facts = []
    for db, url in urls.items():
        engine = sa.create_engine(url)
        try:
            lines = machine_facts(engine).splitlines()
        finally:
            engine.dispose()
        facts += lines[:-1] if not facts else []
        facts.append(f"{report.DB_TITLE[db]:<8}: {lines[-1].split(': ', 1)[1]}")
    tag = uuid.uuid4().hex[:6]
    results = [jobs.run(pythons[peer.name], peer.runner, job, peer=peer.name, label=label,
                        timeout=args.timeout)
               for peer, label, job in plan(args, peers, urls, tag)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=1, default=str)
    print_report(args, results, list(urls), facts, setup_log, peers, started)
    return 1 if report.failures(results) else 0


def print_report(args: argparse.Namespace, results: list[jobs.JobResult], dbs: list[str],
                 facts: list[str], setup_log: list[str], peers: list[catalog.Peer],
                 started: float) -> None:
    out = ["", *facts, f"load at the end: {load_average()}",
           f"wall time: {time.monotonic() - started:.0f} s; publish {args.tx:,} transactions x "
           f"{args.runs} runs per variant (interleaved), drain {args.drain_rows:,} rows x "
           f"{args.drain_runs} runs, dedupe {args.dedupe_messages:,} messages x {args.runs} runs"
           + (" [--quick: smoke figures, not for comparison]" if args.quick else ""),
           "environments: " + "; ".join(setup_log) if setup_log else "",
           "versions: " + " | ".join(report.peer_versions(results, peers))]
    for db in dbs:
        out += ["", f"== {report.DB_TITLE[db]} ==", ""]
        for measure, render in (("publish", report.publish_table), ("drain", report.drain_table),
                                ("dedupe", report.dedupe_table)):
            if report.of(results, db, measure):
                out += [render(results, db), ""]
    out += ["== summary (issue 17's table, this run) ==", "", report.summary(results, dbs), ""]
    out += ["== unfairness in this comparison ==", ""]
    out += [f"- {line}" for line in report.unfairness(results, dbs, args.drain_budget,
                                                        args.drain_rows)]
    out += [f"- left out: {line}" for line in catalog.LEFT_OUT]
    failed = report.failures(results)
    if failed:
        out += ["", "== FAILED ==", *failed]
    print("\n".join(out))
