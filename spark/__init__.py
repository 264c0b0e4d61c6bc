"""The Spark source of the reconciler (`source.py`), its session (`session.py`), JDBC reads
(`reads.py`, `jdbc.py`) and the spark-submit entry (`reconcile_job.py`); see README.md here."""
