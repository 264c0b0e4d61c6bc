"""A tiny Django app for the Django peers: the business table (`Order`), the consumer's effect
table (`Effect`) and jaiminho's decorated send function. Its table names come from the job's
prefix (environment variable CKIT_PEERS_PREFIX, set before `django.setup()`)."""
