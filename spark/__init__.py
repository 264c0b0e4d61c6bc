"""The PySpark reconcile job (`reconcile_job.py`) and its JDBC reads; see README.md here."""
