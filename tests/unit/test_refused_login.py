"""Which failed PostgreSQL logins are refusals for good: libpq keeps only the server's
words for a refused login, so the words decide (the tests with a real cluster cover the
missing database and role; these, the answers a trust-auth test cluster cannot give)."""

from __future__ import annotations

import psycopg
import pytest

from plunder.store.postgres.connections import refused_for_good, server_reason

AT = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("said", "for_good"),
    [
        ('FATAL:  password authentication failed for user "app"', True),
        ('FATAL:  database "farm" does not exist', True),
        ('FATAL:  role "app" does not exist', True),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "app", database "x"', True),
        ('FATAL:  role "app" is not permitted to log in', True),
        ("fe_sendauth: no password supplied", True),
        ("Connection refused\n\tIs the server running on that host?", False),
        ("FATAL:  the database system is starting up", False),
        ("FATAL:  sorry, too many clients already", False),
        ("server closed the connection unexpectedly", False),
    ],
)
def test_a_refusal_for_good_is_told_from_a_moment_of_trouble(said: str, for_good: bool) -> None:
    assert refused_for_good(psycopg.OperationalError(AT + said)) is for_good


def test_the_reason_is_the_servers_own_words() -> None:
    exc = psycopg.OperationalError(AT + 'FATAL:  database "farm" does not exist')
    assert server_reason(exc) == 'database "farm" does not exist'
    refused = psycopg.OperationalError(AT + "Connection refused\n\tIs the server running?")
    assert server_reason(refused) == AT + "Connection refused"
