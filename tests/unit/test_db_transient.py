"""`db.is_transient`: which database failures mean "not now" (503, retry) and which are
a statement's own fault (a 500 or a domain answer)."""

from __future__ import annotations

import pytest
from sqlalchemy import exc as sa_exc

from app.db import driver_error, is_transient


class DriverError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (sa_exc.TimeoutError("QueuePool limit reached"), True),
        (sa_exc.OperationalError("SELECT 1", {}, Exception("server closed")), True),
        (sa_exc.InterfaceError("SELECT 1", {}, Exception("connection is closed")), True),
        (sa_exc.DBAPIError("SELECT 1", {}, DriverError("57P01")), True),  # admin shutdown
        (sa_exc.DBAPIError("SELECT 1", {}, DriverError("08006")), True),  # connection failure
        (DriverError("57P03"), True),  # starting up, raised unwrapped by the connect
        (DriverError("53300"), True),  # too many connections
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (TimeoutError(), True),
        (sa_exc.IntegrityError("INSERT", {}, DriverError("23505")), False),
        (sa_exc.DBAPIError("SELECT 1", {}, DriverError("42601")), False),  # syntax error
        (ValueError("bad"), False),
        (KeyError("x"), False),
    ],
)
def test_is_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_invalidated_connection_is_transient() -> None:
    error = sa_exc.DBAPIError("SELECT 1", {}, DriverError("XX000"), connection_invalidated=True)
    assert is_transient(error)


def test_a_wrapped_outage_is_transient() -> None:
    outer = RuntimeError("while serving the request")
    outer.__cause__ = ConnectionRefusedError(111, "Connect call failed")
    assert is_transient(outer)
    assert not is_transient(RuntimeError("alone"))


@pytest.mark.parametrize(
    ("error", "closed", "kind", "transient"),
    [
        (DriverError("23505"), False, sa_exc.IntegrityError, False),  # unique violation
        (DriverError("42601"), False, sa_exc.DBAPIError, False),  # syntax error
        (DriverError("57P01"), False, sa_exc.OperationalError, True),  # terminated
        (DriverError("08006"), False, sa_exc.OperationalError, True),
        (ConnectionResetError(104, "reset by peer"), False, sa_exc.OperationalError, True),
        (TimeoutError(), False, sa_exc.OperationalError, True),
        (RuntimeError("connection was closed in the middle"), True, sa_exc.OperationalError, True),
        (ValueError("invalid input for query argument"), False, sa_exc.DBAPIError, False),
    ],
)
def test_driver_errors_are_raised_as_sqlalchemy_raises_them(
    error: Exception, closed: bool, kind: type[sa_exc.DBAPIError], transient: bool
) -> None:
    """`execute_once` calls the driver itself: its errors are translated so that callers
    catching IntegrityError and `is_transient` see what SQLAlchemy would have raised."""
    translated = driver_error(error, "SELECT 1", {}, closed=closed)
    assert type(translated) is kind
    assert translated.orig is error
    assert translated.connection_invalidated is transient
    assert is_transient(translated) is transient
