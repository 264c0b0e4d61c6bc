"""The `ckit` command line."""
