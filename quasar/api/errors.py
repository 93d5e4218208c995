"""How the API answers a request that an exception ended: one mapping, used by the app's exception
handlers and by the submission fast lane (quasar/api/fastlane.py), so both answer alike.

Every error body is ``{"detail": "..."}``; an unexpected error is logged here and answered with a
plain 500, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from quasar import auth
from quasar.api.db import DatabaseBusy
from quasar.chain import ChainError
from quasar.errors import QuasarError
from quasar.log import Repeats

logger = logging.getLogger(__name__)
DATABASE_ERRORS = Repeats(logger)


class ApiError(QuasarError):
    """A refused request: ``status`` and a ``detail`` safe to return to the caller."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})


def error_response(error: Exception, method: str, path: str) -> JSONResponse:
    """The response for ``error``, raised while answering ``method path``."""
    if isinstance(error, ApiError):
        return JSONResponse({"detail": error.detail}, status_code=error.status, headers=error.headers)
    if isinstance(error, auth.AuthFailure):
        return JSONResponse({"detail": error.reason}, status_code=error.status_code)
    if isinstance(error, DatabaseBusy):
        return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": "1"})
    if isinstance(error, OperationalError):
        # Said once, then every REPEAT_EVERY_S: an outage refuses every request that needs the database.
        DATABASE_ERRORS.say("database", logging.ERROR, f"database error: {error.orig}; requests that need it get 503")
        return JSONResponse(
            {"detail": "the database is unavailable; retry shortly"}, status_code=503, headers={"Retry-After": "5"}
        )
    if isinstance(error, ChainError):
        return JSONResponse(
            {"detail": f"the chain is unavailable: {error}"}, status_code=503, headers={"Retry-After": "12"}
        )
    logger.error("unexpected error on %s %s", method, path, exc_info=error)
    return JSONResponse({"detail": "internal error"}, status_code=500)
