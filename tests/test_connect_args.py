"""A database URL option its driver does not take is refused when the engine is made, with one
line, before any connection (PyMySQL raised it at the first connection as a TypeError)."""

from __future__ import annotations

import importlib.util

import pytest

from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError

#: each driver with an option it takes
DRIVERS = {"mysql+pymysql": "program_name=x",
           **({"postgresql+pg8000": "application_name=x"} if importlib.util.find_spec("pg8000")
              else {})}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_misspelt_url_option_is_refused_naming_it_before_connecting(driver: str) -> None:
    # Given a URL whose query string misspells an option (nothing listens on port 1)
    url = f"{driver}://app:S3cr3t@127.0.0.1:1/orders?chraset=utf8&{DRIVERS[driver]}"
    # When an engine is made / Then one line names the option and the driver, not the password
    with pytest.raises(ConfigError) as refused:
        make_engine(url)
    line = str(refused.value)
    assert "takes no option 'chraset'" in line and driver.split("+")[1] in line, line
    assert DRIVERS[driver].split("=")[0] not in line.split("takes no option")[1]
    assert "S3cr3t" not in line and "\n" not in line


@pytest.mark.parametrize("url", [
    "mysql+pymysql://app:pw@127.0.0.1:1/orders?charset=utf8mb4&connect_timeout=3&ssl_ca=/x.pem",
    "postgresql+psycopg://app:pw@127.0.0.1:1/orders?application_name=x&sslmode=disable",
    *(["postgresql+pg8000://app:pw@127.0.0.1:1/orders?timeout=3"] if len(DRIVERS) > 1 else []),
    "sqlite:///:memory:",
])
def test_options_the_driver_takes_are_accepted(url: str) -> None:
    make_engine(url).dispose()


def test_an_option_value_the_dialect_cannot_read_is_a_configuration_error() -> None:
    # Given a number option that is not a number (PyMySQL's dialect reads it with int())
    url = "mysql+pymysql://app:S3cr3t@127.0.0.1:1/orders?connect_timeout=abc"
    # When an engine is made / Then one line, a configuration error, not a bare ValueError
    with pytest.raises(ConfigError, match="an option's value is not one pymysql takes") as bad:
        make_engine(url)
    assert "abc" in str(bad.value) and "S3cr3t" not in str(bad.value)


@pytest.mark.parametrize(("url", "instead"), [
    ("mysql+pymysql://app:S3cr3t@127.0.0.1:1/orders?ssl_mode=REQUIRED", "ssl_ca"),
    ("mysql+pymysql://app:S3cr3t@127.0.0.1:1/orders?sslmode=require", "ssl_ca"),
    *([("postgresql+pg8000://app:S3cr3t@127.0.0.1:1/orders?sslmode=require", "ssl_context")]
      if len(DRIVERS) > 1 else []),
    # psycopg's connect() takes any keyword (libpq's options): only another driver's TLS
    # option is refused before connecting, libpq says itself what else it does not take
    ("postgresql+psycopg://app:S3cr3t@127.0.0.1:1/orders?ssl_mode=REQUIRED", "sslmode"),
])
def test_another_drivers_tls_option_is_refused_naming_what_this_driver_takes(
        url: str, instead: str) -> None:
    # Given a URL copied from another driver's setup, with its TLS option
    # When an engine is made / Then the line names the option this driver takes instead
    with pytest.raises(ConfigError) as refused:
        make_engine(url)
    line = str(refused.value)
    assert "takes no option 'ssl" in line and instead in line, line
    assert "misspelt" not in line and "S3cr3t" not in line
